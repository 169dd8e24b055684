"""`python -m bench.fair`: issue 12's benchmark through the whole appliance, over HTTP with real keys.
random:tiny served with 16 seats; four light keys each send one short streamed chat request (16 tokens) about every
1.5 s, alone for 30 s, then for 30 s beside a heavy key that keeps 24 long streams (256 tokens, ignore_eos) in
flight; under the fair policy and under fcfs, each on a fresh server. Prints the light keys' TTFT
p50/p95 (as the client saw it: request sent to first content) alone and beside the heavy key, the heavy key's and
the total tokens/s (the server's own generation counter, /metrics). Both servers run from the start and the
policies take turns in short rounds; the heavy key's streams come from a process of their own.

--front-end: the tenants are end users of one front-end key instead (`appliance keys create --front-end`), each
named as Open WebUI names them (X-OpenWebUI-User-Id): three light ones and a greedy one. The fair scheduler must
then keep the light people's TTFT as it keeps the light keys'.

--people: the tenants are four people of one plan, each signed in once to make a personal key (bench/people.py),
three light and one greedy: each person is one fair-share tenant (`user:<id>`), whatever key or session they use."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.engine.runs import percentile
from bench.people import people_keys
from bench.servers import Server, clean_env, create_keys, free_port, running

MODEL = "random:tiny"
METRICS_TOKEN = "bench-fair-metrics"
LIGHT_KEYS = [f"light-{i}" for i in range(4)]
FRONT_END_KEY = "webui"
ADMIN_PASSWORD = "bench-fair-admin-password"


@dataclass(frozen=True, slots=True)
class Tenants:
    """Who sends what: each tenant's request headers (its key, and on a front-end key its end user's name)."""

    light: dict[str, dict[str, str]]
    heavy: dict[str, str]

    @classmethod
    def of_keys(cls, keys: dict[str, str]) -> Tenants:
        return cls({name: bearer(keys[name]) for name in LIGHT_KEYS}, bearer(keys["heavy"]))

    @classmethod
    def of_people(cls, keys: dict[str, str]) -> Tenants:
        """Four people of one plan, each through a personal key (bench/people.py): three light, one greedy."""
        return cls({name: bearer(keys[name]) for name in LIGHT_KEYS[:3]}, bearer(keys["greedy"]))

    @classmethod
    def of_front_end(cls, key: str) -> Tenants:
        """Four end users of one key: three light, one greedy."""
        light = {name: bearer(key) | {"X-OpenWebUI-User-Id": name} for name in LIGHT_KEYS[:3]}
        return cls(light, bearer(key) | {"X-OpenWebUI-User-Id": "greedy"})


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass(slots=True)
class Phase:
    light_ttft: list[float] = field(default_factory=list)
    light_tokens: int = 0
    total_tokens: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def server_for(policy: str, seats: int, data_dir: Path) -> Server:
    port = free_port()
    env = clean_env() | {
        "APPLIANCE_DATA_DIR": str(data_dir),
        "APPLIANCE_PORT": str(port),
        "APPLIANCE_MODEL": MODEL,
        "APPLIANCE_QUANTIZATION": "none",
        "APPLIANCE_DEVICE": "cpu",
        "APPLIANCE_MAX_NUM_SEQS": str(seats),
        "APPLIANCE_POLICY": policy,
        "APPLIANCE_METRICS_TOKEN": METRICS_TOKEN,
        "APPLIANCE_LOG_LEVEL": "warning",
        "APPLIANCE_ADMIN_PASSWORD": ADMIN_PASSWORD,  # --people makes its people through the admin API
    }
    appliance = str(Path(sys.executable).with_name("appliance"))
    url = f"http://127.0.0.1:{port}"
    return Server(f"appliance, {policy}", [appliance, "serve"], env, url, "", data_dir / "server.log", "/ready")


def body(tokens: int, text: str) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_once(
    http: httpx.AsyncClient, headers: dict[str, str], payload: dict[str, object]
) -> tuple[float | None, int]:
    """One streamed request: seconds to its first content, and its completion tokens (from the usage chunk)."""
    sent = time.monotonic()
    first: float | None = None
    tokens = 0
    async with http.stream("POST", "/v1/chat/completions", json=payload, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.monotonic() - sent
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    return first, tokens


async def light_key(
    http: httpx.AsyncClient,
    key: dict[str, str],
    until: float,
    args: argparse.Namespace,
    rng: random.Random,
    phase: Phase,
) -> None:
    await asyncio.sleep(rng.uniform(0, args.interval))  # the keys do not start in step
    while (start := time.monotonic()) < until:
        try:
            ttft, tokens = await stream_once(http, key, body(args.light_tokens, "Say something short."))
        except (httpx.HTTPError, RuntimeError) as exc:
            phase.errors.append(f"light: {exc}")
        else:
            if ttft is not None:
                phase.light_ttft.append(ttft)
            phase.light_tokens += tokens
        await asyncio.sleep(max(0.0, start + rng.uniform(0.5, 1.5) * args.interval - time.monotonic()))


async def generated_total(http: httpx.AsyncClient) -> int:
    scraped = await http.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    scraped.raise_for_status()
    lines = [ln for ln in scraped.text.splitlines() if ln.startswith("vllm:generation_tokens_total")]
    return int(float(lines[0].rsplit(" ", 1)[1])) if lines else 0


async def run_phase(url: str, tenants: Tenants, seconds: float, heavy: bool, args: argparse.Namespace) -> Phase:
    phase = Phase()
    rng = random.Random(args.seed)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        before = await generated_total(http)
        load = None
        if heavy:
            # The heavy key, in a process of its own that imports only httpx: the light keys' TTFT is measured as
            # their own client sees it, not behind the heavy streams' reads in one event loop.
            command = [
                sys.executable,
                "-m",
                "bench.heavy_load",
                url,
                str(args.heavy_streams),
                str(args.heavy_tokens),
            ]
            key = tenants.heavy["Authorization"].removeprefix("Bearer ")
            user = tenants.heavy.get("X-OpenWebUI-User-Id", "")
            load = subprocess.Popen(command, env={**os.environ, "BENCH_KEY": key, "BENCH_USER": user})
            await asyncio.sleep(args.settle)  # the heavy key holds its seats before the light keys are measured
        start = time.monotonic()
        until = start + seconds
        await asyncio.gather(*(light_key(http, h, until, args, rng, phase) for h in tenants.light.values()))
        phase.seconds = time.monotonic() - start + (args.settle if heavy else 0.0)
        total = await generated_total(http)
        if load is not None:
            load.terminate()
            load.wait(10)
        phase.total_tokens = total - before
    return phase


def merged(phases: list[Phase]) -> Phase:
    out = Phase()
    for phase in phases:
        out.light_ttft += phase.light_ttft
        out.light_tokens += phase.light_tokens
        out.total_tokens += phase.total_tokens
        out.seconds += phase.seconds
        out.errors += phase.errors
    return out


def report(policy: str, alone: Phase, beside: Phase) -> str:
    a50, a95 = percentile(alone.light_ttft, 50) * 1000, percentile(alone.light_ttft, 95) * 1000
    b50, b95 = percentile(beside.light_ttft, 50) * 1000, percentile(beside.light_ttft, 95) * 1000
    # The counter's delta and the seconds span the settle time too (the heavy key alone).
    total = beside.total_tokens / beside.seconds
    heavy = (beside.total_tokens - beside.light_tokens) / beside.seconds
    return (
        f"{policy:>6} | {a50:>7.0f} / {a95:>5.0f} ms | {b50:>7.0f} / {b95:>6.0f} ms | {b95 / a95:>7.1f}x | "
        f"{heavy:>11.1f} | {total:>11.1f} | {len(alone.light_ttft) + len(beside.light_ttft):>5}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fair", description=__doc__)
    p.add_argument("--seats", type=int, default=16)
    p.add_argument("--alone", type=float, default=30.0, help="seconds of light traffic alone")
    p.add_argument("--beside", type=float, default=30.0, help="seconds of light traffic beside the heavy key")
    p.add_argument("--settle", type=float, default=3.0, help="seconds the heavy key runs alone before measuring")
    p.add_argument("--interval", type=float, default=1.5, help="seconds between one light key's requests")
    p.add_argument("--light-tokens", type=int, default=16)
    p.add_argument("--heavy-tokens", type=int, default=256)
    p.add_argument("--heavy-streams", type=int, default=24)
    p.add_argument("--policies", default="fair,fcfs")
    p.add_argument("--rounds", type=int, default=2, help="rounds the policies take in turn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--front-end",
        action="store_true",
        help="the tenants are four end users of one front-end key (X-OpenWebUI-User-Id), one of them greedy",
    )
    p.add_argument(
        "--people",
        action="store_true",
        help="the tenants are four people of one plan, each with a personal key, one of them greedy",
    )
    args = p.parse_args(argv)
    if args.front_end and args.people:
        p.error("--front-end or --people, not both")
    who = (
        "3 light end users of one front-end key"
        if args.front_end
        else "3 light people of one plan"
        if args.people
        else "4 light keys"
    )
    heavy = "a greedy end user" if args.front_end else "a greedy person" if args.people else "a heavy key"
    print(
        f"{MODEL} served, {args.seats} seats: {who} ({args.light_tokens} tokens every ~{args.interval} s "
        f"each), {heavy} with {args.heavy_streams} x {args.heavy_tokens}-token streams in flight"
    )
    policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    alone: dict[str, list[Phase]] = {policy: [] for policy in policies}
    beside: dict[str, list[Phase]] = {policy: [] for policy in policies}
    with tempfile.TemporaryDirectory(prefix="bench-fair-") as tmp, contextlib.ExitStack() as servers:
        urls, keys = {}, {}
        for policy in policies:
            data = Path(tmp) / policy
            data.mkdir()
            if args.front_end:
                made = create_keys(data, [FRONT_END_KEY], "--front-end")
                keys[policy] = Tenants.of_front_end(made[FRONT_END_KEY])
            elif not args.people:
                keys[policy] = Tenants.of_keys(create_keys(data, ["heavy", *LIGHT_KEYS]))
            server = server_for(policy, args.seats, data)
            servers.enter_context(running(server))
            urls[policy] = server.url
            if args.people:  # people sign in on the running server to make their keys
                keys[policy] = Tenants.of_people(people_keys(server.url, ADMIN_PASSWORD, [*LIGHT_KEYS[:3], "greedy"]))
        # Short rounds, the policies taking turns (the idle server waits), so a machine whose load drifts
        # weighs on both alike.
        for _ in range(args.rounds):
            for policy in policies:
                alone[policy].append(
                    asyncio.run(run_phase(urls[policy], keys[policy], args.alone / args.rounds, False, args))
                )
                beside[policy].append(
                    asyncio.run(run_phase(urls[policy], keys[policy], args.beside / args.rounds, True, args))
                )
    rows = []
    for policy in policies:
        a, b = merged(alone[policy]), merged(beside[policy])
        if a.errors or b.errors:
            errors = a.errors + b.errors
            print(f"{policy}: {len(errors)} failed requests, the first: {errors[0]}", file=sys.stderr)
        rows.append(report(policy, a, b))
    print(
        f"{'policy':>6} | {'light TTFT alone':>18} | {'beside the ' + heavy.split(' ', 1)[1]:>20} | {'p95 x':>8} | "
        f"{'heavy tok/s':>11} | {'total tok/s':>11} | light"
    )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
