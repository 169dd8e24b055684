"""The console's request history: filters (key, person, status, backend, time range), pagination, one request's
detail, and the same filtered rows as CSV; each row names who sent it (the person, or the key). Queries go through
HistoryService."""

import csv
import io
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from litestar import Response, get
from litestar.params import FromPath, FromQuery
from litestar.plugins.htmx import HTMXRequest
from litestar.response import Stream

from web import deps
from web.console.auth import page_context
from web.console.render import render, wanted_partial
from web.db import SQLITE_INT_MAX, SQLITE_INT_MIN
from web.errors import InvalidRequest
from web.history.record import BACKEND_MAX, STATUSES, is_backend_name
from web.history.routes import RequestView, request_view
from web.history.service import HistoryFilter
from web.models import utcnow

PAGE_SIZE = 50
CSV_CHUNK = 500
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True, slots=True)
class Filters:
    """The filter form as typed (strings, kept for re-display) and what it means for the query."""

    key: str
    person: str
    status: str
    backend: str
    since: str
    until: str
    query: HistoryFilter
    errors: list[str]
    end_user: str = ""  # a front end's end user's id (from a key's end-users page)

    def url_params(self, **extra: Any) -> str:
        values = {
            "key": self.key,
            "person": self.person,
            "status": self.status,
            "backend": self.backend,
            "since": self.since,
            "until": self.until,
            "end_user": self.end_user,
            **extra,
        }
        return urlencode({k: v for k, v in values.items() if v not in ("", None, 0)})


def _when(raw: str, label: str, errors: list[str]) -> datetime | None:
    """A datetime-local value ("2026-01-31T12:00"), read as UTC; the form says so."""
    if not raw.strip():
        return None
    try:
        value = datetime.fromisoformat(raw.strip())
    except ValueError:
        errors.append(f"{label} is not a date and time: {raw!r}")
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:  # a time on the calendar's first or last day, in a zone that moves it off the calendar
        errors.append(f"{label} is outside the years 1 to 9999 in UTC: {raw!r}")
        return None


def _id(raw: str, label: str, errors: list[str]) -> int | None:
    """A key's or a person's id from the form (a select's value); anything else is an unknown one."""
    if not raw.strip():
        return None
    found = None
    with suppress(ValueError):
        found = int(raw)
    if found is None or not SQLITE_INT_MIN <= found <= SQLITE_INT_MAX:
        errors.append(f"unknown {label} {raw[:64]!r}")
        return None
    return found


def parse_filters(
    key: str, status: str, backend: str, since: str, until: str, person: str = "", end_user: str = ""
) -> Filters:
    errors: list[str] = []
    key_id, user_id = _id(key, "key", errors), _id(person, "person", errors)
    end_user_id = _id(end_user, "end user", errors)
    if status and status not in STATUSES:
        errors.append(f"unknown status {status!r}")
        status = ""
    if backend and not is_backend_name(backend):
        errors.append(f"unknown backend {backend[:BACKEND_MAX]!r}")
        backend = ""
    since_at, until_at = _when(since, "From", errors), _when(until, "Until", errors)
    query = HistoryFilter(key_id, status or None, since_at, until_at, backend or None, user_id, end_user_id)
    return Filters(key, person, status, backend, since, until, query, errors, end_user)


@get("/history")
async def history_page(
    request: HTMXRequest,
    history: deps.History,
    keys: deps.Keys,
    accounts: deps.Accounts,
    key: FromQuery[str] = "",
    person: FromQuery[str] = "",
    status: FromQuery[str] = "",
    backend: FromQuery[str] = "",
    since: FromQuery[str] = "",
    until: FromQuery[str] = "",
    end_user: FromQuery[str] = "",
    offset: FromQuery[int] = 0,
) -> Response[Any]:
    filters = parse_filters(key, status, backend, since, until, person, end_user)
    offset = min(max(offset, 0), SQLITE_INT_MAX)  # beyond the last row either way: an empty page
    rows, total = await history.list(filters.query, PAGE_SIZE, offset)
    pages = {
        "offset": offset,
        "total": total,
        "first": offset + 1 if rows else 0,
        "last": offset + len(rows),
        "previous": filters.url_params(offset=max(offset - PAGE_SIZE, 0)) if offset > 0 else None,
        "next": filters.url_params(offset=offset + PAGE_SIZE) if offset + PAGE_SIZE < total else None,
    }
    usernames = await accounts.names()
    context = page_context(
        request,
        "history",
        rows=[request_view(r, usernames) for r in rows],
        keys=await keys.names(),
        people=sorted(usernames.items(), key=lambda p: p[1]),
        statuses=STATUSES,
        backends=await history.backends(),
        filters=filters,
        pages=pages,
        csv_url="/admin/history.csv?" + filters.url_params(),
    )
    return render("console/history.html", context, partial=wanted_partial(request, ("history-table",)))


@get("/history/{request_id:str}")
async def request_detail(
    request: HTMXRequest,
    history: deps.History,
    keys: deps.Keys,
    accounts: deps.Accounts,
    config: deps.Config,
    request_id: FromPath[str],
) -> Response[Any]:
    row = request_view(await history.get(request_id), await accounts.names())
    key_name = (await keys.names()).get(row.key_id) if row.key_id is not None else None
    context = page_context(request, "history", row=row, key_name=key_name, store_text=config.store_text)
    return render("console/request.html", context)


def csv_cell(value: Any) -> str:
    """Text a spreadsheet will not run: prompts and output are untrusted, and =, +, -, @ start a formula."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    text = str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


CSV_COLUMNS = ("key_name", *RequestView.__struct_fields__)


@get("/history.csv")
async def history_csv(
    history: deps.History,
    keys: deps.Keys,
    accounts: deps.Accounts,
    key: FromQuery[str] = "",
    person: FromQuery[str] = "",
    status: FromQuery[str] = "",
    backend: FromQuery[str] = "",
    since: FromQuery[str] = "",
    until: FromQuery[str] = "",
    end_user: FromQuery[str] = "",
) -> Stream:
    filters = parse_filters(key, status, backend, since, until, person, end_user)
    if filters.errors:  # an export of other rows than asked for would pass for the one asked for
        raise InvalidRequest("; ".join(filters.errors))
    now = utcnow()
    # The export ends at the moment it started: rows arriving meanwhile belong to the next one.
    query = filters.query
    until_at = min(query.until, now) if query.until is not None else now
    bounded = replace(query, until=until_at)
    names, usernames = await keys.names(), await accounts.names()

    async def lines() -> AsyncIterator[str]:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(CSV_COLUMNS)
        yield buffer.getvalue()
        async for rows in history.export(bounded, CSV_CHUNK):
            buffer.seek(0)
            buffer.truncate()
            for row in rows:
                view = request_view(row, usernames)
                name = names.get(view.key_id) if view.key_id is not None else None
                writer.writerow([csv_cell(name), *(csv_cell(getattr(view, f)) for f in RequestView.__struct_fields__)])
            yield buffer.getvalue()

    stamp = now.strftime("%Y%m%d-%H%M%S")
    return Stream(
        lines(),
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="requests-{stamp}.csv"',
            "Cache-Control": "no-store",
        },
    )
