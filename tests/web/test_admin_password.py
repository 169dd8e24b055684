"""The admin password's hash: scrypt at OWASP's floor (N=2^17, r=8, p=1); a hash from before (N=2^14) still signs
in and is replaced by one at today's cost at that sign-in; a wrong password changes nothing."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
from pathlib import Path

import pytest
from sqlalchemy import select

from web.db import create_db_engine, create_sessionmaker, sqlite_url, upgrade_schema
from web.errors import AdminAuthRequired
from web.models import User, utcnow
from web.system.admin_auth import ADMIN_USER, AdminAuth, hash_password, verify_password

PASSWORD = "correct horse battery"


def old_hash(password: str) -> str:
    """What the appliance stored before: scrypt at N=2^14."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=1 << 14, r=8, p=1, dklen=32)
    return f"scrypt${1 << 14}$8$1${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def test_new_hashes_are_at_the_owasp_floor_and_verify() -> None:
    stored = hash_password(PASSWORD)
    assert stored.split("$")[:4] == ["scrypt", str(1 << 17), "8", "1"]
    assert verify_password(PASSWORD, stored) and not verify_password(PASSWORD + "x", stored)


async def test_an_old_hash_signs_in_once_and_is_rehashed(tmp_path: Path) -> None:
    engine = create_db_engine(sqlite_url(tmp_path / "admin.db"))
    await upgrade_schema(engine)
    sessions = create_sessionmaker(engine)
    async with sessions.begin() as session:
        now = utcnow()
        session.add(
            User(
                username=ADMIN_USER,
                password_hash=old_hash(PASSWORD),
                role="admin",
                suspended=False,
                overrides="{}",
                created_at=now,
                updated_at=now,
            )
        )
    auth = AdminAuth.over(sessions)

    async def stored() -> str:
        async with sessions() as session:
            value = await session.scalar(select(User.password_hash))
        assert value is not None
        return value

    before = await stored()
    with pytest.raises(AdminAuthRequired):
        await auth.sign_in(ADMIN_USER, "wrong password", "192.0.2.1")
    assert await stored() == before, "a failed sign-in re-hashes nothing"

    await auth.sign_in(ADMIN_USER, PASSWORD, "192.0.2.1")
    upgraded = await stored()
    assert upgraded.split("$")[1] == str(1 << 17)
    assert verify_password(PASSWORD, upgraded) and not verify_password("wrong password", upgraded)
    await AdminAuth.over(sessions).sign_in(ADMIN_USER, PASSWORD, "192.0.2.1")  # a fresh process signs in too
    await engine.dispose()


async def test_gateways_seeding_one_database_together_keep_one_credential(tmp_path: Path) -> None:
    """Two gateways on one database start at once (PostgreSQL, issue 11): both find no credential, both hash,
    and the later insert must give way instead of failing the gateway's start on the unique username."""
    engine = create_db_engine(sqlite_url(tmp_path / "seed.db"))
    await upgrade_schema(engine)
    sessions = create_sessionmaker(engine)
    seeded = await asyncio.gather(AdminAuth.over(sessions).seed(PASSWORD), AdminAuth.over(sessions).seed(PASSWORD))
    assert sorted(seeded) == [False, True]
    async with sessions() as session:
        rows = (await session.scalars(select(User))).all()
    assert len(rows) == 1 and verify_password(PASSWORD, rows[0].password_hash)
    await engine.dispose()
