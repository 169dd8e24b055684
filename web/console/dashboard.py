"""The console's dashboard at /admin: the live panel (engine state, memory headroom, counters, keys, backends),
the charts over the last hour or day, and the diagnosis (per backend where some are remote); each live piece is a
partial htmx polls and swaps by its element id."""

import time
from typing import Any

from litestar import get
from litestar.params import FromQuery
from litestar.plugins.htmx import HTMXRequest, HTMXTemplate

from web import deps
from web.console.auth import Console, page_context
from web.console.backend_diagnosis import diagnose_backends, has_remotes
from web.console.capacity import capacity, typical_chat_tokens
from web.console.charts import Chart, line_chart
from web.console.diagnosis import diagnose
from web.console.live import engine_state, live_view
from web.console.render import fmt_bytes, fmt_duration, fmt_num, fmt_pct, render, wanted_partial
from web.console.samples import WINDOWS, Bucket, Window, buckets
from web.console.tenants import key_shares, seat_holder
from web.keys.info import person_holder
from web.keys.service import KeyService
from web.people.accounts import Accounts

PARTIALS = ("engine-state", "memory", "engine-counters", "key-shares", "backends", "diagnosis", "charts")


def _aligned(rows: list[Bucket], window: Window) -> tuple[list[float], list[Bucket | None]]:
    """Bucket mid-times with a None wherever sampling stopped, so lines break across gaps."""
    times: list[float] = []
    points: list[Bucket | None] = []
    for row in rows:
        if points and row.at - times[-1] > 1.5 * window.bucket_s + window.bucket_s / 2:
            times.append(row.at)
            points.append(None)
        times.append(row.at + window.bucket_s / 2)
        points.append(row)
    return times, points


def build_charts(rows: list[Bucket], window: Window, kind: str, now: float) -> list[Chart]:
    times, points = _aligned(rows, window)
    start = now - window.seconds

    def values(pick: Any) -> list[float | None]:
        return [None if b is None else pick(b) for b in points]

    return [
        line_chart(
            "queue-wait", "Queue wait p95", times,
            [("wait", "queue wait p95", values(lambda b: b.queue_wait_p95_s))], start, now, fmt_duration,
        ),
        line_chart(
            "kv", "KV cache in use", times,
            [("kv", "KV in use", values(lambda b: b.kv_usage))], start, now, fmt_pct, fixed_top=1.0,
        ),
        line_chart(
            "headroom", f"{kind} headroom (free of total)", times,
            [("free", "free", values(lambda b: b.memory_free_bytes))], start, now, fmt_bytes,
            fixed_top=max((b.memory_total_bytes for b in rows), default=None),
        ),
        line_chart(
            "throughput", "Throughput (tokens/s)", times,
            [("tps", "tokens/s", values(lambda b: b.tokens_per_s))], start, now, lambda v: fmt_num(v) + " tok/s",
        ),
        line_chart(
            "load", "Running vs waiting", times,
            [
                ("running", "running", values(lambda b: b.running)),
                ("waiting", "waiting", values(lambda b: b.waiting)),
            ],
            start, now, fmt_num,
        ),
    ]  # fmt: skip


async def tenant_names(keys: KeyService, accounts: Accounts) -> dict[str, str]:
    """Fair share's tenants by name: a key's id, or a person's user:<id> (web/keys/info.py KeyInfo.tenant)."""
    people = {person_holder(user_id): name for user_id, name in (await accounts.names()).items()}
    return {str(key_id): name for key_id, name in (await keys.names()).items()} | people


@get("/")
async def dashboard(
    request: HTMXRequest,
    console: Console,
    gate: deps.Gate,
    inflight: deps.InFlight,
    sessions: deps.Sessions,
    keys: deps.Keys,
    accounts: deps.Accounts,
    router: deps.Router,
    window: FromQuery[str] = "1h",
) -> HTMXTemplate:
    partial = wanted_partial(request, PARTIALS)
    chosen = WINDOWS.get(window, WINDOWS["1h"])
    state = engine_state(gate)
    context = page_context(request, "dashboard", state=state, window=chosen, windows=list(WINDOWS.values()))
    if partial != "engine-state":
        owns_throughput = partial in (None, "engine-counters")
        context["live"] = live_view(gate.client.stats(), len(inflight), console.throughput if owns_throughput else None)
    if partial in (None, "engine-counters"):
        stats = context["live"].stats
        context["capacity"] = capacity(stats, await typical_chat_tokens(sessions) if stats else None)
    if partial in (None, "key-shares", "diagnosis", "charts"):
        stats = context["live"].stats
        context["shares"] = key_shares(stats, await tenant_names(keys, accounts) if stats and stats.tenants else {})
    if partial in (None, "backends", "diagnosis", "charts"):
        context["backends"] = router.statuses()
    if partial in (None, "charts", "diagnosis"):
        rows, kind = await buckets(sessions, chosen)
        live = context["live"]
        kind = kind or live.memory_kind
        context["charts"] = build_charts(rows, chosen, kind, time.time())
        waiting = live.stats.waiting if live.stats else 0
        holder = seat_holder(context["shares"])
        kv_dtype = live.stats.kv_cache_dtype if live.stats else None
        statuses = context["backends"]
        context["diagnosis"] = (
            diagnose_backends(statuses, kind)
            if has_remotes(statuses)
            else diagnose(state.label, state.reason, waiting, live.kv_usage, kind, rows, chosen.label, holder, kv_dtype)
        )
    return render("console/dashboard.html", context, partial=partial)
