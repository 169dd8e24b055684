"""The served benchmark's own logic, without servers: which appliance runs it plans, the workload file it gives
aiperf, and the row it reads back from aiperf's export."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.engine.workload import WorkloadSpec
from bench.served import Row, llama_runs, main, read_row, summary, table, variants, write_dataset

BENCH = Path(__file__).resolve().parents[2] / "bench"
AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16"})


def test_pairs_that_resolve_like_the_defaults_are_not_run_twice() -> None:
    plan = variants("auto/auto,none/float32,none/auto,nf4/auto,int8", AVX512_BF16)
    # The defaults are none/bfloat16 here, so none/auto is not run again.
    assert [(v.quantization, v.dtype) for _, v in plan] == [
        ("auto", "auto"),
        ("none", "float32"),
        ("nf4", "auto"),
        ("int8", "auto"),
    ]
    assert plan[0][0] == "appliance, defaults (none, bfloat16)"
    # Without AVX512-BF16 the defaults are fp32, so nf4 is a run of its own and none/float32 is not; float32
    # weights left unpacked ('plain') or transformers' forward ('hf') are runs of their own.
    avx2 = variants("auto/auto,none/float32,nf4/auto,none/float32/plain,auto/auto/plain+hf", frozenset({"avx2"}))
    assert [(v.quantization, v.dtype, sorted(v.off)) for _, v in avx2] == [
        ("auto", "auto", []),
        ("nf4", "auto", []),
        ("none", "float32", ["plain"]),
        ("auto", "auto", ["hf", "plain"]),
    ]
    assert avx2[2][0] == "appliance, none/float32/plain (none, float32)"


def test_a_kv_pool_type_is_a_run_of_its_own_and_a_setting() -> None:
    plan = variants("none/float32,none/float32@int8,none/float32@fp8,none/float32@auto", frozenset({"avx2"}))
    assert [v.kv_cache_dtype for _, v in plan] == ["auto", "int8", "fp8"]
    assert plan[1][0] == "appliance, none/float32@int8 (none, float32, KV int8)"
    assert plan[1][1].settings()["APPLIANCE_KV_CACHE_DTYPE"] == "int8"
    assert plan[2][1].config(model="random:tiny").kv_cache_dtype == "fp8"


class WordTokenizer:
    def __len__(self) -> int:
        return 50000

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(f"w{i}" for i in ids)


def test_the_workload_file_is_seeded_long_tailed_and_scheduled(tmp_path: Path) -> None:
    spec = WorkloadSpec(num_requests=200, rate=4.0, prompt_median=32, output_median=16, output_max=256, seed=3)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    total = write_dataset(first, spec, WordTokenizer())
    write_dataset(second, spec, WordTokenizer())
    assert first.read_text() == second.read_text()
    lines = [json.loads(line) for line in first.read_text().splitlines()]
    assert len(lines) == 200 and total == sum(line["output_length"] for line in lines)
    stamps = [line["timestamp"] for line in lines]
    assert stamps == sorted(stamps) and 30_000 < stamps[-1] < 70_000  # ~50 s of Poisson arrivals at 4/s
    outputs = sorted(line["output_length"] for line in lines)
    assert outputs[100] < 24 and outputs[-1] > 4 * outputs[100]  # a long tail above the median
    assert all(len(line["text"].split()) >= 1 for line in lines)


def test_a_row_is_read_from_aiperfs_export(tmp_path: Path) -> None:
    export = tmp_path / "profile_export_aiperf.json"
    export.write_text(
        json.dumps(
            {
                "schema_version": "1",
                "request_count": {"unit": "requests", "avg": 64.0},
                "time_to_first_token": {"unit": "ms", "avg": 700.0, "p50": 480.0, "p95": 2100.0},
                "inter_token_latency": {"unit": "ms", "avg": 95.0, "p50": 88.5},
                "output_token_throughput": {"unit": "tokens/sec", "avg": 71.25},
            }
        )
    )
    row = read_row("appliance, defaults", export)
    assert row == Row("appliance, defaults", 71.25, 480.0, 2100.0, 88.5, 64)
    assert table([row]).splitlines()[-1] == "| appliance, defaults | 71.2 | 0.48 s | 2.10 s | 88 ms | 64 |"


def test_a_metric_aiperf_left_out_reads_as_not_a_number(tmp_path: Path) -> None:
    export = tmp_path / "profile_export_aiperf.json"
    export.write_text(json.dumps({"output_token_throughput": {"avg": 10.0}}))
    row = read_row("x", export)
    assert row.output_tokens_per_s == 10.0 and math.isnan(row.itl_p50_ms) and row.requests == 0


def test_rounds_are_summarised_by_median_and_ratio_within_each_round() -> None:
    def row(name: str, tok_s: float) -> Row:
        return Row(name, tok_s, 1000.0, 2000.0 + tok_s, 100.0, 128)

    rounds = [
        [row("appliance, defaults (none, float32) #1", 80.0), row("vLLM CPU 0.32, float32 #1", 50.0)],
        [row("appliance, defaults (none, float32) #2", 60.0), row("vLLM CPU 0.32, float32 #2", 40.0)],
        [row("appliance, defaults (none, float32) #3", 70.0), row("vLLM CPU 0.32, float32 #3", 70.0)],
    ]
    lines = summary(rounds).splitlines()
    # A slow round weighs on both servers: each ratio is taken within its round, then the median of those.
    assert (
        lines[2]
        == "| appliance, defaults (none, float32) | 70.0 | 2.07 s | 100 ms | 1.60x 1.50x 1.00x (median 1.50x) |"
    )
    assert lines[3].startswith("| vLLM CPU 0.32, float32 | 50.0 |") and lines[3].endswith("(median 1.00x) |")


def test_llama_server_runs_are_slots_with_or_without_threads(capsys: pytest.CaptureFixture[str]) -> None:
    assert llama_runs("16, 64x1,") == [(16, None), (64, 1)]
    assert llama_runs("") == []
    for bad in ("0", "16x", "16x0", "x2", "sixteen", "16x2x1"):
        with pytest.raises(SystemExit, match="SLOTS or SLOTSxTHREADS"):
            llama_runs(bad)
    assert main(["--appliance", "", "--vllm-dtypes", "", "--llama-server", "16,64x1", "--dry-run"]) == 0
    planned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("would run")]
    # As a user starts it: no thread count, llama.cpp takes every core; 2,048 tokens of context per slot.
    assert "-np 16 -c 32768" in planned[0] and " -t " not in planned[0]
    assert "-np 64 -c 131072" in planned[1] and planned[1].endswith("-t 1 -tb 1")
    missing = ["--appliance", "", "--vllm-dtypes", "", "--llama-server", "16", "--llama-server-bin", "/nowhere/x"]
    with pytest.raises(SystemExit, match=r"no llama-server at /nowhere/x: bench/llama_server\.sh builds it"):
        main(missing)


def test_each_peer_that_ran_gets_its_own_ratio_column() -> None:
    def row(name: str, tok_s: float) -> Row:
        return Row(name, tok_s, 1000.0, 2000.0, 100.0, 64)

    rounds = [
        [row("appliance, defaults #1", 150.0), row("vLLM CPU 0.32, bfloat16 #1", 100.0),
         row("llama-server, 16 slots, its own threads #1", 50.0)],
        [row("appliance, defaults #2", 120.0), row("vLLM CPU 0.32, bfloat16 #2", 100.0),
         row("llama-server, 16 slots, its own threads #2", 80.0)],
    ]  # fmt: skip
    lines = summary(rounds).splitlines()
    assert lines[0].endswith("| vs vLLM, each round | vs llama-server, each round |")
    assert lines[2].endswith("| 1.50x 1.20x (median 1.35x) | 3.00x 1.50x (median 2.25x) |")
    assert lines[4].startswith("| llama-server, 16 slots, its own threads | 65.0 |")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (`make test` installs it)")
def test_the_scripts_that_make_the_peers_are_shellcheck_clean() -> None:
    run = subprocess.run(["shellcheck", str(BENCH / "served.sh"), str(BENCH / "llama_server.sh")], capture_output=True)
    assert run.returncode == 0, run.stdout.decode()
