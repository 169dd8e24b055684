"""`appliance status` without the admin password (issue 17, O1): what the public /health and /ready say, in
words, against a stand-in server that answers as the appliance does while it loads and once it is ready."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.appliance.conftest import Cli

Reply = tuple[int, dict[str, object]]
LOADING: Reply = (503, {"error": {"message": "not ready: loading: the model is being loaded and warmed up",
                           "type": "server_error", "param": None, "code": "not_ready"}})  # fmt: skip
READY: Reply = (200, {"status": "ready", "model": "SmolLM2-135M-Instruct"})


class StandIn(ThreadingHTTPServer):
    ready: Reply = LOADING


class Answer(BaseHTTPRequestHandler):
    server: StandIn

    def do_GET(self) -> None:
        code, body = (200, {"status": "ok"}) if self.path == "/health" else self.server.ready
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads the command's output, not the stand-in's."""


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, cli: Cli) -> Iterator[StandIn]:
    server = StandIn(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("APPLIANCE_PORT", str(server.server_address[1]))
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_without_the_password_a_loading_server_says_what_it_is_doing(stand_in: StandIn, cli: Cli) -> None:
    result = cli("status")
    assert result.code == 1
    lines = result.out.splitlines()
    assert lines[0].endswith(": loading")
    assert "  why:         the model is being loaded and warmed up" in lines
    assert "  model:       default (this machine's setting)" in lines
    assert "  server:      answering (/health ok)" in lines
    assert "admin password" in lines[-1]


def test_without_the_password_a_ready_server_names_its_model(stand_in: StandIn, cli: Cli) -> None:
    stand_in.ready = READY
    result = cli("status")
    assert result.code == 0
    assert result.out.splitlines()[:3] == [
        f"appliance at http://127.0.0.1:{stand_in.server_address[1]}: ready",
        "  model:       SmolLM2-135M-Instruct",
        "  server:      answering (/health ok)",
    ]
    assert json.loads(cli("status", "--json").out) == {"health": {"status": "ok"}, "ready": READY[1]}
