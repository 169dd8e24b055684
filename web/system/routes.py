"""Liveness, readiness, Prometheus metrics, and the admin API's live stats and engine samples."""

from datetime import UTC, datetime, timedelta
from typing import Annotated

from litestar import Response, Router, get
from litestar.params import QueryParameter
from litestar.types import Guard
from msgspec import Struct
from sqlalchemy import select

from engine import EngineStats, ModelInfo
from web import deps
from web.models import EngineSample
from web.system.metrics import CONTENT_TYPE, KeyQuota, percentile


class Health(Struct):
    status: str


class Readiness(Struct, omit_defaults=True):
    status: str
    model: str | None
    # The local engine's KV pool: tokens it holds (blocks x block size) and its element type (auto: the model's;
    # int8 or fp8: about twice the tokens in the same bytes). Left out where no local engine serves.
    kv_cache_tokens: int | None = None
    kv_cache_dtype: str | None = None


@get("/health", sync_to_thread=False)
def health() -> Health:
    return Health("ok")


@get("/ready", sync_to_thread=False)
def ready(gate: deps.Gate) -> Readiness:
    gate.check()
    info = gate.client.model_info
    if info is None or not info.kv_bytes_per_block:  # a remote backend's context, not a pool
        return Readiness("ready", gate.model_name)
    return Readiness("ready", gate.model_name, info.kv_tokens, info.kv_cache_dtype)


@get("/metrics")
async def metrics(metrics: deps.Metrics, keys: deps.Keys, gate: deps.Gate) -> Response[bytes]:
    metrics.engine_restarts = gate.client.restarts
    metrics.key_quotas = [
        KeyQuota(key.stored_id, key.name, u.used_tokens if u else 0, u.reserved_tokens if u else 0, key.quota_tokens)
        for key, u in await keys.list_with_usage()
    ]
    return Response(metrics.render(), media_type=CONTENT_TYPE)


class Percentiles(Struct):
    p50: float | None
    p95: float | None


class StatsView(Struct):
    state: str
    ready: bool
    reason: str
    draining: bool
    restarts: int  # engine restarts after a crash since the server started
    last_exit: str | None  # why the engine process last died (or failed to start), if it ever did
    in_flight: int
    model: ModelInfo | None
    engine: EngineStats | None
    kv_usage: float | None
    queue_wait_s: Percentiles
    ttft_s: Percentiles
    tpot_s: Percentiles


def _pcts(values: list[float]) -> Percentiles:
    return Percentiles(percentile(values, 0.5), percentile(values, 0.95))


@get("/stats", sync_to_thread=False)
def stats(gate: deps.Gate, inflight: deps.InFlight) -> StatsView:
    ok, why = gate.readiness()
    s = gate.client.stats()
    return StatsView(
        state=gate.client.state,
        ready=ok,
        reason=why,
        draining=gate.draining,
        restarts=gate.client.restarts,
        last_exit=gate.client.last_error,
        in_flight=len(inflight),
        model=gate.client.model_info,
        engine=s,
        kv_usage=s.kv_usage if s else None,
        queue_wait_s=_pcts(s.recent_queue_wait if s else []),
        ttft_s=_pcts(s.recent_ttft if s else []),
        tpot_s=_pcts(s.recent_tpot if s else []),
    )


class SampleView(Struct):
    at: datetime
    running: int
    waiting: int
    kv_usage: float
    memory_kind: str
    memory_total_bytes: int
    memory_free_bytes: int
    weights_bytes: int
    kv_pool_bytes: int
    queue_wait_p95_s: float | None
    tokens_per_s: float


@get("/samples")
async def samples(
    sessions: deps.Sessions,
    minutes: Annotated[int, QueryParameter(ge=1, le=7 * 24 * 60)] = 60,
) -> list[SampleView]:
    since = datetime.now(UTC) - timedelta(minutes=minutes)
    async with sessions() as session:
        rows = await session.scalars(select(EngineSample).where(EngineSample.at >= since).order_by(EngineSample.at))
        return [SampleView(**{f: getattr(r, f) for f in SampleView.__struct_fields__}) for r in rows]


def system_router(metrics_guard: Guard) -> Router:
    """Liveness and readiness for anyone; /metrics behind the metrics guard."""
    return Router(
        path="/", route_handlers=[health, ready, Router("/", route_handlers=[metrics], guards=[metrics_guard])]
    )


def admin_system_router(admin_guard: Guard) -> Router:
    return Router(path="/admin/api", route_handlers=[stats, samples], guards=[admin_guard])
