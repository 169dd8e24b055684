"""`appliance doctor`: one line per check on this machine (exit 0, or a failure that says why), and each
failure it is meant to catch, provoked one at a time."""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from appliance.doctor import host as doctor_host
from appliance.doctor import report as doctor_module
from appliance.doctor.report import GPU_NODES, Doctor
from appliance.settings import load_settings
from tests.appliance.conftest import Cli
from web.static import VENDOR_DIR
from web.static.assets import ASSETS

CHECKS = [
    *("gpu", "cuda", "memory", "bitsandbytes", "compute", "cpu plan", "decode attention", "linear layers", "model"),
    *("data dir", "database", "port", "disk", "assets"),
]
LINE = re.compile(r"^(ok|info|warn|fail) +(" + "|".join(CHECKS) + r") +\S")


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


def test_decode_attention_is_compiled_here_and_a_missing_compiler_is_named(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not torch.cuda.is_available():
        found = doctor(data_dir=str(data_dir)).check_decode_attention()
        assert found.level == "ok" and "compiled for this CPU" in found.message, found.message
    monkeypatch.setenv("CC", "/nonexistent/cc")
    auto = doctor(data_dir=str(data_dir), device="cpu").check_decode_attention()
    assert auto.level == "warn" and "torch's" in auto.message and "cc failed" in auto.message
    insisted = doctor(data_dir=str(data_dir), device="cpu", decode_attention="compiled").check_decode_attention()
    assert insisted.level == "fail" and "APPLIANCE_DECODE_ATTENTION=compiled" in insisted.message
    chosen = doctor(data_dir=str(data_dir), device="cpu", decode_attention="torch").check_decode_attention()
    assert chosen.level == "info"


def test_float32_linear_layers_are_compact_here_and_the_other_cases_say_why(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not torch.cuda.is_available():
        found = doctor(data_dir=str(data_dir), dtype="float32").check_linear_layers()
        assert found.level == "ok" and "compact weights and the engine's own forward" in found.message, found.message
    bf16 = doctor(data_dir=str(data_dir), device="cpu", dtype="bfloat16").check_linear_layers()
    assert bf16.level == "ok" and "in bfloat16" in bf16.message, bf16.message  # the own forward is built in bf16 too
    off = doctor(data_dir=str(data_dir), device="cpu", dtype="float32", compact_weights="false", own_forward="false")
    assert off.check_linear_layers().level == "info"
    # Any python passes the settings' check (vLLM's venv may not be made yet: make test makes it beside the suite).
    vllm = doctor(data_dir=str(data_dir), engine="vllm", vllm_python=sys.executable)
    assert vllm.check_linear_layers().level == "info"
    monkeypatch.setenv("CC", "/nonexistent/cc")
    missing = doctor(data_dir=str(data_dir), device="cpu", dtype="float32").check_linear_layers()
    assert missing.level == "warn" and "cc failed" in missing.message


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


def test_the_auto_choices_follow_the_cpu_flags(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("appliance.doctor.report.cpu_flags", lambda: frozenset({"avx2"}))
    auto = doctor(data_dir=str(data_dir), device="cpu").check_compute()
    assert auto.level == "ok", auto
    assert "quantization none, chosen by auto; compute dtype float32, chosen by auto (CPU flags: avx2)" in auto.message
    forced = doctor(data_dir=str(data_dir), device="cpu", dtype="bfloat16").check_compute()
    assert forced.level == "warn" and "float32 is faster" in forced.message
    monkeypatch.setattr("appliance.doctor.report.cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    fast = doctor(data_dir=str(data_dir), device="cpu").check_compute()
    assert "quantization none, chosen by auto; compute dtype bfloat16, chosen by auto" in fast.message


def test_front_end_assets_missing_or_not_the_pinned_ones_fail(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vendor = tmp_path / "vendor"
    shutil.copytree(VENDOR_DIR, vendor)
    monkeypatch.setattr(doctor_host, "VENDOR_DIR", vendor)
    assert doctor(data_dir=str(data_dir)).check_assets().level == "ok"
    (vendor / ASSETS[0].target).write_text("tampered")
    (vendor / ASSETS[1].target).unlink()
    finding = doctor(data_dir=str(data_dir)).check_assets()
    assert finding.level == "fail" and "appliance assets fetch" in finding.message
    assert f"{ASSETS[0].target} is not {ASSETS[0].package} {ASSETS[0].version}" in finding.message
    assert f"{ASSETS[1].target} is missing" in finding.message


@pytest.mark.parametrize("flags", [frozenset({"avx2"}), frozenset({"avx512_bf16"})])
def test_auto_quantization_is_checked_as_the_engine_resolves_it(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]
) -> None:
    monkeypatch.setattr(doctor_module, "cpu_flags", lambda: flags)
    finding = doctor(data_dir=str(data_dir), quantization="auto", device="cpu").check_bitsandbytes()
    assert finding.level != "fail", finding.message
    assert "skipped: quantization none, chosen by auto" in finding.message
    forced = doctor(data_dir=str(data_dir), quantization="nf4", device="cpu").check_bitsandbytes()
    assert forced.level != "fail" and "runs nf4 on cpu" in forced.message


@pytest.mark.skipif(any(glob.glob(p) for p in GPU_NODES), reason="a GPU may be usable here: torch is asked")
def test_doctor_without_a_gpu_or_quantization_does_not_load_torch(data_dir: Path) -> None:
    """The slow part of the old doctor (13 s): importing torch and transformers, and the gguf package's full
    parse of the model's vocabulary. Where neither a GPU nor bitsandbytes is in play, none of it is needed."""
    heavy = "{'torch', 'transformers', 'gguf'}"
    report = f"import atexit, sys; atexit.register(lambda: print(sorted({heavy} & set(sys.modules))))"
    env = {**os.environ, "APPLIANCE_DATA_DIR": str(data_dir), "APPLIANCE_QUANTIZATION": "none"}
    code = f"{report}; from appliance.cli import main; main.main(['doctor'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.splitlines()[-1] == "[]", done.stdout + done.stderr
