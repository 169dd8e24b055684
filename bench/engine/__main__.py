"""`python -m bench.engine`: one seeded workload against continuous, static and sequential batching and
transformers' continuous batching, on one copy of the model; prints a table (and JSON with --json)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from typing import Any

from tqdm import tqdm

from bench.engine.runs import RunResult, measure_overhead, run_engine, run_transformers_cb
from bench.engine.workload import WorkloadSpec, make_workload
from bench.variant import engine_config
from engine.model.attention import ATTENTION_NAME
from engine.model.kv_cache import bytes_per_block
from engine.model.loader import load_model

RUNS = ("continuous", "static", "sequential", "transformers-cb")
COLUMNS = [
    ("name", "run", "{}"),
    ("output_tokens_per_s", "out tok/s", "{:.1f}"),
    ("requests_per_s", "req/s", "{:.2f}"),
    ("ttft_p50_s", "TTFT p50", "{:.2f}s"),
    ("ttft_p95_s", "TTFT p95", "{:.2f}s"),
    ("queue_wait_p50_s", "queue p50", "{:.2f}s"),
    ("queue_wait_p95_s", "queue p95", "{:.2f}s"),
    ("per_token_latency_p50_s", "tok lat p50", "{:.0f}ms"),
    ("mean_batch_occupancy", "batch", "{:.1f}"),
    ("kv_utilization", "KV use", "{:.0%}"),
    ("preemptions", "preempt", "{}"),
]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--quantization", default="nf4", choices=["none", "nf4", "fp4", "int8"])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--rate", type=float, default=math.inf, help="Poisson arrivals per second (inf: all at once)")
    p.add_argument("--prompt-median", type=int, default=48)
    p.add_argument("--output-median", type=int, default=32)
    p.add_argument("--output-max", type=int, default=192)
    p.add_argument("--sigma", type=float, default=0.8, help="lognormal spread of lengths: the tail's weight")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cpu-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads on CPU (default: all cores; the served engine leaves one to the web server)",
    )
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {', '.join(RUNS)}")
    p.add_argument("--overhead-running", type=int, default=64, help="batch size for the overhead probe (0: skip)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON here ('-' for stdout)")
    p.add_argument(
        "--cache-dir", help="converted-model cache (default: the engine's, $XDG_DATA_HOME/llm-appliance/models)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = set(runs) - set(RUNS)
    if unknown:
        print(f"unknown runs: {', '.join(sorted(unknown))}; choose from {', '.join(RUNS)}", file=sys.stderr)
        return 2
    config = engine_config(args)
    print(f"loading {config.model} ({config.quantization}) …", file=sys.stderr)
    loaded = load_model(config, lambda what: print(f"  {what}", file=sys.stderr), attn_implementation=ATTENTION_NAME)
    spec = WorkloadSpec.from_options(args)
    workload = make_workload(spec, len(loaded.tokenizer))
    results: list[RunResult] = []
    # transformers' CB gets the same KV pool as ours, in blocks of the same size.
    per_block = bytes_per_block(
        loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, config.block_size, loaded.dtype
    )
    num_blocks = config.kv_cache_bytes // per_block
    for name in runs:
        with tqdm(total=len(workload), desc=f"{name:>16}", unit="req", file=sys.stderr) as bar:
            if name == "transformers-cb":
                results.append(run_transformers_cb(loaded, config, num_blocks, workload, bar.update))
            else:
                result = run_engine(loaded, config, name, workload, bar.update)
                results.append(result)
    overhead = None
    if args.overhead_running:
        print(f"measuring engine overhead at {args.overhead_running} running …", file=sys.stderr)
        overhead = measure_overhead(loaded, config, args.overhead_running)
    summaries = [r.summary() for r in results]
    report = {
        "model": loaded.name,
        "quantization": loaded.quantization,
        "device": str(loaded.device),
        "workload": asdict(spec) | {"rate": None if math.isinf(spec.rate) else spec.rate},
        "runs": summaries,
        "ratios": ratios(summaries),
        "overhead": overhead,
    }
    print_table(report)
    if args.json:
        text = json.dumps(report, indent=2, default=float)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0


def ratios(summaries: list[dict[str, Any]]) -> dict[str, float]:
    by = {s["name"]: s for s in summaries}
    out = {}
    cont = by.get("continuous")
    if cont:
        for other in ("static", "sequential", "transformers-cb"):
            if other in by:
                out[f"continuous/{other} tok/s"] = cont["output_tokens_per_s"] / by[other]["output_tokens_per_s"]
    return out


def print_table(report: dict[str, Any]) -> None:
    w = report["workload"]
    print(
        f"\n{report['model']} {report['quantization']} on {report['device']}: {w['num_requests']} requests, "
        f"rate {w['rate'] or 'all at once'}, prompt median {w['prompt_median']}, output median "
        f"{w['output_median']} (max {w['output_max']}, sigma {w['sigma']}), seed {w['seed']}"
    )
    header = " | ".join(f"{title:>11}" for _, title, _ in COLUMNS)
    print(header)
    print("-" * len(header))
    for s in report["runs"]:
        cells = []
        for key, _, fmt in COLUMNS:
            value = s[key]
            if key == "per_token_latency_p50_s":
                value *= 1000
            cells.append(f"{fmt.format(value):>11}")
        print(" | ".join(cells))
    for name, value in report["ratios"].items():
        print(f"{name}: {value:.2f}x")
    if report["overhead"]:
        o = report["overhead"]
        print(
            f"engine overhead at {o['running']} running: {o['overhead_ms']:.2f} ms per step = sampling "
            f"{o['sampling_ms']:.2f} ms + bookkeeping {o['bookkeeping_ms']:.2f} ms "
            f"(step {o['step_ms']:.1f} ms, model forward {o['forward_ms']:.1f} ms)"
        )


if __name__ == "__main__":
    sys.exit(main())
