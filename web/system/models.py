"""Switching the served model while the server runs: a fit check, a drain (requests in flight finish, new ones get
503 not_ready "switching model"), the engine restarted on a replaced copy of its frozen config, then serving.

What the local models are and whether each fits is the catalog's: appliance/ provides it (web never imports it)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from engine import EngineConfig, EngineError, EngineState, ModelInfo
from web.console.render import fmt_bytes
from web.errors import AppError, NotFound
from web.generation.gate import EngineGate
from web.generation.inflight import InFlight

log = logging.getLogger("web.system.models")


@dataclass(frozen=True, slots=True)
class Fit:
    """Weights plus KV for `chats` chats of `chat_tokens` tokens, against the memory the engine would have."""

    fits: bool
    memory: str  # "RAM" or "VRAM"
    available: int  # bytes the engine could have: free now, plus what the served model would give back
    weights: int
    kv_per_chat: int
    chats: int
    chat_tokens: int
    precision: str  # quantization, compute dtype and an 8-bit KV cache, as configured ("nf4, bfloat16, KV int8")
    load_peak: int = 0  # RAM while the weights load, where it exceeds weights + KV, or RAM a GPU's load lacks

    @property
    def summary(self) -> str:
        head = (
            f"weights {fmt_bytes(self.weights)} + KV for {self.chats:,} chat{'' if self.chats == 1 else 's'} "
            f"of {self.chat_tokens:,} tokens"
        )
        if self.memory == "VRAM" and self.load_peak:
            head += f", {fmt_bytes(self.load_peak)} of RAM while loading"
        elif self.load_peak > self.weights + self.kv_per_chat * self.chats:
            head += f", {fmt_bytes(self.load_peak)} while loading"
        tail = f"{fmt_bytes(self.available)} {self.memory} available; {self.precision}"
        return f"fits: {head} ({tail})" if self.fits else f"does not fit: {head} ({tail})"


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str  # the folder or file name under the models folder; "default" for the bundled one
    spec: str  # what EngineConfig.model (APPLIANCE_MODEL) takes: a path, "default" or random:<preset>
    kind: str  # "bundled GGUF", "GGUF", "HF directory", "random preset"
    disk_bytes: int
    params: int | None  # None when the shape could not be read (`problem` says why)
    fit: Fit | None
    problem: str | None = None
    served: bool = False


class Catalog(Protocol):
    def models(self, served: str, served_kv_bytes: int | None) -> Sequence[ModelEntry]:
        """Every local model, the one whose spec is `served` marked. `served_kv_bytes`: the running engine's KV
        pool; then the served model's memory counts as available (a switch gives it back first)."""
        ...


@runtime_checkable
class Restartable(Protocol):
    """What a switch needs of the engine client beyond the gate's (AsyncEngineClient has it)."""

    config: EngineConfig

    async def start(self) -> ModelInfo: ...

    async def shutdown(self, timeout: float = ...) -> None: ...


class SwitchRefused(AppError):
    status_code = 409
    type = "invalid_request_error"
    code = "switch_refused"


class ModelSwitch:
    def __init__(self, gate: EngineGate, inflight: InFlight, catalog: Catalog | None, drain_timeout: float) -> None:
        self.gate = gate
        self.inflight = inflight
        self.catalog = catalog
        self.drain_timeout = drain_timeout
        self._lock = asyncio.Lock()

    @property
    def served_spec(self) -> str:
        client = self.gate.client
        return client.config.model if isinstance(client, Restartable) else ""

    async def models(self) -> Sequence[ModelEntry]:
        if self.catalog is None:
            return []
        # Shapes come from transformers (seconds at the first call): off the event loop.
        info, pool = self.gate.client.model_info, None
        if info is not None and self.gate.client.state == EngineState.READY:
            pool = info.num_kv_blocks * info.kv_bytes_per_block  # what the engine holds, given back by a switch
        return await asyncio.to_thread(self.catalog.models, self.served_spec, pool)

    async def switch(self, name: str) -> ModelEntry:
        """Serve the model named `name`. Raises NotFound, SwitchRefused (served already, does not fit, another
        switch under way, the engine is not serving) or EngineError (neither model loads: the engine is down)."""
        if self._lock.locked():
            raise SwitchRefused(f"a switch to {self.gate.switching} is under way")
        async with self._lock:
            entry = await self._checked(name)
            self.gate.switching = entry.name
            try:
                await self._drain()
                if self.gate.draining:  # SIGTERM came while draining: the shutdown stops the engine
                    raise SwitchRefused("the server is shutting down")
                await self._restart(entry)
            finally:
                self.gate.switching = None
            return dataclasses.replace(entry, served=True)

    async def _checked(self, name: str) -> ModelEntry:
        entry = next((m for m in await self.models() if m.name == name), None)
        if entry is None:
            raise NotFound(f"no local model named {name!r}")
        if entry.served:
            raise SwitchRefused(f"{name} is the model being served")
        if entry.fit is None or not entry.fit.fits:
            raise SwitchRefused(f"{name} {entry.fit.summary if entry.fit else f'cannot be sized: {entry.problem}'}")
        if not isinstance(self.gate.client, Restartable):
            raise SwitchRefused("this engine client cannot be restarted with another model")
        if self.gate.draining or self.gate.client.state != "ready":
            raise SwitchRefused(f"the engine is not serving now ({self.gate.readiness()[1]}); try again once ready")
        return entry

    async def _drain(self) -> None:
        """Requests in flight finish (the gate admits none meanwhile); past the drain timeout they are aborted."""
        self.gate.switch_draining = True
        try:
            deadline = time.monotonic() + self.drain_timeout
            while len(self.inflight) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            for live in self.inflight:
                await live.abort("the served model is being switched and the drain timeout passed")
        finally:
            self.gate.switch_draining = False

    async def _restart(self, entry: ModelEntry) -> None:
        client = self.gate.client
        assert isinstance(client, Restartable)  # _checked refused any other
        previous, previous_name = client.config, self.gate.served_model_name
        # The configured served name belonged to the old model; the new one answers to its own.
        client.config = dataclasses.replace(previous, model=entry.spec, served_model_name=None)
        self.gate.served_model_name = None
        await client.shutdown()
        try:
            info = await client.start()
        except EngineError as exc:
            log.error("switching to %s failed (%s); serving %s again", entry.name, exc, previous.model)
            client.config, self.gate.served_model_name = previous, previous_name
            await client.shutdown()
            await client.start()
            raise SwitchRefused(f"{entry.name} did not load ({exc}); {previous.model} is served again") from None
        log.info("switched the served model to %s (%s)", info.name, entry.spec)
