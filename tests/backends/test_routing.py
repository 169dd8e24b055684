"""A gateway in front of two other appliances (random:tiny) as its remote backends, all real processes, with no
tokenizer copied onto the gateway (it fetches what each publishes) and ready only once it can serve: the requests
spread over both, history and usage are exact across them, upstream keys appear nowhere, a backend
SIGKILLed under load fails over with nothing lost, and a draining backend gets no new requests. The tests run in
file order on one set of servers (the last one drains a backend for good)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from appliance.doctor.backends import backends_finding
from appliance.settings import load_settings
from tests.web.conftest import ADMIN, METRICS_TOKEN, sign_in
from tests.web.server import SHARED_MODEL_CACHE, Server, free_port, serving, start_server

pytestmark = pytest.mark.slow
MODEL = "random:tiny"
TOKENIZER = SHARED_MODEL_CACHE / "random-tiny"  # the random model's tokenizer, which the backends write there
TERMINAL = {"finished", "failed", "cancelled", "rejected", "interrupted"}


@dataclass
class Fleet:
    gateway: Server
    backends: dict[str, Server]  # by the name history rows give them (host:port)
    upstream_keys: dict[str, str]
    key: str  # the gateway's API key
    entries: str  # its APPLIANCE_BACKENDS


def backend_name(server: Server) -> str:
    return server.url.removeprefix("http://")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    with serving(root / "a") as a, serving(root / "b") as b:
        keys = {backend_name(s): s.new_key("gateway") for s in (a, b)}
        # No #tokenizer= anywhere: the gateway fetches each backend's. b takes its prompts as text, as a server that
        # takes no token ids does (Ollama's /v1).
        options = {backend_name(a): "", backend_name(b): "#prompt=text"}
        entries = [f"http://:{keys[n]}@{n}{options[n]}" for n in map(backend_name, (a, b))]
        with serving(root / "gateway", backends=",".join(entries)) as gateway:
            servers = {backend_name(a): a, backend_name(b): b}
            fleet = Fleet(gateway, servers, keys, gateway.new_key("clients"), ",".join(entries))
            # Ready means servable: the model is listed the moment /ready says 200 (the chats follow in the tests).
            listed = httpx.get(gateway.url + "/v1/models", headers={"Authorization": f"Bearer {fleet.key}"}).json()
            assert [m["id"] for m in listed["data"]] == [MODEL]
            wait_for(lambda: all(s["state"] == "up" and s["models"] for s in statuses(fleet)), "both backends up")
            try:
                yield fleet
            finally:  # a backend the tests restarted is not the one serving() kills
                for backend in fleet.backends.values():
                    backend.kill()


def statuses(fleet: Fleet) -> list[dict[str, Any]]:
    response = httpx.get(fleet.gateway.url + "/admin/api/backends", headers=ADMIN, timeout=10)
    response.raise_for_status()
    return list(response.json())


def state_of(fleet: Fleet, name: str) -> str:
    return next(s["state"] for s in statuses(fleet) if s["name"] == name)


def wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError(f"not within {timeout} s: {what}")


def history(server: Server, **query: object) -> list[dict[str, Any]]:
    response = httpx.get(server.url + "/admin/api/requests", params={"limit": 500, **query}, headers=ADMIN)
    response.raise_for_status()
    return list(response.json()["data"])


@dataclass
class Outcome:
    request_id: str
    status: int
    tokens: int  # content deltas the client received
    finished: bool  # a finish_reason arrived
    error: dict[str, Any] | None


async def stream_chat(http: httpx.AsyncClient, fleet: Fleet, max_tokens: int, text: str) -> Outcome:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {fleet.key}"}
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        request_id = response.headers.get("x-request-id", "")
        if response.status_code != 200:
            return Outcome(request_id, response.status_code, 0, False, json.loads(await response.aread())["error"])
        tokens, finished, error = 0, False, None
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
                continue
            for choice in event.get("choices", []):
                tokens += 1 if choice["delta"].get("content") else 0
                finished = finished or choice.get("finish_reason") is not None
        return Outcome(request_id, 200, tokens, finished, error)


async def many(fleet: Fleet, n: int, max_tokens: int, during: Any = None) -> list[Outcome]:
    async with httpx.AsyncClient(base_url=fleet.gateway.url, timeout=120) as http:
        tasks = [asyncio.ensure_future(stream_chat(http, fleet, max_tokens, f"request {i}")) for i in range(n)]
        if during is not None:
            await during()
        return list(await asyncio.gather(*tasks))


def test_requests_spread_over_the_backends_with_exact_usage(fleet: Fleet) -> None:
    models = httpx.get(fleet.gateway.url + "/v1/models", headers={"Authorization": f"Bearer {fleet.key}"}).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    outcomes = asyncio.run(many(fleet, 24, 8))
    assert all(o.status == 200 and o.finished and o.error is None for o in outcomes), outcomes
    rows = {r["id"]: r for r in history(fleet.gateway)}
    ours = [rows[o.request_id] for o in outcomes]
    assert {r["status"] for r in ours} == {"finished"}
    spread = Counter(r["backend"] for r in ours)
    assert set(spread) == set(fleet.backends) and min(spread.values()) >= 4, spread
    # What each backend charged its key equals what the gateway recorded for the requests it sent there.
    for name, backend in fleet.backends.items():
        served = [r for r in history(backend) if r["status"] == "finished"]
        mine = [r for r in ours if r["backend"] == name]
        assert len(served) == len(mine)
        assert sum(r["prompt_tokens"] for r in served) == sum(r["prompt_tokens"] for r in mine)
        assert sum(r["completion_tokens"] for r in served) == sum(r["completion_tokens"] for r in mine) == 8 * len(mine)
    assert history(fleet.gateway, backend=next(iter(fleet.backends)))  # the history filters by backend
    # The gateway times each remote delta it relays (what it adds per token), per backend: at least every content
    # delta the clients read after each stream's first. (Fewer than 8 where the random model's byte tokens left a
    # character unfinished: a delta with no text is no frame, at the backend or here.)
    metrics = httpx.get(fleet.gateway.url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
    for name in fleet.backends:
        line = next(
            x for x in metrics.splitlines() if x.startswith(f'appliance_backend_relay_seconds_count{{backend="{name}"')
        )
        relayed = sum(o.tokens - 1 for o in outcomes if rows[o.request_id]["backend"] == name)
        assert relayed >= 2 * spread[name] and float(line.rsplit(" ", 1)[1]) >= relayed, (line, relayed)


def test_upstream_keys_appear_in_no_log_page_or_api(fleet: Fleet) -> None:
    gateway = fleet.gateway

    async def pages() -> list[str]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            await sign_in(http)
            console = [(await http.get(path)).text for path in ("/admin/backends", "/admin/history", "/admin")]
        api = [
            httpx.get(gateway.url + path, headers=ADMIN).text
            for path in ("/admin/api/backends", "/admin/api/requests", "/admin/api/stats")
        ]
        metrics = httpx.get(gateway.url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
        return [*console, *api, metrics]

    seen = asyncio.run(pages())
    assert all(name in "".join(seen[:3]) for name in fleet.backends)  # the console shows them
    for text in [gateway.log(), *seen]:
        assert not any(key in text for key in fleet.upstream_keys.values())
    assert all(s["url"] == f"http://{s['name']}" for s in statuses(fleet))
    # With only remote backends, the chat page and /ready name the model they serve.
    assert f'data-model="{MODEL}" data-max-model-len="2048"' in httpx.get(gateway.url + "/").text
    assert httpx.get(gateway.url + "/ready").json() == {"status": "ready", "model": MODEL}


def test_doctor_reports_each_backend_without_its_key(fleet: Fleet, tmp_path: Path) -> None:
    found = backends_finding(load_settings({"APPLIANCE_DATA_DIR": str(tmp_path), "APPLIANCE_BACKENDS": fleet.entries}))
    assert found.level == "ok", found
    assert all(f"{name} serves {MODEL}" in found.message for name in fleet.backends)
    assert not any(key in found.message for key in fleet.upstream_keys.values())
    dead = f"embedded,http://127.0.0.1:{free_port()}"
    down = backends_finding(load_settings({"APPLIANCE_DATA_DIR": str(tmp_path), "APPLIANCE_BACKENDS": dead}))
    assert down.level == "warn" and "none of 1 is up (this box serves alone)" in down.message


def test_a_backend_killed_under_load_fails_over_and_nothing_is_lost(fleet: Fleet) -> None:
    victim_name, victim = next(iter(fleet.backends.items()))
    survivor = next(n for n in fleet.backends if n != victim_name)
    before = {r["id"] for r in history(fleet.gateway)}

    async def kill_when_streaming() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            busy = next(s for s in statuses(fleet) if s["name"] == victim_name)["in_flight"]
            if busy >= 2:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # some of them are streaming now
        victim.process.send_signal(signal.SIGKILL)

    outcomes = asyncio.run(many(fleet, 16, 200, during=kill_when_streaming))
    victim.process.wait(10)
    rows = {r["id"]: r for r in history(fleet.gateway) if r["id"] not in before}
    assert len(rows) == len(outcomes)  # one row per request
    for o in outcomes:
        row = rows[o.request_id]
        assert row["status"] in TERMINAL
        if row["status"] == "finished":
            assert o.finished and o.error is None and row["completion_tokens"] == 200 and 0 < o.tokens <= 200
        else:  # cut mid-stream on the killed backend: the in-band error; the tokens streamed are charged
            assert row["status"] == "failed" and row["backend"] == victim_name, row
            assert o.error is not None and o.error["code"] == "engine_unavailable" and not o.finished
            assert row["completion_tokens"] >= o.tokens > 0
    assert any(r["backend"] == survivor and r["status"] == "finished" for r in rows.values())
    # New requests all go to the survivor, once the gateway knows (or on their retry before it does).
    after = asyncio.run(many(fleet, 6, 4))
    assert all(o.status == 200 and o.finished for o in after), after
    assert {r["backend"] for r in history(fleet.gateway) if r["id"] in {o.request_id for o in after}} == {survivor}
    wait_for(lambda: state_of(fleet, victim_name) == "down", "the killed backend shown down", 10)
    # It comes back on its port: the gateway sends it requests again.
    port = victim_name.rsplit(":", 1)[1]
    revived = start_server(victim.data_dir, port=port)
    revived.url = f"http://{victim_name}"
    fleet.backends[victim_name] = revived
    revived.wait_ready()
    wait_for(lambda: state_of(fleet, victim_name) == "up", "the restarted backend up again")


def test_a_draining_backend_gets_no_new_requests(fleet: Fleet) -> None:
    draining_name, draining = list(fleet.backends.items())[1]
    other = next(n for n in fleet.backends if n != draining_name)
    key = fleet.upstream_keys[draining_name]

    async def scenario() -> list[Outcome]:
        async with httpx.AsyncClient(base_url=draining.url, timeout=120) as direct:
            # Long enough that the drain outlasts the gateway's next probes (random:tiny is fast when idle).
            body = {"model": MODEL, "prompt": "x", "max_tokens": 1500, "ignore_eos": True}
            auth = {"Authorization": f"Bearer {key}"}
            longs = [asyncio.ensure_future(direct.post("/v1/completions", json=body, headers=auth)) for _ in range(8)]
            deadline = time.monotonic() + 30  # all eight admitted before the SIGTERM, however slow the box
            while (await direct.get("/admin/api/stats", headers=ADMIN)).json()["in_flight"] < 8:
                assert time.monotonic() < deadline, "the eight long requests were not all admitted in 30 s"
                await asyncio.sleep(0.05)
            draining.process.send_signal(signal.SIGTERM)  # it drains: the long requests still run
            deadline = time.monotonic() + 20
            while state_of(fleet, draining_name) != "draining" and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert state_of(fleet, draining_name) == "draining"
            outcomes = await many(fleet, 8, 4)
            assert all(r.status_code == 200 for r in await asyncio.gather(*longs))  # the drain let them finish
            return outcomes

    outcomes = asyncio.run(scenario())
    assert all(o.status == 200 and o.finished for o in outcomes), outcomes
    ids = {o.request_id for o in outcomes}
    assert {r["backend"] for r in history(fleet.gateway) if r["id"] in ids} == {other}
    assert draining.process.wait(60) == 0


def test_a_gateway_with_no_backend_up_refuses_in_the_api_shape(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    gateway = start_server(tmp_path, backends=f"http://127.0.0.1:{port}#tokenizer={TOKENIZER}")
    try:
        wait_for(lambda: _answers(gateway), "the gateway answers")
        ready = httpx.get(gateway.url + "/ready")
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "engine_unavailable"
        assert "no backend is up" in ready.json()["error"]["message"]
        key = gateway.new_key("clients")
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        refused = httpx.post(
            gateway.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"
        assert [s["state"] for s in httpx.get(gateway.url + "/admin/api/backends", headers=ADMIN).json()] == ["down"]
    finally:
        assert gateway.stop() == 0


def test_ready_and_the_console_say_why_a_backend_serves_nothing(fleet: Fleet, tmp_path: Path) -> None:
    """A wrong key, or an entry naming a model the server does not list: /ready (when nothing else can serve), the
    console's backends panel and the doctor each name the backend and the reason."""
    name = next(iter(fleet.backends))
    wrong_key = f"http://:sk-not-a-key@{name}"
    gateway = start_server(tmp_path / "wrong", backends=wrong_key)
    try:
        wait_for(lambda: _answers(gateway), "the gateway answers")
        wait_for(lambda: "first probe" not in httpx.get(gateway.url + "/ready").text, "the first probe", 20)
        ready = httpx.get(gateway.url + "/ready")
        assert ready.status_code == 503, ready.text
        message = ready.json()["error"]["message"]
        assert f"{name}: its model list answered 401 (a wrong key in its entry?)" in message, message
        [status] = httpx.get(gateway.url + "/admin/api/backends", headers=ADMIN).json()
        assert status["reason"] == "its model list answered 401 (a wrong key in its entry?)"
    finally:
        assert gateway.stop() == 0
    unlisted = f"http://:{fleet.upstream_keys[name]}@{name}#alias=no-such-model=other"
    for entry, why in [
        (wrong_key, "answered 401 (a wrong key in its entry?)"),
        (unlisted, "its entry names no-such-model, which it does not list"),
    ]:
        found = backends_finding(load_settings({"APPLIANCE_DATA_DIR": str(tmp_path), "APPLIANCE_BACKENDS": entry}))
        assert found.level == "fail" and why in found.message, found


def _answers(server: Server) -> bool:
    try:
        return httpx.get(server.url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
