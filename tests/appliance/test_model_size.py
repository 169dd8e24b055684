"""Memory estimates before loading, checked against published sizes: the bundled SmolLM2 (read from its GGUF),
Llama-3.1-8B (from its config.json values) and the random presets (same shape as what the engine builds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from appliance.models.gguf_header import read_header
from appliance.models.size import Machine, fit, memory_need, model_shape
from appliance.settings import load_settings
from engine.model.sources import default_model_path

GIB = 1 << 30
LLAMA_31_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}


def test_the_bundled_gguf_is_read_without_loading_it() -> None:
    shape = model_shape("default")
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.context) == (30, 3, 64, 8192)
    assert shape.params == pytest.approx(134.5e6, rel=0.01)  # SmolLM2-135M


def test_an_8b_model_in_nf4_takes_about_5_6_gib_and_128_kib_per_token(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    shape = model_shape(str(tmp_path))
    assert shape.params == pytest.approx(8.03e9, rel=0.01)
    assert shape.weights_bytes("none", 2) / GIB == pytest.approx(14.96, rel=0.01)
    assert shape.weights_bytes("nf4", 2) / GIB == pytest.approx(5.6, rel=0.02)
    assert shape.kv_bytes_per_token(2) == 128 * 1024
    need = memory_need(shape, "nf4", 2, max_model_len=8192, gpu=True)
    assert need.context == 8192 and need.minimum / GIB == pytest.approx(5.6 + 1 + 1, rel=0.02)
    # An 8-bit pool: a byte per element and a 2-byte scale per row of 128: 65 KiB per token.
    assert shape.kv_bytes_per_token(2, "int8") == shape.kv_bytes_per_token(4, "fp8") == 2 * 32 * 8 * 130


def test_the_fit_counts_chats_in_the_chosen_kv_cache_dtype(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    shape = model_shape(str(tmp_path))
    on = Machine(True, 24 * GIB, "nf4", "bfloat16")
    exact = fit(shape, load_settings({"APPLIANCE_DATA_DIR": str(tmp_path)}), on)
    eight = fit(shape, load_settings({"APPLIANCE_DATA_DIR": str(tmp_path), "APPLIANCE_KV_CACHE_DTYPE": "int8"}), on)
    assert eight.chats >= 1.9 * exact.chats and "KV int8" in eight.summary and "KV" not in exact.precision


def test_an_unknown_model_cannot_be_estimated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a model directory"):
        model_shape(str(tmp_path / "nothing"))


def test_the_gguf_header_reader_agrees_with_the_gguf_package() -> None:
    from gguf import GGUFReader

    path = default_model_path()
    header = read_header(path)
    reference = GGUFReader(path)
    for key in ("general.architecture", "llama.block_count", "llama.attention.head_count_kv", "llama.context_length"):
        assert header.values[key] == reference.get_field(key).contents()  # type: ignore[union-attr]
    assert header.array_lengths["tokenizer.ggml.tokens"] == len(reference.fields["tokenizer.ggml.tokens"].data)
    assert header.tensor_names == {tensor.name for tensor in reference.tensors}


def test_a_cut_or_foreign_gguf_cannot_be_estimated(tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with default_model_path().open("rb") as whole:
        cut.write_bytes(whole.read(4096))
    with pytest.raises(ValueError, match="ends inside its metadata"):
        model_shape(str(cut))
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match="not a GGUF file"):
        model_shape(str(foreign))


def q4_k_m_8b_header(path: Path) -> None:
    """Llama-3.1-8B as a Q4_K_M file lays it out (Q6_K for the output and half the attn_v and ffn_down), the
    header only: the estimate reads nothing else."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.constants import GGML_QUANT_SIZES

    hidden, ffn, kv, vocab = 4096, 14336, 1024, 128256
    writer = GGUFWriter(path, "llama")
    writer.add_context_length(131072)
    writer.add_embedding_length(hidden)
    writer.add_block_count(32)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(32)
    writer.add_head_count_kv(8)
    writer.add_token_list(["t"] * vocab)
    tensors = {"token_embd.weight": (vocab, hidden), "output.weight": (vocab, hidden)}
    for layer in range(32):
        parts = {"attn_q": hidden, "attn_k": kv, "attn_v": kv, "attn_output": hidden, "ffn_gate": ffn, "ffn_up": ffn}
        tensors |= {f"blk.{layer}.{part}.weight": (rows, hidden) for part, rows in parts.items()}
        tensors[f"blk.{layer}.ffn_down.weight"] = (hidden, ffn)
    for name, (rows, columns) in tensors.items():
        more_bits = name == "output.weight" or (
            ("attn_v" in name or "ffn_down" in name) and int(name[4:6].strip(".")) % 2 == 0
        )
        kind = GGMLQuantizationType.Q6_K if more_bits else GGMLQuantizationType.Q4_K
        block, size = GGML_QUANT_SIZES[kind]
        writer.add_tensor_info(
            name, (rows, columns // block * size), np.dtype(np.uint8), rows * columns // block * size, kind
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()


def test_an_8b_q4_k_m_gguf_loads_on_a_cpu_within_1_3_times_its_packed_weights(tmp_path: Path) -> None:
    path = tmp_path / "llama-8b.Q4_K_M.gguf"
    q4_k_m_8b_header(path)
    shape = model_shape(str(path))
    need = memory_need(shape, "none", 4, max_model_len=8192, gpu=False)
    # The float32 embedding (1.96 GiB) and the linear layers in their blocks' packed forms (q4f, q8f).
    assert need.weights / GIB == pytest.approx(7.9, rel=0.03)
    assert need.load_peak <= 1.3 * need.weights
    settings = load_settings({"APPLIANCE_DATA_DIR": str(tmp_path)})
    fits = fit(shape, settings, Machine(False, 20 * GIB, "none", "float32"))
    assert fits.fits and fits.load_peak == need.load_peak
    # In bfloat16 the linear layers keep their blocks beside the bf16 weights (engine/cpu/split_linear.py): the
    # packed forms of the float32 count less its float32 embedding.
    assert shape.cpu_blocks_bytes == shape.cpu_float32_bytes - 4 * 128256 * 4096  # type: ignore[operator]
    in_bf16 = memory_need(shape, "none", 2, max_model_len=8192, gpu=False)
    assert in_bf16.weights == shape.weights_bytes("none", 2) + shape.cpu_blocks_bytes
    assert not fit(shape, settings, Machine(False, 20 * GIB, "none", "bfloat16")).fits  # 15 GiB of bf16 + 5.9 of blocks


def test_bitsandbytes_on_a_gguf_needs_ram_for_one_layer_beside_the_gpu(tmp_path: Path) -> None:
    """The streamed load quantizes each linear layer as it is read (engine/model/bnb.py): on a GPU the host holds
    the vocabulary and one layer in 16 bits, not the float32 model twice as the whole-file conversion did."""
    path = tmp_path / "llama-8b.Q4_K_M.gguf"
    q4_k_m_8b_header(path)
    shape = model_shape(str(path))
    need = memory_need(shape, "nf4", 2, max_model_len=8192, gpu=True)
    assert need.weights / GIB == pytest.approx(5.4, rel=0.05)  # nf4 linears, bf16 embedding and head
    assert need.load_peak == (1 << 30) + 14336 * 4096 * 2  # ffn weights are the largest: 112 MiB in bf16
    # On a CPU (not the default there) the unquantized embedding and head are searched for a packed form: three
    # float32 copies of them at most (bench.gguf_load --shape 1b --quantization nf4: 2,799 MiB for 1,232 of weights).
    on_cpu = memory_need(shape, "nf4", 4, max_model_len=8192, gpu=False)
    assert on_cpu.weights < on_cpu.load_peak < 3 * on_cpu.weights
    settings = load_settings({"APPLIANCE_DATA_DIR": str(tmp_path)})
    assert fit(shape, settings, Machine(True, 24 * GIB, "nf4", "bfloat16", ram=4 * GIB)).fits
    refused = fit(shape, settings, Machine(True, 24 * GIB, "nf4", "bfloat16", ram=GIB))
    assert not refused.fits and "of RAM while loading" in refused.summary
