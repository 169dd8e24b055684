"""The benchmark's load generator, run in its own process: N concurrent streaming chat requests over raw
HTTP/1.1 (so the client costs little CPU), stamping every content chunk on the machine's monotonic clock.

Imports nothing heavy (no engine, no torch): its own CPU time is part of what the benchmark reports.
Usage: python -m web.bench.load HOST:PORT KEY CLIENTS MAX_TOKENS MODEL  (JSON results on stdout)
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time
from typing import Any

import msgspec

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _stream_one(host: str, port: int, request: bytes, start: asyncio.Event) -> dict[str, Any]:
    await start.wait()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    while (await reader.readline()) not in (b"\r\n", b""):
        pass  # status line and headers
    stamps: list[tuple[float, int]] = []
    length, usage, rid, buffer = 0, 0, "", b""
    while True:
        size = int((await reader.readline()).strip() or b"0", 16)  # chunked transfer encoding
        if size == 0:
            break
        buffer += (await reader.readexactly(size + 2))[:-2]
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            data = event[6:]
            if data == b"[DONE]":
                continue
            chunk = msgspec.json.decode(data)
            rid = chunk["id"]
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            for choice in chunk["choices"]:
                text = choice["delta"].get("content") or ""
                if text:
                    length += len(text)
                    stamps.append((time.monotonic(), length))
    writer.close()
    return {"id": rid, "stamps": stamps, "tokens": usage}


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
    result = asyncio.run(run(target, key, int(clients), int(max_tokens), model))
    sys.stdout.buffer.write(msgspec.json.encode(result))


if __name__ == "__main__":
    main()
