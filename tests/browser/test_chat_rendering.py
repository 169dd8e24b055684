"""How the chat page renders a reply's Markdown in a real browser: GFM tables, nested lists, highlighted code,
links only to http(s), and every library served by the appliance itself (the page works offline)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.browser.chat_page import XSS_IMG, XSS_SCRIPT, assert_inert, open_chat, store_conversation
from tests.browser.conftest import SCREENSHOTS, Server

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

expect = pytest.importorskip("playwright.sync_api").expect

REPLY = f"""| Model | Size | Note |
|:------|-----:|:----:|
| SmolLM2 | 135M | `{XSS_IMG}` |
| *tiny* | 1M | {XSS_SCRIPT} |

1. Install
   - with **make**
     - then `make run`
   - or by hand
2. Serve

```python
def answer(question: str) -> str:
    return "Paris"
```

```
plain {XSS_IMG}
```

Links: [mail](mailto:a@b.c), [data](data:text/html,<script>window.__xss=1</script>), [relative](/admin),
[vb](vbscript:msgbox), <javascript:window.__xss=1>, https://example.com/bare and ![pic](https://example.com/p.png)
"""


def show(page: Page, content: str) -> Locator:
    """The assistant message that shows `content`, stored as the chat would have kept it."""
    store_conversation(
        page,
        {
            "id": "rendering",
            "title": "Rendering",
            "system": "",
            "temperature": 0.7,
            "maxTokens": 8,
            "updated": 1,
            "messages": [{"role": "user", "content": "show me"}, {"role": "assistant", "content": content}],
        },
    )
    return page.locator(".message.assistant")


@pytest.fixture
def reply(page: Page, server: Server) -> Locator:
    open_chat(page, server.new_key("rendering"))
    return show(page, REPLY)


def test_tables_have_header_cells_and_column_alignment(page: Page, reply: Locator) -> None:
    table = reply.locator("table")
    expect(table.locator("thead th")).to_have_text(["Model", "Size", "Note"])
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table.locator("tbody tr").first.locator("td")).to_have_text(["SmolLM2", "135M", XSS_IMG])
    expect(table.locator("tbody td em")).to_have_text("tiny")
    aligns = (
        table.locator("tbody tr >> nth=0")
        .locator("td")
        .evaluate_all("cells => cells.map(c => getComputedStyle(c).textAlign)")
    )
    assert aligns == ["left", "right", "center"], aligns
    expect(table.locator("tbody tr").nth(1).locator("td").nth(2)).to_have_text(XSS_SCRIPT)
    assert_inert(page)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "chat-markdown.png"), full_page=True)


def test_nested_lists_keep_their_levels(reply: Locator) -> None:
    outer = reply.locator(".content > ol")
    expect(outer.locator(":scope > li")).to_have_count(2)
    second_level = outer.locator(":scope > li > ul > li")
    expect(second_level).to_have_count(2)
    expect(second_level.first.locator("strong")).to_have_text("make")
    expect(outer.locator(":scope > li > ul > li > ul > li code")).to_have_text("make run")


def test_code_blocks_are_highlighted_by_language_and_stay_text(page: Page, reply: Locator) -> None:
    python = reply.locator("pre code.language-python")
    expect(python).to_contain_text('def answer(question: str) -> str:\n    return "Paris"')
    expect(python.locator("span.hljs-keyword").first).to_have_text("def")
    expect(python.locator("span.hljs-string")).to_have_text('"Paris"')
    colour = python.locator("span.hljs-keyword").first.evaluate("k => getComputedStyle(k).color")
    plain = python.evaluate("c => getComputedStyle(c).color")
    assert colour != plain, "the highlight.js theme is served and applied"
    untagged = reply.locator("pre code").nth(1)
    expect(untagged).to_have_text(f"plain {XSS_IMG}")
    expect(untagged.locator("span")).to_have_count(0)
    assert_inert(page)


def test_only_http_links_become_links(page: Page, reply: Locator) -> None:
    links = reply.locator("a")
    hrefs = links.evaluate_all("links => links.map(a => a.href)")
    assert hrefs == ["https://example.com/bare", "https://example.com/p.png"], hrefs  # an image is only a link
    for label in ("mail", "data", "relative", "vb", "javascript:window.__xss=1", "!pic"):
        expect(reply).to_contain_text(label)
    expect(links.first).to_have_attribute("rel", "noopener noreferrer nofollow")
    expect(links.first).to_have_attribute("target", "_blank")
    expect(reply.locator("img")).to_have_count(0)
    assert_inert(page)


def test_a_reply_still_streaming_shows_its_open_code_block(page: Page, server: Server) -> None:
    open_chat(page, server.new_key("streaming code"))
    reply = show(page, "Here:\n\n```python\nimport os\nprint(os.getcwd(")
    expect(reply.locator("pre code.language-python")).to_have_text("import os\nprint(os.getcwd(")


def test_the_page_loads_everything_from_the_appliance(page: Page, server: Server) -> None:
    """Offline: every script, style and module the chat page loads comes from the appliance itself."""
    requested: list[dict[str, Any]] = []
    page.on("request", lambda r: requested.append({"url": r.url, "type": r.resource_type}))
    open_chat(page, server.new_key("offline"))
    show(page, "```python\nx = 1\n```")
    expect(page.locator(".message.assistant span.hljs-number")).to_have_text("1")
    assert requested and all(r["url"].startswith((server.url + "/", "data:")) for r in requested), requested
    loaded = {r["url"].removeprefix(server.url) for r in requested}
    for path in (
        "/static/vendor/markdown-it.min.js",
        "/static/vendor/purify.js",
        "/static/vendor/highlight.min.js",
        "/static/vendor/highlight-github.min.css",
    ):
        assert path in loaded, sorted(loaded)
