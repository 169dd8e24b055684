"""The small typed structs that cross the process boundary between the engine core and its clients.

Encoded with msgspec (msgpack); the offline API returns the same RequestOutput objects.
"""

from __future__ import annotations

import math
from enum import StrEnum

import msgspec

from engine.sampling_params import SamplingParams
from engine.sched import limits
from engine.sched.tenant import Tenant


class EngineState(StrEnum):
    """Where an engine (the embedded one's process, or a managed vLLM server) is: stopped -> loading -> ready;
    down when it died (a restart brings it back through loading); stopping on shutdown."""

    STOPPED = "stopped"
    LOADING = "loading"
    READY = "ready"
    DOWN = "down"
    STOPPING = "stopping"


class Logprob(msgspec.Struct, frozen=True, array_like=True):
    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]]  # (token id, token text, logprob), best first


class Timings(msgspec.Struct, frozen=True):
    """Monotonic timestamps (time.monotonic, shared by processes on one machine), in seconds."""

    arrival: float
    scheduled: float | None
    first_token: float | None
    finished: float | None


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0


class RequestOutput(msgspec.Struct):
    """A delta of one request: new token ids and the text they complete. The first one with a token has timings
    so far (a request cancelled before its end keeps them); the last one has finished=True, finish_reason
    ("stop", "length" or "abort"), usage and all its timings."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[Logprob] | None = None
    usage: Usage | None = None
    timings: Timings | None = None

    def merge(self, later: RequestOutput) -> None:
        """Fold a later delta into this one (a slow consumer gets one merged delta, memory stays bounded)."""
        self.token_ids.extend(later.token_ids)
        self.text += later.text
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        self.finished = later.finished
        self.finish_reason = later.finish_reason
        self.stop_reason = later.stop_reason
        self.usage = later.usage
        self.timings = later.timings or self.timings  # the first delta's survive a merge with later ones


QUEUE_SNAPSHOT = 256  # waiting request ids a snapshot lists: enough for a page to tell "n-th in line"


class ModelInfo(msgspec.Struct, frozen=True):
    """What a client needs to know about the served model and the pool."""

    name: str
    max_model_len: int
    tokenizer_dir: str
    eos_token_ids: list[int]
    device: str
    dtype: str
    quantization: str
    num_kv_blocks: int
    block_size: int
    kv_bytes_per_block: int
    kv_cache_dtype: str = "auto"  # the pool's element type as vLLM's --kv-cache-dtype names it (auto: the model's)
    kv_groups: int = 1  # layer groups a token's KV is spread over, one block each (engine.sched.kv_groups)
    tokenizer_class: str = ""  # the class AutoTokenizer chose for tokenizer_dir (engine.hf.load_tokenizer), if known

    @property
    def kv_tokens(self) -> int:
        """Tokens the pool holds for one request, every group holding its whole context."""
        return self.num_kv_blocks // max(self.kv_groups, 1) * self.block_size

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """The engine's context-length check, for a server to run before it commits to a request."""
        limits.check_fits(num_prompt_tokens, max_tokens, self.max_model_len, self.kv_tokens)

    def room(self, num_prompt_tokens: int) -> int:
        """The most completion tokens the context and the pool leave after the prompt (below 1: none)."""
        return limits.room(num_prompt_tokens, self.max_model_len, self.kv_tokens)


class TenantStats(msgspec.Struct, frozen=True):
    """One tenant in a snapshot. tokens_per_s: prompt tokens computed plus tokens generated, an exponentially
    decaying rate over about the last minute. service: its fair-share counter (weighted tokens / weight)."""

    id: str
    weight: float
    priority: str
    running: int
    waiting: int
    tokens_per_s: float
    service: float


class QueuePosition(msgspec.Struct, frozen=True):
    """Where a waiting request stands: 1-based position in projected admission order, and the seconds until
    its admission at the recent admission rate (None while nothing was admitted lately)."""

    position: int
    eta_s: float | None


class EngineStats(msgspec.Struct, frozen=True):
    """One snapshot of the engine, built at most every quarter second while busy. memory_kind is "VRAM" on
    CUDA, "RAM" on CPU. tenants: the busy (or recently busy) tenants. queue: the first waiting request ids in
    projected admission order (at most QUEUE_SNAPSHOT); admission_rate: requests admitted per second lately."""

    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_cached: int
    block_size: int
    memory_kind: str
    weights_bytes: int
    kv_pool_bytes: int
    device_memory_total: int
    device_memory_free: int
    preemptions_total: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_finished_total: int
    steps_total: int
    recent_queue_wait: list[float]
    recent_ttft: list[float]
    recent_tpot: list[float]
    time: float
    tenants: list[TenantStats] = []
    queue: list[str] = []
    admission_rate: float = 0.0
    kv_cache_dtype: str = "auto"  # as ModelInfo's
    # The pool's layer groups (engine.sched.kv_groups), a token taking one block of each: every group's sliding
    # window, its blocks behind it given back as a request advances, or None where it keeps the whole context.
    # Empty: one group keeping everything.
    kv_groups: list[int | None] = []

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    def blocks_per_chat(self, tokens: int) -> int:
        """Blocks a chat of this many tokens holds at its end: its whole context in every group that keeps it, the
        window and the next block, partly filled, in every group that slides."""
        whole = math.ceil(tokens / self.block_size)
        return sum(
            whole if w is None else min(whole, math.ceil(w / self.block_size) + 1) for w in self.kv_groups or [None]
        )


# -- client -> core ---------------------------------------------------------------------------------------


class AddRequest(msgspec.Struct, tag="add"):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    tenant: Tenant | None = None


class AbortRequests(msgspec.Struct, tag="abort"):
    request_ids: list[str]


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


# -- core -> client ---------------------------------------------------------------------------------------


class Loading(msgspec.Struct, tag="loading"):
    """What the loading engine is doing now: each progress line of the load, as the log has it."""

    step: str


class Ready(msgspec.Struct, tag="ready"):
    info: ModelInfo


class StartFailed(msgspec.Struct, tag="start_failed"):
    message: str


class Rejected(msgspec.Struct, tag="rejected"):
    """A request refused at admission: kind is "queue_full", "context_length" or "invalid"."""

    request_id: str
    kind: str
    message: str
    param: str | None = None


class StepOutputs(msgspec.Struct, tag="outputs"):
    outputs: list[RequestOutput]
    stats: EngineStats | None = None


ToCore = AddRequest | AbortRequests | Shutdown
FromCore = Loading | Ready | StartFailed | Rejected | StepOutputs
