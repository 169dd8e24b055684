"""The sampler's table read for the charts: samples of a time window averaged into fixed buckets in SQL, so a
24-hour chart reads a few hundred rows, not seventeen thousand."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import BigInteger, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.db import epoch_seconds
from web.models import EngineSample, utcnow


@dataclass(frozen=True, slots=True)
class Window:
    key: str
    label: str
    seconds: int
    bucket_s: int


WINDOWS = {w.key: w for w in (Window("1h", "last hour", 3600, 15), Window("24h", "last 24 h", 86400, 300))}


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket's aggregate: peaks for load and latency, the lowest headroom, the mean throughput."""

    at: float  # epoch seconds of the bucket's start
    running: int
    waiting: int
    kv_usage: float
    memory_free_bytes: int
    memory_total_bytes: int
    queue_wait_p95_s: float | None
    tokens_per_s: float


async def buckets(
    sessions: async_sessionmaker[AsyncSession], window: Window, now: datetime | None = None
) -> tuple[list[Bucket], str | None]:
    """The window's buckets in time order, and the memory kind ("VRAM"/"RAM") of the latest sample."""
    since = (now or utcnow()) - timedelta(seconds=window.seconds)
    # The bucket size as a literal: PostgreSQL matches the select's expression to the GROUP BY's only when both
    # are the same text, which two bound parameters are not.
    slot = epoch_seconds(EngineSample.at) // literal_column(str(int(window.bucket_s)), BigInteger())
    query = (
        select(
            slot,
            func.max(EngineSample.running),
            func.max(EngineSample.waiting),
            func.max(EngineSample.kv_usage),
            func.min(EngineSample.memory_free_bytes),
            func.max(EngineSample.memory_total_bytes),
            func.max(EngineSample.queue_wait_p95_s),
            func.avg(EngineSample.tokens_per_s),
        )
        .where(EngineSample.at >= since)
        .group_by(slot)
        .order_by(slot)
    )
    latest_kind = select(EngineSample.memory_kind).order_by(EngineSample.at.desc()).limit(1)
    async with sessions() as session:
        rows = (await session.execute(query)).all()
        kind = await session.scalar(latest_kind)
    return [
        Bucket(
            at=float(s * window.bucket_s),
            running=int(r),
            waiting=int(w),
            kv_usage=float(kv),
            memory_free_bytes=int(free),
            memory_total_bytes=int(total),
            queue_wait_p95_s=None if qw is None else float(qw),
            tokens_per_s=float(tps or 0.0),
        )
        for s, r, w, kv, free, total, qw, tps in rows
    ], kind
