"""The async side of the engine, used by web/: start the engine process, generate(), abort(), stats().

Each request's deltas go to a one-slot collector that merges them while the consumer is slow, so memory
stays bounded. A dead engine process surfaces as EngineDeadError on every request in flight; restart()
(or auto_restart) starts a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import msgspec

from engine.config import EngineConfig
from engine.errors import (
    ContextLengthError,
    EngineDeadError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    QueueFullError,
)
from engine.hf import load_tokenizer, named_tokenizer_class
from engine.messages import (
    AbortRequests,
    AddRequest,
    EngineState,
    EngineStats,
    FromCore,
    Loading,
    ModelInfo,
    QueuePosition,
    Ready,
    Rejected,
    RequestOutput,
    Shutdown,
    StartFailed,
    StepOutputs,
    ToCore,
)
from engine.sample.prompts import prompt_ids
from engine.sampling_params import SamplingParams
from engine.sched.tenant import Tenant

if TYPE_CHECKING:
    from engine.worker import Worker

log = logging.getLogger("engine.client")


class _Collector:
    """One request's pending output: deltas merge in place until the consumer takes them."""

    __slots__ = ("error", "event", "pending")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.pending: RequestOutput | None = None
        self.error: Exception | None = None

    def put(self, out: RequestOutput) -> None:
        if self.pending is None:
            self.pending = out
        else:
            self.pending.merge(out)
        self.event.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.event.set()

    async def get(self) -> RequestOutput:
        await self.event.wait()
        self.event.clear()
        if self.pending is not None:
            out, self.pending = self.pending, None
            return out
        assert self.error is not None
        raise self.error


OutputObserver = Callable[[Sequence[RequestOutput]], None]


class RequestStream:
    """One request's deltas, as an async iterator; closing it before the final delta aborts the request."""

    __slots__ = ("_client", "_collector", "_done", "_error", "request_id")

    def __init__(
        self, client: AsyncEngineClient, request_id: str, collector: _Collector | None, error: Exception | None
    ) -> None:
        self._client = client
        self.request_id = request_id
        self._collector = collector
        self._error = error
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        if self._collector is None:
            self._done = True
            assert self._error is not None
            raise self._error
        try:
            out = await self._collector.get()
        except BaseException as exc:
            # A refusal or a dead engine ends the request there; a cancelled consumer leaves it running for aclose().
            if isinstance(exc, Exception):
                self._finish(abort=False)
            raise
        if out.finished:
            self._finish(abort=False)
        return out

    async def aclose(self) -> None:
        if not self._done:
            self._finish(abort=self._collector is not None and self._collector.error is None)

    def _finish(self, abort: bool) -> None:
        self._done = True
        if self._collector is not None:
            self._client._release(self.request_id, abort)


class AsyncEngineClient:
    """state: an EngineState (stopped -> loading -> ready; down when the process died; stopping on shutdown)."""

    def __init__(self, config: EngineConfig, *, auto_restart: bool = True, start_timeout: float = 1800.0) -> None:
        self.config = config
        self.auto_restart = auto_restart
        self.start_timeout = start_timeout
        self.state = EngineState.STOPPED
        self.model_info: ModelInfo | None = None
        self.tokenizer: Any = None
        self.restarts = 0
        self.last_error: str | None = None
        self.load_step: str | None = None  # while loading: the load's latest progress line
        self._stats: EngineStats | None = None
        self.last_heartbeat = 0.0  # monotonic time of the engine's latest message: it sends one at least every second
        self._collectors: dict[str, _Collector] = {}
        self._process: Worker | None = None
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._generation = 0
        self._ready: asyncio.Future[ModelInfo] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._encoder = msgspec.msgpack.Encoder()
        self._restart_task: asyncio.Task[None] | None = None
        self._observer: OutputObserver | None = None

    # -- life cycle ------------------------------------------------------------------------------------

    async def start(self) -> ModelInfo:
        """Spawn the engine process and wait until its model is loaded and warmed up."""
        self._loop = asyncio.get_running_loop()
        self._generation += 1
        generation = self._generation
        self.state = EngineState.LOADING
        self.load_step = None
        # Imported here, not with this module: `python -m engine.worker` imports the engine package (so this
        # module) first, and runpy would run a worker module already imported a second time as __main__,
        # with a RuntimeWarning in every start's log.
        from engine.worker import start_worker

        # torch and the model code load there, never here (seconds of a blocked event loop)
        self._process, to_core_w, from_core_r = start_worker("engine.process:run_engine_process", self.config)
        self._ready = self._loop.create_future()
        self._outbox = queue.SimpleQueue()
        threading.Thread(target=self._read, args=(from_core_r, generation), daemon=True).start()
        threading.Thread(target=self._write, args=(to_core_w, self._outbox), daemon=True).start()
        if self.tokenizer is None:  # transformers' tokenizers import (~0.5 s) here while the engine loads
            threading.Thread(target=_import_tokenizers, name="tokenizer-import", daemon=True).start()
        try:
            info = await asyncio.wait_for(asyncio.shield(self._ready), self.start_timeout)
        except TimeoutError:
            self._kill()
            self.state = EngineState.DOWN
            raise ModelLoadError(f"the engine did not become ready within {self.start_timeout:.0f} s") from None
        if self.tokenizer is None or self.model_info is None or self.model_info.tokenizer_dir != info.tokenizer_dir:
            self.tokenizer = await asyncio.to_thread(load_tokenizer, info.tokenizer_dir, info.tokenizer_class)
        self.model_info = info
        self.state = EngineState.READY
        return info

    async def restart(self) -> ModelInfo:
        self._kill()
        self.restarts += 1
        return await self.start()

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the engine to stop; kill it if it does not within timeout."""
        self.state = EngineState.STOPPING
        if self._restart_task is not None:
            self._restart_task.cancel()
        proc = self._process
        if proc is not None and proc.is_alive():
            self._outbox.put(self._encoder.encode(Shutdown()))
            await asyncio.to_thread(proc.join, timeout)
        self._kill()
        self._fail_all(EngineDeadError("the engine is shutting down"))
        self.state = EngineState.STOPPED

    def _kill(self) -> None:
        self._generation += 1  # readers of the old process stop dispatching
        self._outbox.put(None)
        proc = self._process
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        self._process = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # -- requests --------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """A text prompt's ids as the served API makes them (its BOS included)."""
        return prompt_ids(self.tokenizer, text)

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        tenant: Tenant | None = None,
    ) -> RequestStream:
        """Queue the request at once (the engine takes it at its next step) and return its deltas, the last with
        finished=True. A refusal (QueueFullError, InvalidRequestError, ContextLengthError, EngineDeadError when
        the engine is not ready or dies) is raised by the first item. Closing the stream early aborts it."""
        rid = request_id or uuid.uuid4().hex
        if self.state != EngineState.READY:
            return RequestStream(self, rid, None, EngineDeadError(f"the engine is not ready (state: {self.state})"))
        if rid in self._collectors:
            return RequestStream(
                self, rid, None, InvalidRequestError(f"request id {rid!r} is already in use", "request_id")
            )
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        collector = _Collector()
        self._collectors[rid] = collector
        arrival = time.monotonic() if arrival_time is None else arrival_time
        self._send(AddRequest(rid, ids, params, arrival, tenant))
        return RequestStream(self, rid, collector, None)

    def observe_outputs(self, observer: OutputObserver | None) -> None:
        """Call `observer` with every batch of deltas as it arrives from the engine, before any consumer sees
        them (on the event loop; keep it cheap). For measurements: the benchmark stamps each token here."""
        self._observer = observer

    async def abort(self, request_id: str) -> None:
        if request_id in self._collectors:
            self._send(AbortRequests([request_id]))

    def _release(self, request_id: str, abort: bool) -> None:
        """A stream is done with its collector; `abort` when the engine may still be working on it."""
        self._collectors.pop(request_id, None)
        if abort:
            self._send(AbortRequests([request_id]))

    def stats(self) -> EngineStats | None:
        """The latest snapshot the engine sent (at most a quarter second old while busy)."""
        return self._stats

    def queue_position(self, request_id: str) -> QueuePosition | None:
        """Where a waiting request stands in the latest snapshot, with an ETA from the recent admission rate;
        None once it runs, or while it is beyond the snapshot's list (QUEUE_SNAPSHOT) or not yet in it."""
        stats = self._stats
        if stats is None:
            return None
        try:
            position = stats.queue.index(request_id) + 1
        except ValueError:
            return None
        rate = stats.admission_rate
        return QueuePosition(position, position / rate if rate > 0 else None)

    def healthy(self, max_silence: float = 30.0) -> bool:
        """Ready and heard from recently: a hung engine loop (not just a dead one) fails this."""
        return self.state == EngineState.READY and time.monotonic() - self.last_heartbeat < max_silence

    def _send(self, msg: ToCore) -> None:
        if self.state in (EngineState.READY, EngineState.LOADING):
            self._outbox.put(self._encoder.encode(msg))

    # -- threads: pipe reader and writer ----------------------------------------------------------------

    def _write(self, conn: Connection, outbox: queue.SimpleQueue[bytes | None]) -> None:
        while (data := outbox.get()) is not None:
            try:
                conn.send_bytes(data)
            except OSError:
                break
        conn.close()

    def _read(self, conn: Connection, generation: int) -> None:
        decoder = msgspec.msgpack.Decoder(FromCore)
        assert self._loop is not None
        loop = self._loop
        while True:
            try:
                msg = decoder.decode(conn.recv_bytes())
            except (EOFError, OSError):
                break
            if generation != self._generation:
                break
            loop.call_soon_threadsafe(self._dispatch, msg, generation)
        conn.close()
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._on_exit, generation)

    def _dispatch(self, msg: FromCore, generation: int) -> None:
        if generation != self._generation:
            return
        self.last_heartbeat = time.monotonic()
        if isinstance(msg, StepOutputs):
            if msg.stats is not None:
                self._stats = msg.stats
            if self._observer is not None and msg.outputs:
                self._observer(msg.outputs)
            for out in msg.outputs:
                collector = self._collectors.get(out.request_id)
                if collector is not None:
                    collector.put(out)
        elif isinstance(msg, Rejected):
            collector = self._collectors.get(msg.request_id)
            if collector is not None:
                collector.fail(_rejection(msg))
        elif isinstance(msg, Loading):
            self.load_step = msg.step
        elif isinstance(msg, Ready):
            self.load_step = None
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(msg.info)
        elif isinstance(msg, StartFailed):
            self.last_error = msg.message
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(ModelLoadError(msg.message))

    def _on_exit(self, generation: int) -> None:
        if generation != self._generation or self.state in (EngineState.STOPPING, EngineState.STOPPED):
            return
        code = self._process.exitcode if self._process is not None else None
        self.last_error = f"the engine process exited (code {code})"
        log.error("%s", self.last_error)
        self.state = EngineState.DOWN
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineDeadError(self.last_error))
        self._fail_all(EngineDeadError(self.last_error))
        if self.auto_restart and self.model_info is not None:
            self._restart_task = asyncio.ensure_future(self._restart_after_crash())

    async def _restart_after_crash(self) -> None:
        delay = 1.0
        while self.state == EngineState.DOWN:
            try:
                await self.restart()
            except EngineError as exc:
                log.error("engine restart failed: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)

    def _fail_all(self, error: EngineError) -> None:
        for collector in list(self._collectors.values()):
            collector.fail(error)


def _rejection(msg: Rejected) -> EngineError:
    if msg.kind == "queue_full":
        return QueueFullError(msg.message)
    if msg.kind == "context_length":
        return ContextLengthError(msg.message, msg.param)
    return InvalidRequestError(msg.message, msg.param)


def _import_tokenizers() -> None:
    """What load_tokenizer imports for the class the worker names, ahead of it; a failure is left for it to raise."""
    with contextlib.suppress(Exception):
        named_tokenizer_class("transformers.tokenization_utils_tokenizers.TokenizersBackend")
