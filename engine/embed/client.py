"""The async face of the embedding model: start its process, embed(), shutdown(). A dead process fails every
request in flight with one EngineDeadError and is started again (auto_restart)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from engine.embed.config import EmbeddingConfig
from engine.embed.messages import (
    Embedded,
    EmbedderFailed,
    EmbedderReady,
    EmbeddingModelInfo,
    EmbedRefused,
    EmbedRequest,
    FromEmbedder,
    StopEmbedding,
    ToEmbedder,
)
from engine.errors import ContextLengthError, EngineDeadError, EngineError, InvalidRequestError, ModelLoadError
from engine.messages import EngineState

if TYPE_CHECKING:
    from engine.worker import Worker

log = logging.getLogger("engine.embed.client")

EmbeddingInput = str | Sequence[int]


@dataclass(frozen=True, slots=True)
class Embeddings:
    """vectors: one float32 row per input, in input order; token_counts: each input's tokens (after any cut)."""

    vectors: np.ndarray
    token_counts: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(self.token_counts)


class AsyncEmbeddingClient:
    """state: an EngineState (stopped -> loading -> ready; down when the process died; stopping on shutdown)."""

    def __init__(self, config: EmbeddingConfig, *, auto_restart: bool = True, start_timeout: float = 600.0) -> None:
        self.config = config
        self.auto_restart = auto_restart
        self.start_timeout = start_timeout
        self.state = EngineState.STOPPED
        self.model_info: EmbeddingModelInfo | None = None
        self.restarts = 0
        self.last_error: str | None = None
        self._process: Worker | None = None
        self._conn: Connection | None = None
        self._sending = threading.Lock()
        self._waiting: dict[int, asyncio.Future[Embedded]] = {}
        self._ids = itertools.count()
        self._generation = 0
        self._ready: asyncio.Future[EmbeddingModelInfo] | None = None
        self._restarting: asyncio.Task[None] | None = None
        self._wire = msgspec.msgpack.Encoder()

    async def start(self) -> EmbeddingModelInfo:
        """Spawn the embedding process and wait until its model is loaded."""
        loop = asyncio.get_running_loop()
        self._generation += 1
        self.state = EngineState.LOADING
        from engine.worker import start_worker  # here, not with this module: engine/client.py says why

        # torch and the model load there, never here
        self._process, inbox_w, outbox_r = start_worker("engine.embed.process:run_embedding_process", self.config)
        self._conn = inbox_w
        self._ready = loop.create_future()
        reader_args = (outbox_r, self._process, self._generation, loop)
        threading.Thread(target=self._read, args=reader_args, daemon=True).start()
        try:
            info = await asyncio.wait_for(asyncio.shield(self._ready), self.start_timeout)
        except TimeoutError:
            self._kill()
            self.state = EngineState.DOWN
            raise ModelLoadError(f"the embedding model was not ready within {self.start_timeout:.0f} s") from None
        except EngineError:
            self._kill()
            self.state = EngineState.DOWN
            raise
        self.model_info = info
        self.state = EngineState.READY
        return info

    async def restart(self) -> EmbeddingModelInfo:
        self._kill()
        self.restarts += 1
        return await self.start()

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the process to stop; kill it if it does not within timeout."""
        self.state = EngineState.STOPPING
        if self._restarting is not None:
            self._restarting.cancel()
        proc = self._process
        if proc is not None and proc.is_alive():
            await asyncio.to_thread(self._send, StopEmbedding())
            await asyncio.to_thread(proc.join, timeout)
        self._kill()
        self._fail_all(EngineDeadError("the embedding model is shutting down"))
        self.state = EngineState.STOPPED

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def healthy(self) -> bool:
        return self.state == EngineState.READY and self._process is not None and self._process.is_alive()

    async def embed(
        self, inputs: Sequence[EmbeddingInput], *, dimensions: int | None = None, truncate: bool = False
    ) -> Embeddings:
        """One vector per input (a text, or token ids without the model's special tokens). Refusals:
        InvalidRequestError (empty, too many inputs, bad token ids, `dimensions` the model cannot give),
        ContextLengthError (an input over model_info.max_input_tokens, unless `truncate` cuts it),
        EngineDeadError (not ready, or the process died)."""
        info = self.model_info
        if self.state != EngineState.READY or info is None:
            raise EngineDeadError(f"the embedding model is not ready (state: {self.state})")
        wire_inputs = _checked_inputs(inputs, self.config.max_inputs)
        cut = _checked_dimensions(dimensions, info)
        request_id = next(self._ids)
        future: asyncio.Future[Embedded] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            await asyncio.to_thread(self._send, EmbedRequest(request_id, wire_inputs, truncate))
            result = await future
        finally:
            self._waiting.pop(request_id, None)
        vectors = np.frombuffer(result.vectors, dtype=np.float32).reshape(len(result.token_counts), info.dimensions)
        if cut is not None:
            vectors = vectors[:, :cut]
            if info.normalized:  # a cut unit vector is shorter than one: make it a unit vector again
                vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return Embeddings(vectors, result.token_counts)

    def _send(self, msg: ToEmbedder) -> None:
        data = self._wire.encode(msg)
        with self._sending:
            if self._conn is None:
                raise EngineDeadError("the embedding model is not running")
            try:
                self._conn.send_bytes(data)
            except OSError:
                raise EngineDeadError("the embedding process is gone") from None

    def _read(self, conn: Connection, process: Any, generation: int, loop: asyncio.AbstractEventLoop) -> None:
        decoder = msgspec.msgpack.Decoder(FromEmbedder)
        while generation == self._generation:
            try:
                msg = decoder.decode(conn.recv_bytes())
            except (EOFError, OSError):
                break
            loop.call_soon_threadsafe(self._dispatch, msg, generation)
        conn.close()
        process.join(2)  # reaped, so the log can say how it ended (-9: killed, as by the kernel's OOM killer)
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._on_exit, generation, process.exitcode)

    def _dispatch(self, msg: FromEmbedder, generation: int) -> None:
        if generation != self._generation:
            return
        if isinstance(msg, EmbedderReady | EmbedderFailed):
            if self._ready is not None and not self._ready.done():
                if isinstance(msg, EmbedderReady):
                    self._ready.set_result(msg.info)
                else:
                    self.last_error = msg.message
                    self._ready.set_exception(ModelLoadError(msg.message))
            return
        future = self._waiting.get(msg.request_id)
        if future is None or future.done():
            return
        if isinstance(msg, Embedded):
            future.set_result(msg)
        else:
            future.set_exception(_refusal(msg))

    def _on_exit(self, generation: int, code: int | None) -> None:
        if generation != self._generation or self.state in (EngineState.STOPPING, EngineState.STOPPED):
            return
        self.last_error = f"the embedding process exited (code {code})"
        log.error("%s", self.last_error)
        self.state = EngineState.DOWN
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineDeadError(self.last_error))
        self._fail_all(EngineDeadError(self.last_error))
        if self.auto_restart and self.model_info is not None:
            self._restarting = asyncio.ensure_future(self._come_back())

    async def _come_back(self) -> None:
        """Restart after a crash, waiting longer after each failed try (at most a minute)."""
        for attempt in itertools.count():
            try:
                await self.restart()
                return
            except EngineError as exc:
                log.error("embedding model restart failed: %s", exc)
                await asyncio.sleep(min(2.0**attempt, 60.0))

    def _kill(self) -> None:
        self._generation += 1  # the old process's reader stops dispatching
        with self._sending:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        proc = self._process
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        self._process = None

    def _fail_all(self, error: EngineError) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)


def _checked_inputs(inputs: Sequence[EmbeddingInput], max_inputs: int) -> list[str | list[int]]:
    """Each input a text or a list of integers: anything else would not cross the process boundary."""
    items = [inputs] if isinstance(inputs, str) else list(inputs)
    if not items:
        raise InvalidRequestError("input must hold at least one text or token-id list", "input")
    if len(items) > max_inputs:
        raise InvalidRequestError(f"input holds {len(items)} items; at most {max_inputs} per request", "input")
    checked: list[str | list[int]] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            checked.append(item)
        elif isinstance(item, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            checked.append([int(t) for t in item])
        else:
            raise InvalidRequestError(f"input {i} is neither a text nor a list of token ids", "input")
    return checked


def _checked_dimensions(dimensions: int | None, info: EmbeddingModelInfo) -> int | None:
    """None: the model's full vectors; else how many leading dimensions to keep."""
    if dimensions is None or dimensions == info.dimensions:
        return None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions < info.dimensions:
        raise InvalidRequestError(
            f"dimensions must be an integer from 1 to {info.dimensions}, not {dimensions!r}", "dimensions"
        )
    if not info.matryoshka:
        raise InvalidRequestError(
            f"{info.name} gives {info.dimensions} dimensions only: it was not Matryoshka-trained, so its vectors "
            "cut short would not be embeddings; leave dimensions out",
            "dimensions",
        )
    return dimensions


def _refusal(msg: EmbedRefused) -> EngineError:
    if msg.kind == "context_length":
        return ContextLengthError(msg.message, msg.param, prompt_too_long=True)
    if msg.kind == "invalid":
        return InvalidRequestError(msg.message, msg.param)
    return EngineError(msg.message)
