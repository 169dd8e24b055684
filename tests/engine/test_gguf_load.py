"""A GGUF loaded tensor by tensor (engine/model/gguf_load.py): a tiny Llama with random Q4_K / Q6_K / Q8_0 / Q4_0 /
Q5_K blocks and the bundled model's tokenizer loads in a subprocess within a bound on its peak memory, keeps the
blocks the packed kernel multiplies, and the engine's greedy tokens equal transformers' own GGUF load's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.gguf_load import bundled_gguf, write_random_llama
from engine.cpu.kernel_build import KernelBuildError, build_packed_linear

try:
    build_packed_linear("q4f")
except KernelBuildError as exc:  # pragma: no cover - CI installs gcc (make sysdeps-test)
    pytest.skip(f"the packed linear kernel does not build here: {exc}", allow_module_level=True)

Q = GGMLQuantizationType
SHAPE = (256, 512, 2, 4, 2)  # hidden, ffn, layers, heads, kv heads: k-quant rows are whole 256-weight super-blocks
# Layer 0 as a Q4_K_M file; layer 1 tries the other types (Q5_K has no packed form).
TYPES = {"token_embd": Q.Q8_0, "output": Q.Q6_K, "0.attn_v": Q.Q6_K, "0.ffn_down": Q.Q6_K, "1.ffn_down": Q.Q6_K}
TYPES |= {"1.attn_q": Q.Q8_0, "1.attn_v": Q.Q4_0, "1.attn_output": Q.Q5_K}
PROMPT = "The capital of France is"


def block_type(name: str) -> GGMLQuantizationType:
    return TYPES.get(name.removeprefix("blk.").removesuffix(".weight"), Q.Q4_K)


ENGINE_RUN = """
import json, re, sys
from engine import EngineConfig, SamplingParams
from engine.core import EngineCore
from tests.engine.test_equivalence import run
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent through fork and exec.
hwm = lambda: int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
before = hwm()
messages = []
config = EngineConfig(model=sys.argv[1], cache_dir=sys.argv[2], quantization="none", dtype="float32", device="cpu",
                      num_kv_blocks=16)
core = EngineCore(config, progress=messages.append)
peak = hwm()
prompt = core.loaded.tokenizer(sys.argv[3])["input_ids"]
params = SamplingParams(max_tokens=int(sys.argv[4]), temperature=0.0, ignore_eos=True)
tokens = run(core, iter([[("r", prompt, params)]]))["r"]
print(json.dumps({"before": before, "peak": peak, "weights": core.loaded.weights_bytes, "messages": messages,
                  "tokens": tokens}))
"""


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        bundled_gguf()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.Q4_K_M.gguf"
    write_random_llama(path, SHAPE, block_type)
    return path


def test_a_k_quant_gguf_loads_in_bounded_memory_with_transformers_greedy_tokens(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    steps = 8
    done = subprocess.run(
        [sys.executable, "-c", ENGINE_RUN, str(tiny_gguf), str(tmp_path), PROMPT, str(steps)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    engine = json.loads(done.stdout.strip().splitlines()[-1])
    # Q4_K -> q4f, Q6_K -> q8f (v, 2 ffn_down, output), Q8_0 and Q4_0 -> q8; Q5_K's values fit none.
    forms = [m for m in engine["messages"] if m.startswith("linear layers' weights")]
    assert forms == ["linear layers' weights, by the form that holds them exactly: plain 1, q4f 8, q8 2, q8f 4"]
    # The final weights are ~60 MB (a float32 embedding of 49,152 x 256, the rest packed); the load adds the
    # GGUF's vocabulary parsed twice (config and tokenizer, then the reader) and a chunk of rows at a time.
    grown = engine["peak"] - engine["before"]
    assert grown < engine["weights"] + (400 << 20), (grown, engine["weights"])

    tokenizer = AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32)
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    expected = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)[0, ids.shape[1] :]
    assert engine["tokens"] == expected.tolist()
