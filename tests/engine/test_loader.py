"""Model loading: the bundled GGUF (converted once a session), HF dirs, seeded random presets, nf4, errors."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.config import EngineConfig
from engine.errors import ModelLoadError
from engine.model import gguf_source, loader
from engine.model.loader import (
    PRESETS,
    LoadedModel,
    default_model_path,
    load_model,
    random_model_dir,
    resolve_device,
    resolve_dtype,
    resolve_quantization,
)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def load(
    cache_dir: Path, messages: list[str] | None = None, attn: str | None = None, **settings: object
) -> LoadedModel:
    settings = {"quantization": "none", "dtype": "float32", "device": "cpu", **settings}
    config = EngineConfig(cache_dir=str(cache_dir), **settings)  # type: ignore[arg-type]
    return load_model(config, messages.append if messages is not None else None, attn_implementation=attn)


@pytest.fixture(scope="session")
def default_model(cache_dir: Path) -> LoadedModel:
    """The first load reads the bundled GGUF tensor by tensor and caches its config and tokenizer."""
    messages: list[str] = []
    loaded = load(cache_dir, messages, model="default")
    assert any("tensor by tensor" in message for message in messages)
    assert "linear layers' weights, by the form that holds them exactly: q4 210, q8 1" in messages
    return loaded


def test_default_model_loads_as_smollm2(default_model: LoadedModel) -> None:
    m = default_model
    assert m.name == "SmolLM2-135M-Instruct"
    assert type(m.model).__name__ == "LlamaForCausalLM"
    assert (m.device, m.dtype, m.quantization) == (torch.device("cpu"), torch.float32, "none")
    assert m.tokenizer.convert_tokens_to_ids("<|im_end|>") in m.eos_token_ids
    assert m.tokenizer.chat_template
    assert (m.num_layers, m.num_kv_heads, m.head_dim, m.max_model_len) == (30, 3, 64, 8192)
    # The float32 embedding (113 MB) and every linear layer in the GGUF's own 4- and 8-bit blocks (96 MB; float32
    # would be 538 MB), which hold the float32 weights exactly (engine.cpu.packed_linear).
    assert 190e6 < m.weights_bytes < 240e6
    assert not m.model.training and not any(p.requires_grad for p in m.model.parameters())
    assert len(AutoTokenizer.from_pretrained(m.source_dir)) == len(m.tokenizer)


@pytest.mark.parametrize("by_path", [False, True], ids=["default", "gguf-path"])
def test_second_load_uses_the_cache(default_model: LoadedModel, cache_dir: Path, by_path: bool) -> None:
    messages: list[str] = []
    started = time.perf_counter()
    model = str(default_model_path()) if by_path else "default"
    again = load(cache_dir, messages, model=model, max_model_len=512)
    assert time.perf_counter() - started < 10
    assert not any("converting" in message for message in messages)
    assert (again.name, again.source_dir) == ("SmolLM2-135M-Instruct", default_model.source_dir)
    assert again.max_model_len == 512


def test_hf_directory_loads_with_served_name(default_model: LoadedModel, cache_dir: Path) -> None:
    # The whole-file float32 conversion (still what bitsandbytes and vLLM load) gives the streamed load's weights.
    converted = gguf_source.converted_gguf(default_model_path(), cache_dir, lambda _: None)
    loaded = load(cache_dir, model=str(converted), served_model_name="smol")
    assert loaded.name == "smol" and loaded.source_dir == converted
    embeddings = (m.model.model.embed_tokens.weight for m in (loaded, default_model))
    assert torch.equal(*embeddings)
    assert torch.equal(loaded.model.lm_head.packed, default_model.model.lm_head.packed)  # the tied head, packed


def state(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    return loaded.model.state_dict()


def test_random_tiny_is_seeded(default_model: LoadedModel, cache_dir: Path) -> None:
    first, same, other = (load(cache_dir, model="random:tiny", seed=seed) for seed in (1, 1, 2))
    assert type(first.model).__name__ == "LlamaForCausalLM" and first.name == "random:tiny"
    assert all(torch.equal(t, state(same)[k]) for k, t in state(first).items())
    assert not torch.equal(state(first)["lm_head.weight"], state(other)["lm_head.weight"])
    assert len(AutoTokenizer.from_pretrained(first.source_dir)) == len(default_model.tokenizer)
    assert first.model.config.vocab_size == len(default_model.tokenizer)


def test_random_tiny_logits_are_peaky(default_model: LoadedModel, cache_dir: Path) -> None:
    """Greedy equivalence tests need the top-1 token to win by more than float noise."""
    model = load(cache_dir, model="random:tiny").model
    ids = torch.randint(0, model.config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        top2 = model(ids).logits.topk(2, dim=-1).values
    gaps = top2[..., 0] - top2[..., 1]
    assert gaps.median() > 0.05
    assert (gaps > 1e-3).float().mean() > 0.98


def test_random_tiny_qwen2_has_live_biases(default_model: LoadedModel, cache_dir: Path) -> None:
    loaded = load(cache_dir, model="random:tiny-qwen2")
    assert type(loaded.model).__name__ == "Qwen2ForCausalLM"
    q_bias = loaded.model.model.layers[0].self_attn.q_proj.bias
    assert q_bias is not None and q_bias.abs().sum() > 0


def test_registered_attention_is_used(default_model: LoadedModel, cache_dir: Path) -> None:
    AttentionInterface.register("test_loader_attention", sdpa_attention_forward)
    custom = load(cache_dir, model="random:tiny", attn="test_loader_attention")
    reference = load(cache_dir, model="random:tiny")
    assert custom.model.config._attn_implementation == "test_loader_attention"
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.allclose(custom.model(ids).logits, reference.model(ids).logits)


def test_random_tiny_quantized_goes_through_a_saved_copy(default_model: LoadedModel, cache_dir: Path) -> None:
    loaded = load(cache_dir, model="random:tiny", quantization="nf4", seed=3)
    assert loaded.source_dir.name == "random-tiny-seed3"
    assert (loaded.source_dir / "tokenizer.json").is_file()
    assert loaded.model.model.layers[0].mlp.up_proj.weight.dtype == torch.uint8  # packed 4-bit


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("random:nope", "known presets: random:tiny, random:tiny-qwen2"),
        ("/nonexistent/model-dir", "does not exist"),
    ],
)
def test_unknown_sources_fail_clearly(cache_dir: Path, model: str, expected: str) -> None:
    with pytest.raises(ModelLoadError, match=expected):
        load(cache_dir, model=model)


def test_corrupt_gguf_and_non_decoder_dirs_fail_clearly(tmp_path: Path, cache_dir: Path) -> None:
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadError, match=r"reading .*broken\.gguf"):
        load(cache_dir, model=str(corrupt))
    assert not list(cache_dir.glob("**/.broken*"))  # the cut conversion left no staging directory
    AutoConfig.for_model("t5").save_pretrained(tmp_path / "t5")
    with pytest.raises(ModelLoadError, match="decoder-only"):
        load(cache_dir, model=str(tmp_path / "t5"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load(cache_dir, model=str(tmp_path / "empty"))


@pytest.mark.parametrize(("preset", "low", "high"), [("llama-1b", 1.0e9, 1.3e9), ("llama-8b", 7.0e9, 8.0e9)])
def test_big_preset_sizes(default_model: LoadedModel, preset: str, low: float, high: float) -> None:
    config = PRESETS[preset].hf_config(default_model.tokenizer)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert config.max_position_embeddings == 8192
    assert low < sum(p.numel() for p in model.parameters()) < high


def test_device_and_dtype_resolution() -> None:
    cpu = torch.device("cpu")
    # auto follows the CPU: bf16 only where it multiplies bf16 natively (emulated, it is slower than fp32).
    assert resolve_dtype("auto", cpu, frozenset({"avx2", "avx512f"})) == torch.float32
    assert resolve_dtype("auto", cpu, frozenset({"avx512f", "avx512_bf16"})) == torch.bfloat16
    assert resolve_dtype("auto", cpu, frozenset({"amx_bf16"})) == torch.bfloat16
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("float32", cpu, frozenset({"avx512_bf16"})) == torch.float32
    # nf4 only where bitsandbytes' 4-bit CPU kernel is fast; an explicit choice is kept.
    assert resolve_quantization("auto", cpu, frozenset({"avx2"})) == "none"
    assert resolve_quantization("auto", cpu, frozenset({"avx512_bf16"})) == "none"
    assert resolve_quantization("auto", torch.device("cuda"), frozenset()) == "nf4"
    assert resolve_quantization("int8", cpu, frozenset({"avx512_bf16"})) == "int8"
    if torch.cuda.is_available():
        assert resolve_device("auto").type == "cuda"
    else:
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(ModelLoadError, match="no CUDA"):
            resolve_device("cuda")


def test_random_presets_take_a_carried_tokenizer_without_the_bundled_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bare GPU machine gets one random-<preset>/ folder instead of the bundled package (bench/gpu.sh
    --prepare); every other preset then builds its folder from that tokenizer."""
    carried = random_model_dir("tiny", tmp_path / "here")
    there = tmp_path / "there"
    shutil.copytree(carried, there / carried.name)

    def not_installed() -> Path:
        raise ModelLoadError("the default model is not installed")

    monkeypatch.setattr(loader, "default_model_path", not_installed)
    built = random_model_dir("llama-8b", there)
    assert (built / "config.json").is_file() and (built / "tokenizer.json").is_file()
    assert (built / "tokenizer.json").read_bytes() == (carried / "tokenizer.json").read_bytes()
    with pytest.raises(ModelLoadError, match="not installed"):
        random_model_dir("llama-1b", tmp_path / "empty")


def test_auto_choices_are_resolved_and_logged(cache_dir: Path) -> None:
    messages: list[str] = []
    loaded = load(cache_dir, messages, model="random:tiny", quantization="auto", dtype="auto")
    want = resolve_quantization("auto", torch.device("cpu"))
    assert loaded.quantization == want and loaded.dtype == resolve_dtype("auto", torch.device("cpu"))
    dtype = str(loaded.dtype).removeprefix("torch.")
    assert any(f"quantization {want}, compute dtype {dtype} (CPU flags: " in m for m in messages), messages
