"""`appliance audit export|verify` end to end on a migrated SQLite database: export then verify, an append that
continues the file, --since, and the exit status and message for a file someone changed."""

from __future__ import annotations

import json
from pathlib import Path

from bench.audit import fill
from tests.appliance.conftest import Cli


def ids(path: Path) -> list[str]:
    lines = map(json.loads, path.read_text().splitlines())
    return [line["request"]["id"] for line in lines if line["kind"] == "request"]


def migrated(cli: Cli, data_dir: Path) -> Path:
    assert cli("migrate").code == 0
    return data_dir / "appliance.db"


def test_export_then_verify_then_append(cli: Cli, data_dir: Path, tmp_path: Path) -> None:
    db = migrated(cli, data_dir)
    fill(db, 3)
    out = tmp_path / "audit.jsonl"
    exported = cli("audit", "export", str(out))
    assert exported.code == 0, exported.err
    assert "3 requests appended; 4 lines" in exported.out and "next export" in exported.err
    header = json.loads(out.read_text().splitlines()[0])["header"]
    assert header["appliance"]["software"] == "llm-appliance" and header["appliance"]["database"] == str(db)

    checked = cli("audit", "verify", str(out))
    assert checked.code == 0 and "intact, 4 lines" in checked.out
    last_hash = json.loads(out.read_text().splitlines()[-1])["hash"]
    assert last_hash in checked.out and last_hash in exported.out

    fill(db, 2, first=3)
    again = cli("audit", "export", str(out))
    assert again.code == 0 and "2 requests appended; 7 lines" in again.out
    assert ids(out) == [f"req-{n:09d}" for n in range(5)]
    assert cli("audit", "verify", str(out)).code == 0


def test_since_exports_only_later_requests(cli: Cli, data_dir: Path, tmp_path: Path) -> None:
    fill(migrated(cli, data_dir), 4)
    out = tmp_path / "audit.jsonl"
    assert cli("audit", "export", str(out), "--since", "2026-01-01T00:00:00.002").code == 0
    assert ids(out) == ["req-000000002", "req-000000003"]
    refused = cli("audit", "export", str(out), "--since", "yesterday")
    assert refused.code == 2 and "ISO 8601" in refused.err


def test_a_changed_file_fails_verify_and_takes_no_append(cli: Cli, data_dir: Path, tmp_path: Path) -> None:
    db = migrated(cli, data_dir)
    fill(db, 3)
    out = tmp_path / "audit.jsonl"
    cli("audit", "export", str(out))
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join([lines[0], lines[1], lines[3]]))

    checked = cli("audit", "verify", str(out))
    assert checked.code == 1 and f"{out}: line 3: its prev is not the hash of the line before" in checked.err
    fill(db, 1, first=3)
    refused = cli("audit", "export", str(out))
    assert refused.code == 1 and "line 3" in refused.err and "nothing was appended" in refused.err
    assert len(out.read_text().splitlines()) == 3


def test_verify_of_a_missing_file_says_so(cli: Cli, tmp_path: Path) -> None:
    result = cli("audit", "verify", str(tmp_path / "nowhere.jsonl"))
    assert result.code == 1 and "nowhere.jsonl" in result.err
