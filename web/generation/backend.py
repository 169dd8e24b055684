"""The local engine's client as the web room uses it: the embedded engine's AsyncEngineClient, the managed vLLM's
(appliance/vllm/engine.py), web/backends/none.py's NoLocalEngine where every backend is remote, or a test
double. The router reaches it through web/backends/embedded.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from engine import EngineStats, ModelInfo, QueuePosition, RequestOutput, SamplingParams, Tenant


class EngineClient(Protocol):
    @property
    def state(self) -> str:
        """An engine.EngineState, or NoLocalEngine's 'none'."""
        ...

    model_info: ModelInfo | None
    tokenizer: Any
    last_error: str | None
    load_step: str | None  # while loading: what the load is doing now (its latest progress line)
    restarts: int  # restarts after a crash, each attempt counted

    async def start(self) -> ModelInfo: ...

    async def shutdown(self, timeout: float = ...) -> None: ...

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        tenant: Tenant | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Queue the request at once, counted against `tenant`'s fair share (None: the engine's default tenant);
        refusals come with the first item; closing the stream early aborts it."""
        ...

    def queue_position(self, request_id: str) -> QueuePosition | None:
        """Where a waiting request stands and when it should be admitted; None once it runs (or not known)."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats | None: ...
