"""Background jobs on APScheduler 3's AsyncIOScheduler, started and stopped with the app: quota rollover,
history and sample retention, and the 5-second engine sampler that feeds the console's charts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import EngineStats
from web.config import WebConfig
from web.history.service import HistoryService
from web.keys.service import KeyService
from web.models import EngineSample, utcnow
from web.system.metrics import Metrics, percentile

log = logging.getLogger("web.jobs")


class Sampler:
    """Turns engine snapshots into stored samples; tokens/s comes from the counter delta between two."""

    def __init__(
        self,
        stats: Callable[[], EngineStats | None],
        metrics: Metrics,
        sessions: async_sessionmaker[AsyncSession],
    ) -> None:
        self.stats = stats
        self.metrics = metrics
        self.sessions = sessions
        self._previous: EngineStats | None = None

    def build(self, now: datetime) -> EngineSample | None:
        s = self.stats()
        waits = self.metrics.take_queue_waits()
        if s is None:
            return None
        prev, self._previous = self._previous, s
        tokens_per_s, preemptions = 0.0, 0
        # The counters restart with the engine process: a drop means a restart, not negative work.
        restarted = prev is None or s.generation_tokens_total < prev.generation_tokens_total
        if prev is not None and not restarted and s.time > prev.time:
            tokens_per_s = (s.generation_tokens_total - prev.generation_tokens_total) / (s.time - prev.time)
            preemptions = max(s.preemptions_total - prev.preemptions_total, 0)
        return EngineSample(
            at=now,
            running=s.running,
            waiting=s.waiting,
            kv_usage=s.kv_usage,
            kv_blocks_used=s.kv_blocks_used,
            kv_blocks_total=s.kv_blocks_total,
            memory_kind=s.memory_kind,
            memory_total_bytes=s.device_memory_total,
            memory_free_bytes=s.device_memory_free,
            weights_bytes=s.weights_bytes,
            kv_pool_bytes=s.kv_pool_bytes,
            queue_wait_p95_s=percentile(waits, 0.95),
            tokens_per_s=tokens_per_s,
            preemptions=preemptions,
        )

    async def run(self) -> None:
        sample = self.build(utcnow())
        if sample is None:
            return
        async with self.sessions.begin() as session:
            session.add(sample)


class Jobs:
    def __init__(self, config: WebConfig, keys: KeyService, history: HistoryService, sampler: Sampler) -> None:
        self.config = config
        self.keys = keys
        self.history = history
        self.sampler = sampler
        self.scheduler = AsyncIOScheduler(timezone=UTC)
        self._running: set[asyncio.Future[None]] = set()

    def start(self) -> None:
        config = self.config
        soon = datetime.now(UTC) + timedelta(seconds=1)
        common = {"coalesce": True, "max_instances": 1, "misfire_grace_time": 60}
        run = self._run
        self.scheduler.add_job(
            run, "interval", [self.roll_over], minutes=1, next_run_time=soon, id="quota-rollover", **common
        )
        self.scheduler.add_job(run, "interval", [self.prune], hours=1, next_run_time=soon, id="retention", **common)
        self.scheduler.add_job(
            run, "interval", [self.sampler.run], seconds=config.sample_interval, id="engine-sampler", **common
        )
        self.scheduler.start()

    async def stop(self, timeout: float = 10.0) -> None:
        """No new runs, and the running ones finished (up to timeout) before the caller closes the database: a run
        cancelled in the middle of a query at the loop's teardown left aiosqlite's thread waiting, and the process
        with it."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self._running:
            await asyncio.wait(set(self._running), timeout=timeout)

    async def _run(self, job: Callable[[], Awaitable[object]]) -> None:
        future = asyncio.get_running_loop().create_future()
        self._running.add(future)
        try:
            await job()
        finally:
            future.set_result(None)
            self._running.discard(future)

    async def roll_over(self) -> None:
        count = await self.keys.roll_over_all()
        if count:
            log.info("quota period rolled over for %d key(s)", count)

    async def prune(self) -> None:
        config = self.config
        rows, samples = await self.history.prune(config.history_retention_days, config.sample_retention_days)
        if rows or samples:
            log.info("retention: deleted %d request row(s) and %d sample(s)", rows, samples)
