"""Appending the history to an audit file: the rows that ended, in order of arrival (then id), read in keyset
batches and written as they come, so a million rows cost the memory of one batch. A file that already holds an
export is verified first and continued: its chain goes on from its last line, with only rows after its last one.

Only rows that arrived before the horizon are taken: SETTLE before now (a row is written a moment after its
arrival, by a batch writer that may be retrying a busy database), and before the earliest request still in flight
(it would change, and one that ends later must not land behind rows already exported). Values are strings,
integers, booleans and nulls: no floats, whose text other languages' JSON may write differently.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from web.audit.chain import EXPORT, FORMAT, GENESIS, HEADER, REQUEST, ChainEnd, sealed, verify
from web.history.record import IN_FLIGHT
from web.models import ApiKey, RequestRecord, User

SETTLE = timedelta(minutes=5)
BATCH = 1000
CONTAINS = (
    "one `request` line per request in the gateway's history that ended before the export, in order of arrival "
    "(then id): who (the key's id and name, the person's user_id and username, the client's end_user and address), "
    "when, which model and endpoint, prompt/completion/cached tokens, status, backend and gateway; prompt_text and "
    "response_text only where the history stored them (store_text). Names are as they were at export. An `export` "
    "line starts each later run that appended rows."
)
_R = RequestRecord
_COLUMNS = (
    _R.id, _R.arrival_at, _R.finished_at, _R.key_id, ApiKey.name.label("key_name"), _R.user_id, User.username,
    _R.user.label("end_user"), _R.client_addr, _R.model, _R.endpoint, _R.stream, _R.status, _R.finish_reason,
    _R.prompt_tokens, _R.completion_tokens, _R.cached_tokens, _R.backend, _R.gateway, _R.error,
)  # fmt: skip
_TEXTS = (_R.prompt_text, _R.response_text)


@dataclass(frozen=True, slots=True)
class Exported:
    rows: int  # appended by this run
    end: ChainEnd  # the file's, after it
    horizon: datetime  # rows that arrived from here on wait for the next run
    held_by: str | None  # the request still in flight that holds the horizon back, if one does


@dataclass(slots=True)
class _Appender:
    file: BinaryIO
    end: ChainEnd

    def write(self, kind: str, body: dict[str, Any]) -> None:
        end = self.end
        seq = end.seq + 1 if end.lines else 0
        line, digest = sealed(kind, seq, end.hash, body)
        self.file.write(line)
        last = body if kind == REQUEST else end.last_request
        self.end = ChainEnd(end.lines + 1, seq, digest, end.since, last)


async def export(
    db: AsyncEngine,
    path: Path,
    appliance: dict[str, Any],
    since: datetime | None = None,
    now: datetime | None = None,
    settle: timedelta = SETTLE,
) -> Exported:
    """Create the file (header first) or continue its chain; raises ChainBroken, appending nothing, where the
    file does not verify, and BlockingIOError where another export is writing it."""
    now = datetime.now(UTC) if now is None else now
    with _locked(path) as file:
        if file.tell():
            out = _Appender(file, verify(path))
            if out.end.since is not None:
                since = max(filter(None, (since, datetime.fromisoformat(out.end.since))))
            opening = {"exported_at": _iso(now), "appliance": appliance}
        else:
            out = _Appender(file, ChainEnd(0, 0, GENESIS, _iso(since), None))
            head = {"format": FORMAT, "exported_at": _iso(now), "appliance": appliance, "since": _iso(since)}
            out.write(HEADER, head | {"contains": CONTAINS})
            opening = None
        horizon, held_by = await _horizon(db, now - settle)
        rows = 0
        async for record in _records(db, out.end.last_request, since, horizon):
            if opening is not None and rows == 0:
                out.write(EXPORT, opening)
            out.write(REQUEST, record)
            rows += 1
        file.flush()
        os.fsync(file.fileno())  # a record kept for years: on the disk before the run reports it
    return Exported(rows, out.end, horizon, held_by)


@contextmanager
def _locked(path: Path) -> Iterator[BinaryIO]:
    """The file opened to append, held against a second export at once (a nightly timer and a hand-run one)."""
    with path.open("ab") as file:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield file


async def _horizon(db: AsyncEngine, settled: datetime) -> tuple[datetime, str | None]:
    query = select(_R.arrival_at, _R.id).where(_R.status.in_(IN_FLIGHT), _R.arrival_at < settled)
    async with db.connect() as conn:
        row = (await conn.execute(query.order_by(_R.arrival_at, _R.id).limit(1))).first()
    return (settled, None) if row is None else (row.arrival_at, row.id)


async def _records(
    db: AsyncEngine, after: dict[str, Any] | None, since: datetime | None, horizon: datetime
) -> AsyncIterator[dict[str, Any]]:
    """The rows from `since` to `horizon` after the row `after`, a batch per query (keyset: no offset to count
    past, and no cursor held open across the whole table)."""
    base = (
        select(*_COLUMNS, *_TEXTS)
        .outerjoin(ApiKey, ApiKey.id == _R.key_id)
        .outerjoin(User, User.id == _R.user_id)
        .where(_R.arrival_at < horizon)
        .order_by(_R.arrival_at, _R.id)
        .limit(BATCH)
    )
    if since is not None:
        base = base.where(_R.arrival_at >= since)
    cursor = None if after is None else (datetime.fromisoformat(after["arrival_at"]), after["id"])
    while True:
        query = base
        if cursor is not None:
            at, rid = cursor
            # The range alone lets the arrival index find the batch; the OR only drops the rows already sent.
            query = query.where(_R.arrival_at >= at, or_(_R.arrival_at > at, and_(_R.arrival_at == at, _R.id > rid)))
        async with db.connect() as conn:
            result = await conn.execute(query)
            names, batch = list(result.keys()), result.all()
        for row in batch:
            yield _record(dict(zip(names, row, strict=True)))
        if len(batch) < BATCH:
            return
        cursor = (batch[-1].arrival_at, batch[-1].id)


def _record(row: dict[str, Any]) -> dict[str, Any]:
    """A row as its line holds it: times in ISO 8601 UTC, the texts only where they were stored."""
    for name in ("arrival_at", "finished_at"):
        row[name] = _iso(row[name])
    for name in ("prompt_text", "response_text"):
        if row[name] is None:
            del row[name]
    return row


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat(timespec="microseconds")
