"""Running counters and recent latency windows from which each EngineStats snapshot is built."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import psutil
import torch

from engine.sched.request import Request

RECENT = 512


@dataclass(slots=True)
class StatsTracker:
    """prompt_tokens_total counts a request's prompt when its prefill ends (EngineCore.step), not when it
    finishes: a long generation's prompt shows in the prompt-throughput rate while it runs."""

    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    requests_finished_total: int = 0
    steps_total: int = 0
    recent_queue_wait: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    recent_ttft: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    recent_tpot: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))

    def record_finished(self, req: Request) -> None:
        self.requests_finished_total += 1
        if req.scheduled_time is not None:
            self.recent_queue_wait.append(req.scheduled_time - req.arrival_time)
        if req.first_token_time is not None:
            self.recent_ttft.append(req.first_token_time - req.arrival_time)
            n = len(req.output_token_ids)
            if n > 1 and req.finished_time is not None:
                self.recent_tpot.append((req.finished_time - req.first_token_time) / (n - 1))


def device_memory(device: torch.device) -> tuple[str, int, int]:
    """(kind, total bytes, free bytes): VRAM on CUDA, RAM on CPU."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return "VRAM", int(total), int(free)
    vm = psutil.virtual_memory()
    return "RAM", int(vm.total), int(vm.available)
