"""The local engine of a gateway that has none (APPLIANCE_BACKENDS without `embedded`): every backend is remote.
It keeps the parts that show the local engine (status, memory bar, metrics) simple: it is never ready and says
so, and the gateway never starts it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from engine import EngineDeadError, EngineStats, ModelInfo, QueuePosition, RequestOutput, SamplingParams, Tenant

NO_ENGINE = "none"  # its state


class NoLocalEngine:
    state = NO_ENGINE
    model_info: ModelInfo | None = None
    tokenizer: Any = None
    last_error: str | None = None
    load_step: str | None = None
    restarts = 0

    async def start(self) -> ModelInfo:
        raise EngineDeadError("this gateway has no local engine: its backends are remote")

    async def shutdown(self, timeout: float = 10.0) -> None:
        return None

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        tenant: Tenant | None = None,
    ) -> AsyncIterator[RequestOutput]:
        raise EngineDeadError("this gateway has no local engine")

    def queue_position(self, request_id: str) -> QueuePosition | None:
        return None

    async def abort(self, request_id: str) -> None:
        return None

    def stats(self) -> EngineStats | None:
        return None

    def healthy(self, max_silence: float = 30.0) -> bool:
        """For the systemd watchdog: nothing local to hear from; the gateway's own loop answering is enough."""
        return True
