"""The services one app instance shares (config, engine client, database, keys, history, metrics), and the
engine client's shape as the web room uses it (the real AsyncEngineClient or a test double)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from litestar.connection import ASGIConnection
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import EngineStats, ModelInfo, RequestOutput, SamplingParams
from web.config import WebConfig
from web.history.service import HistoryService
from web.history.writer import BatchWriter
from web.keys.limiter import ConcurrencyLimiter
from web.keys.service import KeyService

if TYPE_CHECKING:
    from web.generation.run import Generation
    from web.system.admin_auth import AdminAuth
    from web.system.metrics import Metrics


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
    ) -> AsyncIterator[RequestOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats | None: ...


@dataclass(slots=True)
class Services:
    config: WebConfig
    client: EngineClient
    db: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    writer: BatchWriter
    keys: KeyService
    history: HistoryService
    limiter: ConcurrencyLimiter
    metrics: Metrics
    admin: AdminAuth
    started_at: int = 0
    draining: bool = False
    engine_start_error: str | None = None
    live: dict[str, Generation] = field(default_factory=dict)

    @property
    def model_name(self) -> str | None:
        if self.config.served_model_name:
            return self.config.served_model_name
        info = self.client.model_info
        return info.name if info is not None else None

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): the one place that decides whether requests are admitted."""
        if self.draining:
            return False, "draining: the server is shutting down"
        state = self.client.state
        if state == "ready":
            return True, "ready"
        if self.engine_start_error is not None:
            return False, f"the engine failed to start: {self.engine_start_error}"
        if state == "loading":
            return False, "loading: the model is being loaded and warmed up"
        detail = self.client.last_error
        return False, f"engine {state}" + (f": {detail}" if detail else "")


def services_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Services:
    services: Services = connection.app.state.services
    return services
