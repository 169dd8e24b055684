"""The model server core: continuous batching over a paged KV cache. Imports nothing from web/ or appliance/.

Public names: the offline LLM, the async client for servers, their config and message types, the errors; the
embedding model's async client, its config and result types.
"""

from typing import TYPE_CHECKING

from engine.client import AsyncEngineClient
from engine.config import EngineConfig
from engine.embed.client import AsyncEmbeddingClient, Embeddings
from engine.embed.config import EmbeddingConfig
from engine.embed.messages import EmbeddingModelInfo
from engine.errors import (
    ConfigError,
    ContextLengthError,
    EngineDeadError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    QueueFullError,
)
from engine.hf import load_tokenizer, transformers_class
from engine.messages import (
    EngineState,
    EngineStats,
    Logprob,
    ModelInfo,
    QueuePosition,
    RequestOutput,
    TenantStats,
    Timings,
    Usage,
)
from engine.sample.guided import validate_guided
from engine.sampling_params import MAX_LOGPROBS, GuidedDecoding, SamplingParams
from engine.sched.fair import TenantBook
from engine.sched.limits import check_prompt
from engine.sched.tenant import DEFAULT_TENANT, Tenant

if TYPE_CHECKING:
    from engine.llm import LLM, CompletionResult


def __getattr__(name: str) -> object:
    # The offline LLM pulls in torch and transformers; servers and CLIs that only talk to the engine process
    # should not pay seconds of import time for it.
    if name in ("LLM", "CompletionResult"):
        from engine import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = [
    "DEFAULT_TENANT",
    "LLM",
    "MAX_LOGPROBS",
    "AsyncEmbeddingClient",
    "AsyncEngineClient",
    "CompletionResult",
    "ConfigError",
    "ContextLengthError",
    "EmbeddingConfig",
    "EmbeddingModelInfo",
    "Embeddings",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineState",
    "EngineStats",
    "GuidedDecoding",
    "InvalidRequestError",
    "Logprob",
    "ModelInfo",
    "ModelLoadError",
    "QueueFullError",
    "QueuePosition",
    "RequestOutput",
    "SamplingParams",
    "Tenant",
    "TenantBook",
    "TenantStats",
    "Timings",
    "Usage",
    "check_prompt",
    "load_tokenizer",
    "transformers_class",
    "validate_guided",
]
