"""Whether the server admits requests now: the local engine's state, its start-up failure, whether any remote
backend is up, and the drain at shutdown."""

from __future__ import annotations

import logging
import time

from engine import EngineError, EngineState
from web.backends.router import Router
from web.errors import ServiceUnavailable
from web.generation.backend import EngineClient

log = logging.getLogger("web.generation")


class EngineGate:
    def __init__(
        self, client: EngineClient, served_model_name: str | None = None, router: Router | None = None
    ) -> None:
        self.client = client  # the local engine (web/backends/none.py's NoLocalEngine where all are remote)
        self.router = router
        self.served_model_name = served_model_name
        self.started_at = int(time.time())
        self.draining = False  # for good: the server is shutting down (InFlight.drain)
        self.start_error: str | None = None
        # A switch of the served model (web/system/models.py): the model it moves to, and whether requests in
        # flight are still finishing. Its engine restart is not a crash.
        self.switching: str | None = None
        self.switch_draining = False

    @property
    def model_name(self) -> str | None:
        """The box's model as clients name it; where the local engine has none (yet, or at all), the first model
        the remote backends serve."""
        if self.served_model_name:
            return self.served_model_name
        info = self.client.model_info
        if info is not None:
            return info.name
        if self.router is not None:
            names = self.router.model_names()
            return names[0] if names else None
        return None

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): the one place that decides whether requests are admitted."""
        if self.draining:
            return False, "draining: the server is shutting down"
        if self.switching is not None:
            if self.switch_draining:
                return False, f"switching model to {self.switching}: requests in flight finish first"
            return False, f"switching model to {self.switching}: {self._engine_readiness()[1]}"
        return self._engine_readiness()

    def _engine_readiness(self) -> tuple[bool, str]:
        local = self._local_readiness()
        if self.router is None or not self.router.has_remotes:
            return local
        unprobed = [b.name for b in self.router.remotes if not b.probed]
        if unprobed:
            return False, f"waiting for the first probe of {', '.join(unprobed)}"
        if self.router.up() and self.router.model_names():
            return True, "ready"
        why = "no backend is up" if not self.router.up() else "no backend serves a model"
        reasons = self.router.remote_reasons()
        if self.router.embedded is not None:
            reasons.insert(0, f"the local engine: {local[1]}")
        return False, why + (f" ({'; '.join(reasons)})" if reasons else "")

    @property
    def none_up(self) -> bool:
        """Remote backends, and none of them (nor the local engine) up."""
        return self.router is not None and self.router.has_remotes and not self.router.up()

    def _local_readiness(self) -> tuple[bool, str]:
        state = self.client.state
        if state == EngineState.READY:
            return True, "ready"
        if self.start_error is not None:
            return False, f"the engine failed to start: {self.start_error}"
        if self.crashed:
            return False, self.crash_report()
        if state == EngineState.LOADING:
            step = self.client.load_step
            return False, f"loading: {step}" if step else "loading: the model is being loaded and warmed up"
        detail = self.client.last_error
        return False, f"engine {state}" + (f": {detail}" if detail else "")

    @property
    def crashed(self) -> bool:
        """The engine process died and is not back yet: down, or loading again in a restart after the crash (a
        first load never counts restarts)."""
        state = self.client.state
        return self.switching is None and (
            state == EngineState.DOWN or (state == EngineState.LOADING and self.client.restarts > 0)
        )

    def crash_report(self) -> str:
        """What the operator and the client read while the engine is down: how many restarts, and why it died.
        "state: detail" like the other reasons (appliance status splits them there)."""
        n = self.client.restarts
        doing = "restarting" if self.client.state == EngineState.LOADING else "down"
        last = self.client.last_error or "no exit reason recorded"
        return f"{doing}: after a crash ({n} restart{'' if n == 1 else 's'}; last: {last})"

    def check(self) -> None:
        """Refuse while not ready: engine_unavailable after a crash (the README's name), else not_ready."""
        ready, why = self.readiness()
        if not ready:
            code = "engine_unavailable" if (self.crashed or self.none_up) and not self.draining else "not_ready"
            raise ServiceUnavailable(f"not ready: {why}", code=code)

    async def start_engine(self) -> None:
        """Start the engine; a failure is kept (readiness says it) rather than raised."""
        try:
            info = await self.client.start()
            log.info("engine ready: %s (max_model_len %d)", info.name, info.max_model_len)
        except EngineError as exc:
            self.start_error = str(exc)
            log.error("the engine failed to start: %s", exc)
