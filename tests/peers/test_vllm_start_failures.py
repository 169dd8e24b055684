"""How a managed vLLM that cannot start is reported, without vLLM: a model that is not there fails before anything
runs, and a server that exits while starting fails the start with its exit code and last line, its api key masked
in the log as in the error."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from appliance.settings import load_settings
from appliance.vllm.engine import VllmEngineClient
from engine import ModelLoadError


def client(tmp_path: Path, model: Path, python: Path) -> VllmEngineClient:
    env = {"APPLIANCE_ENGINE": "vllm", "APPLIANCE_VLLM_PYTHON": str(python), "APPLIANCE_MODEL": str(model)}
    return VllmEngineClient(load_settings(env | {"APPLIANCE_DATA_DIR": str(tmp_path), "APPLIANCE_DEVICE": "cpu"}))


def fake_python(tmp_path: Path, script: str) -> Path:
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


async def test_a_missing_model_fails_the_start_before_vllm_runs(tmp_path: Path) -> None:
    c = client(tmp_path, tmp_path / "nowhere", fake_python(tmp_path, "exit 0\n"))
    with pytest.raises(ModelLoadError, match="does not exist"):
        await c.start()
    assert c.state == "down" and c.process is None


async def test_a_server_that_exits_while_starting_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    python = fake_python(tmp_path, 'echo "loading with key $VLLM_API_KEY"\necho "ValueError: no such model"\nexit 3\n')
    c = client(tmp_path, model, python)
    with caplog.at_level(logging.INFO, logger="appliance.vllm"), pytest.raises(ModelLoadError) as failed:
        await c.start()
    assert "exited with code 3 while starting" in str(failed.value) and "no such model" in str(failed.value)
    assert "vllm: loading with key ***" in caplog.text
    assert c.state == "down" and c.model_info is None and c.restarts == 0
