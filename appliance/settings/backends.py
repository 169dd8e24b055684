"""The gateway's backends: the engines behind it, how many requests each keeps in flight, and whether a
conversation stays on one."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.settings.field import PREFIX, SettingsError, at_least_one, setting
from web.backends.spec import BackendSpecError, parse_backends


@dataclass(frozen=True)
class BackendSettings:
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


def check_backends(s: BackendSettings) -> None:
    at_least_one(s, "backend_max_in_flight")
    try:
        parse_backends(s.backends)
    except BackendSpecError as exc:
        raise SettingsError(f"{PREFIX}BACKENDS: {exc}") from None
