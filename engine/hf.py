"""transformers' classes for a process that reaches them from several threads (the web process): each first
import under one lock, as two at once can find a module half initialised.

transformers' modules import each other in a cycle: two threads importing at once, Python's import locks hand one
of them a module still being initialised, and it fails with "cannot import name 'AutoTokenizer' from
'transformers'". The web process imports them from the engine client's start, the
remote backends' probes, the managed vLLM's start and the console's model catalogue, each off the event loop in a
thread of its own; every one goes through here, one import at a time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

_IMPORTING = threading.Lock()


def transformers_class(name: str) -> Any:
    """transformers.<name> (AutoTokenizer, AutoConfig, ...), imported under this process's one lock."""
    with _IMPORTING:
        import transformers

        return getattr(transformers, name)


def load_tokenizer(path: str | Path, **options: Any) -> Any:
    """AutoTokenizer.from_pretrained(path, **options), its class imported as above."""
    return transformers_class("AutoTokenizer").from_pretrained(str(path), **options)
