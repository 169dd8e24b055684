"""py-spy's collapsed stacks split into the parts of an engine step by their innermost known frame."""

from __future__ import annotations

from bench.engine.spy import breakdown

ROOT = "run_engine_process (engine/process.py:60);EngineCore.step (engine/core.py:150)"
MODEL = f"{ROOT};ModelRunner.execute (engine/model/runner.py:70);Module._call_impl (torch/nn/modules/module.py:1786)"
CALL = "Module._call_impl (torch/nn/modules/module.py:1786)"
KERNEL = "AttentionKernel.__call__ (engine/cpu/decode_kernel.py:102)"
OWN = f"{ROOT};ModelRunner.execute (engine/model/runner.py:70);ModelRunner._logits (engine/model/runner.py:120)"
RAW = [
    f"{MODEL};forward (transformers/models/llama/modeling_llama.py:300) 50",
    f"{MODEL};forward (llama.py:240);{CALL};Linear.forward (torch/nn/modules/linear.py:134) 30",
    f"{OWN};CpuForward.__call__ (engine/model/forward.py:110);PackedLinear.forward (engine/cpu/packed_linear.py:53) 40",
    f"{OWN};CpuForward.__call__ (engine/model/forward.py:112) 7",
    f"{OWN};CpuForward.__call__ (engine/model/forward.py:114);attend (engine/model/attention.py:120);{KERNEL} 8",
    f"{MODEL};forward (llama.py:250);paged_attention (engine/model/attention.py:70) 20",
    f"{ROOT};ModelRunner.execute (engine/model/runner.py:80);sample (engine/sample/sampler.py:40);"
    "_argmax (engine/sample/sampler.py:60) 5",
    f"{ROOT};ModelRunner.execute (engine/model/runner.py:50);ModelRunner._tensor (engine/model/runner.py:105) 4",
    f"{ROOT};Scheduler.schedule (engine/sched/scheduler.py:90) 3",
    f"{ROOT};EngineCore._update (engine/core.py:160) 2",
    "run_engine_process (engine/process.py:85);send (engine/process.py:48) 6",
    "run_engine_process (engine/process.py:64);_ConnectionBase.poll (multiprocessing/connection.py:257) 10",
    "Thread._bootstrap (threading.py:1002);TMonitor.run (tqdm/_monitor.py:69) 99",
    "garbled line",
]


def test_samples_go_to_the_innermost_part() -> None:
    parts = breakdown(RAW)
    assert parts == {
        "linear layers": 70,
        "forward": 57,
        "attention": 28,
        "sampling": 5,
        "batch building": 4,
        "scheduler": 3,
        "bookkeeping": 2,
        "pipe I/O": 6,
        "idle": 10,
    }
