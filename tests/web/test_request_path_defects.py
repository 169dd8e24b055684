"""Issue 17's defects on the request path (H1, H2, C1, P1; tests/robustness/BUGS.md keeps the record): a
cancelled stream keeps its queue wait, an engine crash is visible and named, integral-float token counts and
stream_options are judged as OpenAI and vLLM do, and a prompt far past the context is refused untokenized."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from engine import RequestOutput, Timings
from tests.web.conftest import (
    ADMIN,
    METRICS_TOKEN,
    MODEL,
    InLoop,
    assert_openai_error,
    bearer,
    new_key,
    rows,
    sign_in,
)
from tests.web.fakes import FakeTokenizer
from tests.web.test_lifecycle import CHAT, call_then_disconnect
from web.openai.service import MAX_CHARS_PER_TOKEN


async def test_a_stream_cancelled_after_its_first_token_keeps_its_queue_wait(
    in_loop: InLoop, db: sqlite3.Connection
) -> None:
    in_loop.fake.token_delay = 0.05  # scheduled, then the first token 50 ms later
    key = await new_key(in_loop.http)
    body = {**CHAT, "stream": True, "max_tokens": 200, "ignore_eos": True}
    await call_then_disconnect(in_loop.app, key, body, after_chunks=3)
    await in_loop.gateway.writer.flush()
    (row,) = rows(db, "SELECT status, admitted_at, first_token_at, queue_wait_s, ttft_s FROM requests")
    assert row["status"] == "cancelled" and row["first_token_at"] is not None
    assert row["admitted_at"] is not None and row["queue_wait_s"] is not None
    assert 0 <= row["queue_wait_s"] < row["ttft_s"]  # the engine's schedule time, not the first token's


def test_a_merged_delta_keeps_the_first_deltas_timings() -> None:
    first = RequestOutput("r", [1], "a", timings=Timings(1.0, 2.0, 3.0, None))
    first.merge(RequestOutput("r", [2], "b"))
    assert first.timings == Timings(1.0, 2.0, 3.0, None)


async def _engine_state(http: Any) -> str:
    """The dashboard's engine-state partial, as htmx polls it."""
    response = await http.get("/admin", headers={"HX-Request": "true", "HX-Target": "engine-state"})
    assert response.status_code == 200, response.text
    return str(response.text)


async def test_an_engine_crash_is_named_to_clients_the_console_stats_and_metrics(in_loop: InLoop) -> None:
    fake, http = in_loop.fake, in_loop.http
    key = await new_key(http)
    await sign_in(http)  # before the crash: hashing the password on a slow machine outlasted the restart
    fake.kill()
    down = assert_openai_error(await http.post("/v1/chat/completions", json=CHAT, headers=bearer(key)), 503)
    assert down["code"] == "engine_unavailable" and "code -9" in down["message"]
    fake.start_delay = 3.0  # long enough for every check below, even on a loaded CI machine
    restarting = asyncio.create_task(fake.restart())
    await asyncio.sleep(0.05)
    refused = assert_openai_error(await http.post("/v1/completions", json={"model": MODEL, "prompt": "x"},
                                                  headers=bearer(key)), 503, "engine_unavailable")  # fmt: skip
    assert "restarting: after a crash (1 restart; last: the engine process exited (code -9))" in refused["message"]
    assert_openai_error(await http.get("/ready"), 503, "engine_unavailable")
    fragment = await _engine_state(http)
    assert "restarting: after a crash (1 restart; last: the engine process exited (code -9))" in fragment
    assert 'data-state="loading"' not in fragment
    stats = (await http.get("/admin/api/stats", headers=ADMIN)).json()
    assert (stats["restarts"], stats["last_exit"]) == (1, "the engine process exited (code -9)")
    scraped = (await http.get("/metrics", headers=bearer(METRICS_TOKEN))).text
    assert "appliance_engine_restarts_total 1.0" in scraped
    await restarting
    assert (await http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))).status_code == 200
    assert "1 restart after a crash" in await _engine_state(http)


async def test_integral_float_max_tokens_are_counts(in_loop: InLoop) -> None:
    key = await new_key(in_loop.http)
    for body in ({**CHAT, "max_tokens": 3.0}, {**CHAT, "max_completion_tokens": 3.0}):
        answered = await in_loop.http.post("/v1/chat/completions", json={**body, "ignore_eos": True},
                                           headers=bearer(key))  # fmt: skip
        assert answered.status_code == 200, answered.text
        assert answered.json()["usage"]["completion_tokens"] == 3
    completion = {"model": MODEL, "prompt": "hi", "max_tokens": 2.0, "ignore_eos": True}
    answered = await in_loop.http.post("/v1/completions", json=completion, headers=bearer(key))
    assert answered.status_code == 200 and answered.json()["usage"]["completion_tokens"] == 2
    fraction = await in_loop.http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2.5}, headers=bearer(key))
    assert_openai_error(fraction, 400, param="max_tokens")


async def test_stream_options_need_stream(in_loop: InLoop) -> None:
    key = await new_key(in_loop.http)
    options = {"stream_options": {"include_usage": True}}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"model": MODEL, "prompt": "hi"})):
        refused = await in_loop.http.post(path, json={**body, **options}, headers=bearer(key))
        assert assert_openai_error(refused, 400, param="stream_options")["type"] == "invalid_request_error"
        streamed = await in_loop.http.post(path, json={**body, **options, "stream": True}, headers=bearer(key))
        assert streamed.status_code == 200, streamed.text


class _CountingTokenizer(FakeTokenizer):
    def __init__(self) -> None:
        self.chars = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.chars += len(text)
        return super().encode(text, add_special_tokens)


async def test_a_prompt_past_what_the_context_can_hold_is_refused_untokenized(in_loop: InLoop) -> None:
    in_loop.fake.tokenizer = tokenizer = _CountingTokenizer()
    key = await new_key(in_loop.http)
    huge = "x" * (in_loop.fake.max_model_len * MAX_CHARS_PER_TOKEN + 1)
    chat = {**CHAT, "messages": [{"role": "user", "content": huge}]}
    calls = (
        ("/v1/chat/completions", chat, "messages"),
        ("/v1/completions", {"model": MODEL, "prompt": huge}, "prompt"),
    )
    for path, body, param in calls:
        refused = await in_loop.http.post(path, json=body, headers=bearer(key))
        assert_openai_error(refused, 400, "context_length_exceeded", param)
    assert tokenizer.chars == 0
