"""The benchmark's load generator, run in its own process: N concurrent streaming chat requests over raw
HTTP/1.1, stamping every content chunk on the machine's monotonic clock.

It shares the CPU with the server on a small machine, so it is written to cost little per token: one protocol
object per connection parses chunked encoding and SSE events straight from `data_received` (no stream reader,
no per-line awaits), into typed msgspec structs, on uvloop when installed. Imports nothing heavy (no engine, no
torch): its own CPU time is part of what the benchmark reports.
Usage: python -m bench.stream.load HOST:PORT KEY CLIENTS MAX_TOKENS MODEL  (JSON results on stdout)
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time
from typing import Any

import msgspec

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta


class _Usage(msgspec.Struct):
    completion_tokens: int


class _Chunk(msgspec.Struct):
    id: str
    choices: list[_Choice]
    usage: _Usage | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class StreamError(Exception):
    """A stream that did not end as a complete 200 response with [DONE]: the benchmark stops rather than count it."""


class StreamProtocol(asyncio.Protocol):
    """One streamed request on its own connection (Connection: close); `done` resolves with its result, or fails
    with StreamError on a non-200 status, an in-band error event, a malformed frame or a cut connection."""

    def __init__(self, request: bytes, done: asyncio.Future[dict[str, Any]]) -> None:
        self.request, self.done = request, done
        self.raw = b""  # bytes not yet parsed as HTTP (headers, then chunk framing)
        self.events = b""  # chunk payloads not yet split into SSE events
        self.in_body = self.complete = self.saw_done = False
        self.status = b""
        self.stamps: list[tuple[float, int]] = []
        self.length = self.tokens = 0
        self.rid = ""
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        try:
            self._parse(time.monotonic(), self.raw + data)
        except Exception as exc:  # any parse failure ends this stream as a failure
            self._end(exc if isinstance(exc, StreamError) else StreamError(f"malformed response: {exc!r}"))

    def _parse(self, now: float, raw: bytes) -> None:
        if not self.in_body:
            end = raw.find(b"\r\n\r\n")
            if end < 0:
                self.raw = raw
                return
            self.status, self.in_body, raw = raw[: raw.find(b"\r\n")], True, raw[end + 4 :]
            if not self.status.startswith(b"HTTP/1.1 200"):
                raise StreamError(f"{self.status.decode(errors='replace')}: {raw[:300]!r}")
        pos = 0
        while (eol := raw.find(b"\r\n", pos)) >= 0:
            size = int(raw[pos:eol].split(b";", 1)[0], 16)  # a chunk size may carry extensions after ";"
            if size == 0:  # the last chunk: the response is complete
                self.complete = True
                break
            if len(raw) < eol + 2 + size + 2:
                break
            self.events += raw[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2
        self.raw = raw[pos:]
        while (cut := self.events.find(b"\n\n")) >= 0:
            event, self.events = self.events[:cut], self.events[cut + 2 :]
            self._event(event.removeprefix(b"data: "), now)
        if self.complete:
            self._end(None if self.saw_done else StreamError("the stream ended without data: [DONE]"))

    def _event(self, data: bytes, now: float) -> None:
        if data == b"[DONE]":
            self.saw_done = True
            return
        if data.startswith(b'{"error"'):
            raise StreamError(f"in-band error: {data[:300].decode(errors='replace')}")
        chunk = _decode_chunk(data)
        self.rid = chunk.id
        if chunk.usage is not None:
            self.tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if text := choice.delta.content:
                self.length += len(text)
                self.stamps.append((now, self.length))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.complete:
            self._end(StreamError(f"the connection closed before the stream ended ({exc!r})"))

    def _end(self, error: StreamError | None) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.done.done():
            return
        if error is not None:
            self.done.set_exception(error)
        else:
            status = self.status.decode(errors="replace")
            self.done.set_result({"id": self.rid, "stamps": self.stamps, "tokens": self.tokens, "status": status})


async def _stream_one(host: str, port: int, request: bytes, start: asyncio.Event) -> dict[str, Any]:
    await start.wait()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[dict[str, Any]] = loop.create_future()
    await loop.create_connection(lambda: StreamProtocol(request, done), host, port)
    return await done


async def run(target: str, key: str, clients: int, max_tokens: int, model: str) -> dict[str, Any]:
    host, port = target.split(":")
    body = msgspec.json.encode(
        {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
         "stream": True, "stream_options": {"include_usage": True}}
    )  # fmt: skip
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {target}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    start = asyncio.Event()
    tasks = [asyncio.create_task(_stream_one(host, int(port), request, start)) for _ in range(clients)]
    await asyncio.sleep(0.2)
    cpu, began = cpu_seconds(), time.monotonic()
    start.set()
    results = await asyncio.gather(*tasks)
    ended = max((r["stamps"][-1][0] for r in results if r["stamps"]), default=time.monotonic())
    return {"began": began, "ended": ended, "results": results, "cpu": cpu_seconds() - cpu}


def main() -> None:
    target, key, clients, max_tokens, model = sys.argv[1:6]
    coro = run(target, key, int(clients), int(max_tokens), model)
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        result = runner(coro)
    except StreamError as exc:
        sys.exit(f"load generator: a stream failed, so no figures: {exc}")
    sys.stdout.buffer.write(msgspec.json.encode(result))


if __name__ == "__main__":
    main()
