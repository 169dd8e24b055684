"""The offline API tokenizes a prompt as the served API does: a tokenizer that adds a BOS adds it in both."""

from __future__ import annotations

from types import SimpleNamespace

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from engine.client import AsyncEngineClient
from engine.llm import LLM
from web.generation.prompts import _encode


def bos_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_offline_and_client_prompts_carry_the_bos_the_served_path_adds() -> None:
    tok = bos_tokenizer()
    served = _encode(tok, "hello world")
    assert served == [0, 3, 4]
    assert LLM.encode(SimpleNamespace(tokenizer=tok), "hello world") == served  # type: ignore[arg-type]
    assert AsyncEngineClient.encode(SimpleNamespace(tokenizer=tok), "hello world") == served  # type: ignore[arg-type]
    assert LLM.encode(SimpleNamespace(tokenizer=tok), [3, 4]) == [3, 4]  # type: ignore[arg-type]
