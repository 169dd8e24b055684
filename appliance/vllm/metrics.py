"""What the managed vLLM server's Prometheus /metrics says, as the engine's EngineStats snapshot the console, the
gateway's /metrics and the samples job read: load and KV use (web.backends.scrape), its pool from
vllm:cache_config_info, its token and request counters. What vLLM does not export stays zero or empty."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from appliance.vllm.process import Launch
from engine import EngineStats, ModelInfo
from web.backends.scrape import Load, read_load

TIMEOUT_S = 2.0
MAX_BYTES = 8 << 20
COUNTERS = {
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:request_success_total": "requests_finished_total",
    "vllm:num_preemptions_total": "preemptions_total",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
}


class Scrape:
    """One read of /metrics: the load, the counters and the pool's blocks (0 where not exported)."""

    __slots__ = ("blocks", "counters", "load")

    def __init__(self, text: str) -> None:
        self.load: Load | None = read_load(text)
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS.values(), 0)
        self.blocks = (0, 0, 0)  # (KV blocks, block size, the pool's bytes)
        for name, labels, value in _samples(text):
            if name in COUNTERS:
                self.counters[COUNTERS[name]] += int(value)
            elif name == "vllm:cache_config_info":
                figures = ("num_gpu_blocks", "block_size", "kv_cache_memory_bytes")
                self.blocks = (_int(labels.get(figures[0])), _int(labels.get(figures[1])), _int(labels.get(figures[2])))


async def scrape(http: httpx.AsyncClient, base_url: str) -> Scrape | None:
    """None: the server did not answer (a heartbeat missed)."""
    try:
        r = await http.get(f"{base_url}/metrics", timeout=TIMEOUT_S)
    except httpx.HTTPError:
        return None
    if r.status_code != 200 or len(r.content) > MAX_BYTES:
        return None
    return Scrape(r.text)


def device_memory(device: str) -> tuple[int, int]:
    """(total, free) bytes: RAM on a CPU, the GPU's VRAM as nvidia-smi reports it (vLLM's process holds the
    CUDA context, not this one); (0, 0) where it cannot be read."""
    if not device.startswith("cuda"):
        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)
    query = ["nvidia-smi", "--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(
            [*query, "-i", device.partition(":")[2] or "0"], capture_output=True, text=True, timeout=5
        )
        total, free = (int(v) << 20 for v in done.stdout.split(","))
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0, 0
    return total, free


def stats_of(
    last: Scrape | None, launch: Launch, info: ModelInfo, weights_bytes: int, memory: tuple[int, int]
) -> EngineStats:
    load = last.load if last is not None else None
    counters = last.counters if last is not None else dict.fromkeys(COUNTERS.values(), 0)
    total = info.num_kv_blocks
    used = round((load.kv_usage or 0.0) * total) if load is not None else 0
    return EngineStats(
        running=load.running if load is not None else 0,
        waiting=load.waiting if load is not None else 0,
        kv_blocks_total=total,
        kv_blocks_used=used,
        kv_blocks_cached=0,
        block_size=info.block_size,
        memory_kind="VRAM" if launch.device.startswith("cuda") else "RAM",
        weights_bytes=weights_bytes,
        kv_pool_bytes=total * info.kv_bytes_per_block,
        kv_cache_dtype=info.kv_cache_dtype,
        device_memory_total=memory[0],
        device_memory_free=memory[1],
        preemptions_total=counters["preemptions_total"],
        prefix_cache_queries=counters["prefix_cache_queries"],
        prefix_cache_hits=counters["prefix_cache_hits"],
        prompt_tokens_total=counters["prompt_tokens_total"],
        generation_tokens_total=counters["generation_tokens_total"],
        requests_finished_total=counters["requests_finished_total"],
        steps_total=0,
        recent_queue_wait=[],
        recent_ttft=[],
        recent_tpot=[],
        time=time.monotonic(),
    )


def _samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    wanted = ("vllm:cache_config_info", *COUNTERS)
    # Only the lines wanted reach the parser: vLLM's histograms are most of the text, read once a second.
    lines = "\n".join(line for line in text.splitlines() if line.startswith(wanted))
    try:
        for family in text_string_to_metric_families(lines):
            for sample in family.samples:
                yield sample.name, sample.labels, sample.value
    except (ValueError, IndexError, KeyError):  # what prometheus_client's parser raises on a malformed line
        return  # the rest of this read is skipped; the next one may be whole


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0
