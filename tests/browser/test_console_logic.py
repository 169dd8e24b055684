"""The console's pure parts without a browser: the login limit, throughput, the memory split, the
diagnosis, the chart scale, CSV cells, and the asset fetcher refusing a file whose hash is not the pinned one."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from engine import EngineStats
from web.console import charts
from web.console.capacity import capacity
from web.console.diagnosis import diagnose
from web.console.history import csv_cell
from web.console.live import ThroughputMeter, live_view, memory_segments
from web.console.samples import Bucket
from web.static import assets
from web.system.login_limiter import LoginLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failed_logins_are_limited_per_address_in_a_sliding_window() -> None:
    clock = Clock()
    limiter = LoginLimiter(limit=5, window_s=60, clock=clock)
    for _ in range(5):
        assert limiter.retry_after("10.0.0.1") == 0
        limiter.failed("10.0.0.1")
        clock.now += 1
    assert 55 <= limiter.retry_after("10.0.0.1") <= 56
    assert limiter.retry_after("10.0.0.2") == 0
    clock.now += 56
    assert limiter.retry_after("10.0.0.1") == 0


def test_throughput_comes_from_counter_deltas_and_restarts_with_the_engine() -> None:
    clock = Clock()
    meter = ThroughputMeter(clock=clock)
    assert meter.observe(100) is None
    clock.now += 2
    assert meter.observe(160) == pytest.approx(30.0)
    clock.now += 2
    assert meter.observe(10) is None  # the counter went back: a restarted engine
    clock.now += 100
    meter.observe(10)
    clock.now += 2
    assert meter.observe(30) == pytest.approx(10.0)  # the stale point an idle gap left is not averaged in


def stats(**values: object) -> EngineStats:
    base: dict[str, object] = dict(
        running=0, waiting=0, kv_blocks_total=100, kv_blocks_used=0, kv_blocks_cached=0, block_size=16,
        memory_kind="VRAM", weights_bytes=4 << 30, kv_pool_bytes=8 << 30, device_memory_total=24 << 30,
        device_memory_free=10 << 30, preemptions_total=0, prefix_cache_queries=0, prefix_cache_hits=0,
        prompt_tokens_total=0, generation_tokens_total=0, requests_finished_total=0, steps_total=0,
        recent_queue_wait=[], recent_ttft=[], recent_tpot=[], time=0.0,
    )  # fmt: skip
    base.update(values)
    return EngineStats(**base)  # type: ignore[arg-type]


def test_memory_split_covers_the_device_without_overlap() -> None:
    parts = {s.key: s for s in memory_segments(stats(kv_blocks_used=25))}
    assert parts["weights"].bytes == 4 << 30
    assert parts["kv-used"].bytes == 2 << 30 and parts["kv-pool"].bytes == 6 << 30
    assert parts["other"].bytes == 2 << 30 and parts["free"].bytes == 10 << 30
    assert sum(s.width for s in parts.values()) == pytest.approx(1.0)
    squeezed = memory_segments(stats(device_memory_total=10 << 30, device_memory_free=5 << 30))
    assert sum(s.width for s in squeezed) <= 1.0 + 1e-9


def bucket(waiting: int, kv: float) -> Bucket:
    return Bucket(0.0, 4, waiting, kv, 1, 2, None, 10.0)


def test_diagnosis_names_memory_or_compute_as_the_limit() -> None:
    memory = diagnose("ready", "ready", 3, 0.97, "VRAM", [bucket(3, 0.97)], "last hour")
    assert memory.verdict == "memory" and "Memory is the limit" in memory.headline
    assert any("quantization" in lever for lever in memory.levers)
    assert any("VRAM" in lever for lever in memory.levers)
    compute = diagnose("ready", "ready", 2, 0.3, "RAM", [bucket(2, 0.3)], "last hour")
    assert compute.verdict == "compute" and "room" in compute.headline
    healthy = diagnose("ready", "ready", 0, 0.1, "RAM", [bucket(0, 0.1)], "last hour")
    assert healthy.verdict == "healthy" and not healthy.levers
    earlier = diagnose("ready", "ready", 0, 0.1, "RAM", [bucket(0, 0.1), bucket(5, 0.99)], "last hour")
    assert earlier.verdict == "healthy" and "KV cache full" in earlier.details[0] and earlier.levers
    assert diagnose("down", "engine down: crashed", 0, None, "RAM", [], "last hour").verdict == "down"


def test_memory_bound_names_the_8bit_kv_cache_where_it_is_off_and_the_console_counts_its_blocks() -> None:
    window = [bucket(3, 0.97)]
    exact = diagnose("ready", "ready", 3, 0.97, "VRAM", window, "last hour", kv_cache_dtype="auto")
    assert any("APPLIANCE_KV_CACHE_DTYPE=int8" in lever for lever in exact.levers)
    eight = diagnose("ready", "ready", 3, 0.97, "VRAM", window, "last hour", kv_cache_dtype="int8")
    assert not any("KV_CACHE_DTYPE" in lever for lever in eight.levers), "already on: not a lever"
    # The same pool bytes in 8 bits: twice the blocks (engine.model.kv_cache), so twice the chats that fit.
    sixteen, int8 = stats(kv_blocks_total=1000), stats(kv_blocks_total=1940, kv_cache_dtype="int8")
    room16, room8 = capacity(sixteen, 2048), capacity(int8, 2048)
    assert room16 is not None and room8 is not None and room8.chats >= 1.9 * room16.chats
    labels = {s.key: s.label for s in memory_segments(int8)}
    assert labels["kv-used"] == "KV (int8) in use" and {s.label for s in memory_segments(sixteen)} >= {"KV in use"}


def test_chart_scale_is_round_and_gaps_break_the_line() -> None:
    assert [charts.nice_ceiling(v) for v in (0, 0.8, 3, 7.5, 12, 0.013)] == [1.0, 1.0, 5, 10, 20, 0.02]
    chart = charts.line_chart("x", "X", [0, 1, 2, 3], [("a", "A", [1.0, None, 2.0, 3.0])], 0, 3, str)
    path = chart.lines[0].path
    assert path.count("M") == 2 and path.count("L") == 1
    assert chart.y_max_label == "5" and not chart.empty
    assert charts.line_chart("x", "X", [], [("a", "A", [])], 0, 1, str).empty
    # A fixed top of 0 (a headroom chart while the device's memory is unknown) scales to the data instead.
    zero = charts.line_chart("x", "X", [0, 1], [("a", "A", [0.0, 0.0])], 0, 1, str, fixed_top=0.0)
    assert zero.y_max_label == "1.0" and not zero.empty


def test_a_young_servers_charts_span_its_samples_not_the_empty_hour() -> None:
    """Ten minutes of samples on the 1-hour chart: they fill the plot from its left edge (issue 17, U1), and
    the start label is the first sample's time. A minute of data still gets a five-minute axis."""
    now = 1_800_000_000.0
    times = [now - 600 + 15 * i for i in range(40)]
    chart = charts.line_chart("x", "X", times, [("a", "A", [1.0] * 40)], now - 3600, now, str)
    first_x = float(chart.lines[0].path.split()[0].removeprefix("M").split(",")[0])
    assert first_x == pytest.approx(charts.PAD_LEFT)
    assert chart.x_start_label == charts._clock(now - 600, False)
    minute = charts.line_chart("x", "X", times[-4:], [("a", "A", [1.0] * 4)], now - 3600, now, str)
    assert minute.x_start_label == charts._clock(now - charts.MIN_SPAN_S, False)
    full = charts.line_chart("x", "X", [now - 7200, now], [("a", "A", [1.0, 1.0])], now - 3600, now, str)
    assert full.x_start_label == charts._clock(now - 3600, False)


def test_tokens_per_second_reads_zero_once_nothing_runs() -> None:
    clock = Clock()
    meter = ThroughputMeter(clock=clock)
    for generated in range(0, 1000, 100):  # a burst: 50 tokens/s for 20 s
        view = live_view(stats(running=4, generation_tokens_total=generated), 4, meter)
        clock.now += 2
    assert view.tokens_per_s == pytest.approx(50.0)
    idle = live_view(stats(running=0, waiting=0, generation_tokens_total=1000), 0, meter)
    assert idle.tokens_per_s == 0.0
    assert live_view(stats(running=0, waiting=0), 0).tokens_per_s is None  # a partial that does not own it


def test_csv_cells_never_start_a_spreadsheet_formula() -> None:
    assert csv_cell('=HYPERLINK("http://evil")') == '\'=HYPERLINK("http://evil")'
    assert csv_cell("+1") == "'+1" and csv_cell("@SUM(A1)") == "'@SUM(A1)" and csv_cell("-2") == "'-2"
    assert csv_cell("plain") == "plain" and csv_cell(None) == "" and csv_cell(3) == "3"


def fake_pack(content: bytes) -> object:
    def pack(asset: assets.Asset, workdir: Path) -> Path:
        tarball = workdir / "pkg.tgz"
        with tarfile.open(tarball, "w:gz") as archive:
            info = tarfile.TarInfo(asset.member)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
        return tarball

    return pack


def test_asset_fetch_refuses_content_that_is_not_the_pinned_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assets, "_npm_pack", fake_pack(b"alert('not htmx')"))
    with pytest.raises(assets.AssetError, match="refusing"):
        assets.fetch_assets(tmp_path)
    assert not any(tmp_path.iterdir())

    pinned = assets.Asset("demo", "1.0.0", "package/demo.js", "demo.js", assets._sha256(b"ok"))
    monkeypatch.setattr(assets, "ASSETS", (pinned,))
    monkeypatch.setattr(assets, "_npm_pack", fake_pack(b"ok"))
    assert assets.fetch_assets(tmp_path) == [tmp_path / "demo.js"]
    assert (tmp_path / "demo.js").read_bytes() == b"ok" and assets.is_current(pinned, tmp_path)


def test_a_sliding_window_model_has_room_for_chats_of_its_window_not_their_length() -> None:
    """Where every layer slides, blocks behind the window are given back as a chat advances: a chat of 2,000
    tokens under a 256-token window holds 17 blocks (16 its window spans, the next partly filled), not 125."""
    from web.console.capacity import capacity

    assert capacity(stats(kv_blocks_total=1000, kv_blocks_used=100), 2000).chats == 900 // 125
    assert capacity(stats(kv_blocks_total=1000, kv_blocks_used=100, kv_groups=[256]), 2000).chats == 900 // 17
    assert capacity(stats(kv_blocks_total=1000, kv_blocks_used=100, kv_groups=[256]), 100).chats == 900 // 7


def test_a_model_mixing_windowed_and_global_layers_has_room_by_its_groups() -> None:
    """Gemma-style (engine.sched.kv_groups): a chat takes a block in every group for each 16 tokens; the global
    group keeps all 125 of a 2,000-token chat, each of the two windowed groups 17; without giving back, 3 x 125."""
    from web.console.capacity import capacity

    mixed = stats(kv_blocks_total=3000, kv_blocks_used=300, kv_groups=[None, 256, 256])
    assert capacity(mixed, 2000).chats == 2700 // (125 + 17 + 17)
    held = stats(kv_blocks_total=3000, kv_blocks_used=300, kv_groups=[None, None, None])
    assert capacity(held, 2000).chats == 2700 // 375
