"""The chat page while its request waits for a seat: the server's queue comments become "Waiting for a seat —
3rd in line, about 4 s", replaced by the reply when its first token comes, and never kept with the conversation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.browser.chat_page import open_chat, send
from tests.browser.conftest import Server

if TYPE_CHECKING:
    from playwright.sync_api import Page

expect = pytest.importorskip("playwright.sync_api").expect

# The page's own fetch, with /v1/chat/completions answered by a stream that is queued until the test releases it:
# the server's queue is not something a test can hold still on a real engine.
QUEUED_STREAM = """
const realFetch = window.fetch.bind(window);
window.fetch = (url, options) => {
  if (!String(url).endsWith("/v1/chat/completions")) return realFetch(url, options);
  const encoder = new TextEncoder();
  const body = new ReadableStream({
    async start(controller) {
      controller.enqueue(encoder.encode(": queued position=3 eta=4\\n\\n"));
      await new Promise((resolve) => { window.releaseQueue = resolve; });
      controller.enqueue(encoder.encode(": queued position=2 eta=2\\n\\n"));
      await new Promise((resolve) => { window.releaseQueue = resolve; });
      const chunk = { choices: [{ index: 0, delta: { role: "assistant", content: "Seated at last." } }] };
      controller.enqueue(encoder.encode(`data: ${JSON.stringify(chunk)}\\n\\ndata: [DONE]\\n\\n`));
      controller.close();
    },
  });
  return Promise.resolve(new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } }));
};
"""


def test_a_queued_reply_says_where_it_stands_until_it_starts(page: Page, server: Server) -> None:
    page.add_init_script(QUEUED_STREAM)
    open_chat(page, server.new_key("queued"))
    send(page, "Anyone there?")
    reply = page.locator(".message.assistant").last
    expect(reply.locator(".waiting")).to_have_text("Waiting for a seat — 3rd in line, about 4 s")
    page.evaluate("window.releaseQueue()")
    expect(reply.locator(".waiting")).to_have_text("Waiting for a seat — 2nd in line, about 2 s")
    page.evaluate("window.releaseQueue()")
    expect(reply.locator(".content")).to_have_text("Seated at last.")
    expect(reply.locator(".waiting")).to_have_count(0)
    stored = page.evaluate("JSON.stringify(localStorage)")
    assert "Seated at last." in stored and "Waiting for a seat" not in stored
