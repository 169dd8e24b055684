"""The console's CSV export (issue 16) streams every matching row once, newest first, in chunks that each start
after the last row sent: no COUNT and no OFFSET per chunk, and rows sharing one arrival time are neither skipped nor
repeated at a chunk's edge."""

from __future__ import annotations

import csv
import io
import sqlite3

import pytest
from sqlalchemy import event

from tests.web.conftest import InLoop, bearer, new_key, sign_in
from tests.web.test_lifecycle import CHAT
from web.console import history as console_history


async def test_the_export_streams_each_row_once_without_count_or_offset(
    in_loop: InLoop, db: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = await new_key(in_loop.http, "exporter")
    for _ in range(10):
        response = await in_loop.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
        assert response.status_code == 200, response.text
    await in_loop.gateway.writer.flush()
    # Four rows at one instant, across the edge of the 3-row chunks below.
    ids = [r[0] for r in db.execute("SELECT id FROM requests ORDER BY arrival_at DESC, id")]
    same = db.execute("SELECT arrival_at FROM requests WHERE id = ?", (ids[2],)).fetchone()[0]
    db.executemany("UPDATE requests SET arrival_at = ? WHERE id = ?", [(same, i) for i in ids[2:6]])
    db.commit()
    expected = [r[0] for r in db.execute("SELECT id FROM requests ORDER BY arrival_at DESC, id")]

    monkeypatch.setattr(console_history, "CSV_CHUNK", 3)
    statements: list[tuple[str, tuple[object, ...]]] = []

    def seen(conn: object, cursor: object, statement: str, parameters: tuple[object, ...], *_: object) -> None:
        statements.append((statement.upper(), parameters))

    engine = in_loop.gateway.db.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    await sign_in(in_loop.http)
    try:
        export = await in_loop.http.get("/admin/history.csv")
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert export.status_code == 200, export.text
    header, *records = list(csv.reader(io.StringIO(export.text)))
    id_column = header.index("id")
    assert [r[id_column] for r in records] == expected  # every row once, in the history's order
    assert {r[header.index("key_name")] for r in records} == {"exporter"}
    reads = [(s, p) for s, p in statements if "FROM REQUESTS" in s]
    assert len(reads) == 4  # 10 rows in chunks of 3: 3 + 3 + 3 + 1
    assert not any("COUNT(" in s for s, _ in reads), reads
    # SQLite's compiler writes "LIMIT ? OFFSET ?" for any limit: the offset must always be 0 (nothing rescanned).
    assert all(p[-1] == 0 for s, p in reads if s.endswith("OFFSET ?")), reads
