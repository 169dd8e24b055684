"""`python -m bench.engine.sampler_knobs`: the sampler's cost per step (ms) at R rows over a V-wide vocabulary:
all plain greedy, all plain random, and a quarter of the rows with penalties + min_p + logit_bias beside plain
greedy or plain random rows. Random fp32 logits; each row has a prompt and an output of the given lengths."""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from engine.sample.sampler import sample
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
RANDOM = SamplingParams(temperature=1.0)


@dataclass(slots=True)
class Row:
    prompt_token_ids: list[int]
    output_token_ids: list[int]


def knobbed(temperature: float, rng: random.Random, vocab: int) -> SamplingParams:
    """What a client turning every knob sends: penalties, min_p and a handful of biased tokens."""
    bias = tuple((rng.randrange(vocab), rng.uniform(-5.0, 5.0)) for _ in range(8))
    return SamplingParams(
        temperature=temperature,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        logit_bias=bias,
    )


def mixes(rows: int, rng: random.Random, vocab: int) -> dict[str, list[SamplingParams]]:
    quarter = rows // 4
    return {
        "all plain greedy": [GREEDY] * rows,
        "all plain random": [RANDOM] * rows,
        "1/4 knobs (greedy), 3/4 plain greedy": [knobbed(0.0, rng, vocab) for _ in range(quarter)]
        + [GREEDY] * (rows - quarter),
        "1/4 knobs (random), 3/4 plain random": [knobbed(1.0, rng, vocab) for _ in range(quarter)]
        + [RANDOM] * (rows - quarter),
    }


def measure(params: list[SamplingParams], rows: list[Row], logits: torch.Tensor, steps: int) -> list[float]:
    generators: list[torch.Generator | None] = [None] * len(params)
    times = []
    for step in range(steps + 3):  # the first calls warm the allocator
        t0 = time.perf_counter()
        sample(logits, params, generators, rows)
        if step >= 3:
            times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.sampler_knobs", description=__doc__)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--vocab", type=int, default=49152, help="the bundled SmolLM2's vocabulary")
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens per row")
    p.add_argument("--output", type=int, default=128, help="output tokens so far per row")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the engine's default on 2 cores)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    device = torch.device(args.device)
    logits = torch.randn(args.rows, args.vocab, device=device) * 3
    rows = [
        Row(
            [rng.randrange(args.vocab) for _ in range(args.prompt)],
            [rng.randrange(args.vocab) for _ in range(args.output)],
        )
        for _ in range(args.rows)
    ]
    print(
        f"sampler, {args.rows} rows x {args.vocab} vocab, prompt {args.prompt} + output {args.output} tokens per row, "
        f"{args.device}, {args.threads} thread(s), {args.steps} steps"
    )
    for name, params in mixes(args.rows, rng, args.vocab).items():
        ms = measure(params, rows, logits, args.steps)
        print(
            f"{name:>40}: {statistics.fmean(ms):7.2f} ms per step (p50 {ms[len(ms) // 2]:.2f}, "
            f"p90 {ms[int(len(ms) * 0.9)]:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
