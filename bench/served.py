"""`python -m bench.served` (or bench/served.sh, which makes the peers' venvs and builds llama-server): the
appliance, with its defaults and with each quantization, against vLLM's CPU build and llama.cpp's llama-server, each
served in turn on this machine and measured by the same independent client (aiperf) on a seeded workload (one per
round) with long-tailed lengths and Poisson arrivals. Prints output tok/s, TTFT p50/p95 and inter-token p50 per
server, and the CPU flags they ran on."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.engine.workload import WorkloadSpec, make_workload
from bench.servers import (
    BENCH_KEY,
    LLAMA_SERVER,
    PEERS,
    SERVED_NAME,
    WORK,
    Server,
    appliance_key,
    appliance_server,
    clean_env,
    converted_model,
    llama_server,
    running,
    variant_dir,
    vllm_server,
    warm,
)
from bench.variant import Variant
from engine.cpu.hardware import auto_cpu_dtype, auto_quantization, cpu_flags, describe
from engine.model.sources import default_model_path

APPLIANCE_VARIANTS = "auto/auto,none/float32,none/auto,nf4/auto,fp4/auto,int8/auto"


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    requests: int


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.served", description=__doc__)
    p.add_argument(
        "--appliance",
        default=APPLIANCE_VARIANTS,
        help="quantization/dtype pairs ('' for none); a third part turns off what it names, joined by +: 'plain' "
        "turns compact weights off (APPLIANCE_COMPACT_WEIGHTS: float32 unpacked, bf16 without a GGUF's blocks), "
        "'hf' runs transformers' forward (APPLIANCE_OWN_FORWARD)",
    )
    p.add_argument("--vllm-dtypes", default="float32,bfloat16", help="vLLM runs, one per dtype ('' for none)")
    p.add_argument(
        "--llama-server",
        default="",
        help="llama-server runs on the bundled GGUF, one per SLOTS or SLOTSxTHREADS ('16,64x1': 16 slots on "
        "llama.cpp's own threads, as a user starts it, then 64 slots on one thread); bench/served.sh builds it",
    )
    p.add_argument("--llama-server-bin", type=Path, default=LLAMA_SERVER)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per second")
    p.add_argument("--prompt-median", type=int, default=64)
    p.add_argument("--output-median", type=int, default=48)
    p.add_argument("--output-max", type=int, default=256)
    p.add_argument("--sigma", type=float, default=0.8, help="lognormal spread of both lengths: the tail's weight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm-python", type=Path, default=PEERS / "vllm" / "bin" / "python")
    p.add_argument("--aiperf", type=Path, default=PEERS / "aiperf" / "bin" / "aiperf")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with more than 1, every server is started first and each is measured in turn, round after round, "
        "so that a machine whose speed drifts weighs on all alike; the ratios to vLLM are taken within a round",
    )
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--dry-run", action="store_true", help="print the plan (commands, workload) and start nothing")
    return p.parse_args(argv)


def variants(spec: str, flags: frozenset[str]) -> list[tuple[str, Variant]]:
    """(row name, variant) per appliance run; one that resolves like the defaults is not rerun."""
    rows, seen = [], set()
    for text in filter(None, (s.strip() for s in spec.split(","))):
        variant = Variant.parse(text)
        resolved = Variant(
            auto_quantization("cpu", flags) if variant.quantization == "auto" else variant.quantization,
            auto_cpu_dtype(flags) if variant.dtype == "auto" else variant.dtype,
            variant.off,
            variant.kv_cache_dtype,
        )
        if resolved in seen:
            continue
        seen.add(resolved)
        name = "appliance, defaults" if text == "auto/auto" else f"appliance, {text}"
        kv = "" if resolved.kv_cache_dtype == "auto" else f", KV {resolved.kv_cache_dtype}"
        rows.append((f"{name} ({resolved.quantization}, {resolved.dtype}{kv})", variant))
    return rows


def llama_runs(spec: str) -> list[tuple[int, int | None]]:
    """(slots, threads or None for llama.cpp's own) per llama-server run: 'SLOTS' or 'SLOTSxTHREADS', by commas."""
    runs = []
    for text in filter(None, (s.strip() for s in spec.split(","))):
        slots, x, threads = text.partition("x")
        if not slots.isdigit() or int(slots) < 1 or (x and (not threads.isdigit() or int(threads) < 1)):
            raise SystemExit(f"--llama-server: {text!r} is not SLOTS or SLOTSxTHREADS (positive integers)")
        runs.append((int(slots), int(threads) if threads else None))
    return runs


def write_dataset(path: Path, spec: WorkloadSpec, tokenizer: Any) -> int:
    """aiperf's single_turn JSONL: Poisson timestamps (ms), prompts of lognormal token counts decoded from seeded
    random ids, and each request's exact output length (ignore_eos). Returns the total output tokens asked."""
    workload = make_workload(spec, min(len(tokenizer), 20000), first_token_id=1000)
    with path.open("w") as f:
        for req in workload:
            text = tokenizer.decode(req.prompt_token_ids, skip_special_tokens=True)
            line = {"timestamp": round(req.arrival * 1000, 3), "text": text, "output_length": req.max_tokens}
            f.write(json.dumps(line) + "\n")
    return sum(r.max_tokens for r in workload)


def read_row(name: str, export: Path) -> Row:
    """One row from aiperf's profile_export_aiperf.json (metrics keyed by tag, each with avg/p50/p95, in ms)."""
    data = json.loads(export.read_text())
    metrics = data.get("records", data)

    def stat(tag: str, key: str) -> float:
        entry = metrics.get(tag)
        if not isinstance(entry, dict) or entry.get(key) is None:
            return math.nan
        return float(entry[key])

    return Row(
        name=name,
        output_tokens_per_s=stat("output_token_throughput", "avg"),
        ttft_p50_ms=stat("time_to_first_token", "p50"),
        ttft_p95_ms=stat("time_to_first_token", "p95"),
        itl_p50_ms=stat("inter_token_latency", "p50"),
        requests=int(stat("request_count", "avg")) if not math.isnan(stat("request_count", "avg")) else 0,
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| served | output tok/s | TTFT p50 | TTFT p95 | inter-token p50 | requests |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.output_tokens_per_s:.1f} | {r.ttft_p50_ms / 1000:.2f} s | {r.ttft_p95_ms / 1000:.2f} s "
            f"| {r.itl_p50_ms:.0f} ms | {r.requests} |"
        )
    return "\n".join(lines)


def aiperf_command(
    args: argparse.Namespace, server: Server, key: str, model_dir: Path, dataset: Path, out: Path
) -> list[str]:
    return [
        str(args.aiperf), "profile", "--url", server.url, "--model", SERVED_NAME, "--endpoint-type", "chat",
        "--streaming", "--tokenizer", str(model_dir), "--input-file", str(dataset),
        "--custom-dataset-type", "single_turn", "--fixed-schedule", "--extra-inputs", "ignore_eos:true",
        "--api-key", key, "--random-seed", str(args.seed), "--artifact-dir", str(out), "--ui", "none",
        # No scraping of /metrics (the appliance's asks for the admin) nor of GPUs: on 2 cores the scraper then
        # missed its heartbeats under load, and aiperf exited 1 after a complete run.
        "--no-server-metrics", "--no-gpu-telemetry",
    ]  # fmt: skip


def measure(args: argparse.Namespace, server: Server, key: str, model_dir: Path, dataset: Path, round_: int = 0) -> Row:
    stem = server.log.stem + (f"-{round_ + 1}" if args.rounds > 1 else "")
    out = WORK / ("aiperf-" + stem)
    shutil.rmtree(out, ignore_errors=True)
    warm(server.url, key)
    command = aiperf_command(args, server, key, model_dir, dataset, out)
    with (WORK / f"{stem}.aiperf.log").open("w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, env=clean_env())
    exports = sorted(out.rglob("profile_export_aiperf.json"))
    if not exports:
        raise RuntimeError(f"aiperf wrote no profile_export_aiperf.json under {out}")
    return read_row(server.name + (f" #{round_ + 1}" if args.rounds > 1 else ""), exports[0])


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.machine()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    flags = cpu_flags()
    plan = variants(args.appliance, flags)
    vllm_dtypes = [d.strip() for d in args.vllm_dtypes.split(",") if d.strip()]
    llamas = llama_runs(args.llama_server)
    spec = WorkloadSpec.from_options(args)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores, flags: {describe(flags)}")
    print(
        f"workload: {spec.num_requests} streamed chat requests, Poisson {spec.rate}/s, prompt median "
        f"{spec.prompt_median} tokens, output median {spec.output_median} (max {spec.output_max}), lognormal sigma "
        f"{spec.sigma}, ignore_eos, seed {spec.seed} (plus the round, from 0); client aiperf 0.13 (fixed schedule)"
    )
    if args.dry_run:
        for name, variant in plan:
            settings = " ".join(f"{k}={v}" for k, v in variant.settings().items())
            print(f"would run {name}: {settings} serve")
        for dtype in vllm_dtypes:
            print(f"would run {vllm_server(args.vllm_python, Path('MODEL_DIR'), dtype).name}")
        for slots, threads in llamas:
            print(f"would run {' '.join(llama_server(args.llama_server_bin, Path('GGUF'), slots, threads).command)}")
        return 0
    if llamas and not args.llama_server_bin.is_file():
        raise SystemExit(f"no llama-server at {args.llama_server_bin}: bench/llama_server.sh builds it")
    WORK.mkdir(parents=True, exist_ok=True)
    data_dir = WORK / "appliance"
    keys = [appliance_key(variant_dir(data_dir, i)) for i in range(len(plan))]
    model_dir: Path | None = None
    datasets: dict[int, Path] = {}

    def prepared() -> Path:
        """The bundled model as vLLM and aiperf's tokenizer read it (converted once)."""
        nonlocal model_dir
        if model_dir is None:
            model_dir = converted_model(data_dir)
        return model_dir

    def dataset(round_: int) -> Path:
        """The round's workload: its own prompts (seed + round), so that no server answers a later round from the
        prefix cache the earlier one filled (all do, vLLM too: the second round of one workload ran 1.3x faster)."""
        if round_ not in datasets:
            from transformers import AutoTokenizer

            datasets[round_] = WORK / f"workload-{round_ + 1}.jsonl"
            rounds_spec = replace(spec, seed=spec.seed + round_)
            write_dataset(datasets[round_], rounds_spec, AutoTokenizer.from_pretrained(prepared()))
        return datasets[round_]

    appliances = [
        (appliance_server(name, variant, variant_dir(data_dir, i)), keys[i]) for i, (name, variant) in enumerate(plan)
    ]

    def peers() -> list[tuple[Server, str]]:  # after an appliance has converted the model vLLM serves
        vllms = [vllm_server(args.vllm_python, prepared(), dtype) for dtype in vllm_dtypes]
        gguf = default_model_path()
        return [(s, BENCH_KEY) for s in vllms + [llama_server(args.llama_server_bin, gguf, *r) for r in llamas]]

    def measured(server: Server, key: str, round_: int) -> Row:
        row = measure(args, server, key, prepared(), dataset(round_), round_)
        print(table([row]).splitlines()[-1], file=sys.stderr)
        return row

    rounds: list[list[Row]] = []
    if args.rounds == 1:  # one server up at a time
        rows = []
        for server, key in appliances:
            with running(server):
                rows.append(measured(server, key, 0))
        for server, key in peers():
            with running(server):
                rows.append(measured(server, key, 0))
        rounds.append(rows)
    else:  # every server up, measured in turn
        with ExitStack() as stack:
            servers = []
            for server, key in appliances:  # the appliances first: vLLM serves the model they convert
                stack.enter_context(running(server))
                servers.append((server, key))
            for server, key in peers():
                stack.enter_context(running(server))
                servers.append((server, key))
            for round_ in range(args.rounds):
                rounds.append([measured(server, key, round_) for server, key in servers])
    print(table([row for rows in rounds for row in rows]))
    if args.rounds > 1:
        print(summary(rounds))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for rows in rounds for r in rows], indent=2) + "\n")
    return 0


PEER_NAMES = ("vLLM", "llama-server")


def summary(rounds: list[list[Row]]) -> str:
    """Each server's median output tok/s over the rounds and its ratio, within each round, to the first row of
    each peer that ran (vLLM, llama-server)."""
    peers = [p for p in PEER_NAMES if any(r.name.startswith(p) for r in rounds[0])]
    lines = ["| served (median over rounds) | output tok/s | TTFT p95 | inter-token p50 |"
             + "".join(f" vs {p}, each round |" for p in peers),
             "|---|---|---|---|" + "---|" * len(peers)]  # fmt: skip
    for i, first in enumerate(rounds[0]):
        runs = [rows[i] for rows in rounds]
        columns = ""
        for name in peers:
            ratios = []
            for rows in rounds:
                peer = next((r for r in rows if r.name.startswith(name)), None)
                if peer is not None and peer.output_tokens_per_s > 0:
                    ratios.append(rows[i].output_tokens_per_s / peer.output_tokens_per_s)
            each = " ".join(f"{r:.2f}x" for r in ratios)
            columns += f" {each}{f' (median {statistics.median(ratios):.2f}x)' if ratios else ''} |"
        lines.append(
            f"| {first.name.rsplit(' #', 1)[0]} | {statistics.median(r.output_tokens_per_s for r in runs):.1f} "
            f"| {statistics.median(r.ttft_p95_ms for r in runs) / 1000:.2f} s "
            f"| {statistics.median(r.itl_p50_ms for r in runs):.0f} ms |{columns}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
