"""py-spy's collapsed stacks split into the parts of an engine step by their innermost known frame."""

from __future__ import annotations

from engine.bench.spy import breakdown

ROOT = "run_engine_process (/w/engine/process.py:60);step (/w/engine/core.py:150)"
MODEL = f"{ROOT};execute (/w/engine/runner.py:70);_call_impl (/v/torch/nn/modules/module.py:1786)"
RAW = [
    f"{MODEL};forward (/v/transformers/models/llama/modeling_llama.py:300) 50",
    f"{MODEL};forward (/v/llama.py:250);paged_attention (/w/engine/attention.py:70) 20",
    f"{ROOT};execute (/w/engine/runner.py:80);sample (/w/engine/sampler.py:40);_argmax (/w/engine/sampler.py:60) 5",
    f"{ROOT};execute (/w/engine/runner.py:50);_tensor (/w/engine/runner.py:105) 4",
    f"{ROOT};schedule (/w/engine/scheduler.py:90) 3",
    f"{ROOT};_update (/w/engine/core.py:160) 2",
    "run_engine_process (/w/engine/process.py:85);send (/w/engine/process.py:48) 6",
    "run_engine_process (/w/engine/process.py:64);poll (/u/multiprocessing/connection.py:257) 10",
    "garbled line",
]


def test_samples_go_to_the_innermost_part() -> None:
    parts = breakdown(RAW)
    assert parts == {
        "forward": 50,
        "attention": 20,
        "sampling": 5,
        "batch building": 4,
        "scheduler": 3,
        "bookkeeping": 2,
        "pipe I/O": 6,
        "idle": 10,
    }
