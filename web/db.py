"""The async database engine (SQLite with its pragmas, or PostgreSQL through asyncpg), the session factory, and
schema upgrade through Alembic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import BigInteger, Connection, event, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
MIGRATION_LOCK = 0x6C6C6D61  # PostgreSQL advisory lock key held while migrating ("llma")
# SQLite's INTEGER is 64-bit: no id beyond this range can exist, and no limit beyond it can be stored.
SQLITE_INT_MIN, SQLITE_INT_MAX = -(2**63), 2**63 - 1


class epoch_seconds(FunctionElement[int]):  # named as the SQL function it stands for
    """Whole seconds since 1970 of a stored (naive UTC) datetime, in each dialect's own words."""

    type = BigInteger()
    inherit_cache = True


@compiles(epoch_seconds, "sqlite")
def _epoch_sqlite(element: epoch_seconds, compiler: SQLCompiler, **kw: Any) -> str:
    return f"CAST(strftime('%s', {compiler.process(element.clauses, **kw)}) AS INTEGER)"


@compiles(epoch_seconds, "postgresql")
def _epoch_postgresql(element: epoch_seconds, compiler: SQLCompiler, **kw: Any) -> str:
    return f"CAST(floor(EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)})) AS BIGINT)"


def sqlite_url(path: str | Path) -> str:
    return f"sqlite+aiosqlite:///{Path(path)}"


def redacted_url(url: str) -> str:
    """The URL as it may be logged or shown: its password (a secret) as ***."""
    return make_url(url).render_as_string(hide_password=True)


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_db_engine(url: str) -> AsyncEngine:
    """An engine on `url`; on SQLite every connection uses WAL, enforces foreign keys and waits on a busy
    database (PostgreSQL does all three by itself)."""
    engine = create_async_engine(url, pool_size=8, max_overflow=8, pool_timeout=60)
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _set_pragmas)
    return engine


def _set_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    # Writers queue behind each other instead of failing with "database is locked".
    cursor.execute("PRAGMA busy_timeout=10000")
    # With WAL, NORMAL never corrupts and survives a process crash; only a power cut may lose the last commits.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str | None = None) -> Config:
    """Alembic's config built in code, so start-up does not depend on the working directory."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url)
    return config


async def upgrade_schema(engine: AsyncEngine, revision: str = "head") -> None:
    """Run `alembic upgrade <revision>` on the app's own engine (so the other pragmas apply)."""
    await _migrate(engine, "upgrade", revision)


async def downgrade_schema(engine: AsyncEngine, revision: str = "base") -> None:
    await _migrate(engine, "downgrade", revision)


async def _migrate(engine: AsyncEngine, action: str, revision: str) -> None:
    sqlite = engine.dialect.name == "sqlite"
    async with engine.connect() as conn:
        # SQLite's batch mode rebuilds tables (copy, drop, rename); enforced foreign keys would cascade or refuse
        # the drop. The pragma only takes effect outside a transaction, so it is set before Alembic begins one.
        # PostgreSQL alters tables in place (batch mode issues plain ALTERs there).
        if sqlite:
            await conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
        else:
            # Gateways sharing a server start together: one migrates, the others wait here until it commits and
            # then find the schema at head. The lock ends with the transaction Alembic runs in.
            await conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        await conn.run_sync(_run_alembic, action, revision)
        await conn.commit()
        if sqlite:
            await conn.exec_driver_sql("PRAGMA foreign_keys=ON")


def _run_alembic(connection: Connection, action: str, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    if action == "upgrade":
        command.upgrade(config, revision)
    else:
        command.downgrade(config, revision)
