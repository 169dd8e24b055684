"""The engine client as the web room uses it: the embedded engine's AsyncEngineClient, or a test double."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from engine import EngineStats, ModelInfo, RequestOutput, SamplingParams


class EngineClient(Protocol):
    state: str
    model_info: ModelInfo | None
    tokenizer: Any
    last_error: str | None

    async def start(self) -> ModelInfo: ...

    async def shutdown(self, timeout: float = ...) -> None: ...

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Queue the request at once; refusals come with the first item; closing the stream early aborts it."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats | None: ...
