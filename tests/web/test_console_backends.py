"""The dashboard's Backends panel and /admin/api/backends (issue 11): each backend's state, models, load, latency
and errors, live; what remote servers send (names, errors) shown as text; an upstream key in APPLIANCE_BACKENDS
nowhere in a page; the diagnosis naming the backend that is down or the model whose backends are all short of KV."""

from __future__ import annotations

import html as markup
import re
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from tests.web.conftest import ADMIN, MODEL, InLoop, client_for, sign_in, web_config
from tests.web.fakes import FakeEngineClient
from web.app import build_gateway
from web.backends.spec import parse_backends
from web.backends.status import BackendStatus
from web.console.backend_diagnosis import diagnose_backends

PANEL = {"HX-Request": "true", "HX-Target": "backends"}
DIAGNOSIS = {"HX-Request": "true", "HX-Target": "diagnosis"}
REMOTE = BackendStatus(
    name="10.0.0.5:8000", kind="remote", url="http://10.0.0.5:8000", state="up", models=("qwen",), running=7,
    waiting=2, kv_usage=0.42, in_flight=5, ttft_p50_s=0.25, errors=0, requests=1234, last_error=None,
)  # fmt: skip


def _cells(html: str, name: str) -> dict[str, str]:
    row = re.search(rf'<tr data-backend="{re.escape(name)}">(.*?)</tr>', html, re.S)
    assert row, html
    return dict(re.findall(r'data-metric="([^"]+)"[^>]*>([^<]*)<', row.group(1)))


def _shown(monkeypatch: pytest.MonkeyPatch, in_loop: InLoop, *statuses: BackendStatus) -> None:
    """The router's snapshot as the probes of remote servers would leave it."""
    monkeypatch.setattr(in_loop.gateway.router, "statuses", lambda: list(statuses))


async def test_the_panel_shows_each_backends_state_load_and_errors_as_text(
    in_loop: InLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    await sign_in(in_loop.http)
    embedded = (await in_loop.http.get("/admin", headers=PANEL)).text  # the real router: the embedded engine alone
    assert _cells(embedded, "embedded")["backend-state"] == "up"
    assert _cells(embedded, "embedded")["backend-models"] == MODEL

    evil = replace(
        REMOTE, name="<b>evil</b>:80", state="circuit open", models=(), errors=5,
        last_error="<script>alert(1)</script> upstream said 500",
    )  # fmt: skip
    _shown(monkeypatch, in_loop, REMOTE, evil)
    panel = (await in_loop.http.get("/admin", headers=PANEL)).text
    assert _cells(panel, REMOTE.name) == {
        "backend-state": "up",
        "backend-models": "qwen",
        "backend-running": "7",
        "backend-waiting": "2",
        "backend-kv": "42%",
        "backend-in-flight": "5",
        "backend-ttft": "250 ms",
        "backend-errors": "0",
        "backend-requests": "1,234",
        "backend-last-error": "–",
    }
    assert "<b>evil" not in panel and "<script>" not in panel
    cells = _cells(panel, "&lt;b&gt;evil&lt;/b&gt;:80")
    assert cells["backend-state"] == "circuit open" and cells["backend-errors"] == "5"
    assert markup.unescape(cells["backend-last-error"]) == "<script>alert(1)</script> upstream said 500"
    page = (await in_loop.http.get("/admin")).text
    assert 'id="backends"' in page and 'id="memory"' in page  # on the dashboard, beside the embedded memory bar


async def test_an_upstream_key_in_the_backends_list_is_nowhere_in_the_console_or_the_api(
    fake: FakeEngineClient, db_path: Path
) -> None:
    key = "sk-upstream-secret-4242"
    backends = parse_backends(f"embedded,http://:{key}@127.0.0.1:9")  # nothing listens there: down
    async with client_for(fake, db_path, backends=backends) as client:
        await sign_in(client)
        seen = [(await client.get(path, headers=headers)).text for path, headers in _CONSOLE]
        api = await client.get("/admin/api/backends", headers=ADMIN)
    assert "http://127.0.0.1:9" in seen[1]  # the URL is shown, without its key
    assert all(key not in text for text in [*seen, api.text])
    assert [b["name"] for b in api.json()] == ["embedded", "127.0.0.1:9"]


_CONSOLE = [("/admin", {}), ("/admin", PANEL), ("/admin", DIAGNOSIS), ("/admin/history", {})]


async def test_the_api_gives_the_same_snapshots_to_the_admin_only(
    in_loop: InLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shown(monkeypatch, in_loop, REMOTE)
    assert (await in_loop.http.get("/admin/api/backends")).status_code == 401
    listed = await in_loop.http.get("/admin/api/backends", headers=ADMIN)
    assert listed.status_code == 200
    assert listed.json() == [{**asdict(REMOTE), "models": ["qwen"]}]


async def test_the_diagnosis_names_the_backend_that_is_down_or_the_model_short_of_kv(
    in_loop: InLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    await sign_in(in_loop.http)
    broken = replace(REMOTE, name="10.0.0.6:8000", state="circuit open", models=(), errors=5, last_error="HTTP 500")
    _shown(monkeypatch, in_loop, replace(REMOTE, waiting=0), broken)
    text = markup.unescape((await in_loop.http.get("/admin", headers=DIAGNOSIS)).text)
    assert "Backend 10.0.0.6:8000 is down: circuit open after 5 errors (last error: HTTP 500)." in text, text
    assert "1 backend(s) up take the requests meanwhile" in text

    full = [replace(REMOTE, kv_usage=0.95), replace(REMOTE, name="10.0.0.7:8000", kv_usage=0.93)]
    _shown(monkeypatch, in_loop, *full)
    text = markup.unescape((await in_loop.http.get("/admin", headers=DIAGNOSIS)).text)
    assert "All backends for model qwen are above 90% KV (10.0.0.5:8000 95%, 10.0.0.7:8000 93%)" in text, text


def test_the_diagnosis_reads_each_backend_for_the_verdict() -> None:
    down = replace(REMOTE, state="down", models=(), last_error="connection refused")
    assert diagnose_backends([down], "RAM").verdict == "down"
    assert "Backend 10.0.0.5:8000 is down: connection refused." in diagnose_backends([down], "RAM").details
    other = replace(REMOTE, name="10.0.0.8:8000", models=("llama",), kv_usage=0.2, waiting=0)
    saturated = diagnose_backends([replace(REMOTE, kv_usage=0.97, waiting=4), other, down], "RAM")
    assert (saturated.verdict, saturated.headline) == (
        "memory",
        "All backends for model qwen are above 90% KV (10.0.0.5:8000 97%): its requests wait for memory.",
    )
    busy = diagnose_backends([replace(REMOTE, waiting=4), other], "RAM")
    assert busy.verdict == "compute" and busy.headline.startswith("Backend 10.0.0.5:8000 is compute bound: 4")
    roomy = replace(REMOTE, name="10.0.0.9:8000", kv_usage=0.1, waiting=0)
    one_full = diagnose_backends([replace(REMOTE, kv_usage=0.97, waiting=4), roomy], "RAM")
    assert one_full.verdict == "memory" and "Backend 10.0.0.5:8000 is saturated: 4 request(s)" in one_full.headline
    idle = diagnose_backends([replace(REMOTE, waiting=0), other], "RAM")
    assert idle.verdict == "healthy" and idle.headline.startswith("Healthy: 2 backend(s) up")


async def test_while_the_engine_loads_beside_remote_backends_the_model_name_is_none_not_a_recursion(
    fake: FakeEngineClient, db_path: Path
) -> None:
    """The gate's name, with no local model yet, is the remote backends' first; the embedded backend asked the gate
    for its name before checking that it had a model, and so each other in turn until a RecursionError, at every
    probe while the engine loaded (seen in the managed-vLLM gateway's log)."""
    gateway = build_gateway(web_config(db_path, backends=parse_backends("embedded,http://127.0.0.1:9")), fake)
    try:
        assert fake.model_info is None  # not started: loading, as far as the gateway knows
        assert gateway.gate.model_name is None and gateway.router.model_names() == []
    finally:
        await gateway.router.aclose()
        await gateway.db.dispose()
