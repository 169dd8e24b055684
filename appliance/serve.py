"""Serving with uvicorn, with a SIGTERM that drains: stop admitting (503, /ready fails) while still answering,
let requests in flight finish up to the drain timeout, abort the rest, finalize every row, then exit 0.
Under systemd it also notifies: READY, WATCHDOG and STATUS through the supervisor, STOPPING at the drain."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from types import FrameType

import uvicorn

from appliance.connections import ConnectionGuard, fit_open_file_limit, guarded_protocol
from appliance.sdnotify import Notifier, watchdog_interval
from appliance.settings import Settings
from appliance.supervisor import Supervisor
from appliance.wiring import build_gateway, embedding_client, engine_client, start_embeddings
from engine import AsyncEmbeddingClient
from engine import logs as engine_logs
from web.app import Gateway, app_of

log = logging.getLogger("appliance.serve")


class DrainingServer(uvicorn.Server):
    """uvicorn closes its socket at once on SIGTERM; this one first drains while the socket stays open, so
    callers get a clear 503 and load balancers see /ready fail. A second signal forces the exit."""

    def __init__(
        self,
        config: uvicorn.Config,
        gateway: Gateway,
        supervisor: Supervisor,
        embeddings: AsyncEmbeddingClient | None = None,
    ) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.supervisor = supervisor
        self.embeddings = embeddings  # started beside the chat engine, on this loop; stopped after the server
        self.failed = False  # the engine could not start under systemd: exit non-zero
        self._drain_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        supervising = asyncio.create_task(self._supervise(), name="systemd-supervisor")
        embedding = self.embeddings
        starting = asyncio.create_task(start_embeddings(embedding), name="embeddings-start") if embedding else None
        try:
            await super().serve(sockets)
        finally:
            supervising.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervising
            if embedding is not None and starting is not None:
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
                await embedding.shutdown()

    async def _supervise(self) -> None:
        if not await self.supervisor.run(lambda: self.started, on_ready=settle_heap):
            log.error("the engine failed to start; exiting so that systemd can restart the service")
            self.failed = True
            self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recording the signal: uvicorn would re-raise it after shutdown and the exit status would not be 0.
        if self._drain_task is not None or self._loop is None:
            self.should_exit = True
            self.force_exit = self._drain_task is not None
            return
        timeout = self.gateway.config.drain_timeout
        log.info("received %s: draining for up to %.0f s", signal.Signals(sig).name, timeout)
        self.supervisor.notifier.send("STOPPING=1", f"STATUS=draining requests in flight for up to {timeout:.0f} s")
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self.gateway.inflight.drain(self.gateway.config.drain_timeout)
        finally:
            self.should_exit = True


def settle_heap() -> None:
    """Once serving: start-up's garbage collected and the rest (imports, the app, the tokenizer) frozen, so that a
    full collection while serving walks only what serving made (each walked the whole heap: 0.1-0.3 s here). The
    one collection here holds the event loop about that long, once."""
    gc.collect()
    gc.freeze()


def configure_logging(level: str) -> None:
    """The journal's priority prefixes when systemd runs us, timestamped lines elsewhere (engine.logs)."""
    engine_logs.configure_logging(level)
    # The scheduler logs every run of the 5-second sampler at INFO.
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, logging.getLogger().level))
    # httpx logs every request at INFO: each backend's health and metrics probes would be lines every second.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))


def serve(settings: Settings) -> None:
    """Serve until SIGTERM/SIGINT; raises SystemExit(1) when the engine could not start under systemd."""
    configure_logging(settings.log_level)
    client = engine_client(settings)
    embeddings = embedding_client(settings)
    gateway = build_gateway(settings, client, embeddings)
    guard = ConnectionGuard(fit_open_file_limit(settings.max_connections), settings.request_read_timeout)
    config = uvicorn.Config(
        app_of(gateway),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # every request has its history row; a log line each would cost CPU under load
        lifespan="on",
        # uvloop and httptools (both dependencies): per streamed token they cost the server a third less CPU than
        # asyncio and h11, which is what keeps 100 streams within a few ms of the engine (python -m bench.stream).
        loop="uvloop",
        # httptools, with a deadline to send each request and a cap on connections (appliance.connections).
        http=guarded_protocol(guard),
        timeout_graceful_shutdown=5,
        # uvicorn's default of 5 s equals httpx's (and so the openai package's) idle expiry: a client reusing a
        # connection just as the server closes it gets a bare connection error on a POST it will not retry.
        timeout_keep_alive=settings.keep_alive_timeout,
        log_config=None,
    )
    # The imports and the app live as long as the process: frozen, the tokenizer's load and the engine's start
    # beside it run no full collection over them (a start before this ran seven, 1.1 s in all).
    gc.freeze()
    notifier = Notifier.from_environment()
    address = f"[{settings.host}]:{settings.port}" if ":" in settings.host else f"{settings.host}:{settings.port}"
    supervisor = Supervisor(gateway.gate, client, notifier, watchdog_interval(), address)
    log.info("listening on %s; the engine loads %s now (its progress follows)", address, settings.model)
    server = DrainingServer(config, gateway, supervisor, embeddings)
    try:
        server.run()
    finally:
        notifier.close()
        gc.unfreeze()  # for the interpreter's last collection (engine.worker says why)
    if server.failed:
        raise SystemExit(1)
