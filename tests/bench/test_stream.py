"""The streaming benchmark (`python -m bench.stream`): its load generator's parser, and one small end-to-end run."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
from typing import Any

import msgspec
import pytest

from bench.stream.load import StreamError, StreamProtocol


class FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n" % len(p) + p + b"\r\n" for p in payloads) + b"0\r\n\r\n"


def sse(payload: dict[str, Any] | str) -> bytes:
    return b"data: " + (payload.encode() if isinstance(payload, str) else msgspec.json.encode(payload)) + b"\n\n"


def delta(text: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
FIRST = {"id": "chatcmpl-1", "choices": [{"delta": {"role": "assistant", "content": "Hé"}}]}
USAGE = {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}
SPLIT_EVENT = sse(delta(" over"))
RESPONSE = HEAD + chunked(
    sse(FIRST), sse(delta(" lo")) + sse(delta("")), SPLIT_EVENT[:9], SPLIT_EVENT[9:], sse(delta("!")),
    sse(USAGE), sse("[DONE]"),
)  # fmt: skip


async def feed(pieces: list[bytes], lose: bool = False) -> tuple[asyncio.Future[dict[str, Any]], FakeTransport]:
    """Play a response into a fresh protocol, piece by piece; lose=True then drops the connection."""
    done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    protocol = StreamProtocol(b"POST / HTTP/1.1\r\n\r\n", done)
    transport = FakeTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    for piece in pieces:
        protocol.data_received(piece)
    if lose:
        protocol.connection_lost(None)
    return done, transport


def check_parsed(done: asyncio.Future[dict[str, Any]], transport: FakeTransport) -> None:
    result = done.result()
    assert transport.written == b"POST / HTTP/1.1\r\n\r\n" and transport.closed
    assert result["status"] == "HTTP/1.1 200 OK" and result["id"] == "chatcmpl-1" and result["tokens"] == 4
    assert [length for _, length in result["stamps"]] == [2, 5, 10, 11]  # "Hé", " lo", " over", "!"


@pytest.mark.parametrize("seed", range(20))
async def test_the_load_generator_parses_a_stream_cut_anywhere(seed: int) -> None:
    """Chunk framing and SSE events split across reads at random points, two events in one chunk, an event
    split across two chunks: every content delta is stamped once, with the running text length."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(RESPONSE)), 12))
    check_parsed(*await feed([RESPONSE[a:b] for a, b in zip([0, *cuts], [*cuts, len(RESPONSE)], strict=True)]))


async def test_the_load_generator_parses_a_stream_one_byte_at_a_time() -> None:
    check_parsed(*await feed([RESPONSE[i : i + 1] for i in range(len(RESPONSE))]))


async def test_the_load_generator_accepts_chunk_extensions() -> None:
    body = RESPONSE[len(HEAD) :]
    size_line = body[: body.index(b"\r\n")]
    check_parsed(*await feed([HEAD + size_line + b";name=value" + body[len(size_line) :]]))


@pytest.mark.parametrize(
    ("pieces", "lose", "reason"),
    [
        ([b'HTTP/1.1 429 Too Many Requests\r\ncontent-length: 9\r\n\r\n{"err":1}'], False, "429"),
        ([HEAD + chunked(sse(FIRST), b'data: {"error": {"message": "engine died"}}\n\n')], False, "engine died"),
        ([RESPONSE[: len(RESPONSE) // 2]], True, "closed before the stream ended"),
        ([HEAD + chunked(sse(FIRST), sse(USAGE))], False, "without data: [DONE]"),
        ([HEAD + b"zz\r\n"], False, "malformed response"),
    ],
    ids=["status", "in-band-error", "cut", "no-done", "bad-size"],
)
async def test_the_load_generator_fails_a_stream_that_did_not_end_well(
    pieces: list[bytes], lose: bool, reason: str
) -> None:
    """The benchmark must stop on a failed stream, not count it as a short success."""
    done, transport = await feed(pieces, lose)
    with pytest.raises(StreamError, match=re.escape(reason)):
        done.result()
    assert transport.closed


def test_the_streaming_benchmark_runs_and_reports_its_figures() -> None:
    """A small run of the real command: engine alone, then the server with its load generator in a child process."""
    run = subprocess.run(
        [sys.executable, "-m", "bench.stream", "--clients", "4", "--max-tokens", "6"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert re.search(r"engine alone: +\d+ tokens/s", out), out
    assert re.search(r"through server: +\d+ tokens/s", out), out
    assert "(24 deltas matched" in out, out  # every token of every stream met its engine-side stamp
    assert re.search(r"server added latency per token: p50 [\d.]+ ms +p99 [\d.]+ ms", out), out
