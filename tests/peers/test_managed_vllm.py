"""APPLIANCE_ENGINE=vllm: `appliance serve` starts and supervises a real vLLM server (vLLM's CPU build) on the
bundled model, behind the same readiness, history, metrics, restart and drain as the embedded engine. One
appliance start for the module; the settings, the launch plan and the doctor are checked without one."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from appliance.doctor.report import Doctor
from appliance.settings import Settings, SettingsError, load_settings
from appliance.vllm.process import plan
from tests.peers.vllm import MAX_MODEL_LEN, NO_COMPILE, VLLM_CACHE, VllmModel
from tests.web.conftest import _LOGIN_TOKEN, ADMIN, ADMIN_PASSWORD, METRICS_TOKEN
from tests.web.server import Server, serving

SERVED = "smol-managed"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
RESTART_TIMEOUT_S = 600.0


def settings(**values: str) -> Settings:
    return load_settings({"APPLIANCE_" + k.upper(): v for k, v in values.items()})


# -- settings, launch plan, doctor (no server) -----------------------------------------------------------


def test_the_engine_setting_and_its_python_are_checked(tmp_path: Path) -> None:
    assert settings(data_dir=str(tmp_path)).engine == "embedded"
    with pytest.raises(SettingsError, match="APPLIANCE_ENGINE must be embedded or vllm"):
        settings(engine="sglang")
    with pytest.raises(SettingsError, match=r"needs vLLM's python.*install.sh --engine vllm"):
        settings(engine="vllm", vllm_python=str(tmp_path / "nowhere" / "python"))
    python = tmp_path / "python"
    python.touch()
    with pytest.raises(SettingsError, match="APPLIANCE_QUANTIZATION=int8 is not for APPLIANCE_ENGINE=vllm"):
        settings(engine="vllm", vllm_python=str(python), quantization="int8")
    assert settings(engine="vllm", vllm_python=str(python)).vllm_interpreter == python


def test_the_cpu_launch_keeps_the_key_off_the_command_line_and_quantizes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    python = tmp_path / "python"
    python.touch()
    s = settings(engine="vllm", vllm_python=str(python), quantization="nf4", max_model_len="1024", data_dir="/d")
    with caplog.at_level(logging.INFO, logger="appliance.vllm"):
        launch = plan(s, tmp_path / "model", "smol", "cpu", 8123, "sk-secret-key")
    assert launch.command[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    assert "sk-secret-key" not in " ".join(launch.command) and launch.env["VLLM_API_KEY"] == "sk-secret-key"
    command = launch.command
    flags = {arg: command[i + 1] for i, arg in enumerate(command[:-1]) if arg.startswith("--")}
    assert flags["--dtype"] == "float32" and flags["--max-model-len"] == "1024" and flags["--port"] == "8123"
    assert "--quantization" not in flags and launch.quantization == "none"
    assert "--kv-cache-dtype" not in flags, "auto: vLLM's own (the model's dtype)"
    assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "1" and launch.env["VLLM_USE_AOT_COMPILE"] == "0"
    assert not any(k.startswith("APPLIANCE_") for k in launch.env)
    assert "quantizes nothing" in caplog.text
    cuda = plan(s, tmp_path / "model", "smol", "cuda:1", 8123, "k")
    assert cuda.command[-3:] == ["0.9", "--quantization", "bitsandbytes"] and cuda.env["CUDA_VISIBLE_DEVICES"] == "1"


def test_the_kv_cache_dtype_maps_to_vllms_or_is_refused(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.touch()
    launch = plan(settings(engine="vllm", vllm_python=str(python), kv_cache_dtype="fp8"), tmp_path, "s", "cuda", 1, "k")
    assert launch.command[launch.command.index("--kv-cache-dtype") + 1] == "fp8"
    for refused in ("int8", "bf16"):
        with pytest.raises(SettingsError, match=f"KV_CACHE_DTYPE={refused} is not for APPLIANCE_ENGINE=vllm"):
            settings(engine="vllm", vllm_python=str(python), kv_cache_dtype=refused)


def test_doctor_checks_the_vllm_venv(vllm_model: VllmModel, tmp_path: Path) -> None:
    found = Doctor(settings(engine="vllm", vllm_python=str(vllm_model.python), data_dir=str(tmp_path)))
    findings = list(found.findings())  # importing vLLM takes seconds: once
    checks = [f.check for f in findings]
    assert checks[checks.index("model") + 1] == "vllm", checks
    assert findings[checks.index("decode attention")].level == "info"  # vLLM's engine, not the embedded one
    ok = findings[checks.index("vllm")]
    assert ok.level == "ok" and "vLLM 0.32.0" in ok.message, ok
    without = Doctor(settings(engine="vllm", vllm_python=str(Path(psutil.Process().exe())), data_dir=str(tmp_path)))
    broken = without.check_vllm()
    assert broken.level == "fail" and "cannot import vLLM" in broken.message, broken


# -- one appliance serving through vLLM ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(vllm_model: VllmModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_CACHE_ROOT", str(VLLM_CACHE))
        for name, value in NO_COMPILE.items():  # the appliance passes its environment on to vLLM
            env.setenv(name, value)
        with serving(
            tmp_path_factory.mktemp("managed-vllm"),
            engine="vllm",
            vllm_python=str(vllm_model.python),
            model="default",
            served_model_name=SERVED,
            quantization="nf4",  # not on a CPU: said in the log
            max_model_len=str(MAX_MODEL_LEN),
            kv_cache_bytes=str(1 << 30),
            drain_timeout="5",
        ) as srv:
            yield srv


def vllm_processes(server: Server) -> list[psutil.Process]:
    return [p for p in psutil.Process(server.process.pid).children(recursive=True) if p.is_running()]


def api_server(server: Server) -> psutil.Process:
    found = [p for p in vllm_processes(server) if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())]
    assert len(found) == 1, [p.cmdline() for p in vllm_processes(server)]
    return found[0]


def settled_statuses(server: Server) -> list[str]:
    """The history rows' statuses once none is running any more (the final write is batched)."""
    deadline = time.monotonic() + 10
    while True:
        rows = httpx.get(server.url + "/admin/api/requests", headers=ADMIN).json()["data"]
        if all(r["status"] != "running" for r in rows) or time.monotonic() > deadline:
            return sorted(r["status"] for r in rows)
        time.sleep(0.1)


def console_page(server: Server) -> str:
    """The console's dashboard (its engine status), signed in through the login form as a browser is."""
    with httpx.Client(base_url=server.url) as http:
        token = _LOGIN_TOKEN.search(http.get("/admin/login").text)
        assert token
        form = {"username": "admin", "password": ADMIN_PASSWORD, "csrf_token": token.group(1), "next": "/admin"}
        assert http.post("/admin/login", data=form).status_code == 303
        page = http.get("/admin/")
        assert page.status_code == 200, page.text
        return page.text


def streamed_chat(client: openai.OpenAI) -> tuple[str, openai.types.CompletionUsage]:
    stream = client.chat.completions.create(
        model=SERVED,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), usage


@pytest.mark.slow
def test_served_by_vllm_end_to_end_then_killed_restarted_and_drained(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.new_key(), max_retries=0, timeout=120)
    assert [m.id for m in client.models.list()] == [SERVED]
    text, usage = streamed_chat(client)
    assert "Paris" in text and 1 <= usage.completion_tokens <= 12 and usage.prompt_tokens > 5

    assert settled_statuses(server) == ["finished"]
    rows = httpx.get(server.url + "/admin/api/requests", headers=ADMIN).json()["data"]
    assert (rows[0]["prompt_tokens"], rows[0]["completion_tokens"]) == (usage.prompt_tokens, usage.completion_tokens)
    stats_page = httpx.get(server.url + "/admin/api/stats", headers=ADMIN)
    stats = stats_page.json()
    assert stats["state"] == "ready" and stats["model"]["device"] == "cpu" and stats["model"]["quantization"] == "none"
    assert stats["model"]["max_model_len"] == MAX_MODEL_LEN and stats["engine"]["kv_blocks_total"] > 0
    metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
    assert "vllm:num_requests_running" in metrics and f'model_name="{SERVED}"' in metrics
    console = console_page(server)
    assert SERVED in console
    log = server.log()
    assert "vllm: " in log and "quantizes nothing" in log
    # The key vLLM was started with is nowhere to be read but in its own environment.
    vllm = api_server(server)
    key = vllm.environ()["VLLM_API_KEY"]
    assert len(key) >= 32 and key not in " ".join(vllm.cmdline())
    assert not [where for where in (log, console, stats_page.text, metrics) if key in where]

    # The vLLM server dies under a stream: the stream fails in-band and its row ends failed; the appliance says
    # so (engine_unavailable), starts vLLM again, and serves again.
    cut = client.chat.completions.create(
        model=SERVED, messages=MESSAGES, max_tokens=1000, stream=True, extra_body={"ignore_eos": True}
    )
    assert next(iter(cut)).choices
    api_server(server).kill()
    with pytest.raises(openai.APIError):
        for _ in cut:
            pass
    assert settled_statuses(server) == ["failed", "finished"]
    unavailable, deadline = False, time.monotonic() + RESTART_TIMEOUT_S
    while time.monotonic() < deadline:
        ready = httpx.get(server.url + "/ready", timeout=5)
        if ready.status_code == 503:
            unavailable = unavailable or ready.json()["error"]["code"] == "engine_unavailable"
        elif ready.status_code == 200 and unavailable:
            break
        time.sleep(0.2)
    assert unavailable and ready.status_code == 200, ready.text
    assert httpx.get(server.url + "/admin/api/stats", headers=ADMIN).json()["restarts"] == 1
    assert "Paris" in streamed_chat(client)[0]

    # SIGTERM drains and stops vLLM with its engine core: no process of it is left.
    children = vllm_processes(server)
    assert server.stop() == 0
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
