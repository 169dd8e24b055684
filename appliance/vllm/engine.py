"""APPLIANCE_ENGINE=vllm: a local vLLM OpenAI server the appliance starts and supervises, behind the same engine
client protocol as the embedded engine (web/generation/backend.py), so readiness, restarts and drain are unchanged.

Requests stream from its /v1/completions as token ids (web.backends.upstream); a server that dies fails the
requests in flight with EngineDeadError and is started again, as AsyncEngineClient restarts a crashed engine."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import secrets
import signal
import time
from collections.abc import Sequence
from typing import Any

import httpx

from appliance.settings import Settings
from appliance.vllm import process as vllm_process
from appliance.vllm.metrics import Scrape, device_memory, scrape, stats_of
from appliance.vllm.stream import VllmStream
from engine import (
    EngineDeadError,
    EngineError,
    EngineState,
    EngineStats,
    InvalidRequestError,
    ModelInfo,
    ModelLoadError,
    QueuePosition,
    SamplingParams,
    Tenant,
    load_tokenizer,
)
from web.backends.upstream import Upstream
from web.backends.upstream_stream import UpstreamStream

log = logging.getLogger("appliance.vllm")

READY_POLL_S = 0.5
SCRAPE_S = 1.0  # the load the console and the router read, and the heartbeat the watchdog reads
MEMORY_EVERY = 5  # scrapes: nvidia-smi takes tens of ms
STOP_TIMEOUT_S = 30.0  # vLLM finishes its engine core's shutdown in a few seconds


class VllmEngineClient:
    """state: an EngineState (stopped -> loading -> ready; down when the server died; stopping on shutdown)."""

    def __init__(self, settings: Settings, *, auto_restart: bool = True, start_timeout: float = 1800.0) -> None:
        self.settings = settings
        self.auto_restart = auto_restart
        self.start_timeout = start_timeout
        self.state = EngineState.STOPPED
        self.model_info: ModelInfo | None = None
        self.tokenizer: Any = None
        self.last_error: str | None = None
        self.load_step: str | None = None
        self.restarts = 0
        self.last_heartbeat = 0.0  # monotonic time of the latest metrics the server answered with
        self.process: asyncio.subprocess.Process | None = None
        self._device: str | None = None
        self._launch: vllm_process.Launch | None = None
        self._scrape: Scrape | None = None
        self._weights_bytes = 0
        self._memory = (0, 0)  # the device's (total, free) bytes, read every MEMORY_EVERY scrapes
        self._http: httpx.AsyncClient | None = None
        self._upstream: Upstream | None = None
        self._streams: dict[str, UpstreamStream] = {}
        self._last_lines: collections.deque[str] = collections.deque(maxlen=5)
        self._tasks: list[asyncio.Task[None]] = []  # this server's log pipe, exit watcher and scraper
        self._restart_task: asyncio.Task[None] | None = None

    # -- life cycle ------------------------------------------------------------------------------------

    async def start(self) -> ModelInfo:
        """Start the server and wait until it answers /health and lists the served name in /v1/models."""
        self.state = EngineState.LOADING
        self.load_step = None
        try:
            info = await asyncio.wait_for(self._start(), self.start_timeout)
        except TimeoutError:
            await self._stop_server()
            self.state = EngineState.DOWN
            raise ModelLoadError(f"vLLM did not become ready within {self.start_timeout:.0f} s") from None
        except BaseException:
            await self._stop_server()
            self.state = EngineState.DOWN
            raise
        self.model_info = info
        self.state = EngineState.READY
        self._tasks.append(asyncio.create_task(self._scrape_loop(), name="vllm-scrape"))
        return info

    async def _start(self) -> ModelInfo:
        settings = self.settings
        model, name = await asyncio.to_thread(vllm_process.model_dir, settings, self._progress)
        served = settings.served_model_name or name
        if self._device is None:
            self._device = await asyncio.to_thread(vllm_process.resolve_device, settings)
        key = secrets.token_urlsafe(24)  # a fresh one per start: only this process ever knows it
        port = vllm_process.free_port()
        launch = vllm_process.plan(settings, model, served, self._device, port, key)
        log.info("starting vLLM: %s", " ".join(launch.command))
        self._last_lines.clear()
        process = await vllm_process.spawn(launch)
        self.process, self._launch = process, launch
        self._tasks = [
            asyncio.create_task(vllm_process.pipe_log(process, key, self._on_line), name="vllm-log"),
            asyncio.create_task(self._watch(process), name="vllm-exit"),
        ]
        self._http = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        upstream = self._upstream = Upstream(f"http://127.0.0.1:{port}", key, self._http)
        max_model_len = await self._until_ready(process, upstream, served)
        self._scrape = await scrape(self._http, upstream.base_url)
        if self.tokenizer is None or self.model_info is None or self.model_info.tokenizer_dir != str(model):
            self.tokenizer = await asyncio.to_thread(load_tokenizer, model)
        num_blocks, block_size, pool = self._scrape.blocks if self._scrape is not None else (0, 0, 0)
        if not num_blocks:  # a vLLM without vllm:cache_config_info: the context is the bound the gateway checks
            block_size = block_size or 16
            num_blocks = -(-max_model_len // block_size)
        self._weights_bytes = sum(p.stat().st_size for p in model.glob("*.safetensors"))
        return ModelInfo(
            name=served,
            max_model_len=max_model_len,
            tokenizer_dir=str(model),
            eos_token_ids=vllm_process.eos_token_ids(model, self.tokenizer),
            device=launch.device,
            dtype=launch.dtype,
            quantization=launch.quantization,
            num_kv_blocks=num_blocks,
            block_size=block_size,
            kv_bytes_per_block=pool // num_blocks if num_blocks else 0,
            kv_cache_dtype=self.settings.kv_cache_dtype,
        )

    async def _until_ready(self, process: asyncio.subprocess.Process, upstream: Upstream, served: str) -> int:
        """The served name's context length, once the server is up and lists it."""
        while True:
            if process.returncode is not None:
                await self._log_read()
                raise ModelLoadError(f"vLLM exited with code {process.returncode} while starting{self._tail()}")
            if await upstream.health() == "up":
                with contextlib.suppress(httpx.HTTPError):
                    listed = {m.id: m for m in await upstream.models()}
                    if served in listed:
                        return listed[served].max_model_len or self.settings.max_model_len or 2048
            await asyncio.sleep(READY_POLL_S)

    async def shutdown(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to the server (and the engine core it forked), SIGKILL after `timeout`."""
        self.state = EngineState.STOPPING
        if self._restart_task is not None:
            self._restart_task.cancel()
            await asyncio.gather(self._restart_task, return_exceptions=True)
        await self._stop_server(timeout)
        self.state = EngineState.STOPPED

    async def _stop_server(self, timeout: float = STOP_TIMEOUT_S) -> None:
        process, self.process = self.process, None
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            if task.get_name() != "vllm-log":  # the pipe ends by itself with the server's last lines
                task.cancel()
        if process is not None:
            await vllm_process.stop(process, timeout)
        if tasks:  # none when the start failed before vLLM ran (the model's conversion)
            # A grandchild that left the process group could hold the pipe open: its lines are not waited for.
            await asyncio.wait(tasks, timeout=5.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._drop_streams()

    async def _drop_streams(self) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            await stream.aclose()
        http, self._http, self._upstream = self._http, None, None
        if http is not None:
            await http.aclose()

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if self.process is not process or self.state != EngineState.READY:
            return  # a stop, or a start that reports the exit itself
        self.last_error = f"the vLLM server exited (code {code}){self._tail()}"
        log.error("%s", self.last_error)
        self.state = EngineState.DOWN
        self.process = None
        vllm_process.kill_group(process.pid, signal.SIGKILL)  # its engine core, orphaned
        # The streams in flight fail on their own (the connections reset, as UpstreamError: EngineDeadError).
        self._streams.clear()
        if self.auto_restart:
            self._restart_task = asyncio.ensure_future(self._restart_after_crash())

    async def _restart_after_crash(self) -> None:
        await self._stop_server()
        delay = 1.0
        while self.state == EngineState.DOWN:
            self.restarts += 1
            try:
                await self.start()
            except EngineError as exc:
                log.error("vLLM restart failed: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)

    def _on_line(self, line: str) -> None:
        self._last_lines.append(line)
        if self.state == EngineState.LOADING:
            self.load_step = vllm_process.load_step(line)

    def _progress(self, step: str) -> None:
        self.load_step = step  # the GGUF conversion's progress (a worker thread; a str assignment is atomic)

    async def _log_read(self, timeout: float = 2.0) -> None:
        """Until the log pipe has given its last lines (it ends with the process; the exit can be seen first)."""
        pipes = [t for t in self._tasks if t.get_name() == "vllm-log"]
        if pipes:
            await asyncio.wait(pipes, timeout=timeout)

    def _tail(self) -> str:
        return f"; its last line: {self._last_lines[-1][:300]}" if self._last_lines else ""

    async def _scrape_loop(self) -> None:
        http, upstream = self._http, self._upstream
        assert http is not None and upstream is not None
        device = self._launch.device if self._launch is not None else "cpu"
        for tick in itertools.count():
            read = await scrape(http, upstream.base_url)
            if read is not None:
                self._scrape = read
                self.last_heartbeat = time.monotonic()
            if tick % MEMORY_EVERY == 0:
                self._memory = await asyncio.to_thread(device_memory, device)
            await asyncio.sleep(SCRAPE_S)

    def healthy(self, max_silence: float = 30.0) -> bool:
        """Ready and answering its /metrics lately: a hung server (not just a dead one) fails this."""
        return self.state == EngineState.READY and time.monotonic() - self.last_heartbeat < max_silence

    # -- requests --------------------------------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        tenant: Tenant | None = None,  # vLLM has no fair share of its own: the gateway's queue is the fair one
    ) -> VllmStream:
        rid = request_id or secrets.token_hex(16)
        upstream, info = self._upstream, self.model_info
        if self.state != EngineState.READY or upstream is None or info is None:
            dead = EngineDeadError(f"the engine is not ready (state: {self.state})")
            return VllmStream(self._streams, rid, None, dead)
        if rid in self._streams:
            return VllmStream(self._streams, rid, None, InvalidRequestError(f"request id {rid!r} is already in use"))
        ids = list(self.tokenizer.encode(prompt, add_special_tokens=False)) if isinstance(prompt, str) else prompt
        stream = upstream.generate(info.name, ids, params, rid, arrival_time)
        self._streams[rid] = stream
        return VllmStream(self._streams, rid, stream, None)

    def queue_position(self, request_id: str) -> QueuePosition | None:
        return None  # vLLM does not say where a waiting request stands

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            await stream.abort()

    def stats(self) -> EngineStats | None:
        if self.state != EngineState.READY or self._launch is None or self.model_info is None:
            return None
        return stats_of(self._scrape, self._launch, self.model_info, self._weights_bytes, self._memory)
