"""A stand-in for engine.AsyncEngineClient: same interface, canned deltas, scripted failures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from engine import (
    ContextLengthError,
    EngineDeadError,
    EngineStats,
    InvalidRequestError,
    Logprob,
    ModelInfo,
    QueueFullError,
    QueuePosition,
    RequestOutput,
    SamplingParams,
    Tenant,
    TenantStats,
    Timings,
    Usage,
)

VOCAB = 1000


class FakeTokenizer:
    """One token per character, so tests can count prompt tokens by eye."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % VOCAB for c in text]

    def __init__(self) -> None:
        self.template_kwargs: dict[str, Any] = {}  # the latest call's keyword arguments

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
        self.template_kwargs = kwargs
        if any(m["content"] == "BREAK TEMPLATE" for m in messages):
            raise ValueError("roles must alternate")
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>")

    def __len__(self) -> int:
        return VOCAB


class FakeEngineClient:
    def __init__(
        self,
        *,
        name: str = "fake-model",
        max_model_len: int = 512,
        completion_tokens: int = 5,
        token_delay: float = 0.0,
        start_delay: float = 0.0,
    ) -> None:
        self.name = name
        self.max_model_len = max_model_len
        self.completion_tokens = completion_tokens
        self.token_delay = token_delay
        self.start_delay = start_delay
        self.start_gate: asyncio.Event | None = None  # where set, a start also waits until the test sets it
        self.state = "stopped"
        self.model_info: ModelInfo | None = None
        self.tokenizer: Any = FakeTokenizer()
        self.last_error: str | None = None
        self.load_step: str | None = None
        self.restarts = 0
        self.reject_next: str | None = None  # "queue_full" or "invalid": refuse the next request
        self.requests: list[tuple[str, list[int], SamplingParams]] = []
        self.aborted: list[str] = []
        self.closed_early: list[str] = []
        self.generated: dict[str, int] = {}
        self.tenants: dict[str, Tenant | None] = {}  # request id -> the tenant it was queued for
        self.tenant_stats: list[TenantStats] = []  # what stats() reports of the busy tenants
        # A queue in front of the seats: each request waits queue_wait seconds with queue_ahead requests before it.
        self.queue_wait = 0.0
        self.cached_prompt_tokens = 0  # what each request's usage says the prefix cache held
        self.queue_ahead = 0
        self._admitted_at: dict[str, float] = {}
        self._abort_flags: set[str] = set()
        self._generation = 0
        self.shutdown_called = False

    async def start(self) -> ModelInfo:
        self.state = "loading"
        await asyncio.sleep(self.start_delay)
        if self.start_gate is not None:
            await self.start_gate.wait()
        self.model_info = ModelInfo(
            name=self.name,
            max_model_len=self.max_model_len,
            tokenizer_dir="/nonexistent",
            eos_token_ids=[0],
            device="cpu",
            dtype="float32",
            quantization="none",
            num_kv_blocks=64,
            block_size=16,
            kv_bytes_per_block=1024,
        )
        self.state = "ready"
        return self.model_info

    async def restart(self) -> ModelInfo:
        self.restarts += 1
        return await self.start()

    async def shutdown(self, timeout: float = 10.0) -> None:
        self.shutdown_called = True
        self.state = "stopped"
        self._generation += 1

    def kill(self) -> None:
        """The engine process dies: requests in flight fail, the state is down until restart()."""
        self.state = "down"
        self.last_error = "the engine process exited (code -9)"
        self._generation += 1

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._abort_flags.add(request_id)

    def queue_position(self, request_id: str) -> QueuePosition | None:
        admitted_at = self._admitted_at.get(request_id)
        remaining = admitted_at - time.monotonic() if admitted_at is not None else 0.0
        return QueuePosition(self.queue_ahead + 1, remaining) if remaining > 0 else None

    def stats(self) -> EngineStats | None:
        if self.model_info is None:
            return None
        total = sum(self.generated.values())
        return EngineStats(
            running=1, waiting=2, kv_blocks_total=64, kv_blocks_used=16, kv_blocks_cached=0, block_size=16,
            memory_kind="RAM", weights_bytes=1000, kv_pool_bytes=65536, device_memory_total=1 << 30,
            device_memory_free=1 << 29, preemptions_total=3, prefix_cache_queries=10, prefix_cache_hits=4,
            prompt_tokens_total=100, generation_tokens_total=total, requests_finished_total=len(self.generated),
            steps_total=10, recent_queue_wait=[0.01, 0.02], recent_ttft=[0.05], recent_tpot=[0.01],
            time=time.monotonic(), tenants=self.tenant_stats,
        )  # fmt: skip

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        tenant: Tenant | None = None,
    ) -> AsyncIterator[RequestOutput]:
        rid = request_id or "fake"
        ids = list(prompt) if not isinstance(prompt, str) else self.tokenizer.encode(prompt)
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        if self.state != "ready":
            raise EngineDeadError(f"the engine is not ready (state: {self.state})")
        if self.reject_next is not None:
            kind, self.reject_next = self.reject_next, None
            if kind == "queue_full":
                raise QueueFullError("the waiting queue is full (1024 requests)")
            raise InvalidRequestError("refused by the fake", "prompt")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ContextLengthError("too long for the fake", "max_tokens")
        self.requests.append((rid, ids, params))
        self.tenants[rid] = tenant
        generation = self._generation
        n = params.max_tokens if params.ignore_eos else min(params.max_tokens, self.completion_tokens)
        scheduled = time.monotonic()
        first: float | None = None
        done = False
        self.generated[rid] = 0
        try:
            if self.queue_wait:
                self._admitted_at[rid] = time.monotonic() + self.queue_wait
                await asyncio.sleep(self.queue_wait)
            for i in range(n):
                await asyncio.sleep(self.token_delay)
                if generation != self._generation:
                    raise EngineDeadError(self.last_error or "the engine is shutting down")
                now = time.monotonic()
                first = first or now
                self.generated[rid] = i + 1
                aborted = rid in self._abort_flags
                last = i == n - 1 or aborted
                reason = "abort" if aborted else ("length" if n == params.max_tokens else "stop")
                out = RequestOutput(rid, [100 + i], f"t{i} ", finished=last)
                if params.logprobs is not None:
                    top = [(100 + i, f"t{i} ", -0.1), (7, "x", -2.5)][: max(params.logprobs, 1)]
                    out.logprobs = [Logprob(100 + i, f"t{i} ", -0.1, top[: params.logprobs])]
                if i == 0 and not last:  # as the engine core does: a cut-short request keeps its schedule
                    out.timings = Timings(arrival, scheduled, first, None)
                if last:
                    done = True
                    out.finish_reason = reason
                    out.usage = Usage(len(ids), i + 1, min(self.cached_prompt_tokens, len(ids)))
                    out.timings = Timings(arrival, scheduled, first, now)
                yield out
                if last:
                    return
        finally:
            if not done:
                self.closed_early.append(rid)
