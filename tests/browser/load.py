"""Background load for the browser tests: streamed chat requests held open until the test lets them go."""

from __future__ import annotations

import threading
from types import TracebackType

import httpx


class Load:
    """`count` streamed chat completions of up to `max_tokens` tokens each, read in background threads;
    leaving the block closes them (the server then aborts them)."""

    def __init__(
        self, url: str, key: str, count: int = 4, max_tokens: int = 600, model: str = "random:tiny", prompt: str = ""
    ) -> None:
        self.url, self.key, self.count, self.max_tokens = url, key, count, max_tokens
        self.model, self.prompt = model, prompt
        self.stop = threading.Event()
        self.chunks = 0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)]

    def _run(self, index: int) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": self.prompt or f"load {index}: tell me everything"}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {self.key}"}
        try:
            with (
                httpx.Client(base_url=self.url, timeout=60) as client,
                client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response,
            ):
                if response.status_code != 200:
                    self.errors.append(f"{response.status_code}: {response.read()!r}")
                    return
                for _ in response.iter_lines():
                    self.chunks += 1
                    if self.stop.is_set():
                        return
        except httpx.HTTPError as exc:
            self.errors.append(repr(exc))

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
