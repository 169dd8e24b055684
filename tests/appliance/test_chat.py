"""`appliance chat` in a pseudo-terminal against a real served appliance (random:tiny): the key asked for, replies
streamed, the conversation remembered, /system and /reset, Ctrl-C stopping a reply and not the program, refusals
explained."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from appliance.cli.chat import Api, ChatError, explain, printable
from tests.web.server import REPO, Server

TERMINAL_STATUSES = {"finished", "cancelled", "failed", "rejected", "interrupted"}


class Terminal:
    """`appliance chat ARGS` on its own pseudo-terminal, which is its controlling terminal: Ctrl-C typed there
    reaches it as SIGINT, and getpass reads the key from it."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: becomes the chat, or exits at once
            try:
                os.chdir(REPO)
                os.execve(sys.executable, [sys.executable, "-m", "appliance.cli.main", "chat", *args], env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.screen = ""  # everything shown, \r\n as \n
        self._read_to = 0
        self.code: int | None = None

    def _read(self, timeout: float) -> bool:
        if not select.select([self.fd], [], [], timeout)[0]:
            return False
        try:
            data = os.read(self.fd, 4096)
        except OSError:  # the chat exited and closed its side
            return False
        self.screen += data.decode(errors="replace").replace("\r\n", "\n")
        return bool(data)

    def expect(self, text: str, timeout: float = 60) -> str:
        """What appeared up to and including `text` since the last expect."""
        deadline = time.monotonic() + timeout
        while text not in self.screen[self._read_to :]:
            if time.monotonic() > deadline or (not self._read(0.2) and self.exited()):
                raise AssertionError(f"{text!r} did not appear; the terminal shows:\n{self.screen[-2000:]}")
        end = self.screen.index(text, self._read_to) + len(text)
        shown, self._read_to = self.screen[self._read_to : end], end
        return shown

    def grows(self, chars: int, timeout: float = 60) -> None:
        """Wait until `chars` more characters appeared (a reply streaming)."""
        start, deadline = len(self.screen), time.monotonic() + timeout
        while len(self.screen) < start + chars:
            assert time.monotonic() < deadline, f"nothing streamed:\n{self.screen[-2000:]}"
            self._read(0.2)

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def exited(self) -> bool:
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code is not None

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while not self.exited():
            assert time.monotonic() < deadline, f"the chat did not exit:\n{self.screen[-2000:]}"
            self._read(0.1)
        assert self.code is not None
        return self.code

    def close(self) -> None:
        if not self.exited():
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


@pytest.fixture
def chat(keeping_server: Server, tmp_path: Path) -> Iterator[Any]:
    """The chat command in a terminal, against the shared server that stores text (tests/conftest.py): each test
    finds its history rows by a key of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    env.update(APPLIANCE_DATA_DIR=str(tmp_path), TERM="dumb")
    started: list[Terminal] = []

    def start(*args: str, key: str | None = None) -> Terminal:
        terminal = Terminal(
            ["--url", keeping_server.url, *args], {**env, **({"APPLIANCE_API_KEY": key} if key else {})}
        )
        started.append(terminal)
        return terminal

    yield start
    for terminal in started:
        terminal.close()


def last_request(server: Server, key_id: int) -> dict[str, Any]:
    """The newest history row of the key's, once it reached its end."""
    deadline = time.monotonic() + 20
    while True:
        rows = server.history(key_id=key_id, limit=1)
        if (rows and rows[0]["status"] in TERMINAL_STATUSES) or time.monotonic() > deadline:
            return dict(rows[0])
        time.sleep(0.2)


def test_a_conversation_streams_and_remembers_its_turns(chat: Any, keeping_server: Server) -> None:
    key, key_id = keeping_server.new_key_and_id("terminal")
    terminal = chat("--max-tokens", "6")
    terminal.expect("API key: ")
    terminal.type(key + "\r")
    assert "chatting with" in terminal.expect(">>> ")
    terminal.type("/system Answer like a pirate.\r")
    terminal.expect("system prompt set\n>>> ")
    terminal.type("first question\r")
    reply = terminal.expect(">>> ").split("first question", 1)[1].strip()
    assert reply and reply != ">>>", "a reply was printed before the next prompt"
    terminal.type("second question\r")
    terminal.expect(">>> ")
    prompt = last_request(keeping_server, key_id)["prompt_text"]
    assert all(part in prompt for part in ("Answer like a pirate.", "first question", "second question")), prompt

    terminal.type("/reset\r")
    terminal.expect("conversation forgotten\n>>> ")
    terminal.type("third question\r")
    terminal.expect(">>> ")
    prompt = last_request(keeping_server, key_id)["prompt_text"]
    assert "Answer like a pirate." in prompt and "third question" in prompt and "first question" not in prompt
    terminal.type("/exit\r")
    assert terminal.wait() == 0


def test_ctrl_c_stops_the_reply_and_not_the_program(chat: Any, keeping_server: Server) -> None:
    key, key_id = keeping_server.new_key_and_id("ctrl-c")
    terminal = chat("--max-tokens", "1500", key=key)
    terminal.expect(">>> ")
    terminal.type("Write a very long story\r")
    terminal.expect("story\n")
    terminal.grows(20)
    terminal.type("\x03")
    terminal.expect("[stopped]")
    terminal.expect(">>> ")
    row = last_request(keeping_server, key_id)
    assert row["status"] == "cancelled" and row["completion_tokens"] < 1500, row
    terminal.type("/help\r")
    terminal.expect("/reset")
    # Ctrl-D on an empty line leaves; typed only at the prompt, once readline reads the terminal raw (an EOF sent
    # before it does is a line-discipline event that the switch to raw mode loses).
    terminal.expect(">>> ")
    terminal.type("\x04")
    assert terminal.wait() == 0


def test_refusals_are_explained(chat: Any, keeping_server: Server) -> None:
    bad_key = chat("--key", "sk-not-a-key")
    assert "API key was not accepted" in bad_key.expect("valid key.")
    assert bad_key.wait() == 1

    quota = chat("--max-tokens", "64", key=keeping_server.new_key("tiny quota", quota_tokens=20))
    quota.expect(">>> ")
    quota.type("hello\r")
    assert "token quota is used up" in quota.expect(">>> "), "a refusal leaves the chat running"


def test_overload_and_hostile_text_in_words() -> None:
    body = {"error": {"message": "the server is overloaded", "type": "server_error", "param": None, "code": "x"}}
    error = explain(503, json.dumps(body).encode(), "7")
    assert str(error) == "the appliance cannot take a request now: the server is overloaded. Try again in 7 s."
    assert not error.fatal and explain(401, b"not json", None).fatal
    assert printable("a\x1b]52;c;ZXZpbA==\x07b\x1b[2Jc\tz\n\x9b") == "a]52;c;ZXZpbA==b[2Jc\tz\n"


class Misbehaving(BaseHTTPRequestHandler):
    """A server that is overloaded for /v1/models and breaks its stream off with garbage."""

    def do_GET(self) -> None:
        body = json.dumps({"error": {"message": "overloaded", "type": "server_error", "code": "overloaded"}})
        self.send_response(503)
        self.send_header("Retry-After", "7")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\ndata: {not json\n\n')

    def log_message(self, *args: Any) -> None:
        pass


def test_a_busy_server_and_a_broken_stream_are_errors_in_words() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        api = Api(f"http://127.0.0.1:{httpd.server_address[1]}", "sk-test")
        with pytest.raises(ChatError, match=r"cannot take a request now: overloaded\. Try again in 7 s\."):
            api.model()
        pieces = api.stream({"model": "m", "messages": []})
        assert next(pieces) == "Hel"
        with pytest.raises(ChatError, match="the reply broke off"):
            next(pieces)
    finally:
        httpd.shutdown()
        httpd.server_close()
