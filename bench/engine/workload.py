"""A seeded workload: long-tailed prompt and output lengths, Poisson arrivals, exact lengths (ignore_eos)."""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BenchRequest:
    arrival: float  # seconds after the start of the run
    prompt_token_ids: list[int]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    num_requests: int = 64
    rate: float = 16.0  # requests per second (Poisson); math.inf sends them all at once
    prompt_median: int = 48
    prompt_max: int = 512
    output_median: int = 48
    output_max: int = 256
    sigma: float = 0.8  # lognormal spread: a long tail of big requests
    seed: int = 0

    @classmethod
    def from_options(cls, args: argparse.Namespace) -> WorkloadSpec:
        """From a benchmark command's options of the same names (--requests, --rate, --prompt-median, ...)."""
        return cls(
            num_requests=args.requests,
            rate=args.rate,
            prompt_median=args.prompt_median,
            output_median=args.output_median,
            output_max=args.output_max,
            sigma=args.sigma,
            seed=args.seed,
        )


def make_workload(spec: WorkloadSpec, vocab_size: int, first_token_id: int = 100) -> list[BenchRequest]:
    rng = random.Random(spec.seed)
    t = 0.0
    requests = []
    for _ in range(spec.num_requests):
        if math.isfinite(spec.rate):
            t += rng.expovariate(spec.rate)
        prompt_len = _lognormal(rng, spec.prompt_median, spec.sigma, spec.prompt_max)
        output_len = _lognormal(rng, spec.output_median, spec.sigma, spec.output_max)
        prompt = [rng.randrange(first_token_id, vocab_size) for _ in range(prompt_len)]
        requests.append(BenchRequest(t, prompt, output_len))
    return requests


def _lognormal(rng: random.Random, median: int, sigma: float, cap: int) -> int:
    return max(1, min(cap, round(rng.lognormvariate(math.log(median), sigma))))
