"""The request history: rows written at admission, moved to running, finalized with quota settlement, queried
by the admin API, recovered after a crash and pruned after the retention period."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from web.errors import NotFound
from web.history.record import FINALIZE_REQUEST, INSERT_REQUEST, MARK_RUNNING, RequestLog
from web.history.writer import BatchWriter
from web.keys import quota
from web.models import EngineSample, RequestRecord, utcnow


@dataclass(frozen=True, slots=True)
class HistoryFilter:
    key_id: int | None = None
    status: str | None = None
    since: datetime | None = None
    until: datetime | None = None


class HistoryService:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], writer: BatchWriter) -> None:
        self.sessions = sessions
        self.writer = writer

    # -- writes on the request path --------------------------------------------------------------------

    def mark_running(self, log: RequestLog) -> None:
        params = {
            "rid": log.id,
            "admitted": log.wall(log.scheduled_mono),
            "first": log.wall(log.first_token_mono),
        }

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(MARK_RUNNING, params)

        self.writer.submit(write)

    def finalize(self, log: RequestLog) -> asyncio.Future[bool]:
        """Write the terminal row and replace the key's reservation by the tokens charged, in one transaction
        (retried until the database takes it; the future says whether it did at the first try)."""
        values, key_id = log.final_values(), log.key_id
        reserved, charged = log.reserved_tokens, log.charged_tokens

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(FINALIZE_REQUEST, values)
            if key_id is not None:
                await quota.settle(conn, key_id, reserved, charged)

        return self.writer.submit(write)

    def record_rejected(self, log: RequestLog) -> asyncio.Future[bool]:
        """A request refused before admission (bad input, overload, quota) still gets its row."""
        log.status = "rejected"
        values = log.queued_values(finished_at=utcnow())

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(INSERT_REQUEST, values)

        return self.writer.submit(write)

    # -- start-up and jobs -----------------------------------------------------------------------------

    async def mark_interrupted(self) -> int:
        """Rows a crash left queued or running can never finish: mark them interrupted."""
        async with self.sessions.begin() as session:
            result = await session.execute(
                update(RequestRecord)
                .where(RequestRecord.status.in_(("queued", "running")))
                .values(
                    status="interrupted",
                    reserved_tokens=0,
                    finished_at=utcnow(),
                    error="the server stopped while the request was in flight",
                )
            )
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def prune(self, retention_days: int, sample_retention_days: int) -> tuple[int, int]:
        now = utcnow()
        async with self.sessions.begin() as session:
            rows = await session.execute(
                delete(RequestRecord).where(RequestRecord.arrival_at < now - timedelta(days=retention_days))
            )
            samples = await session.execute(
                delete(EngineSample).where(EngineSample.at < now - timedelta(days=sample_retention_days))
            )
        return int(rows.rowcount), int(samples.rowcount)  # type: ignore[attr-defined]

    # -- queries for the admin API ---------------------------------------------------------------------

    async def list(self, filters: HistoryFilter, limit: int, offset: int) -> tuple[list[RequestRecord], int]:
        conditions = []
        if filters.key_id is not None:
            conditions.append(RequestRecord.key_id == filters.key_id)
        if filters.status is not None:
            conditions.append(RequestRecord.status == filters.status)
        if filters.since is not None:
            conditions.append(RequestRecord.arrival_at >= filters.since)
        if filters.until is not None:
            conditions.append(RequestRecord.arrival_at < filters.until)
        async with self.sessions() as session:
            total = await session.scalar(select(func.count()).select_from(RequestRecord).where(*conditions))
            rows = await session.scalars(
                select(RequestRecord)
                .where(*conditions)
                .order_by(RequestRecord.arrival_at.desc(), RequestRecord.id)
                .limit(limit)
                .offset(offset)
            )
            return list(rows), int(total or 0)

    async def get(self, request_id: str) -> RequestRecord:
        async with self.sessions() as session:
            row = await session.get(RequestRecord, request_id)
        if row is None:
            raise NotFound(f"no request with id {request_id!r}", param="request_id")
        return row
