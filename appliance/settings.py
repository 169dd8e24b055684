"""The appliance's settings: read once from APPLIANCE_* environment variables and an optional env file.

Each field carries its default and a one-line description; `settings_table()` lists them for the README.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from web.backends.spec import BackendSpecError, parse_backends
from web.db import redacted_url, sqlite_url
from web.keys.keyless import PRIVATE_NETWORKS, parse_networks
from web.people.oidc.config import OidcConfig, OidcConfigError, check_discovery_url, parse_group_plans

PREFIX = "APPLIANCE_"
ENV_FILE_VARIABLE = "APPLIANCE_ENV_FILE"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the environment variable."""


def _default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "llm-appliance")


def setting(default: Any, doc: str, *, secret: bool = False, default_doc: str | None = None) -> Any:
    """A field with its one-line description; secrets are kept out of repr (and so out of logs)."""
    metadata = {"doc": doc, "secret": secret, "default_doc": default_doc}
    if callable(default):
        return field(default_factory=default, metadata=metadata, repr=not secret)
    return field(default=default, metadata=metadata, repr=not secret)


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = setting("127.0.0.1", "Address the HTTP server binds to (0.0.0.0 to serve the LAN).")
    port: int = setting(8000, "TCP port of the HTTP server.")
    data_dir: str = setting(
        _default_data_dir,
        "Directory for the database and the converted model cache.",
        default_doc="$XDG_DATA_HOME/llm-appliance",
    )
    engine: str = setting(
        "embedded",
        "Engine: embedded (the appliance's own), or vllm (a local vLLM OpenAI server it starts and supervises; "
        "install.sh --engine vllm makes its venv).",
    )
    vllm_python: str | None = setting(
        None,
        "The vLLM venv's python, for APPLIANCE_ENGINE=vllm.",
        default_doc="the install's PREFIX/vllm-venv, or data/peers/vllm in a checkout (make vllm-env)",
    )
    model: str = setting(
        "default",
        "Model: default (bundled SmolLM2-135M-Instruct), a HF directory, a .gguf or random:<preset>.",
    )
    served_model_name: str | None = setting(None, "Model name the API answers to (default: the model's own name).")
    embedding_model: str = setting(
        "default",
        "Embedding model of /v1/embeddings and /api/embed, in its own process beside the chat model: default "
        "(bundled all-MiniLM-L6-v2), a sentence-transformers or HF encoder directory, or none (those routes "
        "answer 404). One that fails to start is logged; the chat model serves on.",
    )
    quantization: str = setting("auto", "Weight quantization: auto (nf4 on CUDA, none on a CPU), none, nf4, fp4, int8.")
    dtype: str = setting(
        "auto",
        "Compute dtype: auto (bfloat16 on CUDA and on CPUs with native bf16 matmuls, else float32), float32, "
        "bfloat16 or float16.",
    )
    device: str = setting("auto", "Device: auto, cpu, cuda or cuda:N.")
    max_num_seqs: int = setting(128, "Most requests decoded together in one batch.")
    max_num_batched_tokens: int = setting(512, "Most tokens (prefill + decode) computed in one engine step.")
    max_queue: int = setting(1024, "Most requests waiting for a seat; beyond it requests get 503 + Retry-After.")
    policy: str = setting(
        "fair", "Who waits: fair (per-key fair share, interactive before batch) or fcfs (arrival order)."
    )
    kv_cache_bytes: int = setting(1 << 30, "KV-cache pool size in bytes on CPU (GPU sizes it by utilization).")
    kv_cache_dtype: str = setting(
        "auto",
        "KV-cache element type: auto (the compute dtype, exact), bf16, fp16, or 8-bit: int8 or fp8 (e4m3), each "
        "with a scale per token and KV head: about twice the tokens (chats) in the same memory, at a small "
        "cost in fidelity. APPLIANCE_ENGINE=vllm takes auto or fp8 (--kv-cache-dtype).",
    )
    num_kv_blocks: int | None = setting(None, "Exact number of KV blocks (overrides the byte/utilization sizing).")
    gpu_memory_utilization: float = setting(0.90, "Fraction of GPU memory the engine may use (weights + KV).")
    gpu_memory_cap_bytes: int | None = setting(
        None, "Most GPU memory the engine may use, in bytes (emulate a smaller card on a bigger one)."
    )
    cpu_threads: int | None = setting(None, "Torch threads on a CPU-only machine (default: cores - 1, min 1).")
    decode_attention: str = setting(
        "auto",
        "Decode attention: auto (on a CPU, a kernel built at start with the host's C compiler, else torch's), "
        "compiled (that kernel, or no start) or torch.",
    )
    compact_weights: bool = setting(
        True,
        "On a CPU in float32: keep each linear layer's weights in the narrowest form that holds them exactly "
        "(the 4- and 8-bit blocks of a GGUF, bfloat16) and widen them in registers; false keeps float32.",
    )
    own_forward: bool = setting(
        True,
        "On a CPU in float32, Llama and Qwen2 models run the engine's own forward (the same arithmetic as "
        "transformers' in a few calls per layer); false runs transformers' modules.",
    )
    max_model_len: int | None = setting(None, "Cap on prompt + completion tokens (default: the model's context).")
    drain_timeout: float = setting(30.0, "Seconds in-flight requests may finish after SIGTERM before abort.")
    keep_alive_timeout: int = setting(
        75, "Seconds an idle HTTP connection is kept open; above clients' own idle expiry (httpx: 5 s)."
    )
    request_read_timeout: float = setting(
        30.0, "Seconds a client has to send a whole request (headers and body) once it starts; 408 beyond."
    )
    max_connections: int = setting(
        2048, "Most open HTTP connections; beyond it a new one replaces the oldest idle one, or gets 503."
    )
    history_retention_days: int = setting(30, "Days request history is kept.")
    store_text: bool = setting(False, "Store prompt and response text in the history (off for privacy).")
    admin_password: str | None = setting(
        None, "Admin password; used only at first start to seed the stored (hashed) credential.", secret=True
    )
    self_signup: bool = setting(
        False, "People may sign up at /signup; their accounts wait, pending, until the admin approves them."
    )
    metrics_token: str | None = setting(None, "Bearer token that may read /metrics (besides the admin).", secret=True)
    keyless_key_id: int | None = setting(
        None,
        "An API key's id: requests to the API routes with no key (and no session) from KEYLESS_NETWORKS run as "
        "that key (its caps, quota and history), for clients that cannot send one (GitHub Copilot's Ollama "
        "provider). Empty: every request needs a key.",
    )
    keyless_networks: str = setting(
        PRIVATE_NETWORKS,
        "Comma-separated addresses or CIDRs whose requests may come without a key once KEYLESS_KEY_ID is set.",
        default_doc="loopback and the private ranges",
    )
    max_body_bytes: int = setting(4 << 20, "Largest accepted request body in bytes (413 beyond).")
    default_max_tokens: int = setting(
        1024, "max_tokens applied when neither the request nor its key sets one (capped by the context)."
    )
    max_tokens_policy: str = setting(
        "trim",
        "A max_tokens above the key's cap or what the context leaves after the prompt: trim (runs with what fits, "
        "ends with finish_reason length, says x-max-tokens-trimmed-to) or refuse (400).",
    )
    log_level: str = setting("info", "Log level: debug, info, warning or error.")
    database_url: str | None = setting(
        None,
        "Database URL: postgresql+asyncpg://user:password@host/db lets several gateways share keys, quotas "
        "and history (the password is never shown).",
        default_doc="the SQLite file appliance.db in the data dir",
        secret=True,
    )
    gateway_id: str | None = setting(
        None,
        "This gateway's name in the history rows it admits, where several share one PostgreSQL: after a crash "
        "it marks only its own rows interrupted. Keep it the same across restarts.",
        default_doc="hostname:port",
    )
    backends: str = setting(
        "",
        "Engines behind this gateway: comma-separated base URLs of OpenAI-compatible servers (vLLM, SGLang, "
        "llama.cpp, another appliance; a key as the URL's password: http://:KEY@host:port), and `embedded` for "
        "this box's own engine. Empty: the box's engine alone.",
        secret=True,
        default_doc="empty: this box's engine alone",
    )
    backend_max_in_flight: int = setting(
        64,
        "Requests this gateway keeps in flight on each remote backend (an entry's #max_in_flight=N says otherwise); "
        "the rest wait in its fair queue, so the backend's own first-come queue never decides who waits.",
    )
    sticky_backends: bool = setting(
        False, "Keep a conversation on one backend (its prefix cache) unless that one is much busier."
    )
    oidc_discovery_url: str | None = setting(
        None,
        "Single sign-on: the OpenID Connect provider's discovery URL, <issuer>/.well-known/openid-configuration "
        "(Keycloak: https://host/realms/<realm>/...). Unset: password sign-in only.",
    )
    oidc_client_id: str | None = setting(None, "Single sign-on: this appliance's client id at the provider.")
    oidc_client_secret: str | None = setting(
        None, "Single sign-on: the client's secret (a confidential client).", secret=True
    )
    oidc_name: str = setting("single sign-on", 'Single sign-on: the provider\'s name on the "Sign in with" button.')
    oidc_scopes: str = setting("openid profile email", "Single sign-on: the scopes asked for (openid among them).")
    oidc_groups_claim: str = setting("groups", "Single sign-on: the ID token claim that lists a person's groups.")
    oidc_group_plans: str = setting(
        "",
        "Single sign-on: group=plan pairs, comma-separated (staff=teachers,students=pupils); a person in several "
        "mapped groups gets the first listed one's plan. Recomputed at every sign-in.",
        default_doc="empty: no group gives a plan",
    )
    oidc_unmapped_plan: str | None = setting(
        None, "Single sign-on: the plan of a person in no mapped group. Unset: such a person may not sign in."
    )
    oidc_admin_groups: str = setting(
        "",
        "Single sign-on: comma-separated groups whose members are admins (others are made users at each "
        "sign-in). Empty: sign-in never changes a role; the console sets them.",
        default_doc="empty: roles are the console's",
    )
    oidc_redirect_url: str | None = setting(
        None,
        "Single sign-on: the redirect URI registered at the provider, where a proxy changes the address.",
        default_doc="this server's /auth/oidc/callback as the browser reaches it",
    )

    @property
    def vllm_interpreter(self) -> Path:
        """The set APPLIANCE_VLLM_PYTHON, else the first default that exists (else the install's)."""
        if self.vllm_python:
            return Path(self.vllm_python).expanduser()
        candidates = default_vllm_pythons()
        return next((p for p in candidates if p.is_file()), candidates[0])

    @property
    def database_path(self) -> Path:
        return Path(self.data_dir) / "appliance.db"

    @property
    def database(self) -> str:
        """The database's SQLAlchemy URL: the one set, else the SQLite file in the data dir."""
        return self.database_url or sqlite_url(self.database_path)

    @property
    def model_cache_dir(self) -> Path:
        return Path(self.data_dir) / "models"

    @property
    def local_url(self) -> str:
        """Where a client on this machine reaches the server (a wildcard bind address answers on loopback)."""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


def default_vllm_pythons() -> list[Path]:
    """install.sh puts the vLLM venv beside the appliance's (PREFIX/venv, PREFIX/vllm-venv); a checkout's
    `make vllm-env` puts it under data/peers/."""
    installed = Path(sys.prefix).parent / "vllm-venv" / "bin" / "python"
    checkout = Path(__file__).resolve().parents[1] / "data" / "peers" / "vllm" / "bin" / "python"
    return [installed, checkout]


@dataclass(frozen=True, slots=True)
class SettingDoc:
    variable: str
    type: str
    default: str
    description: str


def settings_table() -> list[SettingDoc]:
    """One row per setting: environment variable, type, default and description (for the README)."""
    hints = get_type_hints(Settings)
    rows = []
    for f in dataclasses.fields(Settings):
        meta = f.metadata
        if meta["default_doc"] is not None:
            default = meta["default_doc"]
        else:
            value = f.default
            default = "(unset)" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        rows.append(SettingDoc(PREFIX + f.name.upper(), _type_name(hints[f.name]), default, meta["doc"]))
    return rows


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Build Settings from the env file named by APPLIANCE_ENV_FILE (if any), overridden by the environment."""
    env = dict(os.environ if environ is None else environ)
    values: dict[str, str] = {}
    env_file = env.get(ENV_FILE_VARIABLE)
    if env_file:
        values.update(read_env_file(Path(env_file)))
    values.update({k: v for k, v in env.items() if k.startswith(PREFIX)})
    hints = get_type_hints(Settings)
    kwargs: dict[str, Any] = {}
    known = {PREFIX + f.name.upper() for f in dataclasses.fields(Settings)} | {ENV_FILE_VARIABLE}
    unknown = sorted(set(values) - known)
    if unknown:
        raise SettingsError(f"unknown setting(s): {', '.join(unknown)}")
    for f in dataclasses.fields(Settings):
        variable = PREFIX + f.name.upper()
        if variable in values:
            kwargs[f.name] = _parse(variable, values[variable], hints[f.name])
    settings = Settings(**kwargs)
    _check(settings)
    return settings


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile reads them: # comments, optional quotes, blank lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"{ENV_FILE_VARIABLE}: cannot read {path}: {exc.strerror}") from None
    values = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep:
            raise SettingsError(f"{path}:{number}: expected KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def _parse(variable: str, raw: str, hint: Any) -> Any:
    optional = get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)
    base = next(a for a in get_args(hint) if a is not type(None)) if optional else hint
    text = raw.strip()
    if optional and text == "":
        return None
    try:
        if base is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if base is int:
            return int(text.replace("_", ""))
        if base is float:
            return float(text)
    except ValueError:
        raise SettingsError(f"{variable} must be a {_type_name(base)}, not {raw!r}") from None
    return text


def _check(s: Settings) -> None:
    positive = ("port", "max_num_seqs", "max_num_batched_tokens", "max_queue", "kv_cache_bytes")
    limits: tuple[str, ...] = ("max_body_bytes", "default_max_tokens", "history_retention_days")
    limits += ("keep_alive_timeout", "max_connections", "backend_max_in_flight")
    for name in (*positive, *limits):
        if getattr(s, name) < 1:
            raise SettingsError(f"{PREFIX}{name.upper()} must be at least 1, not {getattr(s, name)}")
    if s.port > 65535:
        raise SettingsError(f"{PREFIX}PORT must be at most 65535, not {s.port}")
    if s.request_read_timeout <= 0:
        raise SettingsError(f"{PREFIX}REQUEST_READ_TIMEOUT must be > 0, not {s.request_read_timeout}")
    if s.drain_timeout < 0:
        raise SettingsError(f"{PREFIX}DRAIN_TIMEOUT must be >= 0, not {s.drain_timeout}")
    if s.max_tokens_policy not in MAX_TOKENS_POLICIES:
        raise SettingsError(f"{PREFIX}MAX_TOKENS_POLICY must be trim or refuse, not {s.max_tokens_policy!r}")
    if s.log_level not in ("debug", "info", "warning", "error"):
        raise SettingsError(f"{PREFIX}LOG_LEVEL must be debug, info, warning or error, not {s.log_level!r}")
    if not s.embedding_model:
        raise SettingsError(f"{PREFIX}EMBEDDING_MODEL must be default, a model directory or none")
    if s.served_model_name is not None and not s.served_model_name.strip():
        raise SettingsError(f"{PREFIX}SERVED_MODEL_NAME must not be blank")
    if s.database_url is not None:
        _check_database_url(s.database_url)
    try:
        parse_networks(s.keyless_networks)
    except ValueError as exc:
        raise SettingsError(f"{PREFIX}KEYLESS_NETWORKS: {exc}") from None
    if s.keyless_key_id is not None and s.keyless_key_id < 1:
        raise SettingsError(f"{PREFIX}KEYLESS_KEY_ID must be a key's id (at least 1), not {s.keyless_key_id}")
    try:
        parse_backends(s.backends)
    except BackendSpecError as exc:
        raise SettingsError(f"{PREFIX}BACKENDS: {exc}") from None
    _check_oidc(s)
    if s.engine not in ENGINES:
        raise SettingsError(f"{PREFIX}ENGINE must be {' or '.join(ENGINES)}, not {s.engine!r}")
    if s.engine == "vllm":
        _check_vllm(s)


ENGINES = ("embedded", "vllm")
MAX_TOKENS_POLICIES = ("trim", "refuse")
# vLLM quantizes at load only through bitsandbytes' 4-bit NF4 (on CUDA); on a CPU it serves unquantized weights.
VLLM_QUANTIZATIONS = ("auto", "none", "nf4")
# vLLM's --kv-cache-dtype: auto (the model's dtype) or fp8 (e4m3 on CUDA); it has no int8 KV cache.
VLLM_KV_CACHE_DTYPES = ("auto", "fp8")


def _check_vllm(s: Settings) -> None:
    python = s.vllm_interpreter
    if not python.is_file():
        how = (
            f"{PREFIX}VLLM_PYTHON={s.vllm_python}"
            if s.vllm_python
            else "no vLLM venv at " + " or ".join(str(p) for p in default_vllm_pythons())
        )
        raise SettingsError(
            f"{PREFIX}ENGINE=vllm needs vLLM's python, and {how} does not exist: make it with "
            f"install.sh --engine vllm (or make vllm-env in a checkout), or point {PREFIX}VLLM_PYTHON at one"
        )
    if s.quantization not in VLLM_QUANTIZATIONS:
        raise SettingsError(
            f"{PREFIX}QUANTIZATION={s.quantization} is not for {PREFIX}ENGINE=vllm: it takes "
            f"{', '.join(VLLM_QUANTIZATIONS)} (nf4 is bitsandbytes on CUDA)"
        )
    if s.model.startswith("random:"):
        raise SettingsError(f"{PREFIX}ENGINE=vllm serves a real model, not {s.model}")
    if s.kv_cache_dtype not in VLLM_KV_CACHE_DTYPES:
        raise SettingsError(
            f"{PREFIX}KV_CACHE_DTYPE={s.kv_cache_dtype} is not for {PREFIX}ENGINE=vllm: vLLM has no int8 KV cache, "
            f"and keeps a 16-bit one in the model's dtype; it takes {' or '.join(VLLM_KV_CACHE_DTYPES)} "
            "(--kv-cache-dtype)"
        )


# The async drivers the app runs on: SQLAlchemy's asyncio engine needs one.
DATABASE_DRIVERS = ("sqlite+aiosqlite", "postgresql+asyncpg")


def _check_database_url(url: str) -> None:
    """The messages never carry the URL's password."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise SettingsError(f"{PREFIX}DATABASE_URL is not a database URL (dialect+driver://...)") from None
    if parsed.drivername not in DATABASE_DRIVERS:
        raise SettingsError(
            f"{PREFIX}DATABASE_URL must start with one of {', '.join(d + '://' for d in DATABASE_DRIVERS)}, "
            f"not {redacted_url(url)}"
        )


def oidc_config(s: Settings) -> OidcConfig | None:
    """Single sign-on's configuration, or None where no discovery URL is set."""
    if s.oidc_discovery_url is None:
        return None
    if not s.oidc_client_id or not s.oidc_client_secret:
        raise SettingsError(f"{PREFIX}OIDC_DISCOVERY_URL needs {PREFIX}OIDC_CLIENT_ID and {PREFIX}OIDC_CLIENT_SECRET")
    return OidcConfig(
        discovery_url=s.oidc_discovery_url,
        client_id=s.oidc_client_id,
        client_secret=s.oidc_client_secret,
        name=s.oidc_name,
        scopes=s.oidc_scopes,
        groups_claim=s.oidc_groups_claim,
        group_plans=parse_group_plans(s.oidc_group_plans),
        unmapped_plan=s.oidc_unmapped_plan,
        admin_groups=frozenset(filter(None, (g.strip() for g in s.oidc_admin_groups.split(",")))),
        redirect_url=s.oidc_redirect_url,
    )


def _check_oidc(s: Settings) -> None:
    if s.oidc_discovery_url is None:
        if s.oidc_client_id or s.oidc_client_secret:
            raise SettingsError(f"{PREFIX}OIDC_CLIENT_ID and _SECRET need {PREFIX}OIDC_DISCOVERY_URL")
        return
    try:
        check_discovery_url(s.oidc_discovery_url)
        parse_group_plans(s.oidc_group_plans)
    except OidcConfigError as exc:
        raise SettingsError(f"{PREFIX}OIDC_*: {exc}") from None
    if "openid" not in s.oidc_scopes.split():
        raise SettingsError(f"{PREFIX}OIDC_SCOPES must include openid")
    oidc_config(s)


def _type_name(hint: Any) -> str:
    args = [a for a in get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    name = {str: "string", int: "integer", float: "number", bool: "boolean"}.get(base, str(base))
    return f"{name} (optional)" if args else name
