"""The chat page in a real browser against a real appliance: streaming, Stop, keyboard, errors, inert XSS."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tests.browser.chat_page import XSS_IMG, XSS_SCRIPT, assert_inert, open_chat, send, store_conversation
from tests.browser.conftest import SCREENSHOTS, Server

if TYPE_CHECKING:
    from playwright.sync_api import Page

expect = pytest.importorskip("playwright.sync_api").expect


def test_reply_streams_then_stop_cancels_on_the_server(page: Page, server: Server) -> None:
    open_chat(page, server.new_key("streaming"), max_tokens=12)
    send(page, "Say something")
    reply = page.locator(".message.assistant").last
    expect(reply.locator(".stats")).to_contain_text("TTFT", timeout=30_000)
    expect(reply.locator(".stats")).to_contain_text("tok/s")
    expect(reply.locator(".stats")).to_contain_text("completion tokens")

    page.click("#toggle-settings")
    page.fill("#max-tokens", "1500")
    page.press("#max-tokens", "Tab")
    page.click("#toggle-settings")
    send(page, "Now write a very long story")
    reply = page.locator(".message.assistant").last
    expect(page.locator("#stop")).to_be_visible()
    lengths = []
    for _ in range(40):  # the reply grows piece by piece while the stream is open
        lengths.append(len(reply.inner_text()))
        if len(set(lengths)) >= 3:
            break
        time.sleep(0.25)
    assert len(set(lengths)) >= 3, f"the reply did not grow in steps: {lengths}"
    page.click("#stop")
    expect(reply.locator(".stats")).to_contain_text("stopped")
    expect(page.locator("#send")).to_be_visible()
    stopped_at = len(reply.inner_text())
    time.sleep(0.6)
    assert len(reply.inner_text()) == stopped_at

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        rows = server.requests(limit=1)
        if rows and rows[0]["status"] == "cancelled":
            break
        time.sleep(0.3)
    assert rows[0]["status"] == "cancelled", rows[0]
    assert rows[0]["completion_tokens"] < 1500


def test_keyboard_conversations_and_phone_screen(page: Page, server: Server) -> None:
    page.set_viewport_size({"width": 390, "height": 800})
    open_chat(page, server.new_key("phone"), max_tokens=4)
    page.fill("#prompt", "first line")
    page.press("#prompt", "Shift+Enter")
    page.locator("#prompt").press_sequentially("second line")
    assert page.locator(".message").count() == 0
    page.press("#prompt", "Enter")
    expect(page.locator(".message.user").first).to_have_text("first line\nsecond line")
    expect(page.locator(".message.assistant .stats")).to_contain_text("TTFT", timeout=30_000)
    expect(page.locator("#sidebar")).not_to_be_in_viewport()
    page.click("#toggle-sidebar")
    expect(page.locator("#sidebar")).to_be_in_viewport()
    expect(page.locator("#conversations li.active .open")).to_have_text("first line")

    page.on("dialog", lambda dialog: dialog.accept("Renamed chat"))
    page.click("#conversations li.active .rename")
    expect(page.locator("#conversations li.active .open")).to_have_text("Renamed chat")
    page.click("#new-chat")
    expect(page.locator("#conversations li")).to_have_count(2)
    page.reload()
    expect(page.locator("#conversations li")).to_have_count(2)
    page.click("#toggle-sidebar")
    page.locator("#conversations li", has_text="Renamed chat").locator(".delete").click()
    expect(page.locator("#conversations li")).to_have_count(1)


def test_a_small_quota_answers_the_first_message(page: Page, server: Server) -> None:
    """Issue 17, Q1: the page asked for 512 tokens, and a key with a 500-token monthly quota was refused on its
    first message (with a Retry-After of a month). Now the page asks for no particular length and the server
    runs a request with what the quota has left."""
    open_chat(page, server.new_key("small quota", quota_tokens=500, quota_period="month"), max_tokens=None)
    send(page, "hello")
    expect(page.locator(".message.assistant").last).not_to_have_text("")
    expect(page.locator(".message.assistant .error")).to_have_count(0)
    with server.admin() as api:
        key_id = next(k["id"] for k in api.get("/admin/api/keys").json() if k["name"] == "small quota")
    deadline = time.monotonic() + 30
    while not (rows := server.requests(key_id=key_id, status="finished")) and time.monotonic() < deadline:
        time.sleep(0.1)
    (row,) = rows
    assert row["max_tokens_requested"] is None and row["max_tokens_applied"] <= 500 - row["prompt_tokens"]


def test_refusals_are_explained_in_plain_words(page: Page, server: Server) -> None:
    open_chat(page, server.new_key("tiny quota", quota_tokens=20), max_tokens=64)
    send(page, "hello")
    expect(page.locator(".message.assistant .error")).to_contain_text("quota is used up")

    key = server.new_key("to revoke")
    with server.admin() as api:
        key_id = next(k["id"] for k in api.get("/admin/api/keys").json() if k["name"] == "to revoke")
        assert api.post(f"/admin/api/keys/{key_id}/revoke").status_code == 200
    open_chat(page, key)
    send(page, "hello")
    expect(page.locator(".message.assistant .error").last).to_contain_text("revoked")

    open_chat(page, "sk-not-a-key")
    send(page, "hello")
    expect(page.locator(".message.assistant .error").last).to_contain_text("not accepted")


def test_untrusted_text_stays_inert(page: Page, server: Server) -> None:
    open_chat(page, server.new_key("xss"), max_tokens=8)
    send(page, f"{XSS_IMG} {XSS_SCRIPT} [x](javascript:window.__xss=1)")
    expect(page.locator(".message.assistant .stats")).to_contain_text("TTFT", timeout=30_000)
    expect(page.locator(".message.user")).to_contain_text(XSS_IMG)
    assert_inert(page)

    hostile = (
        f"# Title\nClick [me](javascript:window.__xss=1) or [me too](JaVaScRiPt:window.__xss=1).\n\n"
        f"{XSS_IMG} {XSS_SCRIPT}\n\n**bold** and *italic* and `{XSS_IMG}` and [docs](https://example.com/docs)\n\n"
        f"```html\n{XSS_SCRIPT}\n```\n- one\n- two <b onmouseover=window.__xss=1>x</b>\n"
    )
    conversation = {
        "id": "hostile",
        "title": XSS_IMG,
        "system": "",
        "temperature": 0.7,
        "maxTokens": 8,
        "updated": 1,
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": hostile}],
    }
    store_conversation(page, conversation)
    reply = page.locator(".message.assistant")
    expect(reply.locator("h3")).to_have_text("Title")
    expect(reply.locator("strong")).to_have_text("bold")
    expect(reply.locator("em")).to_have_text("italic")
    expect(reply.locator("pre code")).to_have_text(XSS_SCRIPT)
    expect(reply.locator("li")).to_have_count(2)
    link = reply.locator("a")
    expect(link).to_have_count(1)
    expect(link).to_have_attribute("href", "https://example.com/docs")
    expect(link).to_have_attribute("target", "_blank")
    expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
    expect(reply).to_contain_text("Click me or me too.")
    expect(reply).to_contain_text(XSS_IMG)
    expect(page.locator("#chat-title")).to_have_text(XSS_IMG)
    page.hover(".message.assistant li >> nth=1")
    assert_inert(page)


EXAMPLE_REPLY = """Use the official `openai` client with this appliance's address and your key:

```python
from openai import OpenAI

client = OpenAI(base_url="http://appliance.lan:8000/v1", api_key="sk-...")
reply = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}])
```

- **Streaming** works too: pass `stream=True`.
- Your key's *max_tokens cap* and quota still apply."""


def test_overload_is_explained_with_the_retry_time(page: Page, server: Server) -> None:
    open_chat(page, server.new_key("overload"))
    body = {
        "error": {"message": "the server is overloaded", "type": "server_error", "param": None, "code": "overloaded"}
    }
    page.route(
        "**/v1/chat/completions", lambda route: route.fulfill(status=503, headers={"Retry-After": "7"}, json=body)
    )
    send(page, "hello")
    expect(page.locator(".message.assistant .error")).to_have_text(
        "The server is overloaded right now. Try again in 7 s."
    )


def test_chat_screenshot(page: Page, server: Server) -> None:
    """Into artifacts/ only (the README's come from tests/browser/screenshots.py, with the bundled model): the first
    exchange is stored in the browser (the tiny test model writes random words) to show the Markdown rendering;
    the second reply streams live from the appliance."""
    open_chat(page, server.new_key("screenshot"), max_tokens=24)
    example = [
        {"role": "user", "content": "How do I call the appliance from Python?"},
        {
            "role": "assistant",
            "content": EXAMPLE_REPLY,
            "stats": {
                "ttftMs": 84,
                "tokensPerS": 41.7,
                "promptTokens": 31,
                "completionTokens": 112,
                "finishReason": "stop",
            },
        },
    ]
    store_conversation(
        page,
        {
            "id": "shot",
            "title": "Calling the API",
            "system": "",
            "temperature": 0.7,
            "maxTokens": 24,
            "updated": 1,
            "messages": example,
        },
    )
    send(page, "And what does the random test model say?")
    expect(page.locator(".message.assistant").nth(1).locator(".stats")).to_contain_text("TTFT", timeout=30_000)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "chat.png"))
