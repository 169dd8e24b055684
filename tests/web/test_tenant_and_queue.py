"""Issue 12 on the request path: each request reaches the engine as its key's tenant (id, weight, class), and a
streamed request that waits for a seat tells its client where it stands with SSE comments."""

from __future__ import annotations

from typing import Any

from engine import Tenant
from tests.web.conftest import ADMIN, bearer, new_key
from tests.web.fakes import FakeEngineClient

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def test_each_request_reaches_the_engine_as_its_keys_tenant(client: Any, fake: FakeEngineClient) -> None:
    chat_key = await new_key(client, "chat")
    batch_key = await new_key(client, "nightly", weight=0.5, priority="batch")
    listed = {k["name"]: k["id"] for k in (await client.get("/admin/api/keys", headers=ADMIN)).json()}
    assert (await client.post("/v1/chat/completions", json=CHAT, headers=bearer(chat_key))).status_code == 200
    body = {"model": "fake-model", "prompt": "go", "max_tokens": 2, "stream": True}
    assert (await client.post("/v1/completions", json=body, headers=bearer(batch_key))).status_code == 200
    assert list(fake.tenants.values()) == [
        Tenant(str(listed["chat"]), 1.0, "interactive"),
        Tenant(str(listed["nightly"]), 0.5, "batch"),
    ]
    await client.patch(f"/admin/api/keys/{listed['nightly']}", json={"weight": 4}, headers=ADMIN)
    assert (await client.post("/v1/completions", json=body, headers=bearer(batch_key))).status_code == 200
    assert list(fake.tenants.values())[-1] == Tenant(str(listed["nightly"]), 4.0, "batch"), "a change applies at once"
