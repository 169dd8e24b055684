"""`python -m bench.audit`: the audit export's memory and speed over a history of synthetic rows, 100k then 1M by
default, each exported (then verified) by a fresh process that reports its own peak RSS: flat RSS across the sizes
shows the export streams. `fill` is also the tests' fast way to a large history (executemany, one transaction)."""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from web.audit.chain import verify
from web.audit.export import export
from web.db import create_db_engine, sqlite_url, upgrade_schema

START = datetime(2026, 1, 1, tzinfo=UTC)
NOW = datetime(2030, 1, 1, tzinfo=UTC)  # after every synthetic row: the export's horizon takes them all
_INSERT = (
    "INSERT INTO requests (id, key_id, model, endpoint, stream, status, finish_reason, prompt_tokens, "
    "completion_tokens, cached_tokens, reserved_tokens, arrival_at, finished_at, backend, prompt_text, response_text) "
    "VALUES (?, ?, 'default', 'chat.completions', 0, 'finished', 'stop', ?, ?, 0, 0, ?, ?, 'embedded', ?, ?)"
)


def migrate(path: Path) -> None:
    async def run() -> None:
        engine = create_db_engine(sqlite_url(path))
        try:
            await upgrade_schema(engine)
        finally:
            await engine.dispose()

    asyncio.run(run())


def fill(path: Path, count: int, first: int = 0, text: bool = False) -> None:
    """`count` finished requests of key 1 (made if missing), one millisecond apart from START + `first` ms, with
    ids req-<number>; with their texts when `text`."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT OR IGNORE INTO api_keys (id, name, prefix, key_hash, created_at, quota_period) "
            "VALUES (1, 'synthetic', 'sk-syn', ?, '2026-01-01 00:00:00.000000', 'none')",
            ("0" * 64,),
        )
        conn.executemany(_INSERT, _rows(first, count, text))


def _rows(first: int, count: int, text: bool) -> Iterator[tuple[object, ...]]:
    for n in range(first, first + count):
        at = START + timedelta(milliseconds=n)
        stored = (f"prompt {n}", f"response {n}") if text else (None, None)
        yield (f"req-{n:09d}", 1, 20 + n % 50, 100 + n % 200, _stored(at), _stored(at + timedelta(seconds=1)), *stored)


def _stored(at: datetime) -> str:
    """A time as SQLAlchemy keeps it in SQLite (naive UTC, always with microseconds)."""
    return at.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def child(db: Path, out: Path) -> None:
    """Export then verify, in this fresh process: its peak RSS is the export's alone."""

    async def run() -> int:
        engine = create_db_engine(sqlite_url(db))
        try:
            return (await export(engine, out, {"software": "bench"}, now=NOW)).rows
        finally:
            await engine.dispose()

    began = time.perf_counter()
    rows = asyncio.run(run())
    exported = time.perf_counter() - began
    verify(out)
    verified = time.perf_counter() - began - exported
    print(json.dumps({"rows": rows, "export_s": exported, "verify_s": verified, "peak_rss_mib": peak_rss_kib() / 1024}))


def peak_rss_kib() -> int:
    """This process's peak RSS since its exec: Linux's VmHWM. getrusage's ru_maxrss would not do, as it keeps the
    peak of the process that forked it (a test runner's hundreds of MiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure(count: int) -> dict[str, float]:
    """Export `count` synthetic rows in a child process; its times, peak RSS and the file's size."""
    with tempfile.TemporaryDirectory() as tmp:
        db, out = Path(tmp) / "appliance.db", Path(tmp) / "audit.jsonl"
        migrate(db)
        fill(db, count)
        command = [sys.executable, "-m", "bench.audit", "--child", str(db), str(out)]
        got: dict[str, float] = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        return got | {"file_mib": out.stat().st_size / 2**20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--child", nargs=2, type=Path, metavar=("DB", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    print("rows       export s   rows/s    verify s   file MiB   peak RSS MiB")
    for count in args.rows:
        got = measure(count)
        rate = got["rows"] / got["export_s"]
        print(
            f"{got['rows']:<10.0f} {got['export_s']:<10.1f} {rate:<9.0f} {got['verify_s']:<10.1f} "
            f"{got['file_mib']:<10.1f} {got['peak_rss_mib']:.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
