"""Tokenizers fetched from the backends that publish them (another appliance: web/backends/publish.py), so that
an operator need not copy each remote model's tokenizer onto the gateway box. What a backend sends is untrusted:
only the published file names, bounded in size, loaded by transformers without remote code."""

from __future__ import annotations

import logging
import tempfile
import threading
from pathlib import Path
from typing import Any

from engine import load_tokenizer

log = logging.getLogger("web.backends")

# What a fast tokenizer and its chat template are made of; nothing else of the model directory leaves the box.
PUBLISHED = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
MAX_PUBLISHED_BYTES = 64 << 20  # a 256k-token vocabulary's tokenizer.json is ~35 MB


class FetchedTokenizers:
    """One tokenizer per (backend, model), loaded once from the files the backend published."""

    def __init__(self) -> None:
        self._loaded: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()  # probes load from worker threads

    def get(self, backend: str, model: str) -> Any:
        return self._loaded.get((backend, model))

    def load(self, backend: str, model: str, files: dict[str, str]) -> Any:
        """The tokenizer the files make, or None (said in the log) where they make none."""
        problem = _check(files)
        if problem is not None:
            log.error("backend %s: the tokenizer it published for %s is refused: %s", backend, model, problem)
            return None
        with self._lock, tempfile.TemporaryDirectory(prefix="appliance-tokenizer-") as tmp:
            for name, text in files.items():
                (Path(tmp) / name).write_text(text, encoding="utf-8")
            try:
                tokenizer = load_tokenizer(tmp, local_files_only=True, trust_remote_code=False)
            except Exception as exc:  # a broken file from a remote server: that model stays unservable, said once
                log.error("backend %s: the tokenizer it published for %s does not load: %s", backend, model, exc)
                return None
            self._loaded[backend, model] = tokenizer
            return tokenizer


def _check(files: dict[str, str]) -> str | None:
    unknown = sorted(set(files) - set(PUBLISHED))
    if unknown:
        return f"files it may not send: {', '.join(n[:40] for n in unknown[:5])}"
    if "tokenizer.json" not in files:
        return "no tokenizer.json"
    if sum(len(text) for text in files.values()) > MAX_PUBLISHED_BYTES:
        return f"larger than {MAX_PUBLISHED_BYTES >> 20} MiB"
    return None
