"""engine.hf: transformers' classes reached from several threads at once, as the web process reaches them (the
engine client's start, remote backends' probes, the managed vLLM's start, the console's catalogue)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Eight threads released together, each importing a class for the first time in a fresh process, four processes.
# Without the lock a thread found a module half initialised ("module 'transformers' has no attribute
# 'AutoTokenizer'"; in CI "cannot import name 'AutoTokenizer'", and a gateway without its backend's tokenizer) in
# each of 4 runs of this test.
RACE = """
import threading
from engine.hf import transformers_class
names = ["AutoTokenizer", "AutoConfig", "AutoModelForCausalLM", "PreTrainedTokenizerFast"] * 2
errors, barrier = [], threading.Barrier(len(names))
def first_use(name):
    barrier.wait()
    try:
        transformers_class(name)
    except Exception as exc:
        errors.append(f"{name}: {exc}")
threads = [threading.Thread(target=first_use, args=(n,)) for n in names]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(errors or "ok")
"""


def test_first_imports_from_several_threads_at_once_all_succeed() -> None:
    runs = [
        subprocess.Popen([sys.executable, "-c", RACE], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(4)
    ]
    outputs = [run.communicate(timeout=120)[0].decode() for run in runs]
    assert all(out.strip().endswith("ok") for out in outputs), outputs
