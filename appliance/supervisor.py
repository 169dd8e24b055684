"""Tells systemd how the server is doing: READY=1 once /ready would answer 200, WATCHDOG=1 only while the
engine loop is heard from, STATUS= lines when the state changes. STOPPING=1 is sent by the server at SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from appliance.sdnotify import Notifier
from engine import EngineState
from web.generation.gate import EngineGate

log = logging.getLogger("appliance.supervisor")

# The engine sends a message at least every second; a few seconds of silence is a stall, not jitter.
MIN_SILENCE_S = 5.0
LOADING_TICK_S = 0.2
RUNNING_TICK_S = 2.0


class Heartbeat(Protocol):
    """What the supervisor needs from the engine client (AsyncEngineClient has it)."""

    @property
    def state(self) -> str: ...

    def healthy(self, max_silence: float = ...) -> bool: ...


class Supervisor:
    def __init__(
        self, gate: EngineGate, engine: Heartbeat, notifier: Notifier, watchdog_s: float | None, address: str
    ) -> None:
        self.gate = gate
        self.engine = engine
        self.notifier = notifier
        self.watchdog_s = watchdog_s
        # A ping is skipped once the engine has been silent this long; systemd acts after twice the interval.
        self.max_silence = max(MIN_SILENCE_S, watchdog_s or 0.0)
        self.address = address
        self._status = ""

    async def run(self, listening: Callable[[], bool], on_ready: Callable[[], None] = lambda: None) -> bool:
        """Until cancelled; on_ready runs once, when READY=1 is sent. Returns False early when the engine failed
        to start under systemd: a service stuck in "activating" until TimeoutStartSec helps nobody, while an exit
        lets Restart= and the journal speak."""
        while True:
            ready, why = self.gate.readiness()
            if ready and listening():
                break
            if self.gate.start_error is not None and self.notifier.enabled:
                self.notifier.send(f"STATUS={why}")
                return False
            self.status(why if listening() else "starting: the database first, then the model")
            await asyncio.sleep(LOADING_TICK_S)
        self._status = f"serving {self.gate.model_name} on {self.address}"
        self.notifier.send("READY=1", f"STATUS={self._status}")
        log.info("ready: %s", self._status)
        on_ready()
        tick = min(RUNNING_TICK_S, self.watchdog_s or RUNNING_TICK_S)
        last_ping = 0.0
        while True:
            ready, why = self.gate.readiness()
            self.status(f"serving {self.gate.model_name} on {self.address}" if ready else why)
            now = time.monotonic()
            # Half a tick early rather than half a tick late: sleeps overshoot.
            if self.watchdog_s is not None and now - last_ping >= self.watchdog_s - tick / 2 and self.alive():
                self.notifier.send("WATCHDOG=1")
                last_ping = now
            await asyncio.sleep(tick)

    def alive(self) -> bool:
        """The engine loop turns (heard from lately), or a crashed engine is being reloaded, which can take
        minutes for a large model; the client's start timeout bounds a reload that hangs."""
        return self.engine.healthy(max_silence=self.max_silence) or self.engine.state is EngineState.LOADING

    def status(self, text: str) -> None:
        if text != self._status:
            self._status = text
            self.notifier.send(f"STATUS={text}")
