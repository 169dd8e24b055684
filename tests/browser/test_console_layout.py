"""The console's stat cards in a real browser at a narrow width (issue 17, U1): a value may break between two
figures, never between a number and its unit ("15 ms / 15⏎ms"). The partial is rendered offline with the app's
own template and stylesheet, so no server is needed."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import pytest

from tests.browser.test_console_logic import stats
from web.console import render
from web.console.live import live_view

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytest.importorskip("playwright.sync_api")

CSS = render.TEMPLATES_DIR.parent / "static" / "css" / "app.css"

# For each word of an element's text, the top of the line it sits on.
WORD_TOPS = """element => {
  const words = [];
  const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const match of node.data.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      words.push([match[0], Math.round(range.getBoundingClientRect().top)]);
    }
  }
  return words;
}"""


@pytest.mark.parametrize(("waits", "ttfts"), [([0.015, 0.015], [1.25, 1.97]), ([0.120, 0.950], [0.3, 12.5])])
def test_stat_cards_never_part_a_number_from_its_unit(browser: Browser, waits: list[float], ttfts: list[float]) -> None:
    live = live_view(stats(recent_queue_wait=waits, recent_ttft=ttfts), 0)
    template = render.template_config().engine_instance.engine.get_template("console/partials/engine-counters.html")
    page = browser.new_page()
    try:
        page.set_content(
            f"<!doctype html><style>{CSS.read_text()}</style><main class='panel'>{template.render(live=live)}</main>"
        )
        # The tiles' grid reflows with the width; the old layout parted "15 ms" at most widths from 380 to 1,400 px.
        for width in range(320, 1441, 40):
            page.set_viewport_size({"width": width, "height": 800})
            for metric in ("queue-wait", "ttft"):
                words = page.locator(f"[data-metric={metric}]").evaluate(WORD_TOPS)
                assert {"ms", "s"} & {word for word, _ in words}, words
                for (number, top), (unit, unit_top) in itertools.pairwise(words):
                    if unit in ("ms", "s", "min"):
                        assert unit_top == top, f"{width} px, {metric}: {number!r} and {unit!r} on two lines: {words}"
    finally:
        page.close()
