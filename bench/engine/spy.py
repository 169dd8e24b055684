"""`python -m bench.engine.spy RAW`: where the engine process's time went, from py-spy's raw (collapsed) samples.

Record the served engine under load with `py-spy record --idle --format raw --pid PID -o RAW` (py-spy 0.4 from
PyPI); this splits the samples into the parts of a step: the linear layers, the rest of the model's forward
(norms, rotary embedding, activations, module calls), paged attention, sampling, building the batch, the
scheduler and the rest of the step's bookkeeping, the pipe to the web process (encoding, sending, receiving), and
idle waiting.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# (part, function, file): a frame "function (path/file:line)" matches when both do ("" matches any function);
# a stack belongs to the part of its innermost matching frame.
MARKERS = (
    ("linear layers", "forward", "engine/cpu/packed_linear.py"),
    ("linear layers", "forward", "engine/cpu/prepack.py"),
    ("linear layers", "forward", "torch/nn/modules/linear.py"),
    ("attention", "paged_attention", "engine/model/attention.py"),
    ("attention", "attend", "engine/model/attention.py"),
    ("sampling", "sample", "engine/sample/sampler.py"),
    ("forward", "__call__", "engine/model/forward.py"),
    ("forward", "_call_impl", "torch/nn/modules/module.py"),
    ("batch building", "execute", "engine/model/runner.py"),
    ("scheduler", "", "engine/sched/scheduler.py"),
    ("scheduler", "", "engine/sched/block_manager.py"),
    ("detokenizing", "", "engine/sample/detokenizer.py"),
    ("pipe I/O", "send", "engine/process.py"),
    ("pipe I/O", "send_bytes", "multiprocessing/connection.py"),
    ("pipe I/O", "recv_bytes", "multiprocessing/connection.py"),
    ("idle", "poll", "multiprocessing/connection.py"),
    ("bookkeeping", "", "engine/core.py"),
    ("bookkeeping", "", "engine/stats.py"),
)
PARTS = tuple(dict.fromkeys(part for part, _, _ in MARKERS))


def classify(stack: str) -> str:
    for frame in reversed(stack.split(";")):
        function, _, where = frame.partition(" (")
        for part, wanted, path in MARKERS:
            if path in where and (not wanted or function == wanted or function.endswith("." + wanted)):
                return part
    return "other"


def breakdown(lines: Iterable[str]) -> Counter[str]:
    """Samples per part from `frame;frame;... count` lines (py-spy qualifies methods: `Class.method (file:line)`).
    Helper threads (tqdm's monitor, torch's pools) are left out: the step loop is the main thread."""
    parts: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit() and not stack.startswith("Thread._bootstrap"):
            parts[classify(stack)] += int(count)
    return parts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.spy", description=__doc__)
    p.add_argument("raw", type=Path, help="py-spy record --format raw output")
    args = p.parse_args(argv)
    parts = breakdown(args.raw.read_text().splitlines())
    total = sum(parts.values()) or 1
    busy = total - parts["idle"] or 1
    print(f"{'part':>16} | {'of all':>7} | {'of busy':>7}")
    for part in (*PARTS, "other"):
        if parts[part]:
            of_busy = "" if part == "idle" else f"{parts[part] / busy:7.1%}"
            print(f"{part:>16} | {parts[part] / total:7.1%} | {of_busy:>7}")
    print(f"{total} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
