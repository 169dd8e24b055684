"""The model server core: continuous batching over a paged KV cache. Imports nothing from web/ or appliance/.

Public names: the offline LLM, the async client for servers, their config and message types, the errors.
"""

from engine.client import AsyncEngineClient
from engine.config import EngineConfig
from engine.errors import (
    ConfigError,
    ContextLengthError,
    EngineDeadError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    QueueFullError,
)
from engine.llm import LLM, CompletionResult
from engine.messages import EngineStats, Logprob, ModelInfo, RequestOutput, Timings, Usage
from engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AsyncEngineClient",
    "CompletionResult",
    "ConfigError",
    "ContextLengthError",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineStats",
    "InvalidRequestError",
    "Logprob",
    "ModelInfo",
    "ModelLoadError",
    "QueueFullError",
    "RequestOutput",
    "SamplingParams",
    "Timings",
    "Usage",
]
