"""The API's settings: who may call it without a key, how big a request may be, and what max_tokens a request
runs with."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.settings.field import PREFIX, SettingsError, at_least_one, setting
from web.keys.keyless import PRIVATE_NETWORKS, parse_networks

MAX_TOKENS_POLICIES = ("trim", "refuse")


@dataclass(frozen=True)
class ApiSettings:
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


def check_api(s: ApiSettings) -> None:
    at_least_one(s, "max_body_bytes", "default_max_tokens")
    if s.max_tokens_policy not in MAX_TOKENS_POLICIES:
        raise SettingsError(f"{PREFIX}MAX_TOKENS_POLICY must be trim or refuse, not {s.max_tokens_policy!r}")
    try:
        parse_networks(s.keyless_networks)
    except ValueError as exc:
        raise SettingsError(f"{PREFIX}KEYLESS_NETWORKS: {exc}") from None
    if s.keyless_key_id is not None and s.keyless_key_id < 1:
        raise SettingsError(f"{PREFIX}KEYLESS_KEY_ID must be a key's id (at least 1), not {s.keyless_key_id}")
