"""A stream that waits for a seat on a real server (random:tiny, one seat): the official `openai` client parses it
as usual while the bytes on the wire carry the queue comments before the first chunk."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.web.server import Server, serving

pytestmark = pytest.mark.slow
MODEL = "random:tiny"


class Tee(httpx.BaseTransport):
    """An HTTP transport that keeps a copy of every response body it passes on."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.seen = bytearray()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        return httpx.Response(
            response.status_code, headers=response.headers, stream=_Copied(response, self.seen), request=request
        )

    def close(self) -> None:
        self.inner.close()


class _Copied(httpx.SyncByteStream):
    def __init__(self, response: httpx.Response, seen: bytearray) -> None:
        self.response, self.seen = response, seen

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.response.stream:  # type: ignore[union-attr]
            self.seen.extend(chunk)
            yield chunk

    def close(self) -> None:
        self.response.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("queue-server"), max_num_seqs="1") as srv:
        yield srv


def test_the_openai_client_reads_a_queued_stream(server: Server) -> None:
    key = server.new_key("one-tenant")  # one key: FCFS within it, so the stream must wait its turn
    long = {"model": MODEL, "prompt": "x", "max_tokens": 1900, "ignore_eos": True}

    def hold_the_seat() -> None:
        httpx.post(server.url + "/v1/completions", json=long, headers={"Authorization": f"Bearer {key}"}, timeout=120)

    holders = [threading.Thread(target=hold_the_seat) for _ in range(2)]
    for holder in holders:
        holder.start()
        time.sleep(0.2)  # in this order: the stream queues behind both
    tee = Tee()
    client = openai.OpenAI(
        base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120, http_client=httpx.Client(transport=tee)
    )
    started = time.monotonic()
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    waited = time.monotonic() - started
    for holder in holders:
        holder.join()
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and 1 <= chunks[-1].usage.completion_tokens <= 4
    wire = bytes(tee.seen).decode()
    assert waited > 1.5, f"the stream did not wait (in {waited:.2f} s): make the holders longer"
    head = wire.split("data: ", 1)[0]  # all before the first chunk
    assert head.startswith(":") and ": queued position=" in head and "eta=" in head, wire[:300]
