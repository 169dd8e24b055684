"""transformers' classes for a process that reaches them from several threads (the web process): each first
import under one lock, as two at once can find a module half initialised.

transformers' modules import each other in a cycle: two threads importing at once, Python's import locks hand one
of them a module still being initialised, and it fails with "cannot import name 'AutoTokenizer' from
'transformers'". The web process imports them from the engine client's start, the
remote backends' probes, the managed vLLM's start and the console's model catalogue, each off the event loop in a
thread of its own; every one goes through here, one import at a time.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import Any

_IMPORTING = threading.Lock()


def transformers_class(name: str) -> Any:
    """transformers.<name> (AutoTokenizer, AutoConfig, ...), imported under this process's one lock."""
    with _IMPORTING:
        import transformers

        return getattr(transformers, name)


def load_tokenizer(path: str | Path, tokenizer_class: str = "", **options: Any) -> Any:
    """AutoTokenizer.from_pretrained(path, **options), its class imported as above.

    `tokenizer_class` ("transformers.<module>.<Class>") is the class AutoTokenizer already chose for this directory in
    another process (the engine worker names it in ModelInfo): that class loads it straight away. AutoTokenizer's
    choice reads the model's config, and transformers' config module imports torch (about 2.5 s of a gateway's
    start); the tokenizer classes do not. Same class, same files: the same tokenizer.
    """
    if tokenizer_class:
        return named_tokenizer_class(tokenizer_class).from_pretrained(str(path), **options)
    return transformers_class("AutoTokenizer").from_pretrained(str(path), **options)


def tokenizer_class_name(tokenizer: Any) -> str:
    """What load_tokenizer's `tokenizer_class` takes for this tokenizer's class; "" (AutoTokenizer, then) for a
    class outside transformers' own modules (a model's own code)."""
    cls = type(tokenizer)
    return f"{cls.__module__}.{cls.__qualname__}" if cls.__module__.startswith("transformers.") else ""


def named_tokenizer_class(name: str) -> Any:
    """The class tokenizer_class_name named: one of transformers' tokenizer classes, or ValueError."""
    module, _, attr = name.rpartition(".")
    if not module.startswith("transformers.") or not attr.isidentifier():
        raise ValueError(f"not one of transformers' tokenizer classes: {name!r}")
    with _IMPORTING:
        cls = getattr(importlib.import_module(module), attr, None)
        base = importlib.import_module("transformers.tokenization_utils_base").PreTrainedTokenizerBase
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"not one of transformers' tokenizer classes: {name!r}")
    return cls
