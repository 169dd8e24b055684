"""`python -m bench.engine.gpu`: the GPU benchmark, written as one JSON file and a short text table.

On CUDA (the default), the model is random:llama-8b: Llama-3-8B shapes, seeded random weights and the bundled
tokenizer. It runs in nf4 under a 24 GiB cap, so a 24 GB consumer card is emulated on a bigger one. Three parts:

1. capacity: `--streams` long requests are sent at once. The figure is the most of them decoding together, with
   the preemptions it cost.
2. policies: one workload through continuous, static and transformers' continuous batching, on the same weights
   and the same number of KV blocks.
3. memory: weights, KV pool and what is left under the cap.

`--dry-run` does all of it on the CPU with random:tiny and small sizes. It checks the script end to end on a
machine without a GPU; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import transformers

from bench.engine.__main__ import print_table, ratios
from bench.engine.runs import RunResult, run_engine, run_transformers_cb
from bench.engine.workload import WorkloadSpec, make_workload
from bench.variant import engine_config
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.model.attention import ATTENTION_NAME
from engine.model.loader import LoadedModel, load_model
from engine.sampling_params import SamplingParams
from engine.sched.policy import Policy

GIB = 1 << 30
ENGINE_POLICIES: tuple[Policy, ...] = (Policy.CONTINUOUS, Policy.STATIC)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.engine.gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, random:tiny, small sizes: check the script only")
    p.add_argument("--model", default=None, help="default: random:llama-8b (random:tiny with --dry-run)")
    p.add_argument("--quantization", default=None, help="default: nf4 (none with --dry-run)")
    p.add_argument("--cap-gib", type=float, default=24.0, help="GPU memory the engine may use, in GiB")
    p.add_argument("--streams", type=int, default=None, help="capacity probe: requests sent at once (default 128)")
    p.add_argument("--stream-prompt", type=int, default=256, help="capacity probe: prompt tokens per request")
    p.add_argument("--stream-output", type=int, default=256, help="capacity probe: output tokens per request")
    p.add_argument("--requests", type=int, default=None, help="policy workload size (default 256)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="batch seats for the policy runs (default 128)")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--seconds", type=float, default=90.0, help="stop the capacity probe after this long")
    p.add_argument("--out", type=Path, default=Path("artifacts/gpu"), help="folder for gpu.json and gpu.txt")
    args = p.parse_args(argv)
    dry = args.dry_run
    args.model = args.model or ("random:tiny" if dry else "random:llama-8b")
    args.quantization = args.quantization or ("none" if dry else "nf4")
    args.streams = args.streams or (12 if dry else 128)
    args.requests = args.requests or (16 if dry else 256)
    args.max_num_seqs = args.max_num_seqs or (8 if dry else 128)
    if dry:
        args.stream_prompt, args.stream_output = min(args.stream_prompt, 24), min(args.stream_output, 12)
    return args


def gpu_engine_config(args: argparse.Namespace) -> EngineConfig:
    return engine_config(
        args,
        device="cpu" if args.dry_run else "cuda",
        gpu_memory_cap_bytes=None if args.dry_run else int(args.cap_gib * GIB),
        kv_cache_bytes=64 << 20,  # the CPU pool of --dry-run; CUDA sizes its pool from the cap
    )


def capacity(loaded: LoadedModel, config: EngineConfig, args: argparse.Namespace) -> dict[str, Any]:
    """Send `streams` requests at once and step until they finish or time runs out."""
    core = EngineCore(replace(config, max_num_seqs=args.streams), loaded=loaded)
    core.warm_up()
    params = SamplingParams(max_tokens=args.stream_output, temperature=0.0, ignore_eos=True)
    vocab = len(loaded.tokenizer)
    for i in range(args.streams):
        prompt = [(100 + i * 7919 + j * 104729) % (vocab - 100) + 100 for j in range(args.stream_prompt)]
        core.add_request(f"s{i}", prompt, params)
    held, steps, finished = 0, 0, 0
    started = time.monotonic()
    while core.has_work() and time.monotonic() - started < args.seconds:
        outputs = core.step()
        steps += 1
        finished += sum(1 for o in outputs if o.finished)
        running = core.scheduler.running
        decoding = sum(1 for r in running if r.num_computed_tokens >= r.num_prompt_tokens)
        held = max(held, decoding)
    stats = core.stats()
    result = {
        "streams_sent": args.streams,
        "streams_held": held,
        "finished": finished,
        "steps": steps,
        "seconds": time.monotonic() - started,
        "preemptions": stats.preemptions_total,
        "kv_blocks": stats.kv_blocks_total,
        "kv_tokens": stats.kv_blocks_total * stats.block_size,
        "tokens_per_stream": args.stream_prompt + args.stream_output,
    }
    del core
    _release()
    return result


def workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    """All at once, long-tailed lengths: the batch a busy LAN sends after a lull."""
    return WorkloadSpec(
        num_requests=args.requests,
        rate=math.inf,
        prompt_median=16 if args.dry_run else 128,
        prompt_max=1024,
        output_median=8 if args.dry_run else 128,
        output_max=24 if args.dry_run else 512,
        sigma=0.8,
    )


def policies(loaded: LoadedModel, config: EngineConfig, spec: WorkloadSpec, errors: dict[str, str]) -> list[RunResult]:
    """config carries num_kv_blocks, so every run, transformers' too, gets the same pool. A run that fails is
    recorded in `errors` and the others still run (the GPU machine's transformers may differ from ours)."""
    assert config.num_kv_blocks is not None
    num_blocks = config.num_kv_blocks
    workload = make_workload(spec, len(loaded.tokenizer))
    runs: list[tuple[str, Callable[[], RunResult]]] = [
        *((p, lambda p=p: run_engine(loaded, config, p, workload, _ignore)) for p in ENGINE_POLICIES),
        ("transformers-cb", lambda: run_transformers_cb(loaded, config, num_blocks, workload, _ignore)),
    ]
    results: list[RunResult] = []
    for name, run in runs:
        print(f"  {name} …", file=sys.stderr, flush=True)
        try:
            results.append(run())
        except Exception as exc:  # one failed run must not lose the others' figures
            traceback.print_exc()
            errors[name] = repr(exc)
        _release()
    return results


def _ignore(_: int) -> None:
    pass


def memory(loaded: LoadedModel, config: EngineConfig) -> dict[str, Any]:
    """The split after one engine has sized its pool (on CUDA from the cap, after a worst-case warm-up)."""
    core = EngineCore(config, loaded=loaded)
    stats = core.stats()
    out = {
        "kind": stats.memory_kind,
        "cap_bytes": config.gpu_memory_cap_bytes,
        "weights_bytes": stats.weights_bytes,
        "kv_pool_bytes": stats.kv_pool_bytes,
        "kv_bytes_per_block": core.kv.bytes_per_block,
        "device_total_bytes": stats.device_memory_total,
        "device_free_bytes": stats.device_memory_free,
    }
    if loaded.device.type == "cuda":
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(loaded.device)
    if config.gpu_memory_cap_bytes is not None:
        out["free_under_cap_bytes"] = config.gpu_memory_cap_bytes - stats.weights_bytes - stats.kv_pool_bytes
    del core
    _release()
    return out


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def table(report: dict[str, Any]) -> str:
    cap, mem = report["capacity"], report["memory"]
    lines = [
        f"{report['model']} {report['quantization']} on {report['device']}"
        + (f", capped at {mem['cap_bytes'] / GIB:.1f} GiB" if mem["cap_bytes"] else "")
        + (" (DRY RUN: figures mean nothing)" if report["dry_run"] else ""),
        f"streams held: {cap['streams_held']} of {cap['streams_sent']} sent at once"
        f" ({cap['tokens_per_stream']} tokens each; {cap['preemptions']} preemptions;"
        f" KV pool {cap['kv_tokens']} tokens)",
        f"memory: weights {mem['weights_bytes'] / GIB:.2f} GiB, KV pool {mem['kv_pool_bytes'] / GIB:.2f} GiB"
        + (f", free under the cap {mem['free_under_cap_bytes'] / GIB:.2f} GiB" if "free_under_cap_bytes" in mem else "")
        + f", device free {mem['device_free_bytes'] / GIB:.2f} of {mem['device_total_bytes'] / GIB:.2f} GiB",
    ]
    bars = report["bars"]
    lines.append("bars: " + "; ".join(f"{name}: {'met' if ok else 'NOT met'}" for name, ok in bars.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run to check the script on the CPU", file=sys.stderr)
        return 2
    config = gpu_engine_config(args)
    report: dict[str, Any] = {
        "model": config.model,
        "quantization": config.quantization,
        "device": config.device,
        "dry_run": args.dry_run,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "errors": {},
    }
    print(f"loading {config.model} ({config.quantization}) on {config.device} …", file=sys.stderr, flush=True)
    loaded = load_model(config, lambda what: print(f"  {what}", file=sys.stderr, flush=True), ATTENTION_NAME)
    report |= {"model": loaded.name, "quantization": loaded.quantization, "device": str(loaded.device)}
    print("sizing the KV pool …", file=sys.stderr, flush=True)
    report["memory"] = mem = memory(loaded, config)
    save(args.out, report)  # each part is kept as soon as it is measured: a later failure loses nothing before it
    config = replace(config, num_kv_blocks=mem["kv_pool_bytes"] // mem["kv_bytes_per_block"])
    print("capacity probe …", file=sys.stderr, flush=True)
    report["capacity"] = cap = capacity(loaded, config, args)
    save(args.out, report)
    print("policies …", file=sys.stderr, flush=True)
    spec = workload_spec(args)
    summaries = [r.summary() for r in policies(loaded, config, spec, report["errors"])]
    workload = asdict(spec) | {"rate": None}
    report["policies"] = {"kv_blocks": config.num_kv_blocks, "workload": workload, "runs": summaries}
    report["ratios"] = r = ratios(summaries)
    report["bars"] = {
        "100 streams held": cap["streams_held"] >= 100,
        "continuous >= 3x static": r.get("continuous/static tok/s", 0.0) >= 3.0,
        "continuous >= 1.5x transformers-cb": r.get("continuous/transformers-cb tok/s", 0.0) >= 1.5,
    }
    runs_table = io.StringIO()
    with contextlib.redirect_stdout(runs_table):
        print_table({**report, "workload": workload, "runs": summaries, "overhead": None})
    text = runs_table.getvalue().strip() + "\n\n" + table(report) + "\n"
    for name, error in report["errors"].items():
        text += f"{name} failed: {error}\n"
    save(args.out, report)
    (args.out / "gpu.txt").write_text(text)
    print(text, end="")
    return 1 if report["errors"] else 0


def save(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(_finite(report), indent=2) + "\n")


def _finite(value: Any) -> Any:
    """JSON has no NaN: a percentile over nothing is written as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
