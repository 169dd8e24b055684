"""The console's models page (issue 16): the local models with their fit, the served one marked; "Serve this
model" refuses a model that does not fit, drains the requests in flight (new ones get 503 not_ready "switching
model"), restarts the engine on the new model, and /v1/models names it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from engine import EngineConfig, ModelInfo
from tests.waiting import until
from tests.web.conftest import InLoop, bearer, new_key, sign_in, web_config
from tests.web.fakes import FakeEngineClient
from web.app import Gateway, build_gateway
from web.console.live import engine_state
from web.system.models import Fit, ModelEntry

FITS = Fit(True, "RAM", 8 << 30, 270 << 20, 46 << 20, 16, 2048, "none, float32")
TOO_BIG = Fit(False, "RAM", 8 << 30, 16 << 30, 256 << 20, 0, 2048, "none, float32")
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


class SwitchableFake(FakeEngineClient):
    """The fake engine with the real client's frozen config: it serves the model its config names."""

    def __init__(self) -> None:
        super().__init__(token_delay=0.05, completion_tokens=10)
        self.config = EngineConfig(model="/models/fake-model")
        self.started_models: list[str] = []

    async def start(self) -> ModelInfo:
        self.name = Path(self.config.model).name
        self.started_models.append(self.config.model)
        return await super().start()


class StubCatalog:
    def models(self, served: str, served_kv_bytes: int | None) -> Sequence[ModelEntry]:
        entries = [
            ModelEntry("fake-model", "/models/fake-model", "HF directory", 300 << 20, 135_000_000, FITS),
            ModelEntry("small", "/models/small", "HF directory", 200 << 20, 100_000_000, FITS),
            ModelEntry("huge.gguf", "/models/huge.gguf", "GGUF", 16 << 30, 8_000_000_000, TOO_BIG),
        ]
        return [replace(e, served=e.spec == served) for e in entries]


@pytest.fixture
def fake() -> FakeEngineClient:
    return SwitchableFake()


@pytest.fixture
def gateway(fake: FakeEngineClient, db_path: Path) -> Gateway:
    return build_gateway(web_config(db_path), fake, StubCatalog())


def _row(html: str, name: str) -> str:
    row = re.search(rf'<tr class="model[^"]*" data-model="{re.escape(name)}">(.*?)</tr>', html, re.S)
    assert row, html
    return row.group(1)


async def _serve(in_loop: InLoop, name: str) -> tuple[int, str]:
    page = await in_loop.http.get("/admin/models")
    token = _CSRF.search(page.text)
    assert token, page.text
    done = await in_loop.http.post("/admin/models/serve", data={"name": name, "csrf_token": token.group(1)})
    return done.status_code, done.text


async def test_the_page_lists_the_models_with_their_fit_and_marks_the_served_one(in_loop: InLoop) -> None:
    await sign_in(in_loop.http)
    page = await in_loop.http.get("/admin/models")
    assert page.status_code == 200, page.text
    served = _row(page.text, "fake-model")
    assert "served" in served and "Serve this model" not in served
    assert "fits: weights 270.0 MiB + KV for 16 chats of 2,048 tokens" in _row(page.text, "small")
    assert "Serve this model" in _row(page.text, "small")
    assert "does not fit" in _row(page.text, "huge.gguf")


async def test_a_model_that_does_not_fit_is_refused_and_nothing_restarts(in_loop: InLoop) -> None:
    await sign_in(in_loop.http)
    forged = await in_loop.http.post("/admin/models/serve", data={"name": "small", "csrf_token": "forged"})
    assert forged.status_code == 403
    status, html = await _serve(in_loop, "huge.gguf")
    assert status == 409 and "huge.gguf does not fit" in html
    assert isinstance(in_loop.fake, SwitchableFake) and in_loop.fake.started_models == ["/models/fake-model"]


async def test_a_switch_drains_then_serves_the_new_model(in_loop: InLoop) -> None:
    key = await new_key(in_loop.http)
    await sign_in(in_loop.http)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    in_loop.fake.token_delay = 0.15  # 1.5 s: the switch begins (and refuses) while it runs, however slow the box
    in_flight = asyncio.create_task(in_loop.http.post("/v1/chat/completions", json=body, headers=bearer(key)))
    await until(lambda: in_loop.gateway.inflight, "the request in flight")
    switching = asyncio.create_task(_serve(in_loop, "small"))
    await until(lambda: not in_loop.gateway.gate.readiness()[0], "the switch to refuse new requests")
    refused = await in_loop.http.post("/v1/chat/completions", json=body, headers=bearer(key))
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "not_ready" and "switching model to small" in error["message"]
    assert engine_state(in_loop.gateway.gate).label == "draining"  # the console's engine state
    finished = await in_flight
    assert finished.status_code == 200 and finished.json()["choices"][0]["finish_reason"] == "length"
    status, html = await switching
    assert status == 200 and "Now serving small." in html
    models = await in_loop.http.get("/v1/models", headers=bearer(key))
    assert [m["id"] for m in models.json()["data"]] == ["small"]
    assert "served" in _row(html, "small")


async def test_a_switch_does_not_end_a_shutdowns_drain(in_loop: InLoop) -> None:
    """SIGTERM during a switch's drain: the server keeps refusing as it shuts down once the switch is over."""
    gate = in_loop.gateway.models.gate
    key = await new_key(in_loop.http)
    await sign_in(in_loop.http)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    in_loop.fake.token_delay = 0.15  # 1.5 s: the switch begins (and refuses) while it runs, however slow the box
    in_flight = asyncio.create_task(in_loop.http.post("/v1/chat/completions", json=body, headers=bearer(key)))
    await until(lambda: in_loop.gateway.inflight, "the request in flight")
    switching = asyncio.create_task(_serve(in_loop, "small"))
    await until(lambda: gate.switch_draining, "the switch to drain")
    gate.draining = True  # what InFlight.drain does at shutdown
    _, (status, html) = await asyncio.gather(in_flight, switching)
    assert status == 409 and "the server is shutting down" in html
    assert gate.draining and gate.readiness() == (False, "draining: the server is shutting down")
    assert isinstance(in_loop.fake, SwitchableFake) and in_loop.fake.started_models == ["/models/fake-model"]
