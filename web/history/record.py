"""One request's history as it happens: what admission knew, what the engine reported, and the row it becomes.

Engine timings are monotonic seconds; they become UTC wall-clock times through the offset taken at arrival.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, cast

from sqlalchemy import Table, bindparam, insert, update

from engine import Timings, Usage
from web.models import RequestRecord


class Status(StrEnum):
    """A history row's status, stored as these strings: queued and running until the request ends, then one of
    TERMINAL."""

    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


TERMINAL = (Status.FINISHED, Status.CANCELLED, Status.REJECTED, Status.FAILED, Status.INTERRUPTED)
STATUSES = tuple(Status)
IN_FLIGHT = (Status.QUEUED, Status.RUNNING)
_requests = cast(Table, RequestRecord.__table__)
INSERT_REQUEST = insert(_requests)
_FINAL_COLUMNS = (
    "status", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "admitted_at",
    "first_token_at", "finished_at", "queue_wait_s", "ttft_s", "tpot_s", "e2e_s", "error", "response_text",
    "backend",
)  # fmt: skip
# Bound names differ from column names: SQLAlchemy reserves a column's own name for its SET value.
FINALIZE_REQUEST = (
    update(_requests)
    .where(_requests.c.id == bindparam("rid"))
    .values({name: bindparam("v_" + name, type_=_requests.c[name].type) for name in _FINAL_COLUMNS})
    .values(reserved_tokens=0)
)
MARK_RUNNING = (
    update(_requests)
    .where(_requests.c.id == bindparam("rid"), _requests.c.status == Status.QUEUED)
    .values(
        status=Status.RUNNING,
        admitted_at=bindparam("admitted", type_=_requests.c.admitted_at.type),
        first_token_at=bindparam("first", type_=_requests.c.first_token_at.type),
        backend=bindparam("serving", type_=_requests.c.backend.type),
    )
)

# A running request's progress, so that a crash leaves a row that charges what was streamed: tokens so far, and
# e2e_s as the time of this checkpoint (the recovery takes it as the row's finish).
CHECKPOINT = (
    update(_requests)
    .where(_requests.c.id == bindparam("rid"), _requests.c.status.in_(IN_FLIGHT))
    .values(
        completion_tokens=bindparam("tokens", type_=_requests.c.completion_tokens.type),
        e2e_s=bindparam("at", type_=_requests.c.e2e_s.type),
    )
)

# The column's width; a longer name (a remote host's, up to 253 characters) is cut to fit, not refused by
# PostgreSQL with the whole row.
BACKEND_MAX = 100


def is_backend_name(text: str) -> bool:
    """Whether `text` could be a backend's name in the history (a filter's value: PostgreSQL refuses a query
    with a NUL in its text)."""
    return 0 < len(text) <= BACKEND_MAX and "\x00" not in text


@dataclass(slots=True)
class RequestLog:
    id: str
    key_id: int | None
    model: str
    endpoint: str
    stream: bool
    arrival_at: datetime  # wall clock, UTC
    arrival_mono: float  # the same instant on time.monotonic(), shared with the engine process
    client_addr: str | None = None
    user: str | None = None
    max_tokens_requested: int | None = None
    max_tokens_applied: int | None = None
    prompt_tokens: int = 0
    reserved_tokens: int = 0
    prompt_text: str | None = None
    status: Status = Status.QUEUED
    finish_reason: str | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0
    scheduled_mono: float | None = None
    first_token_mono: float | None = None
    finished_mono: float | None = None
    error: str | None = None
    response_text: str | None = None
    backend: str | None = None  # the backend that serves it, set when the router picks one (a retry: the last)
    user_id: int | None = None  # the person whose quota it counts against (their key or session)
    end_user_id: int | None = None  # else the front end's end user whose quota it counts against

    def wall(self, mono: float | None) -> datetime | None:
        return None if mono is None else self.arrival_at + timedelta(seconds=mono - self.arrival_mono)

    def apply_engine_result(self, usage: Usage | None, timings: Timings | None) -> None:
        """Take the engine's own counts and timestamps, which are more exact than what the server observed."""
        if usage is not None:
            self.prompt_tokens = usage.prompt_tokens
            self.completion_tokens = usage.completion_tokens
            self.cached_tokens = usage.cached_prompt_tokens
        if timings is not None:
            self.scheduled_mono = timings.scheduled
            self.first_token_mono = timings.first_token or self.first_token_mono
            self.finished_mono = timings.finished or self.finished_mono

    def assume_scheduled_by_first_token(self) -> None:
        """A backend that never said when it scheduled the request (a remote one, or output cut short before any
        timings): the first token bounds it from above, so queue wait is at most overstated by the prefill."""
        if self.scheduled_mono is None and self.first_token_mono is not None:
            self.scheduled_mono = self.first_token_mono

    @property
    def backend_name(self) -> str | None:
        """The backend as its column holds it."""
        return None if self.backend is None else self.backend[:BACKEND_MAX]

    @property
    def charged_tokens(self) -> int:
        """Prompt tokens count once the engine produced output for the request; generated tokens always."""
        prompt = self.prompt_tokens if self.first_token_mono is not None or self.completion_tokens else 0
        return prompt + self.completion_tokens

    def queued_values(self, finished_at: datetime | None = None) -> dict[str, Any]:
        """The row as admission writes it (INSERT_REQUEST's parameters)."""
        return {
            "id": self.id,
            "key_id": self.key_id,
            "user_id": self.user_id,
            "end_user_id": self.end_user_id,
            "model": self.model,
            "endpoint": self.endpoint,
            "stream": self.stream,
            "status": self.status,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": 0,
            "cached_tokens": 0,
            "max_tokens_requested": self.max_tokens_requested,
            "max_tokens_applied": self.max_tokens_applied,
            "reserved_tokens": self.reserved_tokens,
            "arrival_at": self.arrival_at,
            "finished_at": finished_at,
            "client_addr": self.client_addr,
            "user": self.user,
            "error": self.error,
            "prompt_text": self.prompt_text,
            "backend": self.backend_name,
        }

    def final_values(self) -> dict[str, Any]:
        """FINALIZE_REQUEST's parameters: the columns written when the request ends, with derived latencies."""
        first, finished, scheduled = self.first_token_mono, self.finished_mono, self.scheduled_mono
        n = self.completion_tokens
        values = {
            "status": self.status,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": n,
            "cached_tokens": self.cached_tokens,
            "admitted_at": self.wall(scheduled),
            "first_token_at": self.wall(first),
            "finished_at": self.wall(finished),
            "queue_wait_s": None if scheduled is None else scheduled - self.arrival_mono,
            "ttft_s": None if first is None else first - self.arrival_mono,
            "tpot_s": None if first is None or finished is None or n < 2 else (finished - first) / (n - 1),
            "e2e_s": None if finished is None else finished - self.arrival_mono,
            "error": self.error,
            "response_text": self.response_text,
            "backend": self.backend_name,
        }
        return {"v_" + k: v for k, v in values.items()} | {"rid": self.id}
