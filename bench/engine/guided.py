"""`python -m bench.engine.guided`: what guided decoding costs a batch. R requests decoding at once, none or a
quarter of them under a JSON schema; prints ms per decode step, the guided work in it (bitmask fill + apply,
matcher advance) and output tokens/s. The two mixes take turns step by step, so a shared machine's noise hits
both alike."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bench.variant import engine_config
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.model.attention import ATTENTION_NAME
from engine.model.loader import LoadedModel, load_model
from engine.sampling_params import GuidedDecoding, SamplingParams

# A wide record, every field required: output that stays under the grammar for every measured step and keeps
# crossing keys and separators, where the mask bans nearly the whole vocabulary. (Strings get maxLength 64:
# xgrammar 0.2.8 fills a row inside a string of maxLength <= 16 in 2-12 ms, a cost of its own, not measured here.)
_FIELD_TYPES: list[dict[str, Any]] = [
    {"type": "integer"},
    {"type": "string", "maxLength": 64},
    {"type": "boolean"},
    {"enum": ["low", "medium", "high"]},
    {"type": "number"},
]
NUM_FIELDS = 200
SCHEMA = {
    "type": "object",
    "properties": {f"field_{i}": _FIELD_TYPES[i % len(_FIELD_TYPES)] for i in range(NUM_FIELDS)},
    "required": [f"field_{i}" for i in range(NUM_FIELDS)],
}


@dataclass(slots=True)
class Timer:
    """Wall time spent in the wrapped calls since the last reset, in ms."""

    ms: float = 0.0
    rows: int = 0  # constrained rows over the steps, counted by count_rows

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.ms += (time.perf_counter() - t0) * 1000

        return timed

    def count_rows(self, batch: Any, prepare: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            result = prepare(*args)
            self.rows += batch.rows
            return result

        return counted


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.engine.guided", description=__doc__)
    p.add_argument("--model", default="random:tiny", help="random:tiny or default (the bundled SmolLM2)")
    p.add_argument("--running", type=int, default=64, help="requests decoding at once")
    p.add_argument("--constrained", type=int, default=16, help="of them under the JSON schema")
    p.add_argument("--context", type=int, default=64, help="prompt tokens of every request")
    p.add_argument("--steps", type=int, default=40, help="decode steps measured per round, of each mix")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cpu-threads", type=int, default=1, help="the served engine's count on a 2-core machine")
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def max_tokens(args: argparse.Namespace) -> int:
    """Room for the measured steps and the ones the first requests decode while the last still prefill."""
    return 2 * args.rounds * args.steps + args.running


def decoding_core(config: EngineConfig, loaded: LoadedModel, args: argparse.Namespace, constrained: int) -> EngineCore:
    """An engine whose requests have all finished their prompts (and compiled their grammar) and are decoding."""
    core = EngineCore(config, loaded=loaded)
    guided = GuidedDecoding(kind="json_schema", schema=json.dumps(SCHEMA))
    if constrained:
        # Compiled before any request comes: else the others decode ahead while it compiles, and the two mixes
        # would be measured at different context lengths.
        core.grammars.get(guided).result()
    budget = max_tokens(args)
    for i in range(args.running):
        g = guided if i < constrained else None
        params = SamplingParams(max_tokens=budget, temperature=0.0, ignore_eos=True, guided=g)
        core.add_request(f"r{i}", [100 + (i * 7 + j) % 4000 for j in range(args.context)], params)
    while core.scheduler.held or core.scheduler.waiting or any(not r.output_token_ids for r in core.scheduler.running):
        core.step()
    return core


def measure(cores: dict[str, EngineCore], steps: int) -> dict[str, tuple[list[float], Timer]]:
    """Per mix: the ms of each of `steps` decode steps, and the guided work in all of them (ms and constrained
    rows). The mixes take turns step by step, so a shared machine's noise falls on both alike."""
    timers = {name: Timer() for name in cores}
    saved = {name: (core.guided.mask, core.guided.accept, core.guided.prepare) for name, core in cores.items()}
    times: dict[str, list[float]] = {name: [] for name in cores}
    running = {name: len(core.scheduler.running) for name, core in cores.items()}
    try:
        for name, core in cores.items():
            # The runner and the core share this object: wrapping its two calls times them wherever they are made.
            core.guided.mask = timers[name].wrap(core.guided.mask)  # type: ignore[method-assign]
            core.guided.accept = timers[name].wrap(core.guided.accept)  # type: ignore[method-assign]
            core.guided.prepare = timers[name].count_rows(core.guided, core.guided.prepare)  # type: ignore[method-assign]
        for _ in range(steps):
            for name, core in cores.items():
                t0 = time.perf_counter()
                core.step()
                times[name].append((time.perf_counter() - t0) * 1000)
    finally:
        for name, core in cores.items():
            core.guided.mask, core.guided.accept, core.guided.prepare = saved[name]  # type: ignore[method-assign]
    if any(len(core.scheduler.running) != running[name] for name, core in cores.items()):
        raise SystemExit("a request finished during the measurement: raise --rounds * --steps headroom")
    return {name: (times[name], timers[name]) for name in cores}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    blocks_per_seq = -(-(args.context + max_tokens(args)) // 16)
    config = engine_config(
        args,
        quantization="none",
        dtype="float32",
        max_num_seqs=args.running,
        max_num_batched_tokens=max(512, args.running),
        num_kv_blocks=args.running * blocks_per_seq,
    )
    loaded = load_model(config, attn_implementation=ATTENTION_NAME)
    if loaded.device.type == "cpu":
        torch.set_num_threads(args.cpu_threads)
    mixes = {"unconstrained": 0, f"{args.constrained} constrained": args.constrained}
    cores = {name: decoding_core(config, loaded, args, n) for name, n in mixes.items()}
    results = measure(cores, args.rounds * args.steps)
    print(
        f"guided decoding, {args.model} on {args.device} ({args.cpu_threads} thread(s)), {args.running} requests "
        f"decoding, context {args.context}, {args.rounds * args.steps} steps of each mix, taking turns"
    )
    for name, (times, guided) in results.items():
        print(
            f"{name:>16}: {statistics.median(times):7.2f} ms per step (median), guided work "
            f"{guided.ms / len(times):5.2f} ms per step on {guided.rows / len(times):.0f} constrained row(s), "
            f"{args.running * 1000 * len(times) / sum(times):7.1f} output tokens/s"
        )
    plain, constrained = (results[name][0] for name in mixes)
    overhead = statistics.median(c - p for p, c in zip(plain, constrained, strict=True))
    print(
        f"overhead: {overhead:+.2f} ms per step (median of the steps' differences; bar <= 1 ms); "
        f"throughput {sum(plain) / sum(constrained):.3f}x of unconstrained (bar >= 0.9x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
