"""`python -m bench.embed`: texts per second through the embedding client (its own process, one torch thread),
as one request of N texts and as N concurrent one-text requests that the process batches together."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from engine import AsyncEmbeddingClient, EmbeddingConfig


async def best_of(runs: int, call: Callable[[], Awaitable[object]]) -> float:
    """The fastest of `runs` calls, in seconds: the least disturbed by whatever else shares the cores."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        await call()
        best = min(best, time.perf_counter() - start)
    return best


async def measure(model: str, texts: int, runs: int, threads: int) -> None:
    client = AsyncEmbeddingClient(EmbeddingConfig(model=model, threads=threads))
    info = await client.start()
    batch = [f"short text number {i} about cats and dogs" for i in range(texts)]
    await client.embed(batch)
    try:
        one = await best_of(runs, lambda: client.embed(batch))
        apart = await best_of(runs, lambda: asyncio.gather(*(client.embed([t]) for t in batch)))
    finally:
        await client.shutdown()
    print(f"{info.name} ({info.dimensions} dimensions), {threads} thread(s), {texts} short texts, best of {runs}:")
    print(f"  one request of {texts}: {one * 1000:.0f} ms, {texts / one:.0f} texts/s")
    print(f"  {texts} concurrent requests of 1: {apart * 1000:.0f} ms, {texts / apart:.0f} texts/s")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.embed", description=__doc__)
    p.add_argument("--model", default="default", help="default (bundled all-MiniLM-L6-v2) or a model directory")
    p.add_argument("--texts", type=int, default=32)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    asyncio.run(measure(args.model, args.texts, args.runs, args.threads))


if __name__ == "__main__":
    main()
