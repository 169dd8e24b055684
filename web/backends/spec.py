"""APPLIANCE_BACKENDS: the engines the gateway routes to, a comma-separated list of base URLs of OpenAI-compatible
servers, and the token `embedded` for the box's own engine (an empty list: the embedded engine alone).

    http://10.0.0.5:8000                          a vLLM (or SGLang, llama.cpp, another appliance) on the LAN
    http://:KEY@10.0.0.6:8000                     one that wants an API key: the URL's password (never logged)
    http://10.0.0.7:8080#alias=qwen2.5:7b=qwen    its model `qwen2.5:7b` served here as `qwen`
    http://10.0.0.8:8000#tokenizer=/srv/models/m  the tokenizer the gateway uses for its models (a local dir)
    http://10.0.0.9:11434/v1#prompt=text          a server that takes no token ids (Ollama): the prompt as text

The fragment (after #) is the gateway's, never sent upstream: `alias=UPSTREAM=SERVED` (repeatable),
`tokenizer=DIR`, `prompt=text` and `max_in_flight=N` (the requests this gateway keeps in flight there; the rest
wait in its fair queue). A model whose name is the embedded engine's uses the embedded engine's tokenizer."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlsplit

EMBEDDED = "embedded"
MAX_BACKENDS = 64
MAX_SEATS = 100_000


class BackendSpecError(ValueError):
    """APPLIANCE_BACKENDS cannot be read; the message names the entry (without its key)."""


@dataclass(frozen=True, slots=True)
class BackendSpec:
    name: str  # how history rows and the console name it: host:port
    base_url: str  # scheme://host:port[/path], without credentials or fragment
    api_key: str | None = field(default=None, repr=False)
    aliases: tuple[tuple[str, str], ...] = ()  # (upstream model id, served name)
    tokenizer: str | None = None
    text_prompt: bool = False  # send the templated prompt as text, not token ids
    max_in_flight: int | None = None  # seats: requests this gateway keeps in flight there (None: the setting's)

    def served_name(self, upstream_id: str) -> str:
        return dict(self.aliases).get(upstream_id, upstream_id)


@dataclass(frozen=True, slots=True)
class Backends:
    embedded: bool  # the box's own engine is one of them
    remotes: tuple[BackendSpec, ...]


LOCAL_ONLY = Backends(embedded=True, remotes=())


def parse_backends(text: str | None) -> Backends:
    entries = [e.strip() for e in (text or "").split(",") if e.strip()]
    if not entries:
        return LOCAL_ONLY
    if len(entries) > MAX_BACKENDS:
        raise BackendSpecError(f"at most {MAX_BACKENDS} backends, not {len(entries)}")
    remotes = [parse_remote(e) for e in entries if e != EMBEDDED]
    names = [r.name for r in remotes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BackendSpecError(f"backend {twice[0]} is listed twice")
    return Backends(EMBEDDED in entries, tuple(remotes))


def parse_remote(entry: str) -> BackendSpec:
    try:
        url = urlsplit(entry)
        port = url.port
    except ValueError as exc:
        raise BackendSpecError(f"backend {redacted(entry)!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise BackendSpecError(f"backend {redacted(entry)!r} must be an http:// or https:// URL with a host")
    host = url.hostname
    port = port or (443 if url.scheme == "https" else 80)
    shown_host = f"[{host}]" if _is_ipv6(host) else host
    name = f"{shown_host}:{port}"
    path = url.path.rstrip("/")
    if path.endswith("/v1"):  # Ollama's and others' documented base URL ends in /v1; the gateway adds it itself
        path = path[: -len("/v1")]
    options = _fragment(url.fragment, name)
    key = unquote(url.password) if url.password else None
    return BackendSpec(name, f"{url.scheme}://{name}{quote(path)}", key or None, *options)


def _fragment(fragment: str, name: str) -> tuple[tuple[tuple[str, str], ...], str | None, bool, int | None]:
    aliases: list[tuple[str, str]] = []
    tokenizer = None
    text = False
    seats = None
    for key, value in parse_qsl(fragment, keep_blank_values=True):
        if key == "alias":
            upstream, sep, served = value.rpartition("=")
            if not sep or not upstream or not served:
                raise BackendSpecError(f"backend {name}: alias must be UPSTREAM=SERVED, not {value!r}")
            aliases.append((upstream, served))
        elif key == "tokenizer" and value:
            tokenizer = value
        elif key == "prompt" and value in ("text", "ids"):
            text = value == "text"
        elif key == "max_in_flight":
            if not value.isdigit() or not 1 <= int(value) <= MAX_SEATS:
                raise BackendSpecError(f"backend {name}: max_in_flight must be 1 to {MAX_SEATS}, not {value!r}")
            seats = int(value)
        else:
            raise BackendSpecError(
                f"backend {name}: unknown option {key!r} after # (alias=, tokenizer=, prompt=text, max_in_flight=)"
            )
    return tuple(aliases), tokenizer, text, seats


def redacted(entry: str) -> str:
    """An entry as it may be shown: any password in it replaced by ***."""
    scheme, sep, rest = entry.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return entry
    userinfo, _, after = rest.partition("@")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{after}"


def _is_ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False
