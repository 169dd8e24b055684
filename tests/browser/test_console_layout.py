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
        panel = template.render(live=live, capacity=None)
        page.set_content(f"<!doctype html><style>{CSS.read_text()}</style><main class='panel'>{panel}</main>")
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


def test_chart_axis_labels_are_never_cut_at_the_charts_edge(browser: Browser) -> None:
    """Issue 16: the y axis's top label ("100 tok/s", "23.5 GiB") lay partly left of the SVG, cut."""
    from web.console.charts import line_chart
    from web.console.render import fmt_bytes, fmt_num
    from web.console.samples import WINDOWS

    times = [1000.0, 1300.0, 1600.0]
    made = [
        line_chart("tps", "Throughput", times, [("tps", "tokens/s", [5.0, 80.0, 3000.0])], 700.0, 1600.0,
                   lambda v: fmt_num(v) + " tok/s"),
        line_chart("free", "Headroom", times, [("free", "free", [1e9, 2e10, 3e10])], 700.0, 1600.0, fmt_bytes,
                   fixed_top=25.2e9),
    ]  # fmt: skip
    template = render.template_config().engine_instance.engine.get_template("console/partials/charts.html")
    page = browser.new_page()
    try:
        html = template.render(charts=made, window=WINDOWS["1h"])
        page.set_content(f"<!doctype html><style>{CSS.read_text()}</style>{html}")
        for width in (360, 800, 1400):
            page.set_viewport_size({"width": width, "height": 900})
            for figure in page.locator("figure.chart").all():
                svg = figure.locator("svg").bounding_box()
                assert svg is not None
                for tick in figure.locator("text.tick").all():
                    box = tick.bounding_box()
                    assert box is not None
                    label = tick.text_content()
                    assert box["x"] >= svg["x"] - 0.5, f"{width} px: {label!r} starts left of its chart"
                    assert box["x"] + box["width"] <= svg["x"] + svg["width"] + 0.5, f"{width} px: {label!r} cut"
    finally:
        page.close()
