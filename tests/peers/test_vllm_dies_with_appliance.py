"""The managed vLLM does not outlive the appliance, even one killed with SIGKILL (no drain, no shutdown): without
systemd's cgroup to clean up (a terminal, `make run`, a test) it would keep its memory and port forever. A stand-in
module plays vLLM's server: what is checked is the appliance's launch, not vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.web.server import REPO

DRIVER = """
import asyncio, os, sys
from appliance.vllm.process import Launch, spawn

async def main():
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", "1"]
    server = await spawn(Launch(command, dict(os.environ), "cpu", "float32", "none"))
    print(server.pid, flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


def test_a_killed_appliance_takes_its_vllm_with_it(tmp_path: Path) -> None:
    server_module = tmp_path / "vllm" / "entrypoints" / "openai" / "api_server.py"
    server_module.parent.mkdir(parents=True)
    for package in (server_module.parent, *server_module.parent.parents[:2]):
        (package / "__init__.py").touch()
    server_module.write_text("import time\ntime.sleep(120)\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    appliance = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    assert appliance.stdout is not None
    vllm = psutil.Process(int(appliance.stdout.readline()))
    try:
        deadline = time.monotonic() + 30
        # Still the launcher, before its exec (or amid it: the command line reads empty for a moment).
        while vllm.cmdline()[1:2] != ["-m"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert vllm.cmdline()[1:] == ["-m", "vllm.entrypoints.openai.api_server", "--port", "1"]
        appliance.kill()
        appliance.wait()
        assert vllm.wait(10) is not None or not vllm.is_running()
    finally:
        appliance.kill()
        appliance.wait()
        if vllm.is_running():
            vllm.kill()  # the stand-in a failed check left behind
