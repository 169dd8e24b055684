"""A backend's load read from its Prometheus /metrics: waiting and running requests and KV-cache use, under the
names vLLM, SGLang and llama.cpp's server export (the appliance exports vLLM's). Only the few lines wanted are
parsed; anything malformed is skipped (the text comes from the network)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# (waiting, running, KV use 0..1) per server family, first family found wins.
FAMILIES = (
    ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"),
    ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"),
    ("llamacpp:requests_deferred", "llamacpp:requests_processing", "llamacpp:kv_cache_usage_ratio"),
)
_WANTED = {name for family in FAMILIES for name in family}


@dataclass(frozen=True, slots=True)
class Load:
    waiting: int
    running: int
    kv_usage: float | None  # 0..1; None where the server exports none

    @property
    def requests(self) -> int:
        return self.waiting + self.running


def read_load(text: str) -> Load | None:
    values: dict[str, float] = {}
    kv_seen: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in _WANTED:
            continue
        labels_end = line.rfind("}")
        if "{" in line and labels_end < 0:  # labels never closed: a broken line
            continue
        value = _value(line[labels_end + 1 :] if "{" in line else line[len(name) :])
        if value is None:
            continue
        if name.endswith(("usage_perc", "token_usage", "usage_ratio")):
            kv_seen[name] = max(kv_seen.get(name, 0.0), value)  # several engines: the fullest one
        else:
            values[name] = values.get(name, 0.0) + value  # several label sets (models, engines): summed
    for waiting, running, kv in FAMILIES:
        if waiting in values or running in values:
            usage = kv_seen.get(kv)
            return Load(int(values.get(waiting, 0)), int(values.get(running, 0)), _fraction(usage))
    return None


def _value(text: str) -> float | None:
    parts = text.split()
    if not parts:
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _fraction(value: float | None) -> float | None:
    return None if value is None else min(value, 1.0)
