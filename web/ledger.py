"""The ledger: every request's history row and its key's quota, kept together. It alone reserves quota (with
the row's insert, one transaction), settles it to the tokens charged (with the row's final write, one
transaction), and releases what a crash left behind, so that each accepted request ends in exactly one terminal
row and the quota charged equals the usage recorded.

The quota statements are built once with bind parameters and run as Core statements: building SQLAlchemy
expressions and ORM bookkeeping per request cost more CPU than the database work itself."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from math import ceil
from typing import Any

import msgspec
from sqlalchemy import Update, bindparam, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from engine import EngineError
from web.errors import AppError, InsufficientQuota, StorageUnavailable, from_engine_error
from web.generation.disconnect import ClientDisconnected
from web.generation.policy import Prepared
from web.history.record import CHECKPOINT, FINALIZE_REQUEST, IN_FLIGHT, INSERT_REQUEST, MARK_RUNNING, RequestLog, Status
from web.history.writer import BatchWriter, Write, describe
from web.keys.front_end import FrontEnds
from web.keys.info import KeyInfo, holder_of
from web.keys.limiter import ConcurrencyLimiter
from web.keys.periods import next_period_start, period_start
from web.keys.service import KeyService
from web.models import RequestRecord, UTCDateTime, utcnow
from web.quota import (
    NO_QUOTA,
    RESERVE,
    RESERVE_END_USER,
    RESERVE_PERSON,
    SETTLE,
    SETTLE_END_USER,
    SETTLE_PERSON,
)
from web.system.metrics import Metrics

logger = logging.getLogger("web.ledger")
LEFTOVERS = select(
    RequestRecord.id,
    RequestRecord.key_id,
    RequestRecord.user_id,
    RequestRecord.end_user_id,
    RequestRecord.prompt_tokens,
    RequestRecord.completion_tokens,
    RequestRecord.arrival_at,
    RequestRecord.first_token_at,
    RequestRecord.e2e_s,
    RequestRecord.reserved_tokens,
).where(
    RequestRecord.status.in_(IN_FLIGHT),
    # Only this gateway's: another one sharing the database may be serving its own right now.
    or_(RequestRecord.gateway == bindparam("gateway"), RequestRecord.gateway.is_(None)),
)
INTERRUPT = (
    update(RequestRecord)
    .where(RequestRecord.id == bindparam("rid"))
    .values(
        status=Status.INTERRUPTED,
        reserved_tokens=0,
        finished_at=bindparam("finished", type_=UTCDateTime()),
        error="the server stopped while the request was in flight",
    )
)
# Seconds between a running request's checkpoints: a crash leaves at most this much of its output uncharged.
CHECKPOINT_S = 1.0
# Reservations racing for a quota's last tokens: each try either reserves or learns how much is left.
RESERVE_TRIES = 3


class Ledger:
    def __init__(
        self,
        db: AsyncEngine,
        writer: BatchWriter,
        keys: KeyService,
        limiter: ConcurrencyLimiter,
        metrics: Metrics,
        store_text: bool = False,
        gateway: str | None = None,
        front_ends: FrontEnds | None = None,
    ) -> None:
        self.db = db
        self.gateway = gateway  # written into each row it admits; its recovery takes only those
        self.writer = writer
        self.keys = keys
        self.limiter = limiter
        self.metrics = metrics
        self.store_text = store_text
        self.front_ends = front_ends

    # -- start-up ---------------------------------------------------------------------------------------

    async def recover(self) -> int:
        """Rows a crash left queued or running can never finish: each ends interrupted at its last checkpoint,
        its key charged what the checkpoint counted (the tokens had reached the client) and the row's reservation
        released. Rows of other gateways on the same database are theirs. Returns how many were interrupted."""
        async with self.db.begin() as conn:
            leftovers = (await conn.execute(LEFTOVERS, {"gateway": self.gateway})).all()
            for row in leftovers:
                last = row.arrival_at + timedelta(seconds=row.e2e_s) if row.e2e_s is not None else None
                finished = last or row.first_token_at or row.arrival_at
                await conn.execute(INTERRUPT, {"rid": row.id, "finished": finished})
                charged = row.prompt_tokens + row.completion_tokens if row.completion_tokens else 0
                counted = _settlement(row.key_id, row.user_id, row.end_user_id, row.reserved_tokens, charged)
                if counted is not None:
                    await conn.execute(*counted)
        return len(leftovers)

    # -- who pays -------------------------------------------------------------------------------------------

    async def payer(self, log: RequestLog, key: KeyInfo, headers: Mapping[str, str]) -> KeyInfo:
        """Whose request it is, once its body is read (log.user holds the body's user): the key's, or on a
        trusted front-end key the end user or person it names (web/keys/front_end.py), noted on the row."""
        if self.front_ends is None:
            return key
        key = await self.front_ends.resolve(key, headers, log.user)
        log.user_id, log.end_user_id = key.user_id, key.end_user_id
        if key.end_user is not None:
            log.user = key.end_user
        return key

    # -- admission --------------------------------------------------------------------------------------

    @asynccontextmanager
    async def refusals(self, log: RequestLog) -> AsyncIterator[None]:
        """Whatever refuses the request inside this block gets it a `rejected` row and leaves as an AppError; a
        client gone before its body was read gets a `cancelled` row (ClientDisconnected goes on up)."""
        try:
            yield
        except ClientDisconnected:
            log.status, log.reserved_tokens = Status.CANCELLED, 0
            log.error = "the client disconnected before it was read"
            self.metrics.observe_request(log)
            await self._write_refused(log)
            raise
        except Exception as exc:
            error = self._refusal(log, exc)
            log.status, log.error, log.reserved_tokens = Status.REJECTED, error.message, 0
            await self._write_refused(log, storage_down=isinstance(error, StorageUnavailable))
            if error is exc:
                raise
            raise error from None

    async def _write_refused(self, log: RequestLog, storage_down: bool = False) -> None:
        """The row of a request that never ran, as it is; there once the client has its answer, unless storage is
        down (then it is queued until the database takes it)."""
        written = self.writer.submit(_insert(self._row(log, finished_at=utcnow())))
        if not (storage_down or self.writer.refusing):
            await written

    async def admit(self, log: RequestLog, key: KeyInfo, prepared: Prepared) -> Prepared:
        """Take one of the key's concurrent slots, reserve prompt + n x max_tokens of its quota (n choices) and
        write the queued row, or raise (nothing is left taken then). max_tokens is an upper bound: where the quota
        has less left, the request runs with what is left (and ends with finish_reason "length"); only a prompt
        that leaves no token is refused. Returns the request as admitted."""
        return await self.reserve(log, key, self.hold(log, key, prepared))

    def hold(self, log: RequestLog, key: KeyInfo, prepared: Prepared) -> Prepared:
        """admit's first step, which waits for nothing: the row's counts and one of the key's concurrent slots
        (or a 429). Returns the request as it runs when the quota cuts nothing: under the key's tenant."""
        log.prompt_text = prepared.prompt_text if self.store_text else None
        log.prompt_tokens = len(prepared.prompt_ids)
        log.max_tokens_requested = prepared.requested_max_tokens
        self.limiter.acquire(key.holder, key.max_concurrent)
        return replace(prepared, tenant=key.tenant)

    async def reserve(self, log: RequestLog, key: KeyInfo, held: Prepared) -> Prepared:
        """admit's second step, after hold: the quota reserved and the queued row written in one transaction, or
        raise with the slot given back. Returns the request as admitted (max_tokens cut to what is left)."""
        try:
            granted = await self._reserve_up_to(key, log, held.params.max_tokens, held.n)
        except BaseException:
            self.limiter.release(key.holder)
            raise
        self.writer.retry_now()  # the database just took a write: what it refused before may go through now
        if granted == held.params.max_tokens:
            return held
        return replace(held, params=msgspec.structs.replace(held.params, max_tokens=granted))

    async def admit_tokens(self, log: RequestLog, key: KeyInfo, tokens: int, prompt_text: str | None) -> None:
        """Admit a request that generates nothing (embeddings): one of the key's concurrent slots, `tokens` (an
        upper bound of its input) reserved and the queued row written in one transaction, or raise with nothing
        left taken. settle() charges the tokens the row then counts."""
        log.prompt_text = prompt_text if self.store_text else None
        log.prompt_tokens = log.reserved_tokens = tokens
        log.max_tokens_applied = 0
        self.limiter.acquire(key.holder, key.max_concurrent)
        try:
            if not await self._reserve(key, log):
                raise await self._quota_error(key, log)
        except BaseException:
            self.limiter.release(key.holder)
            raise
        self.writer.retry_now()

    async def _reserve_up_to(self, key: KeyInfo, log: RequestLog, max_tokens: int, n: int) -> int:
        """Reserve for n choices of max_tokens, else of what the quota has left shared among them, else raise
        InsufficientQuota."""
        wanted = max_tokens
        for _ in range(RESERVE_TRIES):
            log.max_tokens_applied, log.reserved_tokens = wanted, log.prompt_tokens + n * wanted
            if await self._reserve(key, log):
                return wanted
            room = (await self.keys.remaining(key) or 0) - log.prompt_tokens
            if room < n:  # the prompt leaves less than a token for each choice
                break
            wanted = min(max_tokens, room // n)
        log.max_tokens_applied, log.reserved_tokens = max_tokens, log.prompt_tokens + n * max_tokens
        raise await self._quota_error(key, log)

    async def _reserve(self, key: KeyInfo, log: RequestLog) -> bool:
        now = utcnow()
        start = period_start(key.quota_period, now, key.period_anchor)
        values = {"kid": key.id, "n": log.reserved_tokens, "start": start, "now": now}
        quota = NO_QUOTA if key.quota_tokens is None else key.quota_tokens
        if key.user_id is not None:
            statement, values = RESERVE_PERSON, {**values, "kid": key.user_id, "quota": quota}
        elif key.end_user_id is not None:
            statement, values = RESERVE_END_USER, {**values, "kid": key.end_user_id, "quota": quota}
        else:
            statement = RESERVE
        async with self.db.begin() as conn:
            reserved = await conn.execute(statement, values)
            if not reserved.rowcount:
                return False
            await conn.execute(INSERT_REQUEST, self._row(log))
        return True

    def _row(self, log: RequestLog, **values: Any) -> dict[str, Any]:
        return {**log.queued_values(**values), "gateway": self.gateway}

    async def _quota_error(self, key: KeyInfo, log: RequestLog) -> InsufficientQuota:
        remaining = await self.keys.remaining(key)
        period = key.quota_period
        now = utcnow()
        resets = next_period_start(period, period_start(period, now, key.period_anchor))
        when = f"; it resets at {resets:%Y-%m-%d %H:%M} UTC" if resets is not None else ""
        scope = f"this {period}" if period != "none" else "in total"
        # Retry-After only where waiting helps: a quota of period "none" never resets.
        headers = {"Retry-After": str(max(1, ceil((resets - now).total_seconds())))} if resets is not None else {}
        # Waiting helps only where the quota resets; otherwise only the admin can (`appliance keys set`).
        advice = "Wait for the reset or ask" if resets is not None else "Ask"
        # An embedding request (admit_tokens) generates nothing: its input is what does not fit.
        whose = "this API key" if key.end_user is None else f"end user {key.end_user!r}"
        short = "which leaves no room for a completion" if log.max_tokens_applied else "too few for its input"
        return InsufficientQuota(
            f"insufficient quota: this request's prompt takes {log.prompt_tokens} tokens and {whose} has "
            f"{remaining} of {key.quota_tokens} tokens left {scope}{when}, {short}. "
            f"{advice} the administrator for more quota.",
            headers=headers,
        )

    def _refusal(self, log: RequestLog, exc: Exception) -> AppError:
        """Why the request is refused, as the client is told; counted in /metrics."""
        if isinstance(exc, AppError):
            error = exc
        elif isinstance(exc, EngineError):
            error = from_engine_error(exc)
        elif isinstance(exc, SQLAlchemyError | OSError):  # asyncpg raises a refused connect as it is
            logger.error("the database refused request %s at admission: %s", log.id, describe(exc))
            self.metrics.observe_db_error("admission")
            error = StorageUnavailable("the request history cannot be written right now; retry shortly")
        else:
            logger.exception("request %s failed at admission", log.id, exc_info=exc)
            error = AppError("internal server error")
        self.metrics.observe_rejected(error.code or error.type)
        return error

    # -- in flight and at the end ---------------------------------------------------------------------

    def mark_running(self, log: RequestLog) -> None:
        params = {
            "rid": log.id,
            "admitted": log.wall(log.scheduled_mono),
            "first": log.wall(log.first_token_mono),
            "serving": log.backend_name,
        }

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(MARK_RUNNING, params)

        self.writer.submit(write)

    def checkpoint(self, log: RequestLog, now_mono: float) -> None:
        """A running request's progress so far (not awaited: the writer batches it with everything else)."""
        params = {"rid": log.id, "tokens": log.completion_tokens, "at": now_mono - log.arrival_mono}

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(CHECKPOINT, params)

        self.writer.submit(write)

    async def settle(self, log: RequestLog) -> None:
        """The request's end, exactly once: the terminal row and the key's reservation replaced by the tokens
        charged, in one transaction (retried until the database takes it; while it refuses writes, the caller
        is not held up), and the key's slot given back."""
        if log.key_id is not None or log.user_id is not None:
            self.limiter.release(holder_of(log.key_id, log.user_id, log.end_user_id))
        self.metrics.observe_request(log)
        values = log.final_values()
        counted = _settlement(log.key_id, log.user_id, log.end_user_id, log.reserved_tokens, log.charged_tokens)

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(FINALIZE_REQUEST, values)
            if counted is not None:
                await conn.execute(*counted)

        settled = self.writer.submit(write)
        if not self.writer.refusing:  # else it is queued until the database takes it
            await settled

    async def flush(self, timeout: float) -> bool:
        """Wait for every write submitted so far, for up to `timeout` s; whether they all went through."""
        return await self.writer.flush(timeout=timeout)


def _settlement(
    key_id: int | None, user_id: int | None, end_user_id: int | None, reserved: int, charged: int
) -> tuple[Update, dict[str, int]] | None:
    """The statement that replaces a request's reservation by its charge: on its person's quota where it has one
    (their key or session), else on its front end's end user's, else on its key's."""
    if user_id is not None:
        return SETTLE_PERSON, {"kid": user_id, "reserved": reserved, "charged": charged}
    if end_user_id is not None:
        return SETTLE_END_USER, {"kid": end_user_id, "reserved": reserved, "charged": charged}
    if key_id is not None:
        return SETTLE, {"kid": key_id, "reserved": reserved, "charged": charged}
    return None


def _insert(values: dict[str, Any]) -> Write:
    async def write(conn: AsyncConnection) -> None:
        await conn.execute(INSERT_REQUEST, values)

    return write
