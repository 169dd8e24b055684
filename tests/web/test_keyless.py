"""Keyless access (web/keys/keyless.py): with the operator's keyless key set, a request with no credential from
its networks runs as that key (caps, quota, history), GitHub Copilot's Ollama provider's sequence replayed as it
sends it; a wrong key is still 401, other networks and the admin's routes are never opened, and revoking the key
closes the door."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import httpx
import pytest

from appliance.settings import SettingsError, load_settings
from tests.web.conftest import ADMIN, MODEL, bearer, lifespan, rows, wait_ready, web_config
from tests.web.fakes import FakeEngineClient
from web.app import create_app
from web.keys.keyless import PRIVATE_NETWORKS, Keyless, parse_networks

Clients = Callable[[str], AbstractAsyncContextManager[httpx.AsyncClient]]


@asynccontextmanager
async def opened(db_path: Path, key_id: int) -> AsyncIterator[Clients]:
    """One app with keyless key `key_id` from the private ranges, and clients calling it from any address."""
    app = create_app(web_config(db_path, keyless=Keyless(key_id, parse_networks(PRIVATE_NETWORKS))), FakeEngineClient())

    @asynccontextmanager
    async def client_from(host: str) -> AsyncIterator[httpx.AsyncClient]:
        transport = httpx.ASGITransport(app=app, client=(host, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://appliance", timeout=30) as http:
            yield http

    async with lifespan(app):
        async with client_from("127.0.0.1") as http:
            await wait_ready(http)
        yield client_from


async def make_key(http: httpx.AsyncClient, **limits: object) -> tuple[int, str]:
    response = await http.post("/admin/api/keys", json={"name": "copilot", **limits}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return int(response.json()["info"]["id"]), str(response.json()["key"])


async def test_copilot_runs_as_the_keyless_key_from_the_lan(db_path: Path, db: sqlite3.Connection) -> None:
    async with opened(db_path, key_id=1) as client_from:
        async with client_from("192.168.1.20") as lan:
            key_id, key = await make_key(lan, quota_tokens=40, quota_period="none", max_tokens_per_request=8)
            assert key_id == 1
            # microsoft/vscode-copilot-chat, src/extension/byok/vscode-node/ollamaProvider.ts: the version, the
            # tags, /api/show per model, all without an Authorization header; then chat at /v1/chat/completions
            # with "Bearer " and the (unset) key, which is empty.
            assert (await lan.get("/api/version")).status_code == 200
            tags = (await lan.get("/api/tags")).json()["models"]
            assert [m["model"] for m in tags] == [MODEL]
            shown = (await lan.post("/api/show", json={"model": MODEL})).json()
            assert "completion" in shown["capabilities"]
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
            chat = await lan.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer "})
            assert chat.status_code == 200, chat.text
            assert chat.headers["x-max-tokens-trimmed-to"] == "8"  # the keyless key's cap applies
            row = rows(db, "SELECT key_id, status FROM requests WHERE id = ?", chat.headers["x-request-id"])[0]
            assert (row["key_id"], row["status"]) == (key_id, "finished")
            # Its quota is the keyless requests' quota: spent, they are refused as the key's would be.
            for _ in range(6):
                last = await lan.post("/api/chat", json={"model": MODEL, "messages": body["messages"]})
                if last.status_code == 429:
                    break
            assert last.status_code == 429, last.text
            usage = (await lan.get(f"/admin/api/keys/{key_id}", headers=ADMIN)).json()["usage"]
            assert usage["used_tokens"] <= 40 and usage["reserved_tokens"] == 0

            # A key sent is judged alone: a wrong one is 401, never keyless.
            wrong = await lan.get("/api/tags", headers=bearer("sk-wrong"))
            assert wrong.status_code == 401
            # The admin's routes and the console never open this way.
            assert (await lan.get("/admin/api/keys")).status_code == 401

        async with client_from("203.0.113.7") as outside:  # not in the networks: a key is needed
            assert (await outside.get("/api/tags")).status_code == 401
            assert (await outside.get("/api/tags", headers=bearer(key))).status_code == 200  # the key itself works
            response = await outside.get("/v1/models")
            assert response.status_code == 401 and response.json()["error"]["code"] == "missing_api_key"
        async with client_from("::ffff:10.0.0.9") as mapped:  # an IPv4 client on a dual-stack socket
            assert (await mapped.get("/api/tags")).status_code == 200

        async with client_from("10.1.1.1") as lan:
            assert (await lan.post(f"/admin/api/keys/{key_id}/revoke", headers=ADMIN)).status_code == 200
            assert (await lan.get("/api/tags")).status_code == 401
            closed = await lan.get("/v1/models")
            assert closed.status_code == 401 and closed.json()["error"]["code"] == "missing_api_key"


async def test_without_the_setting_no_request_goes_keyless(db_path: Path) -> None:
    app = create_app(web_config(db_path), FakeEngineClient())
    async with lifespan(app):
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://appliance") as http:
            await wait_ready(http)
            await make_key(http)
            assert (await http.get("/api/tags")).status_code == 401


def test_the_settings_check_the_networks_and_the_id(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("APPLIANCE_KEYLESS_NETWORKS", "10.0.0.0/8, 192.168.5.7")
    monkeypatch.setenv("APPLIANCE_KEYLESS_KEY_ID", "3")
    settings = load_settings()
    keyless = Keyless(settings.keyless_key_id, parse_networks(settings.keyless_networks))
    assert keyless.key_for("192.168.5.7") == 3 and keyless.key_for("192.168.5.8") is None
    assert keyless.key_for("testclient") is None and keyless.key_for(None) is None
    monkeypatch.setenv("APPLIANCE_KEYLESS_NETWORKS", "10.0.0.0/8,the-lan")
    with pytest.raises(SettingsError, match="KEYLESS_NETWORKS: 'the-lan' is not an address"):
        load_settings()
    monkeypatch.setenv("APPLIANCE_KEYLESS_NETWORKS", "10.0.0.0/8")
    monkeypatch.setenv("APPLIANCE_KEYLESS_KEY_ID", "0")
    with pytest.raises(SettingsError, match="KEYLESS_KEY_ID"):
        load_settings()
