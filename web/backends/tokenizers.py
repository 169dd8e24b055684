"""The tokenizers the gateway prepares remote backends' requests with: a model named like the local engine's uses
the local engine's; one whose backend entry names a directory (#tokenizer=DIR) uses that one, loaded once. The
gateway applies the chat template and counts the prompt itself, so that keys, caps, quotas and tool calls work
the same whichever backend serves."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import load_tokenizer
from web.generation.backend import EngineClient

log = logging.getLogger("web.backends")


class Tokenizers:
    def __init__(self, local: EngineClient, local_name: Callable[[], str | None]) -> None:
        self._local = local
        self._local_name = local_name  # the name the gateway serves the local engine's model as
        self._loaded: dict[str, Any] = {}
        self._failed: set[str] = set()
        self._lock = threading.Lock()  # probes call from worker threads

    def __call__(self, served_name: str, directory: str | None) -> tuple[Any, str] | None:
        """(tokenizer, its directory) for a model a backend serves as `served_name`, or None."""
        if directory is not None:
            tokenizer = self._load(directory)
            return None if tokenizer is None else (tokenizer, directory)
        info = self._local.model_info
        if info is not None and self._local.tokenizer is not None and served_name in (info.name, self._local_name()):
            return self._local.tokenizer, info.tokenizer_dir
        return None

    def _load(self, directory: str) -> Any:
        with self._lock:
            if directory in self._loaded or directory in self._failed:
                return self._loaded.get(directory)
            try:
                tokenizer = load_tokenizer(Path(directory), local_files_only=True)
            except Exception as exc:  # a missing or broken directory: the model stays unservable, said once
                log.error("the tokenizer in %s could not be loaded: %s", directory, exc)
                self._failed.add(directory)
                return None
            self._loaded[directory] = tokenizer
            return tokenizer
