"""One OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, another appliance) as the gateway speaks to it:
its health, its models, its load, its own JSON endpoints, and a generation request (web/backends/upstream_stream.py
holds the request's body and the stream read back). Everything it sends is untrusted: bodies are parsed defensively
and its error messages are cut before they reach a client (web/backends/upstream_errors.py). Its key is sent as a
bearer token and never appears in a message, a log line or a repr."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import httpx

from engine import SamplingParams
from web.backends.scrape import Load, read_load
from web.backends.status import BackendState
from web.backends.upstream_errors import UpstreamError, error_message, json_body
from web.backends.upstream_stream import UpstreamStream, completion_body, stream_timeout

log = logging.getLogger("web.backends")

PROBE_TIMEOUT_S = 2.0
MAX_TOKENIZER_BYTES = 160 << 20  # a published tokenizer as JSON (escaping can double its 64 MiB of files)


@dataclass(frozen=True, slots=True)
class UpstreamModel:
    id: str
    max_model_len: int | None  # vLLM says it in /v1/models; servers that do not leave it None


class Upstream:
    def __init__(self, base_url: str, api_key: str | None, http: httpx.AsyncClient) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = http

    def __repr__(self) -> str:
        return f"Upstream({self.base_url!r})"

    def generate(
        self,
        model: str,
        prompt: Sequence[int] | str,
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None = None,
    ) -> UpstreamStream:
        body = completion_body(model, prompt, params, request_id)
        return UpstreamStream(self._open, self.base_url, body, request_id, arrival_time or time.monotonic())

    def _open(self, body: dict[str, Any]) -> AbstractAsyncContextManager[httpx.Response]:
        return self._http.stream(
            "POST", f"{self.base_url}/v1/completions", json=body, headers=self._headers, timeout=stream_timeout()
        )

    async def health(self) -> BackendState:
        """Up (200), draining (503: vLLM answers so while it shuts down), loading or down. An appliance
        answers its /health while alive and its /ready while it can serve: both are asked. llama.cpp's server
        answers /health as an appliance does but has no /ready (404; 401 without the key, when it has one): its
        /health decides, and a wrong key is for the model list to say."""
        try:
            r = await self._http.get(f"{self.base_url}/health", headers=self._headers, timeout=PROBE_TIMEOUT_S)
            if r.status_code == 200 and json_body(r.content[:1024]) == {"status": "ok"}:
                r = await self._http.get(f"{self.base_url}/ready", headers=self._headers, timeout=PROBE_TIMEOUT_S)
                if r.status_code in (401, 403, 404):
                    return BackendState.UP
        except httpx.HTTPError:
            return BackendState.DOWN
        if r.status_code == 200:
            return BackendState.UP
        if r.status_code == 503:
            why = error_message(json_body(r.content[:4096])).lower()
            if "loading" in why:
                return BackendState.LOADING
            return BackendState.DRAINING if "drain" in why or not why else BackendState.DOWN
        return BackendState.DOWN

    async def models(self) -> list[UpstreamModel]:
        r = await self._http.get(f"{self.base_url}/v1/models", headers=self._headers, timeout=PROBE_TIMEOUT_S)
        r.raise_for_status()
        data = json_body(r.content).get("data")
        out = []
        for entry in data if isinstance(data, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("id"), str) and 0 < len(entry["id"]) <= 256:
                max_len = entry.get("max_model_len")
                meta = entry.get("meta")
                if max_len is None and isinstance(meta, dict):
                    max_len = meta.get("n_ctx")  # llama.cpp's: a request's context (its slots share -c)
                ok = isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0
                out.append(UpstreamModel(entry["id"], max_len if ok else None))
        return out

    async def post(self, path: str, body: dict[str, Any], timeout: float, max_bytes: int) -> httpx.Response:
        """One JSON request to the server's own API (vLLM's /tokenize), on its key; an answer over max_bytes is a
        broken (or hostile) server's."""
        async with self._http.stream(
            "POST", f"{self.base_url}{path}", json=body, headers=self._headers, timeout=timeout
        ) as r:
            raw = bytearray()
            async for chunk in r.aiter_bytes():
                raw += chunk
                if len(raw) > max_bytes:
                    raise UpstreamError(f"the backend's {path} answered more than {max_bytes} bytes")
        return httpx.Response(r.status_code, content=bytes(raw), request=r.request)

    async def tokenizer_files(self, model: str) -> dict[str, str] | None:
        """The tokenizer files another appliance publishes for `model` (web/backends/publish.py), or None where the
        server publishes none (vLLM, SGLang, llama.cpp) or sends something else."""
        try:
            async with self._http.stream(
                "GET", f"{self.base_url}/v1/tokenizer", params={"model": model}, headers=self._headers
            ) as r:
                if r.status_code != 200:
                    return None
                raw = bytearray()
                async for chunk in r.aiter_bytes():
                    raw += chunk
                    if len(raw) > MAX_TOKENIZER_BYTES:
                        return None
        except httpx.HTTPError:
            return None
        files = json_body(bytes(raw)).get("files")
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            return None
        return files

    async def scrape(self) -> Load | None:
        """Its load from /metrics (None: it exports none the gateway knows)."""
        try:
            r = await self._http.get(f"{self.base_url}/metrics", headers=self._headers, timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        if r.status_code != 200 or len(r.content) > 8 << 20:
            return None
        return read_load(r.text)
