"""People's storage: the admin credential moves into a users row by migration 0008 (and back on downgrade);
sessions are stored only hashed, end when idle and at their maximum age, and with their person's suspension."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import text

from web.db import create_db_engine, create_sessionmaker, downgrade_schema, sqlite_url, upgrade_schema
from web.models import utcnow
from web.people.accounts import Accounts
from web.people.sessions import IDLE_TIMEOUT_S, MAX_AGE_S, TOUCH_EVERY_S, SessionStore, csrf_of, tokens_match
from web.system.admin_auth import AdminAuth

PASSWORD = "correct horse battery"


async def test_the_admin_credential_moves_into_a_users_row_and_back(tmp_path: Path) -> None:
    engine = create_db_engine(sqlite_url(tmp_path / "move.db"))
    await upgrade_schema(engine, "0007")
    stored = "scrypt$16384$8$1$c2FsdA==$ZGlnZXN0"  # any hash: it moves as it is, never re-made
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO admin_credentials (username, password_hash, updated_at) VALUES ('admin', :h, :t)"),
            {"h": stored, "t": "2026-01-02 03:04:05"},
        )
    await upgrade_schema(engine)
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT username, password_hash, role, suspended FROM users"))).all()
        tables = (await conn.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))).scalars().all()
    assert [tuple(r) for r in rows] == [("admin", stored, "admin", 0)]
    assert "admin_credentials" not in tables
    await downgrade_schema(engine, "0007")
    async with engine.connect() as conn:
        back = (await conn.execute(text("SELECT username, password_hash FROM admin_credentials"))).all()
    assert [tuple(r) for r in back] == [("admin", stored)]
    await engine.dispose()


async def test_a_migrated_admin_signs_in_with_the_old_password(tmp_path: Path) -> None:
    engine = create_db_engine(sqlite_url(tmp_path / "old.db"))
    await upgrade_schema(engine, "0007")
    from web.people.passwords import hash_password

    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO admin_credentials (username, password_hash, updated_at) VALUES ('admin', :h, :t)"),
            {"h": hash_password(PASSWORD), "t": "2026-01-02 03:04:05"},
        )
    await upgrade_schema(engine)
    auth = AdminAuth.over(create_sessionmaker(engine))
    assert (await auth.sign_in("admin", PASSWORD, "192.0.2.1")).role == "admin"
    await engine.dispose()


class Clock:
    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now


async def test_sessions_are_hashed_and_expire_when_idle_at_their_age_and_with_suspension(tmp_path: Path) -> None:
    engine = create_db_engine(sqlite_url(tmp_path / "sessions.db"))
    await upgrade_schema(engine)
    sessions = create_sessionmaker(engine)
    person = await Accounts(sessions).create("erin", PASSWORD)
    clock = Clock()
    store = SessionStore(sessions, clock)
    session = await store.create(person.id, "192.0.2.1")
    async with engine.connect() as conn:
        stored = (await conn.execute(text("SELECT id_hash FROM web_sessions"))).scalars().all()
    assert session.token not in stored and session.csrf_token not in stored and len(stored) == 1
    assert session.csrf_token == csrf_of(session.token) and session.csrf_token != session.token
    assert (found := await store.get(session.token)) is not None and found.person.username == "erin"

    clock.now += timedelta(seconds=IDLE_TIMEOUT_S + 1)
    assert await store.get(session.token) is None

    busy = await store.create(person.id)
    for _ in range(MAX_AGE_S // (IDLE_TIMEOUT_S // 2) + 1):  # kept busy, it still ends at the maximum age
        clock.now += timedelta(seconds=IDLE_TIMEOUT_S // 2)
        alive = await store.get(busy.token)
    assert alive is None
    assert (
        await store.get("unknown") is None and await store.get(None) is None and await store.get("x" * 10_000) is None
    )

    again = await store.create(person.id)
    clock.now += timedelta(seconds=TOUCH_EVERY_S)
    assert await store.get(again.token) is not None
    await Accounts(sessions).set_suspended(person.id, True)
    assert await store.get(again.token) is None
    assert tokens_match("abc", "abc") and not tokens_match("abc", "abd") and not tokens_match("abc", None)
    await engine.dispose()
