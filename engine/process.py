"""The engine core's busy loop in its own process, fed by an input pipe; outputs and stats go back on another.

The HTTP server never shares a GIL with the model, and a crash here cannot take the web process down.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
import threading
import time
from multiprocessing.connection import Connection

import msgspec

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.errors import ContextLengthError, InvalidRequestError, QueueFullError
from engine.logs import configure_logging
from engine.messages import (
    AbortRequests,
    AddRequest,
    FromCore,
    Loading,
    ModelInfo,
    Ready,
    Rejected,
    RequestOutput,
    Shutdown,
    StartFailed,
    StepOutputs,
    ToCore,
)

STATS_INTERVAL = 0.25  # seconds between stats snapshots while busy
IDLE_POLL = 1.0  # an idle loop still sends a snapshot this often: it doubles as a heartbeat

log = logging.getLogger("engine.process")


def run_engine_process(config: EngineConfig, inbox: Connection, outbox: Connection) -> None:
    """Entry point of the engine process: load, warm up, say Ready, then serve until Shutdown or EOF."""
    # Ctrl-C reaches the whole process group: the server decides when the engine stops, after draining.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(config.log_level)
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(ToCore)

    sending = threading.Lock()  # while loading, progress also comes from the heartbeat thread

    def send(msg: FromCore) -> None:
        data = encoder.encode(msg)
        with sending:
            outbox.send_bytes(data)

    def progress(step: str) -> None:
        log.info("%s", step)
        # /ready, systemd's STATUS and the console say it too, not only the log. A client gone: the load goes on
        # and the serving loop then meets EOF.
        with contextlib.suppress(OSError):
            send(Loading(step))

    try:
        core = EngineCore(config, progress=progress)
        core.warm_up()
    except Exception as exc:  # any start-up failure is reported, then the process ends
        log.exception("engine failed to start")
        send(StartFailed(f"{type(exc).__name__}: {exc}"))
        return
    # The model, its tokenizer and the KV pool's block table live as long as the process too: the load's garbage
    # collected, the rest frozen (engine.worker froze the imports), so a collection while serving walks only
    # what serving made.
    gc.collect()
    gc.freeze()
    send(Ready(core.model_info()))
    log.info("engine ready: %s", describe(core.model_info()))
    last_stats = 0.0
    while True:
        outputs: list[RequestOutput] = []
        timeout: float | None = 0.0 if core.has_work() else IDLE_POLL
        try:
            while inbox.poll(timeout):
                timeout = 0.0
                msg = decoder.decode(inbox.recv_bytes())
                if isinstance(msg, Shutdown):
                    return
                if isinstance(msg, AbortRequests):
                    outputs.extend(core.abort(msg.request_ids))
                else:
                    rejected = _add(core, msg)
                    if rejected is not None:
                        send(rejected)
        except EOFError:  # the client is gone: nobody to serve
            return
        if core.has_work():
            outputs.extend(core.step())
            for rejected in core.take_rejected():  # accepted, then its grammar failed to compile
                send(rejected)
        now = time.monotonic()
        due = now - last_stats >= (STATS_INTERVAL if core.has_work() or outputs else IDLE_POLL)
        if outputs or due:
            stats = core.stats() if due else None
            if due:
                last_stats = now
            send(StepOutputs(outputs, stats))


def describe(info: ModelInfo) -> str:
    """The ready line's account of the model and the pool, for a person reading the log."""
    quantization = "unquantized" if info.quantization == "none" else info.quantization
    pool_mib = info.num_kv_blocks * info.kv_bytes_per_block / 2**20
    return (
        f"{info.name} on {info.device} ({info.dtype}, {quantization}), context {info.max_model_len} tokens, "
        f"KV cache {info.kv_tokens} tokens ({info.num_kv_blocks} blocks, {pool_mib:.0f} MiB)"
    )


def _add(core: EngineCore, msg: AddRequest) -> Rejected | None:
    try:
        core.add_request(msg.request_id, msg.prompt_token_ids, msg.params, msg.arrival_time, msg.tenant)
    except QueueFullError as exc:
        return Rejected(msg.request_id, "queue_full", str(exc))
    except ContextLengthError as exc:
        return Rejected(msg.request_id, "context_length", str(exc), exc.param)
    except InvalidRequestError as exc:
        return Rejected(msg.request_id, "invalid", str(exc), exc.param)
    return None
