"""engine.hf: transformers' classes reached from several threads at once, as the web process reaches them (the
engine client's start, remote backends' probes, the managed vLLM's start, the console's catalogue)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from engine.config import EngineConfig
from engine.hf import load_tokenizer, named_tokenizer_class, tokenizer_class_name
from engine.model.loader import random_model_dir
from tests.engine.test_conformance import FAMILIES

REPO = Path(__file__).resolve().parents[2]
# Eight threads released together, each importing a class for the first time in a fresh process, four processes.
# Without the lock a thread found a module half initialised ("module 'transformers' has no attribute
# 'AutoTokenizer'"; in CI "cannot import name 'AutoTokenizer'", and a gateway without its backend's tokenizer) in
# each of 4 runs of this test.
RACE = """
import threading
from engine.hf import named_tokenizer_class, transformers_class
names = ["AutoTokenizer", "AutoConfig", "AutoModelForCausalLM", "PreTrainedTokenizerFast", "named"] * 2
errors, barrier = [], threading.Barrier(len(names))
def first_use(name):
    barrier.wait()
    try:
        if name == "named":
            named_tokenizer_class("transformers.models.qwen2.tokenization_qwen2.Qwen2Tokenizer")
        else:
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


# Every family the engine serves, each a folder of its config and the default tokenizer: AutoTokenizer reads the
# model type and picks a class (TokenizersBackend for llama, Qwen2Tokenizer for qwen2, ...).
MODEL_TYPES = sorted({model_type for model_type, _ in FAMILIES.values()})
TEXTS = ["Hello, world!", "  spaces\tand\nnewlines  ", "<|im_start|>user\nhé 東京 🙂<|im_end|>", ""]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]


@pytest.fixture(scope="module")
def default_tokenizer_dir() -> Path:
    return random_model_dir("tiny", EngineConfig().model_cache_dir)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_class_autotokenizer_chose_loads_the_same_tokenizer(
    model_type: str, default_tokenizer_dir: Path, tmp_path: Path
) -> None:
    """The gateway loads the class the engine's AutoTokenizer named (ModelInfo.tokenizer_class), not AutoTokenizer:
    whatever the model type, the tokenizer is the same in every way a prompt meets it."""
    auto = AutoTokenizer.from_pretrained(default_tokenizer_dir)
    AutoConfig.for_model(model_type, vocab_size=len(auto)).save_pretrained(tmp_path)
    auto.save_pretrained(tmp_path)
    chosen = AutoTokenizer.from_pretrained(tmp_path)
    named = load_tokenizer(tmp_path, tokenizer_class_name(chosen))
    assert type(named) is type(chosen)
    assert len(named) == len(chosen) and named.get_vocab() == chosen.get_vocab()
    assert named.all_special_tokens == chosen.all_special_tokens and named.eos_token_id == chosen.eos_token_id
    for text in TEXTS:
        assert named.encode(text) == chosen.encode(text)
        assert named.decode(chosen.encode(text)) == chosen.decode(chosen.encode(text))
    for generation_prompt in (True, False):
        rendered = chosen.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=generation_prompt)
        assert named.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=generation_prompt) == (
            rendered
        )


def test_a_class_of_a_models_own_code_is_left_to_autotokenizer(default_tokenizer_dir: Path) -> None:
    own = type("OwnTokenizer", (type(AutoTokenizer.from_pretrained(default_tokenizer_dir)),), {})
    own.__module__ = "transformers_modules.someone.model.tokenization"  # where trust_remote_code puts a model's code
    assert tokenizer_class_name(own.__new__(own)) == ""


@pytest.mark.parametrize(
    "name",
    [
        "os.system",
        "transformers.modeling_utils.PreTrainedModel",  # transformers', not a tokenizer
        "transformers.tokenization_utils_tokenizers.no_such_class",
        "transformers.tokenization_utils_tokenizers.TokenizersBackend; import os",
        "TokenizersBackend",
    ],
)
def test_only_transformers_tokenizer_classes_are_named(name: str) -> None:
    with pytest.raises(ValueError, match="not one of transformers' tokenizer classes"):
        named_tokenizer_class(name)
