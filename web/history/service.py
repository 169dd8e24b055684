"""The request history as the admin reads it (filtered lists, one request), and its pruning after the retention
period. Rows are written by the ledger (web/ledger.py), which keeps them together with the quota."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.errors import NotFound
from web.models import EngineSample, RequestRecord, StoredResponse, utcnow


@dataclass(frozen=True, slots=True)
class HistoryFilter:
    key_id: int | None = None
    status: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    backend: str | None = None
    user_id: int | None = None  # the person a request counted against (their session or any of their keys)
    end_user_id: int | None = None  # the front end's end user it counted against (web/keys/front_end.py)


# The history's one order: newest first, the id breaking ties, so pages and exports never skip or repeat a row.
NEWEST_FIRST = (RequestRecord.arrival_at.desc(), RequestRecord.id)
Rows = list[RequestRecord]  # named outside the class, whose `list` method would shadow the builtin
Names = list[str]


def _backends_seen() -> Select[tuple[str]]:
    """The distinct backends the history names, in order, one index seek each (a skip scan): DISTINCT would read
    every row's index entry, 90 ms a page view at a million rows on SQLite."""
    backend = RequestRecord.backend
    seen = select(func.min(backend).label("name")).cte("seen", recursive=True)
    after = select(func.min(backend)).where(backend > seen.c.name).scalar_subquery()
    seen = seen.union_all(select(after).where(seen.c.name.is_not(None)))
    return select(seen.c.name).where(seen.c.name.is_not(None))


BACKENDS_SEEN = _backends_seen()


def _conditions(filters: HistoryFilter) -> list[Any]:
    conditions: list[Any] = []
    if filters.key_id is not None:
        conditions.append(RequestRecord.key_id == filters.key_id)
    if filters.status is not None:
        conditions.append(RequestRecord.status == filters.status)
    if filters.since is not None:
        conditions.append(RequestRecord.arrival_at >= filters.since)
    if filters.until is not None:
        conditions.append(RequestRecord.arrival_at < filters.until)
    if filters.backend is not None:
        conditions.append(RequestRecord.backend == filters.backend)
    if filters.user_id is not None:
        conditions.append(RequestRecord.user_id == filters.user_id)
    if filters.end_user_id is not None:
        conditions.append(RequestRecord.end_user_id == filters.end_user_id)
    return conditions


class HistoryService:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    # -- jobs ------------------------------------------------------------------------------------------

    async def prune(self, retention_days: int, sample_retention_days: int) -> tuple[int, int]:
        now = utcnow()
        async with self.sessions.begin() as session:
            cutoff = now - timedelta(days=retention_days)
            rows = await session.execute(delete(RequestRecord).where(RequestRecord.arrival_at < cutoff))
            # a stored Responses answer is text of the history's: it goes with the history's retention
            await session.execute(delete(StoredResponse).where(StoredResponse.created_at < cutoff))
            samples = await session.execute(
                delete(EngineSample).where(EngineSample.at < now - timedelta(days=sample_retention_days))
            )
        return int(rows.rowcount), int(samples.rowcount)  # type: ignore[attr-defined]

    # -- queries for the admin API ---------------------------------------------------------------------

    async def list(self, filters: HistoryFilter, limit: int, offset: int) -> tuple[list[RequestRecord], int]:
        conditions = _conditions(filters)
        async with self.sessions() as session:
            total = await session.scalar(select(func.count()).select_from(RequestRecord).where(*conditions))
            rows = await session.scalars(
                select(RequestRecord).where(*conditions).order_by(*NEWEST_FIRST).limit(limit).offset(offset)
            )
            return list(rows), int(total or 0)

    async def export(self, filters: HistoryFilter, chunk: int) -> AsyncIterator[Rows]:
        """Every matching row, newest first, `chunk` rows at a time: each chunk a short query that starts after
        the last row of the one before (no COUNT, no OFFSET rescanning what was already sent, no transaction
        held open while the client reads)."""
        conditions = _conditions(filters)
        after: tuple[datetime, str] | None = None
        while True:
            page = select(RequestRecord).where(*conditions)
            if after is not None:
                at, rid = after
                page = page.where(
                    or_(RequestRecord.arrival_at < at, and_(RequestRecord.arrival_at == at, RequestRecord.id > rid))
                )
            async with self.sessions() as session:
                rows = list(await session.scalars(page.order_by(*NEWEST_FIRST).limit(chunk)))
            if rows:
                yield rows
            if len(rows) < chunk:
                return
            after = (rows[-1].arrival_at, rows[-1].id)

    async def backends(self) -> Names:
        """The backends the history names, sorted: the filter's choices."""
        async with self.sessions() as session:
            return list(await session.scalars(BACKENDS_SEEN))

    async def get(self, request_id: str) -> RequestRecord:
        async with self.sessions() as session:
            row = await session.get(RequestRecord, request_id)
        if row is None:
            raise NotFound(f"no request with id {request_id!r}", param="request_id")
        return row
