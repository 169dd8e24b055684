"""Admin JSON API for the request history: filtered (key, person, status, backend, time), paginated list and one
request's detail, each row naming its person."""

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated

import msgspec
from litestar import Router, get
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.types import Guard
from msgspec import Struct

from web import deps
from web.db import SQLITE_INT_MAX, SQLITE_INT_MIN
from web.errors import InvalidRequest
from web.history.record import BACKEND_MAX, STATUSES, is_backend_name
from web.history.service import HistoryFilter
from web.models import RequestRecord

MAX_PAGE = 500


class RequestView(Struct):
    id: str
    key_id: int | None
    user_id: int | None  # the person it counted against: their session, or one of their personal keys
    username: str | None  # that person's user name (None for a service's key, or a person since deleted)
    end_user_id: int | None  # else the front end's end user it counted against (the key's end-users list)
    model: str
    endpoint: str
    stream: bool
    status: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    max_tokens_requested: int | None
    max_tokens_applied: int | None
    arrival_at: datetime
    admitted_at: datetime | None
    first_token_at: datetime | None
    finished_at: datetime | None
    queue_wait_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    client_addr: str | None
    backend: str | None
    user: str | None
    error: str | None
    prompt_text: str | None
    response_text: str | None


class RequestPage(Struct):
    data: list[RequestView]
    total: int
    limit: int
    offset: int


_STORED = tuple(name for name in RequestView.__struct_fields__ if name != "username")


def request_view(row: RequestRecord, usernames: Mapping[int, str]) -> RequestView:
    """The row as the API shows it, its person named from `usernames` (Accounts.names)."""
    username = usernames.get(row.user_id) if row.user_id is not None else None
    return RequestView(username=username, **{name: getattr(row, name) for name in _STORED})


def utc_time(raw: str | None, name: str) -> datetime | None:
    """An RFC 3339 date-time with its zone, or Unix seconds, in UTC. Read here rather than by Litestar: msgspec
    raises a plain ValueError (not a validation error) for a timestamp in the year 10000."""
    if raw is None:
        return None
    try:
        value = msgspec.convert(raw, datetime, strict=False)
    except (msgspec.ValidationError, ValueError):
        raise InvalidRequest(
            f"{name} is neither a date-time (e.g. 2026-01-31T12:00:00Z) nor Unix seconds in the years 1 to 9999",
            param=name,
        ) from None
    if value.tzinfo is None:
        raise InvalidRequest(f"{name} needs a time zone (e.g. 2026-01-31T12:00:00Z)", param=name)
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is in year 0 in UTC, 9999-12-31T23:59-01:00 in year 10000
        raise InvalidRequest(f"{name} is outside the years 1 to 9999 in UTC", param=name) from None


@get("/")
async def list_requests(
    history: deps.History,
    accounts: deps.Accounts,
    key_id: Annotated[int | None, QueryParameter(ge=SQLITE_INT_MIN, le=SQLITE_INT_MAX)] = None,
    user_id: Annotated[int | None, QueryParameter(ge=SQLITE_INT_MIN, le=SQLITE_INT_MAX)] = None,
    end_user_id: Annotated[int | None, QueryParameter(ge=SQLITE_INT_MIN, le=SQLITE_INT_MAX)] = None,
    status: FromQuery[str | None] = None,
    since: FromQuery[str | None] = None,
    until: FromQuery[str | None] = None,
    backend: FromQuery[str | None] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)] = 50,
    offset: Annotated[int, QueryParameter(ge=0, le=SQLITE_INT_MAX)] = 0,
) -> RequestPage:
    if status is not None and status not in STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(STATUSES)}", param="status")
    if backend is not None and not is_backend_name(backend):
        raise InvalidRequest(f"backend must be a backend's name of 1 to {BACKEND_MAX} characters", param="backend")
    when = utc_time(since, "since"), utc_time(until, "until")
    filters = HistoryFilter(key_id, status, *when, backend, user_id, end_user_id)
    rows, total = await history.list(filters, limit, offset)
    usernames = await accounts.names()
    return RequestPage([request_view(r, usernames) for r in rows], total, limit, offset)


@get("/{request_id:str}")
async def get_request(history: deps.History, accounts: deps.Accounts, request_id: FromPath[str]) -> RequestView:
    return request_view(await history.get(request_id), await accounts.names())


def history_router(admin_guard: Guard) -> Router:
    return Router(path="/admin/api/requests", route_handlers=[list_requests, get_request], guards=[admin_guard])
