"""`appliance status`: asks the running server how it is doing. With the admin password (its stats API): engine
state, requests running and waiting, KV-cache use, memory headroom, recent queue wait; without it, what the public
/health and /ready say: the state and why, the model, whether the server answers. Exit 0 ready, 1 not ready,
3 not running."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any

from appliance.settings import Settings
from web.console.render import fmt_bytes, fmt_duration, fmt_pct

EXIT_READY, EXIT_NOT_READY, EXIT_NOT_RUNNING = 0, 1, 3
TIMEOUT_S = 10.0


class StatusError(Exception):
    """The server could not be asked; the message says why and what to do. exit_code as above."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def fetch(base: str, path: str, password: str | None, timeout: float = TIMEOUT_S) -> tuple[int, Any]:
    """(HTTP status, decoded JSON body). Raises StatusError when nothing answers."""
    url = base + path
    headers = {"accept": "application/json"}
    if password is not None:
        headers["authorization"] = "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, {"error": {"message": body.decode(errors="replace")[:200]}}
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StatusError(
            f"nothing answers at {base} ({reason}): the appliance is not running there "
            "(start it with `appliance serve` or `systemctl start appliance`; see `journalctl -u appliance`)",
            EXIT_NOT_RUNNING,
        ) from None
    except ValueError:
        raise StatusError(f"{url} answered something that is not JSON: is this port the appliance's?", 1) from None


def error_message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body))
    return str(body)


def status(settings: Settings, password: str | None, as_json: bool) -> int:
    base = settings.local_url
    if password is None:
        return public_status(base, settings.model, as_json)
    code, body = fetch(base, "/admin/api/stats", password)
    if code == 401:
        raise StatusError(
            f"the server refused the admin password ({error_message(body)}); APPLIANCE_ADMIN_PASSWORD only seeds "
            "the first credential, so after `appliance admin set-password` pass the current one with "
            "--password-stdin",
            EXIT_NOT_READY,
        )
    if code != 200:
        raise StatusError(f"{base}/admin/api/stats answered {code}: {error_message(body)}", EXIT_NOT_READY)
    if as_json:
        print(json.dumps(body, indent=2))
    else:
        print("\n".join(describe(base, body)))
    return EXIT_READY if body["ready"] else EXIT_NOT_READY


def public_status(base: str, model_setting: str, as_json: bool) -> int:
    """Without the admin credential: what /health and /ready tell anyone on the LAN."""
    health_code, health = fetch(base, "/health", None)
    ready_code, ready = fetch(base, "/ready", None)
    if as_json:
        print(json.dumps({"health": health, "ready": ready}, indent=2))
    else:
        print("\n".join(describe_public(base, health_code == 200, ready_code == 200, ready, model_setting)))
    return EXIT_READY if ready_code == 200 else EXIT_NOT_READY


def describe_public(base: str, alive: bool, ready: bool, body: Any, model_setting: str) -> list[str]:
    if ready:
        state, detail = "ready", ""
    else:
        # "not ready: loading: the model is being loaded and warmed up" -> state "loading" and its detail.
        state, _, detail = error_message(body).removeprefix("not ready: ").partition(": ")
    lines = [f"appliance at {base}: {state}"]
    if detail:
        lines.append(f"  why:         {detail}")
    served = body.get("model") if ready and isinstance(body, dict) else None
    lines.append(f"  model:       {served}" if served else f"  model:       {model_setting} (this machine's setting)")
    lines.append(f"  server:      {'answering (/health ok)' if alive else '/health fails'}")
    lines.append(
        "  more:        requests, KV cache, memory and queue wait need the admin password "
        "(APPLIANCE_ADMIN_PASSWORD, or --password-stdin)"
    )
    return lines


def describe(base: str, stats: dict[str, Any]) -> list[str]:
    state = "ready" if stats["ready"] else stats["reason"]
    lines = [f"appliance at {base}: {state}"]
    model, engine = stats.get("model"), stats.get("engine")
    if model:
        lines.append(
            f"  model:       {model['name']} on {model['device']} ({model['dtype']}, {model['quantization']}), "
            f"context {model['max_model_len']:,} tokens"
        )
    if not engine:
        lines.append(f"  engine:      {stats['state']} (no numbers yet)")
        return lines
    lines.append(
        f"  requests:    {engine['running']} running, {engine['waiting']} waiting, "
        f"{stats['in_flight']} in flight through the API{', draining' if stats['draining'] else ''}"
    )
    total, used = engine["kv_blocks_total"], engine["kv_blocks_used"]
    lines.append(
        f"  KV cache:    {fmt_pct(used / total if total else 0)} in use ({used:,} of {total:,} blocks of "
        f"{engine['block_size']} tokens; {engine['kv_blocks_cached']:,} hashed for prefix reuse)"
    )
    free, total_memory = fmt_bytes(engine["device_memory_free"]), fmt_bytes(engine["device_memory_total"])
    lines.append(
        f"  {engine['memory_kind'] + ':':<12} {free} free of {total_memory} "
        f"(weights {fmt_bytes(engine['weights_bytes'])}, KV pool {fmt_bytes(engine['kv_pool_bytes'])})"
    )
    wait, ttft = stats["queue_wait_s"], stats["ttft_s"]
    lines.append(
        f"  queue wait:  p50 {fmt_duration(wait['p50'])}, p95 {fmt_duration(wait['p95'])}; "
        f"time to first token p50 {fmt_duration(ttft['p50'])} (recent requests)"
    )
    lines.append(
        f"  since start: {engine['requests_finished_total']:,} requests, "
        f"{engine['generation_tokens_total']:,} tokens generated, {engine['preemptions_total']:,} preemptions"
    )
    return lines
