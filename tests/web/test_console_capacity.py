"""Capacity in words (issue 16): the console says how many more chats of the recent typical length fit in the free
KV blocks, from the live block numbers and the history's finished requests."""

from __future__ import annotations

import re

from tests.web.conftest import InLoop, bearer, new_key, sign_in
from tests.web.test_lifecycle import CHAT


async def _capacity(in_loop: InLoop) -> str:
    counters = await in_loop.http.get("/admin", headers={"HX-Request": "true", "HX-Target": "engine-counters"})
    assert counters.status_code == 200, counters.text
    found = re.search(r'data-metric="capacity">([^<]*)<', counters.text)
    assert found, counters.text
    return found.group(1)


async def test_the_console_says_how_many_more_typical_chats_fit(in_loop: InLoop) -> None:
    await sign_in(in_loop.http)
    # The fake engine: 64 blocks of 16 tokens, 16 in use, so 48 free.
    before = await _capacity(in_loop)
    assert before.startswith("No room for another 2,000-token chat"), before  # 125 blocks each: none fit
    assert "no finished requests yet" in before

    key = await new_key(in_loop.http)
    for _ in range(3):
        response = await in_loop.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
        assert response.status_code == 200, response.text
    tokens = response.json()["usage"]["total_tokens"]
    await in_loop.gateway.writer.flush()
    blocks = -(-tokens // 16)
    assert await _capacity(in_loop) == f"Room for about {48 // blocks} more {tokens}-token chats."
