"""`python -m bench.heavy_load URL STREAMS TOKENS` (key in BENCH_KEY; BENCH_USER, where set, names the end user on
a front-end key as Open WebUI does, X-OpenWebUI-User-Id): the heavy key of bench.fair,
STREAMS long streamed chat requests of TOKENS tokens (ignore_eos) kept in flight until terminated. A process of its
own that imports only httpx, so it starts in a fraction of a second and its reads delay no other client."""

from __future__ import annotations

import asyncio
import os
import sys

import httpx

MODEL = "random:tiny"


async def stream(http: httpx.AsyncClient, headers: dict[str, str], tokens: int) -> None:
    """One stream: a new long request as soon as the last one ends, read to the end without parsing it (the
    server's own counter gives the tokens)."""
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me everything you know."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    while True:
        try:
            async with http.stream("POST", "/v1/chat/completions", json=payload, headers=headers) as response:
                async for _ in response.aiter_raw():
                    pass
                if response.status_code != 200:
                    raise RuntimeError(f"status {response.status_code}")
        except (httpx.HTTPError, RuntimeError) as exc:
            print(f"bench_load: {exc!r}", file=sys.stderr)
            await asyncio.sleep(0.5)


async def load(url: str, headers: dict[str, str], streams: int, tokens: int) -> None:
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await asyncio.gather(*(stream(http, headers, tokens) for _ in range(streams)))


def main(argv: list[str]) -> int:
    url, streams, tokens = argv[0], int(argv[1]), int(argv[2])
    # The load generator stands for clients on other machines: on the server's own cores it yields to the
    # server's processes rather than slow the engine's steps down.
    os.nice(19)
    headers = {"Authorization": f"Bearer {os.environ['BENCH_KEY']}"}
    if os.environ.get("BENCH_USER"):
        headers["X-OpenWebUI-User-Id"] = os.environ["BENCH_USER"]
    asyncio.run(load(url, headers, streams, tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
