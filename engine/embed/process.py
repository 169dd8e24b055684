"""The embedding model's own process: load, then answer requests, batching those that arrive together up to
a token budget per round, so one big request does not hold up many small ones for long."""

from __future__ import annotations

import logging
import os
import signal
from collections import deque
from multiprocessing.connection import Connection

import msgspec
import torch
from transformers.utils import logging as hf_logging

from engine.embed.config import EmbeddingConfig
from engine.embed.encoder import Encoder
from engine.embed.layout import read_layout
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
from engine.errors import ContextLengthError, InvalidRequestError
from engine.logs import configure_logging

DEFAULT_NAME = "all-MiniLM-L6-v2"

log = logging.getLogger("engine.embed")


def run_embedding_process(config: EmbeddingConfig, inbox: Connection, outbox: Connection) -> None:
    """Entry point: load and warm up, say EmbedderReady (or EmbedderFailed), serve until StopEmbedding or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when this process stops
    configure_logging(config.log_level)
    # The tokenizer's own thread pool would contend for the core the chat engine computes on.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    torch.set_num_threads(config.threads)
    # A load of a second or two: a progress bar would only be a line of carriage returns in the journal.
    hf_logging.disable_progress_bar()
    wire = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(ToEmbedder)

    def send(msg: FromEmbedder) -> None:
        outbox.send_bytes(wire.encode(msg))

    try:
        layout = read_layout(config.model)
        encoder = Encoder(layout)
        encoder.encode([[]], config.max_batch_tokens)  # the first pass pays one-off allocations; not a request
    except Exception as exc:  # any start-up failure is reported, then the process ends
        log.exception("the embedding model failed to start")
        send(EmbedderFailed(f"{type(exc).__name__}: {exc}"))
        return
    name = config.served_model_name or (DEFAULT_NAME if config.model == "default" else layout.path.name)
    info = EmbeddingModelInfo(
        name, encoder.dimensions, encoder.max_input_tokens, layout.pooling, layout.normalize, layout.matryoshka
    )
    send(EmbedderReady(info))
    log.info(
        "embedding model ready: %s (%d dimensions, %s pooling, %d tokens per input)",
        name,
        info.dimensions,
        info.pooling,
        info.max_input_tokens,
    )
    pending: deque[tuple[int, list[list[int]]]] = deque()
    while True:
        try:
            # Block only when idle; while work waits, take whatever else has arrived and batch it in.
            while not pending or inbox.poll(0):
                msg = decoder.decode(inbox.recv_bytes())
                if isinstance(msg, StopEmbedding):
                    return
                refused = _admit(encoder, msg, pending)
                if refused is not None:
                    send(refused)
        except EOFError:  # the client is gone: nobody to answer
            return
        for reply in _run_round(encoder, pending, config.max_batch_tokens):
            send(reply)


def _admit(encoder: Encoder, msg: EmbedRequest, pending: deque[tuple[int, list[list[int]]]]) -> EmbedRefused | None:
    try:
        pending.append((msg.request_id, encoder.token_ids(msg.inputs, msg.truncate)))
    except ContextLengthError as exc:
        return EmbedRefused(msg.request_id, "context_length", str(exc), exc.param)
    except InvalidRequestError as exc:
        return EmbedRefused(msg.request_id, "invalid", str(exc), exc.param)
    return None


def _run_round(
    encoder: Encoder, pending: deque[tuple[int, list[list[int]]]], budget: int
) -> list[Embedded | EmbedRefused]:
    """The oldest requests whose tokens fit the budget (at least one) in shared encoder passes."""
    taken = [pending.popleft()]
    tokens = sum(len(ids) for ids in taken[0][1])
    while pending and tokens + (more := sum(len(ids) for ids in pending[0][1])) <= budget:
        taken.append(pending.popleft())
        tokens += more
    rows = [ids for _, request in taken for ids in request]
    try:
        vectors = encoder.encode(rows, budget)
    except Exception as exc:  # a failed pass fails its requests, not the process
        log.exception("an embedding pass failed")
        return [EmbedRefused(rid, "error", f"the embedding model failed: {exc}") for rid, _ in taken]
    replies: list[Embedded | EmbedRefused] = []
    start = 0
    for rid, request in taken:
        replies.append(Embedded(rid, vectors[start : start + len(request)].tobytes(), [len(i) for i in request]))
        start += len(request)
    return replies
