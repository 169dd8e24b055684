"""`appliance doctor`: one line per check on this machine (exit 0, or a failure that says why), and each
failure it is meant to catch, provoked one at a time."""

from __future__ import annotations

import re
import socket
import sqlite3
from pathlib import Path

import pytest
import torch

from appliance.doctor import Doctor
from appliance.settings import load_settings
from tests.appliance.conftest import Cli

CHECKS = ["gpu", "cuda", "memory", "bitsandbytes", "model", "data dir", "database", "port", "disk"]
LINE = re.compile(r"^(ok|info|warn|fail) +(gpu|cuda|memory|bitsandbytes|model|data dir|database|port|disk) +\S")


def doctor(**settings: str) -> Doctor:
    return Doctor(load_settings({"APPLIANCE_" + k.upper(): v for k, v in settings.items()}))


def test_doctor_on_this_machine_passes_or_explains(cli: Cli) -> None:
    result = cli("doctor")
    *lines, summary = result.out.splitlines()
    assert [LINE.match(line).group(2) for line in lines if LINE.match(line)] == CHECKS, result.out
    failures = [line for line in lines if line.startswith("fail")]
    assert result.code == (1 if failures else 0), result.out
    assert summary.startswith(f"doctor: {len(failures)} failure(s)")
    if not torch.cuda.is_available():
        assert lines[0].startswith("info  gpu") and lines[1].startswith("info  cuda"), "no GPU is not a failure"
    # A fresh data directory: nothing to migrate yet is a warning, not a failure.
    assert any(line.startswith("warn  database") and "appliance migrate" in line for line in lines)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_one_fails(data_dir: Path) -> None:
    checked = doctor(data_dir=str(data_dir), device="cuda")
    assert checked.check_gpu().level == "fail"
    cuda = checked.check_cuda()
    assert cuda.level == "fail" and "cannot use the GPU" in cuda.message


def test_a_missing_model_fails(data_dir: Path, tmp_path: Path) -> None:
    finding = doctor(data_dir=str(data_dir), model=str(tmp_path / "nowhere")).check_model()
    assert finding.level == "fail" and "does not exist" in finding.message


def test_a_port_held_by_another_program_fails(data_dir: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        finding = doctor(data_dir=str(data_dir), port=str(port)).check_port()
    assert finding.level == "fail" and f"port {port} is taken by another program" in finding.message


def test_a_data_dir_that_cannot_be_created_fails(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    finding = doctor(data_dir=str(tmp_path / "a-file" / "data")).check_data_dir()
    assert finding.level == "fail" and "is not a directory" in finding.message


@pytest.mark.parametrize(
    ("version", "level", "says"),
    [("0001", "fail", "run `appliance migrate`"), ("f00dfeed", "fail", "unknown to this version")],
)
def test_a_database_not_at_the_latest_schema_fails(data_dir: Path, version: str, level: str, says: str) -> None:
    data_dir.mkdir()
    with sqlite3.connect(data_dir / "appliance.db") as db:
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version VALUES (?)", (version,))
    finding = doctor(data_dir=str(data_dir)).check_database()
    assert finding.level == level and says in finding.message


def test_the_database_after_migrate_is_ok(cli: Cli, data_dir: Path) -> None:
    assert cli("migrate").code == 0
    assert doctor(data_dir=str(data_dir)).check_database().level == "ok"


def test_without_quantization_bitsandbytes_is_skipped(data_dir: Path) -> None:
    assert doctor(data_dir=str(data_dir), quantization="none").check_bitsandbytes().level == "info"
