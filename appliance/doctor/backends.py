"""`appliance doctor`'s look at APPLIANCE_BACKENDS: each remote server's health and the models it lists, asked the
way the gateway asks (its key, never shown), and whether the tokenizer directory an entry names is there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from appliance.doctor.host import FAIL, INFO, OK, WARN, Finding
from appliance.settings import Settings
from web.backends.remote_tokenizer import TokenizerUnavailable, remote_tokenizer
from web.backends.spec import BackendSpec, parse_backends
from web.backends.upstream import Upstream


def backends_finding(settings: Settings) -> Finding:
    backends = parse_backends(settings.backends)
    if not backends.remotes:
        return Finding(INFO, "backends", "none besides this box's engine (APPLIANCE_BACKENDS is empty)")
    found = asyncio.run(_probe_all(backends.remotes))
    up = [line for ok, line in found if ok]
    lines = "; ".join(line for _, line in found)
    local = " and this box's engine" if backends.embedded else ""
    if not up:
        level = WARN if backends.embedded else FAIL
        return Finding(level, "backends", f"none of {len(found)} is up{local and ' (this box serves alone)'}: {lines}")
    level = OK if len(up) == len(found) else WARN
    return Finding(level, "backends", f"{len(up)} of {len(found)} up{local}: {lines}")


async def _probe_all(specs: tuple[BackendSpec, ...]) -> list[tuple[bool, str]]:
    async with httpx.AsyncClient(trust_env=False) as http:
        return list(await asyncio.gather(*(_probe(spec, http) for spec in specs)))


async def _probe(spec: BackendSpec, http: httpx.AsyncClient) -> tuple[bool, str]:
    upstream = Upstream(spec.base_url, spec.api_key, http)
    health = await upstream.health()
    if health != "up":
        return False, f"{spec.name} {health}"
    try:
        listed = await upstream.models()
    except httpx.HTTPStatusError as exc:
        status = exc.response.status_code
        wrong_key = " (a wrong key in its entry?)" if status in (401, 403) else ""
        return False, f"{spec.name} up, but its model list answered {status}{wrong_key}"
    except httpx.HTTPError as exc:
        return False, f"{spec.name} up, but its model list failed ({type(exc).__name__})"
    models = [spec.served_name(m.id) for m in listed]
    serves = f"{spec.name} serves {', '.join(models) or 'nothing'}"
    unlisted = [upstream_id for upstream_id, _ in spec.aliases if upstream_id not in {m.id for m in listed}]
    if unlisted:
        return False, f"{serves}, but its entry names {', '.join(unlisted)}, which it does not list"
    if spec.tokenizer is None:
        how = [await _tokenizer_of(upstream, m.id, spec.text_prompt) for m in listed]
        bare = [f"{name} ({why})" for name, (ok, why) in zip(models, how, strict=True) if not ok]
        if bare:
            return False, f"{serves}, but no tokenizer for {', '.join(bare)}: add #tokenizer=DIR to its entry"
        ways = ", ".join(sorted({why for _, why in how}))
        return bool(listed), serves + (f" ({ways})" if listed else "")
    if not (Path(spec.tokenizer) / "tokenizer_config.json").is_file():
        return False, f"{serves}, but #tokenizer={spec.tokenizer} holds no tokenizer"
    return True, f"{serves} (tokenizer {spec.tokenizer})"


async def _tokenizer_of(upstream: Upstream, model: str, text_prompt: bool) -> tuple[bool, str]:
    """Where the gateway would get the model's tokenizer (web/backends/remote.py's order), or why it gets none."""
    if await upstream.tokenizer_files(model) is not None:
        return True, "it publishes their tokenizer"
    if text_prompt:
        return False, "it publishes none"
    try:
        tokenizer = await remote_tokenizer(upstream, model)
    except TokenizerUnavailable as exc:
        return False, f"it publishes none, and {exc}"
    if tokenizer.llama_cpp:
        return True, "its /apply-template and /tokenize render their prompts"
    return True, "its /tokenize renders their prompts"
