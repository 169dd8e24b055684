"""Driving the chat page from tests: open it with a key, send a message, check that hostile text stayed inert."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.sync_api import Page

XSS_IMG = "<img src=x onerror=window.__xss=1>"
XSS_SCRIPT = "<script>window.__xss=1</script>"


def open_chat(page: Page, key: str, max_tokens: int | None = 16) -> None:
    """Open the chat with `key` (asked for on a first visit, else set in the settings) and a max_tokens (None: an
    empty field, the page's default: no particular length)."""
    page.goto("/")
    if page.locator("#key-input").is_visible():  # first visit: the page asks for a key
        page.fill("#key-input", key)
        page.click("#key-form button")
        page.click("#toggle-settings")
    else:
        page.click("#toggle-settings")
        page.fill("#api-key", key)
    page.fill("#max-tokens", "" if max_tokens is None else str(max_tokens))
    page.press("#max-tokens", "Tab")
    page.click("#toggle-settings")


def send(page: Page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def assert_inert(page: Page) -> None:
    """No payload ran (window.__xss unset) and none became an element: no injected image or script, and no
    link to anything but http(s)."""
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.locator("img[src='x'], img[src$='/x']").count() == 0
    assert page.evaluate("[...document.scripts].every(s => s.src && !s.textContent.includes('__xss'))")
    hrefs = page.evaluate("[...document.querySelectorAll('a')].map(a => a.protocol)")
    assert all(p in ("http:", "https:") for p in hrefs), hrefs


def store_conversation(page: Page, conversation: dict[str, Any]) -> None:
    """Put one conversation in the page's localStorage, as the chat itself would have kept it, and reload."""
    stored = {"conversations": [conversation], "currentId": conversation["id"]}
    page.evaluate("(s) => localStorage.setItem('appliance.conversations.v1', s)", json.dumps(stored))
    page.reload()
