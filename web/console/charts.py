"""A small server-side line-chart renderer: time series to SVG path data with a rounded y scale; the template
draws the SVG. Only numbers reach the markup, so nothing in a chart can carry script."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

WIDTH, HEIGHT = 600, 140
# The shortest time axis: while a young server's samples cover less of the window, the axis starts at its first
# sample instead of squeezing the data into the last pixels, but a few minutes of data still read as a few minutes.
MIN_SPAN_S = 300.0
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 52, 8, 8, 20
# The y-axis label's room: its ticks are 11 units high (app.css), a glyph at most ~7 wide; the plot starts after
# the longest label ("100 tok/s", "23.5 GiB"), so no label is cut at the chart's left edge.
TICK_CHAR_W, TICK_GAP = 7, 6


@dataclass(frozen=True, slots=True)
class Line:
    key: str  # CSS class of the stroke
    label: str
    path: str  # SVG path data; empty when there is no value at all


@dataclass(frozen=True, slots=True)
class Chart:
    key: str
    title: str
    lines: list[Line]
    y_max_label: str
    x_start_label: str
    x_end_label: str
    empty: bool
    width: int = WIDTH
    height: int = HEIGHT
    plot_left: int = PAD_LEFT  # at least PAD_LEFT: wider when the y label needs it
    plot_right: int = WIDTH - PAD_RIGHT
    plot_top: int = PAD_TOP
    plot_bottom: int = HEIGHT - PAD_BOTTOM


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is at least `value` (a readable axis top)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10 * power


def plot_left_for(y_label: str) -> int:
    return max(PAD_LEFT, TICK_GAP + len(y_label) * TICK_CHAR_W + TICK_GAP)


def _path(times: Sequence[float], values: Sequence[float | None], x0: float, x1: float, top: float, left: int) -> str:
    """Points outside the data (None) break the line, so a gap in sampling shows as a gap."""
    span = max(x1 - x0, 1e-9)
    plot_w, plot_h = WIDTH - left - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM
    parts: list[str] = []
    pen_down = False
    for t, v in zip(times, values, strict=True):
        if v is None:
            pen_down = False
            continue
        x = left + (t - x0) / span * plot_w
        y = PAD_TOP + plot_h - min(max(v / top, 0.0), 1.0) * plot_h
        # "h0" after a move: a lone point (one sample between gaps) still shows, as a round dot.
        parts.append(f"L{x:.1f},{y:.1f}" if pen_down else f"M{x:.1f},{y:.1f} h0")
        pen_down = True
    return " ".join(parts)


def _clock(epoch: float, with_date: bool) -> str:
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%m-%d %H:%M" if with_date else "%H:%M") + " UTC"


def line_chart(
    key: str,
    title: str,
    times: Sequence[float],
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    start: float,
    end: float,
    fmt: Callable[[float], str],
    fixed_top: float | None = None,
) -> Chart:
    """`series` is (css key, label, values aligned with `times`); the y axis starts at 0 and ends at a round
    number above the largest value (or at `fixed_top`, e.g. 100% for a usage). The x axis ends at `end` and
    starts at `start`, or later where the data does (see MIN_SPAN_S)."""
    if times and times[0] > start:
        start = max(start, min(times[0], end - MIN_SPAN_S))
    present = [v for _, _, values in series for v in values if v is not None]
    top = fixed_top if fixed_top else nice_ceiling(max(present, default=0.0))  # a 0 top (no memory known) too
    y_label = fmt(top)
    left = plot_left_for(y_label)
    lines = [Line(css, label, _path(times, values, start, end, top, left)) for css, label, values in series]
    long = end - start > 6 * 3600
    return Chart(
        key=key,
        title=title,
        lines=lines,
        y_max_label=y_label,
        plot_left=left,
        x_start_label=_clock(start, long),
        x_end_label=_clock(end, long),
        empty=not present,
    )
