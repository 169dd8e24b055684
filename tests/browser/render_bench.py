"""How long the chat takes to render a reply's Markdown (markdown-it, highlight.js, DOMPurify) in Debian's chromium,
by reply length: a streamed reply is rendered again at each repaint. Prints numbers; asserts nothing.

    python -m tests.browser.render_bench
"""

from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS
from web.static import STATIC_DIR

BLOCK = (
    "Here is a table and some code:\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\n- one\n  - two\n\n"
    "```python\ndef f(x: int) -> int:\n    return x * 2  # doubled\n```\n\n"
    "Some **bold** text, a https://example.com link.\n\n"
)
ROUNDS = 50
TIMED = """async ([text, rounds]) => {
  const { renderMarkdown } = await import("/js/markdown.js");
  renderMarkdown(text);
  const begun = performance.now();
  for (let i = 0; i < rounds; i++) renderMarkdown(text);
  return (performance.now() - begun) / rounds;
}"""


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def main() -> None:
    from playwright.sync_api import sync_playwright

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(STATIC_DIR)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{httpd.server_address[1]}/css/app.css")  # any page of that origin
            for blocks in (1, 10, 40, 100):
                ms = page.evaluate(TIMED, [BLOCK * blocks, ROUNDS])
                print(f"{len(BLOCK) * blocks:6d} characters: {ms:6.2f} ms per render")
            browser.close()
    finally:
        httpd.shutdown()
        httpd.server_close()


if __name__ == "__main__":
    main()
