"""`python -m bench.engine.steps`: milliseconds per decode step for each quantization and dtype at a few batch
sizes, and (--profile) where a step's time goes, by torch.profiler. It is how the `auto` defaults were chosen.
--kv-cache-dtype auto,int8 compares KV pools: their engines take turns on one copy of the weights, with a ratio
to the first pool's time on each row."""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import defaultdict
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from bench.variant import Variant, variant_help
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.cpu.decode_kernel import AttentionKernel
from engine.model.attention import ATTENTION_NAME, GROUP_COST_BLOCKS
from engine.model.loader import LoadedModel, load_model
from engine.sampling_params import SamplingParams


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.engine.steps", description=__doc__)
    p.add_argument("--model", default="default")
    p.add_argument(
        "--variants",
        default="none/float32,none/bfloat16,nf4/float32,nf4/bfloat16",
        help="comma-separated variants, each " + variant_help(),
    )
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--context", type=int, default=64, help="prompt tokens of every request (the median with --sigma)")
    p.add_argument("--sigma", type=float, default=0.0, help="lognormal spread of the contexts (0: all alike)")
    p.add_argument(
        "--attention",
        default="",
        help="decode attentions to compare, comma-separated: compiled (engine.cpu.decode_kernel), torch (its default "
        "groups), torch/N (group cost N), torch/one (a single padded group); '': the engine's default",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="KV pools to compare, comma-separated (auto, bf16, fp16, int8, fp8: engine.model.kv_cache)",
    )
    p.add_argument("--device", default="cpu", help="cpu, or cuda (then --cpu-threads does not matter)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cpu-threads", type=int, default=1, help="the served engine's count on a 2-core machine")
    p.add_argument("--profile", action="store_true", help="also print a per-part breakdown of the largest batch")
    return p.parse_args(argv)


def decoding_core(base: EngineConfig, batch: int, context: int, steps: int, sigma: float = 0.0) -> EngineCore:
    """An engine whose `batch` requests have finished their prompts and are all decoding; with sigma, prompts of
    seeded lognormal lengths around `context` (capped at 1,536 tokens)."""
    budget = max(512, batch)
    rng = random.Random(0)
    lengths = [
        min(1536, max(1, round(context * math.exp(rng.gauss(0.0, sigma))))) if sigma else context for _ in range(batch)
    ]
    # The first requests decode while the last ones prefill: enough tokens that none ends before the measurement.
    prefill_steps = sum(lengths) // budget + 1
    params = SamplingParams(max_tokens=steps + prefill_steps + 8, temperature=0.0, ignore_eos=True)
    # A pool just large enough (not the 1 GiB default): two engines' pools side by side stay small.
    blocks = sum(-(-(n + params.max_tokens) // base.block_size) for n in lengths) + 8
    sized = replace(base, max_num_seqs=batch, max_num_batched_tokens=budget, num_kv_blocks=blocks)
    core = EngineCore(sized, loaded=_loaded(base))
    for i, n in enumerate(lengths):
        core.add_request(f"s{i}", [100 + (i * 7 + j) % 4000 for j in range(n)], params)
    while core.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in core.scheduler.running):
        core.step()
    core.step()
    return core


ONE_GROUP = 1 << 30  # a group cost no split can pay for: every decode in one padded group
_cache: dict[tuple[str, str, str, str], LoadedModel] = {}


def _loaded(config: EngineConfig) -> LoadedModel:
    """One variant's weights at a time, reused across its batch sizes."""
    key = (config.quantization, config.dtype, str(config.compact_weights), str(config.own_forward))
    if key not in _cache:
        _cache.clear()
        _cache[key] = load_model(config, attn_implementation=ATTENTION_NAME)
    return _cache[key]


def use_attention(core: EngineCore, attention: str, kernel: AttentionKernel | None) -> None:
    """compiled, torch, torch/N or torch/one (see --attention) for the engine's next steps."""
    kind, _, cost = attention.partition("/")
    if kind == "compiled":
        if kernel is None:
            raise SystemExit("the compiled decode attention does not build here (see the log)")
        core.runner.decode_kernel = kernel
    elif kind == "torch":
        core.runner.decode_kernel = None
        core.runner.group_cost = ONE_GROUP if cost == "one" else int(cost) if cost else GROUP_COST_BLOCKS
    else:
        raise SystemExit(f"--attention: compiled, torch, torch/N or torch/one, not {attention!r}")


def step_ms(core: EngineCore, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        core.step()
    return (time.perf_counter() - t0) * 1000 / steps


def breakdown(core: EngineCore, steps: int) -> dict[str, float]:
    """ms per step in the 15 costliest torch ops (self CPU time): matmuls are the forward's linear layers,
    index_select/bmm/softmax the attention, argmax-free numpy sampling does not appear."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            core.step()
    parts: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        parts[event.key] += event.self_cpu_time_total / 1000 / steps
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:15]
    return dict(top)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"torch {torch.__version__}, {args.cpu_threads} thread(s), context {args.context}", file=sys.stderr)
    attentions = [a.strip() for a in args.attention.split(",") if a.strip()] or [""]
    pools = [k.strip() for k in args.kv_cache_dtype.split(",") if k.strip()]
    if pools == ["auto"]:
        print(f"{'variant':>24} | " + " | ".join(f"batch {b:>3}" for b in batches))
    else:
        print(f"{'variant and pool':>26} | " + " | ".join(f"batch {b:>3}      " for b in batches))
        return compare_pools(args, batches, pools)
    for variant in args.variants.split(","):
        base = Variant.parse(variant).config(model=args.model, device=args.device, cpu_threads=args.cpu_threads)
        cells: dict[str, list[float]] = {a: [] for a in attentions}
        for b in batches:
            core = decoding_core(base, b, args.context, args.steps * len(attentions), args.sigma)
            kernel = core.runner.decode_kernel
            for attention in attentions:  # they take turns on one engine, so a drifting machine favours none
                if attention:
                    use_attention(core, attention, kernel)
                cells[attention].append(step_ms(core, args.steps))
        for attention, row in cells.items():
            label = f"{variant} {attention}" if attention else variant
            print(f"{label:>24} | " + " | ".join(f"{ms:7.1f}ms" for ms in row), flush=True)
        if args.profile:
            core = decoding_core(base, batches[-1], args.context, args.steps, args.sigma)
            for name, ms in breakdown(core, args.steps).items():
                print(f"    {ms:8.2f} ms  {name}")
    return 0


def compare_pools(args: argparse.Namespace, batches: list[int], pools: list[str]) -> int:
    """A row per variant and pool: ms per decode step at each batch, and its ratio to the first pool's. The pools'
    engines decode the same requests and take turns in rounds, so a machine that drifts favours none."""
    rounds = 4
    for variant in args.variants.split(","):
        base = Variant.parse(variant).config(model=args.model, device=args.device, cpu_threads=args.cpu_threads)
        cells: dict[str, list[float]] = {k: [] for k in pools}
        for b in batches:
            cores = {k: decoding_core(replace(base, kv_cache_dtype=k), b, args.context, args.steps, args.sigma)
                     for k in pools}  # type: ignore[arg-type]  # fmt: skip
            total = dict.fromkeys(pools, 0.0)
            for _ in range(rounds):
                for k, core in cores.items():
                    total[k] += step_ms(core, max(1, args.steps // rounds)) / rounds
            for k in pools:
                cells[k].append(total[k])
            del cores
        for k, row in cells.items():
            label = f"{variant} kv={k}"
            ratios = " | ".join(
                f"{ms:7.1f}ms {ms / first:4.2f}x" for ms, first in zip(row, cells[pools[0]], strict=True)
            )
            print(f"{label:>26} | {ratios}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
