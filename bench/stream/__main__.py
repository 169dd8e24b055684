"""Streaming benchmark: N concurrent streaming clients on random:tiny, engine alone versus through the server.

`python -m bench.stream` runs the engine alone (AsyncEngineClient in this process), then the full server (uvicorn
in this process) with bench.stream.load as the clients in a child process. Added latency per token = the client's
receipt - the moment the server process got that token from the engine (when AsyncEngineClient dispatched the
engine's step), on the one monotonic clock both processes share; so it includes every wait inside the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from bench.stream.load import MESSAGES, cpu_seconds
from bench.variant import engine_config
from engine import AsyncEngineClient, EngineConfig, RequestOutput, SamplingParams
from web.system.metrics import percentile

T = TypeVar("T")


class DeltaClock:
    """Stamps every delta when the engine client receives it, before any consumer runs (the client's public
    observe_outputs hook)."""

    def __init__(self, client: AsyncEngineClient) -> None:
        self.stamps: defaultdict[str, list[tuple[int, float]]] = defaultdict(list)  # id -> (text length, t)
        self._length: defaultdict[str, int] = defaultdict(int)
        client.observe_outputs(self.observe)

    def observe(self, outputs: Sequence[RequestOutput]) -> None:
        now = time.monotonic()
        for out in outputs:
            if out.text:
                self._length[out.request_id] += len(out.text)
                self.stamps[out.request_id].append((self._length[out.request_id], now))

    def added_ms(self, rid: str, client_stamps: list[tuple[float, int]]) -> list[float]:
        """Per delta the client received (one token each unless merged): receipt minus engine dispatch."""
        engine = self.stamps.get(rid, [])
        added, i = [], 0
        for received, length in client_stamps:
            while i < len(engine) and engine[i][0] <= length:
                added.append((received - engine[i][1]) * 1000)
                i += 1
        return added


def stream_engine_config(args: argparse.Namespace) -> EngineConfig:
    return engine_config(
        args,
        quantization="none",
        max_num_seqs=max(args.clients, 1),
        max_num_batched_tokens=args.batched_tokens,
        kv_cache_bytes=args.kv_bytes,
    )


def pct(values: list[float], q: float) -> float:
    """The server's own nearest-rank percentile, NaN for no values (printed as such)."""
    value = percentile(values, q)
    return float("nan") if value is None else value


async def engine_alone(args: argparse.Namespace) -> tuple[float, list[float]]:
    """Tokens/s and per-token gaps (ms) with no server in the way."""
    client = AsyncEngineClient(stream_engine_config(args), auto_restart=False)
    await client.start()
    ids = client.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    gaps: list[float] = []
    total = 0

    async def one() -> None:
        nonlocal total
        last = None
        async for out in client.generate(ids, params):
            now, n = time.monotonic(), len(out.token_ids)
            total += n
            if last is not None and n:
                gaps.extend([(now - last) * 1000 / n] * n)
            last = now

    start = time.monotonic()
    await asyncio.gather(*(one() for _ in range(args.clients)))
    elapsed = time.monotonic() - start
    await client.shutdown()
    return total / elapsed, gaps


async def through_server(args: argparse.Namespace) -> dict[str, Any]:
    import uvicorn

    from web.app import app_of, build_gateway
    from web.config import WebConfig
    from web.db import sqlite_url
    from web.keys.info import KeyLimits

    with tempfile.TemporaryDirectory() as tmp:
        client = AsyncEngineClient(stream_engine_config(args), auto_restart=False)
        clock = DeltaClock(client)
        gateway = build_gateway(WebConfig(database_url=sqlite_url(Path(tmp) / "bench.db")), client)
        app = app_of(gateway)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http=args.http)
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        while client.state != "ready" or client.model_info is None:
            await asyncio.sleep(0.1)
        _, key = await gateway.keys.create("bench", KeyLimits())
        cpu_before = cpu_seconds()
        load = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.stream.load", f"127.0.0.1:{port}", key, str(args.clients),
            str(args.max_tokens), client.model_info.name, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await load.communicate()
        server_cpu = cpu_seconds() - cpu_before
        server.should_exit = True
        await serving
        if load.returncode != 0:
            raise SystemExit(f"the load generator failed (exit {load.returncode}); its reason is above")
    return {**msgspec.json.decode(out), "server_cpu": server_cpu, "clock": clock}


def report(args: argparse.Namespace, alone: tuple[float, list[float]], served: dict[str, Any]) -> None:
    tokens = sum(r["tokens"] for r in served["results"])
    rate = tokens / (served["ended"] - served["began"])
    added, later, gaps, chunks = [], [], [], 0
    for r in served["results"]:
        per_token = served["clock"].added_ms(r["id"], r["stamps"])
        added.extend(per_token)
        later.extend(per_token[1:])
        previous = None
        for ts, _ in r["stamps"]:
            chunks += 1
            if previous is not None:
                gaps.append((ts - previous) * 1000)
            previous = ts
    engine_rate, engine_gaps = alone
    lines = [
        f"workload: {args.clients} concurrent streams x {args.max_tokens} tokens, {args.model}, {os.cpu_count()} CPUs",
        f"engine alone:   {engine_rate:8.0f} tokens/s  per-token gap p50 {pct(engine_gaps, 0.5):7.2f} ms"
        f"  p99 {pct(engine_gaps, 0.99):7.2f} ms",
        f"through server: {rate:8.0f} tokens/s  per-chunk gap p50 {pct(gaps, 0.5):7.2f} ms"
        f"  p99 {pct(gaps, 0.99):7.2f} ms",
        f"server added latency per token: p50 {pct(added, 0.5):.2f} ms  p99 {pct(added, 0.99):.2f} ms"
        f"  ({len(added)} deltas matched, {tokens / max(chunks, 1):.2f} tokens per chunk);"
        f" after the first token p50 {pct(later, 0.5):.2f} ms  p99 {pct(later, 0.99):.2f} ms",
        f"CPU per streamed token: server process {served['server_cpu'] / tokens * 1e6:.0f} us (with its engine-client"
        f" threads), load generator {served['cpu'] / tokens * 1e6:.0f} us",
        f"bars: >= 5000 streamed tokens/s: {'met' if rate >= 5000 else 'NOT met'};"
        f" <= 5 ms p99 added per token: {'met' if pct(added, 0.99) <= 5 else 'NOT met'}",
    ]
    print("\n".join(lines))


def _run(coro: Coroutine[Any, Any, T], loop: str) -> T:
    """Run on uvloop when installed, as `appliance serve` does (uvicorn picks it), unless asked for asyncio."""
    if loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stream", description=__doc__)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--model", default="random:tiny")
    parser.add_argument("--batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-bytes", type=int, default=512 << 20)
    parser.add_argument("--http", default="auto", help="uvicorn's HTTP implementation: auto, h11 or httptools")
    parser.add_argument("--loop", default="auto", help="event loop: auto (uvloop when installed) or asyncio")
    args = parser.parse_args()
    alone = _run(engine_alone(args), args.loop)
    served = _run(through_server(args), args.loop)
    report(args, alone, served)


if __name__ == "__main__":
    main()
