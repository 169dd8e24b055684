"""Settings into the two rooms' configs (EngineConfig, WebConfig), and the app built from them."""

from __future__ import annotations

import logging
from socket import gethostname

from appliance.models.catalogue import LocalModels
from appliance.settings import Settings, load_settings
from appliance.settings.sign_in import oidc_config
from appliance.vllm.engine import VllmEngineClient
from engine import AsyncEmbeddingClient, AsyncEngineClient, EmbeddingConfig, EngineConfig, EngineError
from web.app import Gateway
from web.app import build_gateway as build_web_gateway
from web.backends.none import NoLocalEngine
from web.backends.spec import parse_backends
from web.config import WebConfig
from web.db import is_sqlite
from web.generation.backend import EngineClient
from web.keys.keyless import Keyless, parse_networks

log = logging.getLogger("appliance.wiring")
NO_EMBEDDINGS = "none"


def engine_config(settings: Settings) -> EngineConfig:
    """Raises engine.ConfigError naming the bad value (quantization, dtype, device, limits)."""
    return EngineConfig(
        model=settings.model,
        served_model_name=settings.served_model_name,
        quantization=settings.quantization,  # type: ignore[arg-type]  # validated by EngineConfig
        dtype=settings.dtype,  # type: ignore[arg-type]
        device=settings.device,
        num_kv_blocks=settings.num_kv_blocks,
        kv_cache_bytes=settings.kv_cache_bytes,
        kv_cache_dtype=settings.kv_cache_dtype,  # type: ignore[arg-type]  # validated by EngineConfig
        gpu_memory_utilization=settings.gpu_memory_utilization,
        gpu_memory_cap_bytes=settings.gpu_memory_cap_bytes,
        cpu_threads=settings.cpu_threads,
        decode_attention=settings.decode_attention,  # type: ignore[arg-type]  # validated by EngineConfig
        compact_weights=settings.compact_weights,
        own_forward=settings.own_forward,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_queue=settings.max_queue,
        policy=settings.policy,  # type: ignore[arg-type]  # a name: EngineConfig parses it into the Policy
        cache_dir=str(settings.model_cache_dir),
        log_level=settings.log_level,
    )


def engine_client(settings: Settings) -> AsyncEngineClient | VllmEngineClient | NoLocalEngine:
    """The engine APPLIANCE_ENGINE names: the embedded one, or a vLLM server the appliance supervises; none where
    APPLIANCE_BACKENDS lists only remote servers."""
    config = engine_config(settings)  # validates the shared limits either way
    if not parse_backends(settings.backends).embedded:
        return NoLocalEngine()
    if settings.engine == "vllm":
        return VllmEngineClient(settings, auto_restart=True)
    return AsyncEngineClient(config, auto_restart=True)


def embedding_client(settings: Settings) -> AsyncEmbeddingClient | None:
    """The embedding model's client (not started), or None where APPLIANCE_EMBEDDING_MODEL is none. Its process
    runs on one torch thread whatever the chat engine takes: embeddings are short passes, the chat engine's steps
    are what users wait on."""
    if settings.embedding_model == NO_EMBEDDINGS:
        return None
    config = EmbeddingConfig(model=settings.embedding_model, threads=1, log_level=settings.log_level)
    return AsyncEmbeddingClient(config, auto_restart=True)


async def start_embeddings(client: AsyncEmbeddingClient) -> None:
    """Start the embedding model; a failure is logged and leaves embeddings unserved, never the chat model."""
    try:
        info = await client.start()
    except EngineError as exc:
        log.error(
            "no embeddings: the embedding model did not start (%s); APPLIANCE_EMBEDDING_MODEL=none turns them off",
            exc,
        )
        return
    log.info(
        "embeddings: %s, %d dimensions, at most %d tokens per input", info.name, info.dimensions, info.max_input_tokens
    )


def web_config(settings: Settings) -> WebConfig:
    return WebConfig(
        database_url=settings.database,
        served_model_name=settings.served_model_name,
        store_text=settings.store_text,
        history_retention_days=settings.history_retention_days,
        drain_timeout=settings.drain_timeout,
        admin_password=settings.admin_password,
        self_signup=settings.self_signup,
        oidc=oidc_config(settings),
        metrics_token=settings.metrics_token,
        keyless=Keyless(settings.keyless_key_id, parse_networks(settings.keyless_networks)),
        max_body_bytes=settings.max_body_bytes,
        default_max_tokens=settings.default_max_tokens,
        trim_max_tokens=settings.max_tokens_policy == "trim",
        backends=parse_backends(settings.backends),
        sticky_backends=settings.sticky_backends,
        backend_max_in_flight=settings.backend_max_in_flight,
        local_backend_name="vllm" if settings.engine == "vllm" else "embedded",
        local_max_in_flight=settings.max_num_seqs if settings.engine == "vllm" else None,
        # One SQLite file has one gateway, which takes every row it finds in flight; a shared database needs names.
        gateway_id=None if is_sqlite(settings.database) else settings.gateway_id or f"{gethostname()}:{settings.port}",
    )


def build_gateway(
    settings: Settings | None = None, client: EngineClient | None = None, embeddings: AsyncEmbeddingClient | None = None
) -> Gateway:
    """The whole appliance's parts; settings from the environment unless given. `embeddings`: the embedding
    model's client (embedding_client), started and stopped by its caller beside the server."""
    settings = settings or load_settings()
    if is_sqlite(settings.database):
        settings.database_path.parent.mkdir(parents=True, exist_ok=True)
    engine = client or engine_client(settings)
    return build_web_gateway(web_config(settings), engine, LocalModels(settings), embeddings)
