"""The box's own engine (the embedded one, or the vLLM the appliance manages) as a backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from engine import EngineState, RequestOutput, SamplingParams, Tenant
from web.backends.protocol import Served
from web.backends.scrape import Load
from web.backends.status import BackendState
from web.generation.backend import EngineClient

STATES: dict[str, BackendState] = {  # the engine's state (an EngineState, or NoLocalEngine's "none")
    EngineState.READY: BackendState.UP,
    EngineState.LOADING: BackendState.LOADING,
    EngineState.STOPPING: BackendState.DRAINING,
}


class EmbeddedBackend:
    kind = "embedded"
    url: str | None = None

    def __init__(self, client: EngineClient, model_name: Callable[[], str | None], name: str = "embedded") -> None:
        self.client = client
        self.name = name
        self._model_name = model_name  # the gate's: a model switch or served_model_name renames it

    def model_name(self) -> str | None:
        return self._model_name()

    def models(self) -> dict[str, Served]:
        info = self.client.model_info
        if info is None or self.client.state != EngineState.READY:
            return {}
        # Only now: with no model yet, the gate's name is the remote backends' first, which asks this backend
        # again (a RecursionError on every probe while the engine loaded beside remote backends).
        name = self._model_name()
        if name is None:
            return {}
        return {name: Served(name, info.name, info, self.client.tokenizer)}

    def state(self) -> BackendState:
        return STATES.get(self.client.state, BackendState.DOWN)

    def load(self) -> Load | None:
        s = self.client.stats()
        if s is None:
            return None
        kv = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else None
        return Load(s.waiting, s.running, kv)

    def generate(
        self,
        served: Served,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None,
        tenant: Tenant | None,
    ) -> AsyncIterator[RequestOutput]:
        return self.client.generate(prompt_ids, params, request_id=request_id, arrival_time=arrival_time, tenant=tenant)

    async def abort(self, request_id: str) -> None:
        await self.client.abort(request_id)

    async def probe(self) -> None:
        return None
