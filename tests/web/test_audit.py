"""The audit export (web/audit/) over a real migrated SQLite history: every line canonical and chained to the one
before, the text only where the history stored it, appends that continue the chain with only newer rows, a verify
that names the first line edited, removed, inserted, moved or cut, and memory that does not grow with the rows."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.audit import NOW, START, fill, measure
from web.audit.chain import GENESIS, ChainBroken, verify
from web.audit.export import Exported, export
from web.db import create_db_engine, sqlite_url

APPLIANCE = {"software": "test", "gateway": "here:8000"}


def run_export(db_path: Path, out: Path, since: datetime | None = None, now: datetime = NOW) -> Exported:
    async def run() -> Exported:
        engine = create_db_engine(sqlite_url(db_path))
        try:
            return await export(engine, out, APPLIANCE, since=since, now=now)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def requests(path: Path) -> list[dict[str, Any]]:
    return [line["request"] for line in lines(path) if line["kind"] == "request"]


def test_lines_are_canonical_json_chained_by_sha256(db_path: Path, tmp_path: Path) -> None:
    fill(db_path, 3)
    out = tmp_path / "audit.jsonl"
    assert run_export(db_path, out).rows == 3

    raw = out.read_bytes().splitlines()
    prev = GENESIS
    for seq, text in enumerate(raw):
        line = json.loads(text)
        assert text == json.dumps(line, sort_keys=True, separators=(",", ":")).encode()
        assert (line["seq"], line["prev"]) == (seq, prev)
        digest = line.pop("hash")
        assert digest == hashlib.sha256(json.dumps(line, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        prev = digest
    header = lines(out)[0]
    assert header["kind"] == "header" and header["header"]["format"] == "appliance-audit/1"
    assert header["header"]["appliance"] == APPLIANCE
    assert header["header"]["exported_at"] == NOW.isoformat(timespec="microseconds")
    first = requests(out)[0]
    assert (first["id"], first["key_id"], first["key_name"]) == ("req-000000000", 1, "synthetic")
    assert (first["model"], first["endpoint"]) == ("default", "chat.completions")
    assert (first["prompt_tokens"], first["completion_tokens"], first["status"]) == (20, 100, "finished")
    assert (first["arrival_at"], first["backend"]) == ("2026-01-01T00:00:00.000000+00:00", "embedded")

    again = tmp_path / "again.jsonl"
    run_export(db_path, again)
    assert again.read_bytes() == out.read_bytes(), "the same history at the same time exports the same bytes"


def test_the_text_is_there_only_where_the_history_stored_it(db_path: Path, tmp_path: Path) -> None:
    fill(db_path, 2)
    fill(db_path, 2, first=2, text=True)
    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE requests SET response_text = ? WHERE id = 'req-000000003'", ('Zürich\n東京 \u2028 "ok"',))
    out = tmp_path / "audit.jsonl"
    run_export(db_path, out)
    plain, stored = requests(out)[:2], requests(out)[2:]
    assert all("prompt_text" not in r and "response_text" not in r for r in plain)
    texts = [(r["prompt_text"], r["response_text"]) for r in stored]
    assert texts == [("prompt 2", "response 2"), ("prompt 3", 'Zürich\n東京 \u2028 "ok"')]
    assert verify(out).lines == 5, "any text, one line each"


def test_a_person_s_request_names_them(db_path: Path, tmp_path: Path) -> None:
    fill(db_path, 1)
    with sqlite3.connect(db_path) as db:
        db.execute(
            "INSERT INTO users (id, username, password_hash, role, suspended, overrides, created_at, updated_at) "
            "VALUES (7, 'ada', 'x', 'user', 0, '{}', '2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000')"
        )
        db.execute("UPDATE requests SET user_id = 7")
    out = tmp_path / "audit.jsonl"
    run_export(db_path, out)
    assert [(r["user_id"], r["username"]) for r in requests(out)] == [(7, "ada")]


def _edit(raw: list[bytes]) -> list[bytes]:
    raw[2] = raw[2].replace(b'"prompt_tokens":21', b'"prompt_tokens":2')
    return raw


def _edit_and_rehash(raw: list[bytes]) -> list[bytes]:
    line = json.loads(_edit(raw)[2])
    del line["hash"]
    canonical = json.dumps(line, sort_keys=True, separators=(",", ":"))
    line["hash"] = hashlib.sha256(canonical.encode()).hexdigest()
    raw[2] = json.dumps(line, sort_keys=True, separators=(",", ":")).encode()
    return raw


TAMPERING = {
    "edited": (_edit, 3),
    "edited with its hash redone": (_edit_and_rehash, 4),
    "edited whitespace": (lambda raw: [*raw[:2], raw[2].replace(b",", b", ", 1), *raw[3:]], 3),
    "removed": (lambda raw: raw[:2] + raw[3:], 3),
    "inserted": (lambda raw: [*raw[:2], raw[1], *raw[2:]], 3),
    "reordered": (lambda raw: [*raw[:2], raw[3], raw[2], *raw[4:]], 3),
    "header removed": (lambda raw: raw[1:], 1),
}


@pytest.mark.parametrize("tamper", TAMPERING)
def test_verify_names_the_first_bad_line(db_path: Path, tmp_path: Path, tamper: str) -> None:
    fill(db_path, 4)
    out = tmp_path / "audit.jsonl"
    run_export(db_path, out)
    assert verify(out).lines == 5
    change, bad = TAMPERING[tamper]
    out.write_bytes(b"\n".join(change(out.read_bytes().splitlines())) + b"\n")
    with pytest.raises(ChainBroken) as caught:
        verify(out)
    assert caught.value.line == bad and f"line {bad}:" in str(caught.value)


@pytest.mark.parametrize("cut", [1, 40], ids=["newline", "half a line"])
def test_verify_fails_on_a_truncated_last_line(db_path: Path, tmp_path: Path, cut: int) -> None:
    fill(db_path, 2)
    out = tmp_path / "audit.jsonl"
    run_export(db_path, out)
    out.write_bytes(out.read_bytes()[:-cut])
    with pytest.raises(ChainBroken, match="line 3: "):
        verify(out)


def test_export_appends_only_newer_rows_and_continues_the_chain(db_path: Path, tmp_path: Path) -> None:
    fill(db_path, 3)
    out = tmp_path / "audit.jsonl"
    first = run_export(db_path, out)
    fill(db_path, 2, first=3)
    later = NOW + timedelta(days=1)
    second = run_export(db_path, out, now=later)

    assert (first.rows, second.rows) == (3, 2)
    assert second.end == verify(out) and second.end.lines == 7
    assert [line["kind"] for line in lines(out)] == ["header", *["request"] * 3, "export", "request", "request"]
    assert lines(out)[4]["export"]["exported_at"] == later.isoformat(timespec="microseconds")
    assert [r["id"] for r in requests(out)] == [f"req-{n:09d}" for n in range(5)]

    before = out.read_bytes()
    assert run_export(db_path, out).rows == 0
    assert out.read_bytes() == before, "a run with nothing new leaves the file as it was"


def test_export_refuses_to_append_to_a_broken_chain(db_path: Path, tmp_path: Path) -> None:
    fill(db_path, 3)
    out = tmp_path / "audit.jsonl"
    run_export(db_path, out)
    out.write_bytes(out.read_bytes().replace(b'"prompt_tokens":21', b'"prompt_tokens":1'))
    fill(db_path, 1, first=3)
    tampered = out.read_bytes()
    with pytest.raises(ChainBroken, match="line 3: "):
        run_export(db_path, out)
    assert out.read_bytes() == tampered


def test_a_request_in_flight_holds_back_every_row_after_it(db_path: Path, tmp_path: Path) -> None:
    fill(db_path, 5)
    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE requests SET status = 'running' WHERE id = 'req-000000002'")
    out = tmp_path / "audit.jsonl"
    held = run_export(db_path, out)
    assert (held.rows, held.held_by) == (2, "req-000000002")
    assert held.horizon == START + timedelta(milliseconds=2)

    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE requests SET status = 'finished' WHERE id = 'req-000000002'")
    assert run_export(db_path, out).rows == 3
    assert [r["id"] for r in requests(out)] == [f"req-{n:09d}" for n in range(5)]


def test_rows_younger_than_the_settling_time_wait(db_path: Path, tmp_path: Path) -> None:
    fill(db_path, 4)
    out = tmp_path / "audit.jsonl"
    assert run_export(db_path, out, now=START + timedelta(minutes=5, milliseconds=2)).rows == 2
    assert run_export(db_path, out).rows == 2


def test_since_bounds_the_first_export_and_every_later_one(db_path: Path, tmp_path: Path) -> None:
    fill(db_path, 4)
    out = tmp_path / "audit.jsonl"
    since = START + timedelta(milliseconds=2)
    run_export(db_path, out, since=since)
    assert [r["id"] for r in requests(out)] == ["req-000000002", "req-000000003"]
    assert lines(out)[0]["header"]["since"] == since.isoformat(timespec="microseconds")


def test_memory_stays_flat_from_5k_to_50k_rows() -> None:
    """Each size is exported by a fresh process (bench.audit's), whose peak RSS is the export's own; holding the
    rows would cost about 1 KiB each, 45 MiB more for the larger history. The million rows: python -m bench.audit."""
    small, large = measure(5_000), measure(50_000)
    assert (small["rows"], large["rows"]) == (5_000, 50_000)
    assert large["peak_rss_mib"] < small["peak_rss_mib"] + 10, (small, large)


def test_batches_neither_skip_nor_repeat_rows_that_share_an_arrival_time(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(db_path, 7)
    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE requests SET arrival_at = '2026-01-01 00:00:00.001000' WHERE id <= 'req-000000005'")
    monkeypatch.setattr("web.audit.export.BATCH", 2)
    out = tmp_path / "audit.jsonl"
    assert run_export(db_path, out).rows == 7
    assert [r["id"] for r in requests(out)] == [f"req-{n:09d}" for n in range(7)]


def test_a_second_export_at_once_is_refused(db_path: Path, tmp_path: Path) -> None:
    fill(db_path, 1)
    out = tmp_path / "audit.jsonl"
    with out.open("ab") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(BlockingIOError):
            run_export(db_path, out)
    assert out.read_bytes() == b""
