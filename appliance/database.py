"""The database from the command line: migrate it, read its schema revision, and open it (migrated) for the
commands that change keys or the admin credential; they work whether or not the server is running."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass
from typing import TypeVar

from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from appliance.settings import Settings
from web.db import alembic_config, create_db_engine, create_sessionmaker, is_sqlite, redacted_url, upgrade_schema
from web.system.admin_auth import AdminAuth

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Database:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]


@asynccontextmanager
async def open_database(settings: Settings) -> AsyncIterator[Database]:
    """The database at its latest schema (upgraded first, as the server does at start)."""
    if is_sqlite(settings.database):
        settings.database_path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_db_engine(settings.database)
    try:
        await upgrade_schema(engine)
        yield Database(engine, create_sessionmaker(engine))
    finally:
        await engine.dispose()


def with_database(settings: Settings, work: Callable[[Database], Awaitable[T]]) -> T:
    async def run() -> T:
        async with open_database(settings) as db:
            return await work(db)

    return asyncio.run(run())


def migrate(settings: Settings) -> None:
    async def nothing(_: Database) -> None:
        return None

    with_database(settings, nothing)
    print(f"the database at {database_place(settings)} is at the latest schema")


def database_place(settings: Settings) -> str:
    """Where the database is, as it may be shown: the SQLite file, or the URL without its password."""
    return str(settings.database_path) if settings.database_url is None else redacted_url(settings.database_url)


def set_admin_password(settings: Settings, password: str) -> None:
    """Raises web.errors.InvalidRequest for a password that is too short."""
    with_database(settings, lambda db: AdminAuth.over(db.sessions).set_password(password))


@dataclass(frozen=True, slots=True)
class Revision:
    current: str | None  # None: no database, or one never migrated
    head: str
    known: bool  # whether this version of the appliance knows `current`


def schema_revision(settings: Settings) -> Revision:
    """Read-only: the database's Alembic revision against this version's head, without touching the file.
    Raises sqlalchemy's error where a database server cannot be reached."""
    scripts = ScriptDirectory.from_config(alembic_config())
    head = scripts.get_current_head()
    assert head is not None, "the migrations have a single head"
    current = None
    if settings.database_url is not None:
        current = asyncio.run(_server_revision(settings.database_url))
    elif settings.database_path.is_file():
        with closing(sqlite3.connect(f"file:{settings.database_path}?mode=ro", uri=True)) as conn:
            try:
                row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            except sqlite3.OperationalError:  # no such table: never migrated
                row = None
        current = row[0] if row else None
    known = current is None or any(script.revision == current for script in scripts.walk_revisions())
    return Revision(current, head, known)


async def _server_revision(url: str) -> str | None:
    engine = create_db_engine(url)
    try:
        async with engine.connect() as conn:
            try:
                return await conn.scalar(text("SELECT version_num FROM alembic_version"))
            except ProgrammingError:  # no such table: never migrated
                return None
    finally:
        await engine.dispose()
