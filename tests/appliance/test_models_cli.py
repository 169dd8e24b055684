"""`appliance models` and `appliance models add` (issue 16) in a temporary data directory: a random preset saved
as a HF directory and a tiny GGUF written with the gguf package, their parameters and fit checked against a hand
computation, cache entries left out, and what is not a model refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.appliance.conftest import Cli

MIB = 1 << 20
# random:tiny (Llama): hidden 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 128, vocabulary 49,152, untied head.
TINY_LINEAR = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128)  # q, o, k, v and the MLP's three, per layer
TINY_PARAMS = 2 * 49152 * 64 + TINY_LINEAR + 2 * 2 * 64 + 64  # embeddings, head, linears, the norms
TINY_KV_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K and V x layers x KV heads x head dim x float32
# The GGUF: hidden 64, 2 blocks, 4 heads, 2 KV heads, MLP 128, 100 tokens, context 256, tied (no output.weight).
GGUF_PARAMS = 2 * (64 * 16 * (2 * 4 + 2 * 2) + 3 * 64 * 128) + 100 * 64


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama/ (config, tokenizer, safetensors) and tiny.gguf, built once for the module."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.model.loader import random_model_dir

    root = tmp_path_factory.mktemp("sources")
    base = random_model_dir("tiny", root / "cache")
    model_dir = root / "tiny-llama"
    shutil.copytree(base, model_dir)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base)).save_pretrained(model_dir)
    _write_gguf(root / "tiny.gguf")
    return root


def _write_gguf(path: Path) -> None:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_token_list([f"t{i}" for i in range(100)])
    writer.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _listing(cli: Cli, *flags: str) -> dict[str, dict]:
    done = cli("models", "--json", "--device", "cpu", "--quantization", "none", "--dtype", "float32", *flags)
    assert done.code == 0, done.err
    return {entry["name"]: entry for entry in json.loads(done.out)}


def test_added_models_are_listed_with_their_parameters_and_fit(cli: Cli, sources: Path, data_dir: Path) -> None:
    copied = cli("models", "add", str(sources / "tiny-llama"))
    assert copied.code == 0, copied.err
    assert (data_dir / "models" / "tiny-llama" / "model.safetensors").is_file()
    linked = cli("models", "add", "--link", str(sources / "tiny.gguf"))
    assert linked.code == 0, linked.err
    assert (data_dir / "models" / "tiny.gguf").resolve() == (sources / "tiny.gguf").resolve()
    for cache_entry in ("random-tiny", "tiny-llama-0123456789ab"):  # the engine's own: not models to list
        shutil.copytree(sources / "tiny-llama", data_dir / "models" / cache_entry)
    shutil.copytree(sources / "cache" / "random-tiny", data_dir / "models" / "no-weights")

    models = _listing(cli, "--kv-cache-bytes", str(8 * MIB), "--model", str(data_dir / "models" / "tiny-llama"))
    assert set(models) == {"default", "tiny-llama", "tiny.gguf"}
    tiny = models["tiny-llama"]
    assert tiny["kind"] == "HF directory" and tiny["served"] and not models["default"]["served"]
    assert tiny["params"] == TINY_PARAMS
    assert tiny["fit"]["weights"] == TINY_PARAMS * 4
    assert tiny["fit"]["kv_per_chat"] == TINY_KV_PER_TOKEN * 2048
    assert (tiny["fit"]["chats"], tiny["fit"]["chat_tokens"], tiny["fit"]["fits"]) == (8, 2048, True)
    assert tiny["fit_summary"].startswith("fits: weights 24.3 MiB + KV for 8 chats of 2,048 tokens")
    gguf = models["tiny.gguf"]
    assert (gguf["kind"], gguf["params"]) == ("GGUF", GGUF_PARAMS)
    assert (gguf["fit"]["chat_tokens"], gguf["fit"]["chats"]) == (256, 8 * MIB // (TINY_KV_PER_TOKEN * 256))

    text = cli("models", "--device", "cpu", "--model", str(data_dir / "models" / "tiny-llama"))
    assert "* tiny-llama  HF directory" in text.out and "(served: APPLIANCE_MODEL)" in text.out


def test_nf4_quantizes_the_linear_layers_only(cli: Cli, sources: Path) -> None:
    assert cli("models", "add", str(sources / "tiny-llama")).code == 0
    tiny = _listing(cli, "--quantization", "nf4")["tiny-llama"]
    assert tiny["fit"]["weights"] == int(TINY_LINEAR * (0.5 + 4 / 64) + (TINY_PARAMS - TINY_LINEAR) * 4)


def test_a_model_that_needs_more_than_the_machine_has_does_not_fit(cli: Cli, sources: Path) -> None:
    assert cli("models", "add", str(sources / "tiny-llama")).code == 0
    tiny = _listing(cli, "--kv-cache-bytes", str(1 << 50))["tiny-llama"]
    assert not tiny["fit"]["fits"] and tiny["fit_summary"].startswith("does not fit:")


def test_add_refuses_what_is_not_a_model_and_never_overwrites(cli: Cli, sources: Path, tmp_path: Path) -> None:
    assert cli("models", "add", str(sources / "tiny-llama")).code == 0
    again = cli("models", "add", "--link", str(sources / "tiny-llama"))
    assert again.code == 1 and "already exists" in again.err
    empty = tmp_path / "photos"
    empty.mkdir()
    refused = cli("models", "add", str(empty))
    assert refused.code == 1 and "is not a model: a directory without config.json" in refused.err
    no_weights = tmp_path / "config-only"
    shutil.copytree(sources / "cache" / "random-tiny", no_weights)
    assert "no *.safetensors or *.bin weights" in cli("models", "add", str(no_weights)).err
    fake = tmp_path / "notes.gguf"
    fake.write_text("just text")
    assert "not a GGUF file" in cli("models", "add", str(fake)).err
    assert cli("models", "add", str(tmp_path / "missing")).code == 1


def test_the_server_counts_the_served_models_memory_as_available(
    cli: Cli, sources: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A switch stops the served model first: its weights and its engine's KV pool are the new model's to use."""
    from appliance.models import catalogue as models
    from appliance.models.size import Machine
    from appliance.settings import load_settings

    assert cli("models", "add", str(sources / "tiny-llama")).code == 0
    monkeypatch.setattr(models, "machine", lambda _settings: Machine(False, 64 * MIB, "none", "float32"))
    catalog = models.LocalModels(
        load_settings({"APPLIANCE_DATA_DIR": str(data_dir), "APPLIANCE_KV_CACHE_BYTES": "8388608"})
    )
    served = str(data_dir / "models" / "tiny-llama")
    for entry in catalog.models(served, served_kv_bytes=None):
        assert entry.fit is not None and entry.fit.available == 64 * MIB
    for entry in catalog.models(served, served_kv_bytes=8 * MIB):
        assert entry.fit is not None and entry.fit.available == 64 * MIB + TINY_PARAMS * 4 + 8 * MIB
