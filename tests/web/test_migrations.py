"""Schema: Alembic upgrade -> downgrade -> upgrade works, and the models match the migrations exactly."""

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect

from web.db import create_db_engine, downgrade_schema, sqlite_url, upgrade_schema
from web.models import Base


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _diff(connection: Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": True, "render_as_batch": True})
    return list(compare_metadata(context, Base.metadata))


async def test_upgrade_downgrade_upgrade_and_no_autogenerate_difference(tmp_path: Path) -> None:
    engine = create_db_engine(sqlite_url(tmp_path / "m.db"))
    try:
        await upgrade_schema(engine)
        async with engine.connect() as conn:
            assert set(Base.metadata.tables) <= await conn.run_sync(_tables)
        await downgrade_schema(engine, "base")
        async with engine.connect() as conn:
            assert await conn.run_sync(_tables) == {"alembic_version"}
        await upgrade_schema(engine)
        async with engine.connect() as conn:
            assert await conn.run_sync(_diff) == []
            journal = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar()
            foreign_keys = (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar()
        assert (journal, foreign_keys) == ("wal", 1)
    finally:
        await engine.dispose()
