"""`python -m appliance.bench_served` (or bench/served.sh, which makes the peers' venvs): the appliance, with its
defaults and with each quantization, against vLLM's CPU build, each served in turn on this machine and measured
by the same independent client (aiperf) on one seeded workload with long-tailed lengths and Poisson arrivals.
Prints output tok/s, TTFT p50/p95 and inter-token p50 per server, and the CPU flags they ran on."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.bench.workload import WorkloadSpec, make_workload
from engine.hardware import auto_cpu_dtype, auto_quantization, cpu_flags, describe

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "data" / "served-bench"
PEERS = REPO / "data" / "peers"
SERVED_NAME = "bench-model"
BENCH_KEY = "sk-vllm-bench"  # vLLM's --api-key; the appliance's key is created in its own database
READY_TIMEOUT = 900.0  # vLLM's first start compiles for minutes on two cores
APPLIANCE_VARIANTS = "auto/auto,none/float32,none/auto,nf4/auto,fp4/auto,int8/auto"


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    requests: int


@dataclass(frozen=True, slots=True)
class Server:
    name: str
    command: list[str]
    env: dict[str, str]
    url: str
    key: str
    log: Path
    ready_path: str  # the appliance's /health answers while the model still loads; its /ready does not


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m appliance.bench_served", description=__doc__)
    p.add_argument(
        "--appliance",
        default=APPLIANCE_VARIANTS,
        help="quantization/dtype pairs ('' for none); a third part 'plain' keeps float32 weights unpacked",
    )
    p.add_argument("--vllm-dtypes", default="float32,bfloat16", help="vLLM runs, one per dtype ('' for none)")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per second")
    p.add_argument("--prompt-median", type=int, default=64)
    p.add_argument("--output-median", type=int, default=48)
    p.add_argument("--output-max", type=int, default=256)
    p.add_argument("--sigma", type=float, default=0.8, help="lognormal spread of both lengths: the tail's weight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm-python", type=Path, default=PEERS / "vllm" / "bin" / "python")
    p.add_argument("--aiperf", type=Path, default=PEERS / "aiperf" / "bin" / "aiperf")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--dry-run", action="store_true", help="print the plan (commands, workload) and start nothing")
    return p.parse_args(argv)


def variants(spec: str, flags: frozenset[str]) -> list[tuple[str, str, str, bool]]:
    """(row name, quantization, dtype, compact weights) per appliance run; one that resolves like the defaults is
    not rerun."""
    rows, seen = [], set()
    for variant in filter(None, (s.strip() for s in spec.split(","))):
        quantization, _, rest = variant.partition("/")
        dtype, _, weights = rest.partition("/")
        dtype = dtype or "auto"
        resolved = (
            auto_quantization("cpu", flags) if quantization == "auto" else quantization,
            auto_cpu_dtype(flags) if dtype == "auto" else dtype,
            weights != "plain",
        )
        if resolved in seen:
            continue
        seen.add(resolved)
        name = "appliance, defaults" if variant == "auto/auto" else f"appliance, {variant}"
        rows.append((f"{name} ({resolved[0]}, {resolved[1]})", quantization, dtype, resolved[2]))
    return rows


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("APPLIANCE_", "VLLM_"))}


def appliance_server(name: str, quantization: str, dtype: str, compact: bool, data_dir: Path) -> Server:
    port = free_port()
    env = clean_env() | {
        "APPLIANCE_DATA_DIR": str(data_dir),
        "APPLIANCE_PORT": str(port),
        "APPLIANCE_QUANTIZATION": quantization,
        "APPLIANCE_DTYPE": dtype,
        "APPLIANCE_COMPACT_WEIGHTS": str(compact).lower(),
        "APPLIANCE_SERVED_MODEL_NAME": SERVED_NAME,
        "APPLIANCE_LOG_LEVEL": "warning",
    }
    appliance = str(Path(sys.executable).with_name("appliance"))
    log = WORK / f"{name.split(' (')[0].replace(', ', '-').replace('/', '-').replace(' ', '')}.log"
    return Server(name, [appliance, "serve"], env, f"http://127.0.0.1:{port}", "", log, "/ready")


def vllm_server(python: Path, model_dir: Path, dtype: str) -> Server:
    port = free_port()
    # One OpenMP thread, as the appliance's engine takes on two cores; 1 GiB of KV, as the appliance's default.
    env = clean_env() | {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED_NAME, "--dtype", dtype, "--max-model-len", "2048",
        "--port", str(port), "--api-key", BENCH_KEY,
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    return Server(f"vLLM CPU 0.32, {dtype}", command, env, url, BENCH_KEY, WORK / f"vllm-{dtype}.log", "/health")


@contextmanager
def running(server: Server) -> Iterator[None]:
    with server.log.open("w") as log:
        process = subprocess.Popen(server.command, env=server.env, stdout=log, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        while not _ready(server.url + server.ready_path):
            if process.poll() is not None:
                raise RuntimeError(f"{server.name} exited with {process.returncode}; see {server.log}")
            if time.monotonic() - started > READY_TIMEOUT:
                raise TimeoutError(f"{server.name} was not ready in {READY_TIMEOUT:.0f} s; see {server.log}")
            time.sleep(1)
        print(f"  {server.name}: ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
        yield
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def warm(url: str, key: str) -> None:
    """One short request, so that neither server's first-request costs land in the measurement."""
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def aiperf_command(
    args: argparse.Namespace, server: Server, key: str, model_dir: Path, dataset: Path, out: Path
) -> list[str]:
    return [
        str(args.aiperf), "profile", "--url", server.url, "--model", SERVED_NAME, "--endpoint-type", "chat",
        "--streaming", "--tokenizer", str(model_dir), "--input-file", str(dataset),
        "--custom-dataset-type", "single_turn", "--fixed-schedule", "--extra-inputs", "ignore_eos:true",
        "--api-key", key, "--random-seed", str(args.seed), "--artifact-dir", str(out), "--ui", "none",
    ]  # fmt: skip


def measure(args: argparse.Namespace, server: Server, key: str, model_dir: Path, dataset: Path) -> Row:
    out = WORK / ("aiperf-" + server.log.stem)
    shutil.rmtree(out, ignore_errors=True)
    warm(server.url, key)
    command = aiperf_command(args, server, key, model_dir, dataset, out)
    with (WORK / f"{server.log.stem}.aiperf.log").open("w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, env=clean_env())
    exports = sorted(out.rglob("profile_export_aiperf.json"))
    if not exports:
        raise RuntimeError(f"aiperf wrote no profile_export_aiperf.json under {out}")
    return read_row(server.name, exports[0])


def appliance_key(data_dir: Path) -> str:
    """Migrate the bench's own database and create one key without limits in it."""
    return create_keys(data_dir, ["bench"])["bench"]


def create_keys(data_dir: Path, names: list[str]) -> dict[str, str]:
    """Migrate the database in data_dir and create a key without limits per name (the CLI prints it once)."""
    env = clean_env() | {"APPLIANCE_DATA_DIR": str(data_dir)}
    appliance = str(Path(sys.executable).with_name("appliance"))
    subprocess.run([appliance, "migrate"], env=env, check=True, capture_output=True)
    keys = {}
    for name in names:
        made = subprocess.run([appliance, "keys", "create", name], env=env, check=True, capture_output=True, text=True)
        keys[name] = made.stdout.strip().splitlines()[-1]
    return keys


def converted_model(data_dir: Path) -> Path:
    """The appliance's safetensors copy of the bundled model: an HF directory vLLM and aiperf's tokenizer read."""
    found = sorted((data_dir / "models").glob("SmolLM2-135M-Instruct*/config.json"))
    if not found:
        raise RuntimeError(f"no converted model under {data_dir / 'models'}: run at least one appliance variant")
    return found[0].parent


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
    spec = WorkloadSpec.from_options(args)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores, flags: {describe(flags)}")
    print(
        f"workload: {spec.num_requests} streamed chat requests, Poisson {spec.rate}/s, prompt median "
        f"{spec.prompt_median} tokens, output median {spec.output_median} (max {spec.output_max}), lognormal sigma "
        f"{spec.sigma}, ignore_eos, seed {spec.seed}; client aiperf 0.13 (fixed schedule)"
    )
    if args.dry_run:
        for name, quantization, dtype, compact in plan:
            print(
                f"would run {name}: APPLIANCE_QUANTIZATION={quantization} APPLIANCE_DTYPE={dtype} "
                f"APPLIANCE_COMPACT_WEIGHTS={str(compact).lower()} appliance serve"
            )
        for dtype in vllm_dtypes:
            print(f"would run {vllm_server(args.vllm_python, Path('MODEL_DIR'), dtype).name}")
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    data_dir = WORK / "appliance"
    dataset = WORK / "workload.jsonl"
    key = appliance_key(data_dir)
    rows: list[Row] = []
    model_dir: Path | None = None

    def prepared() -> Path:
        """The converted model (the first appliance start makes it), and this run's workload written for it."""
        nonlocal model_dir
        if model_dir is None:
            from transformers import AutoTokenizer

            model_dir = converted_model(data_dir)
            write_dataset(dataset, spec, AutoTokenizer.from_pretrained(model_dir))
        return model_dir

    for name, quantization, dtype, compact in plan:
        server = appliance_server(name, quantization, dtype, compact, data_dir)
        with running(server):
            rows.append(measure(args, server, key, prepared(), dataset))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    for dtype in vllm_dtypes:
        server = vllm_server(args.vllm_python, prepared(), dtype)
        with running(server):
            rows.append(measure(args, server, BENCH_KEY, prepared(), dataset))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
