"""The embedding model's configuration, validated once when built, frozen afterwards."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ConfigError
from engine.logs import LEVELS


@dataclass(frozen=True, slots=True)
class EmbeddingConfig:
    """model: "default" (the bundled all-MiniLM-L6-v2) or a model directory. threads: torch threads in the
    embedding process (one: on a small box the chat engine takes the other cores). max_batch_tokens: the most
    tokens, padding included, one encoder pass takes; concurrent requests share passes up to it. max_inputs:
    the most inputs one request may carry (OpenAI's limit)."""

    model: str = "default"
    served_model_name: str | None = None
    threads: int = 1
    max_batch_tokens: int = 8192
    max_inputs: int = 2048
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("the embedding model must be 'default' or a model directory")
        for name in ("threads", "max_batch_tokens", "max_inputs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, not {value!r}")
        if self.log_level not in LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LEVELS)}, not {self.log_level!r}")
