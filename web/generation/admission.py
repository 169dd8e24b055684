"""Admission of an authenticated request: readiness, input preparation, max_tokens policy, the per-key
concurrency cap, and the atomic quota reservation that writes its history row. Also the drain at shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from math import ceil
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from engine import EngineError, SamplingParams
from web.errors import (
    AppError,
    ContextLengthExceeded,
    InsufficientQuota,
    InvalidRequest,
    ServiceUnavailable,
    StorageUnavailable,
    from_engine_error,
)
from web.generation.run import Generation
from web.history.record import INSERT_REQUEST, RequestLog
from web.history.writer import describe
from web.keys import quota
from web.keys.service import KeyInfo, next_period_start, period_start
from web.models import utcnow

if TYPE_CHECKING:
    from web.state import Services

logger = logging.getLogger("web.generation")
B = TypeVar("B")
SQLITE_INT_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request turned into engine terms; `sampling` holds SamplingParams fields except max_tokens."""

    prompt_ids: list[int]
    max_tokens: int | None
    sampling: dict[str, Any] = field(default_factory=dict)
    prompt_text: str | None = None


def apply_max_tokens(
    requested: int | None, key_cap: int | None, default: int, prompt_tokens: int, max_model_len: int
) -> int:
    """The max_tokens a request runs with: what it asked (within its key's cap and the context), else the
    key's cap or the server default, shortened to what the context leaves."""
    room = max_model_len - prompt_tokens
    if room < 1:
        raise ContextLengthExceeded(
            f"the prompt has {prompt_tokens} tokens; this model's context is {max_model_len} tokens, "
            "which leaves no room for a completion",
            param="messages",
        )
    if requested is None:
        return min(key_cap if key_cap is not None else default, room)
    if requested < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, not {requested}", param="max_tokens")
    if key_cap is not None and requested > key_cap:
        raise InvalidRequest(
            f"max_tokens {requested} is above this API key's limit of {key_cap} tokens per request",
            param="max_tokens",
        )
    if requested > room:
        raise ContextLengthExceeded(
            f"this model's maximum context length is {max_model_len} tokens; the request has {prompt_tokens} "
            f"prompt tokens and asks for {requested} completion tokens ({prompt_tokens + requested} in total)",
            param="max_tokens",
        )
    return requested


async def admit(
    services: Services,
    key: KeyInfo,
    log: RequestLog,
    decode: Callable[[], Awaitable[B]],
    prepare: Callable[[B], Awaitable[Prepared]],
) -> tuple[B, Generation]:
    """Decode, prepare and admit the request, or raise an AppError; either way it gets its history row."""
    acquired = False
    try:
        body = await decode()
        ready, why = services.readiness()
        if not ready:
            raise ServiceUnavailable(f"not ready: {why}", code="not_ready")
        prepared = await prepare(body)
        log.prompt_text = prepared.prompt_text if services.config.store_text else None
        log.prompt_tokens = len(prepared.prompt_ids)
        log.max_tokens_requested = _storable(prepared.max_tokens)
        info = services.client.model_info
        assert info is not None  # ready implies a loaded model
        max_tokens = apply_max_tokens(
            prepared.max_tokens,
            key.max_tokens_per_request,
            services.config.default_max_tokens,
            log.prompt_tokens,
            info.max_model_len,
        )
        log.max_tokens_applied = max_tokens
        params = SamplingParams(max_tokens=max_tokens, **prepared.sampling)
        services.limiter.acquire(key.id, key.max_concurrent)
        acquired = True
        log.reserved_tokens = log.prompt_tokens + max_tokens
        if not await _reserve(services, key, log):
            raise await _quota_error(services, key, log)
    except BaseException as exc:
        # Nothing was committed (the reservation and the queued row are one transaction): give the slot back.
        if acquired:
            services.limiter.release(key.id)
        if not isinstance(exc, Exception):  # cancelled: the caller is gone, and so is the chance to say why
            raise
        error = _refusal(services, log, exc)
        log.error, log.reserved_tokens = error.message, 0
        written = services.history.record_rejected(log)
        if not (isinstance(error, StorageUnavailable) or services.writer.refusing):
            await written  # the row is there once the client has its answer, unless storage is down (then queued)
        if error is exc:
            raise
        raise error from None
    services.writer.retry_now()  # the database just took a write: what it refused before may go through now

    def on_close(generation: Generation) -> None:
        services.limiter.release(key.id)
        services.live.pop(generation.request_id, None)

    stream = services.client.generate(prepared.prompt_ids, params, request_id=log.id, arrival_time=log.arrival_mono)
    generation = Generation(services, log, stream, on_close)
    services.live[log.id] = generation
    return body, generation


def _refusal(services: Services, log: RequestLog, exc: Exception) -> AppError:
    """Why the request is refused, as the client is told; counted in /metrics."""
    if isinstance(exc, AppError):
        error = exc
    elif isinstance(exc, EngineError):
        error = from_engine_error(exc)
    elif isinstance(exc, SQLAlchemyError):
        logger.error("the database refused request %s at admission: %s", log.id, describe(exc))
        services.metrics.observe_db_error("admission")
        error = StorageUnavailable("the request history cannot be written right now; retry shortly")
    else:
        logger.exception("request %s failed at admission", log.id, exc_info=exc)
        error = AppError("internal server error")
    services.metrics.observe_rejected(error.code or error.type)
    return error


def _storable(max_tokens: int | None) -> int | None:
    """max_tokens as asked, within SQLite's INTEGER: a refusal of 10**30 keeps its row."""
    return None if max_tokens is None else max(-SQLITE_INT_MAX - 1, min(max_tokens, SQLITE_INT_MAX))


async def _reserve(services: Services, key: KeyInfo, log: RequestLog) -> bool:
    """Reserve prompt + max_tokens and write the queued row in one short transaction (Core statements: the
    request path pays for no ORM bookkeeping)."""
    now = utcnow()
    start = period_start(key.quota_period, now, key.created_at)
    async with services.db.begin() as conn:
        if not await quota.reserve(conn, key.id, log.reserved_tokens, start, now):
            return False
        await conn.execute(INSERT_REQUEST, log.queued_values())
    return True


async def _quota_error(services: Services, key: KeyInfo, log: RequestLog) -> InsufficientQuota:
    remaining = await services.keys.remaining(key)
    period = key.quota_period
    now = utcnow()
    resets = next_period_start(period, period_start(period, now, key.created_at))
    when = f"; it resets at {resets:%Y-%m-%d %H:%M} UTC" if resets is not None else ""
    scope = f"this {period}" if period != "none" else "in total"
    # Retry-After only where waiting helps: a quota of period "none" never resets.
    headers = {"Retry-After": str(max(1, ceil((resets - now).total_seconds())))} if resets is not None else {}
    return InsufficientQuota(
        f"insufficient quota: this request needs up to {log.reserved_tokens} tokens (prompt "
        f"{log.prompt_tokens} + max_tokens {log.max_tokens_applied}) but this API key has {remaining} of "
        f"{key.quota_tokens} tokens left {scope}{when}. Lower max_tokens or wait for the reset.",
        headers=headers,
    )


async def drain(services: Services, timeout: float) -> None:
    """Stop admitting, let requests in flight finish for up to `timeout` s, then abort and finalize the rest."""
    services.draining = True
    deadline = time.monotonic() + timeout
    while services.live and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for generation in list(services.live.values()):
        await generation.abort("the server is shutting down and the drain timeout passed")
    grace = time.monotonic() + 5.0
    while services.live and time.monotonic() < grace:
        await asyncio.sleep(0.05)
    for generation in list(services.live.values()):
        await generation.close("interrupted", "the server shut down while the request was in flight")
    await services.writer.flush(timeout=5.0)  # the writer's stop() retries what the database still refuses
