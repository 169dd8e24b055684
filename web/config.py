"""What the web room needs to know, built by appliance/ from its settings (web never imports appliance)."""

from __future__ import annotations

from dataclasses import dataclass, field

from web.backends.spec import LOCAL_ONLY, Backends
from web.keys.keyless import NO_KEYLESS, Keyless
from web.people.oidc.config import OidcConfig


@dataclass(frozen=True, slots=True)
class WebConfig:
    database_url: str
    served_model_name: str | None = None
    store_text: bool = False
    history_retention_days: int = 30
    drain_timeout: float = 30.0
    admin_password: str | None = field(default=None, repr=False)
    self_signup: bool = False  # /signup makes pending accounts the admin approves
    metrics_token: str | None = field(default=None, repr=False)
    keyless: Keyless = NO_KEYLESS  # requests with no key from these networks run as this key (web/keys/keyless.py)
    max_body_bytes: int = 4 << 20
    default_max_tokens: int = 1024
    trim_max_tokens: bool = True  # a max_tokens above the key's cap or the context's room runs with what fits
    sample_interval: float = 5.0
    sample_retention_days: int = 7
    run_migrations: bool = True
    # This gateway's name in the rows it admits (several gateways may share one database); stable across restarts.
    gateway_id: str | None = None
    # The engines requests go to (web/backends/spec.py): the local engine alone unless APPLIANCE_BACKENDS says more.
    backends: Backends = LOCAL_ONLY
    backend_max_in_flight: int = 64  # per remote backend, unless its entry says #max_in_flight=N
    sticky_backends: bool = False  # a conversation stays on one backend (its prefix cache) unless that one is busy
    local_backend_name: str = "embedded"  # history rows' name for the local engine ("vllm": the managed vLLM)
    # Seats the gateway counts on the local engine (the managed vLLM's max_num_seqs: its own queue is first come,
    # first served, so the rest wait in the gateway's fair queue); None for the embedded engine, which is fair.
    local_max_in_flight: int | None = None
    oidc: OidcConfig | None = None  # single sign-on with the organisation's OpenID Connect provider (None: off)
