"""Text to prompt ids as the served API makes them: the tokenizer's special tokens (a BOS) added to a plain prompt,
and a conversation through the chat template, which writes its own."""

from __future__ import annotations

from typing import Any

__all__ = ["chat_ids", "prompt_ids"]


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """A plain prompt's ids with the special tokens the tokenizer adds (web/openai/service.py's encoding)."""
    return list(tokenizer.encode(text))


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """A conversation rendered through the model's chat template, ready for the reply."""
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
