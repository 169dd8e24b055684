"""`appliance chat`: a multi-turn chat in the terminal against a running appliance, like `ollama run`. Replies
stream as they are written; Ctrl-C stops a reply (the server cancels it) and not the program; /reset, /system.

It speaks the OpenAI-compatible API with the standard library's http.client: one streamed POST read line by
line needs nothing more, and the runtime gains no HTTP client dependency for it.
"""

from __future__ import annotations

import contextlib
import getpass
import http.client
import json
import os
import re
import signal
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import urlsplit

KEY_VARIABLE = "APPLIANCE_API_KEY"
PROMPT = ">>> "
TIMEOUT_S = 300.0  # the longest silence between two pieces of a reply (a long queue wait included)
HELP = """commands:
  /system TEXT   set the system prompt (/system alone clears it); the conversation goes on
  /reset         forget the conversation (the system prompt stays)
  /exit          leave (Ctrl-D too)
Ctrl-C stops a reply while it streams."""
# Model output and server messages are untrusted and go to a terminal, where an escape sequence could retitle the
# window, write the clipboard (OSC 52) or hide what was printed. Of the control characters only \t and \n pass.
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class ChatError(Exception):
    """A refusal or a failure, in words for the person at the keyboard; fatal when going on cannot help."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(printable(message))
        self.fatal = fatal


def printable(text: str) -> str:
    return CONTROLS.sub("", text)


def explain(status: int, body: bytes, retry_after: str | None) -> ChatError:
    """The server's refusal ({"error": {"message", "type", "code"}}) as a ChatError that says what to do."""
    try:
        error = json.loads(body)["error"]
        message, kind = str(error["message"]), f"{error.get('type')} {error.get('code')}"
    except (ValueError, KeyError, TypeError):
        message, kind = body.decode(errors="replace").strip()[:200] or f"HTTP {status}", ""
    later = f" Try again in {retry_after} s." if retry_after and retry_after.isdigit() else ""
    if status == 401:
        return ChatError(f"the API key was not accepted: {message}. Ask the operator for a valid key.", fatal=True)
    if status == 429 and "insufficient_quota" in kind:
        return ChatError(f"your token quota is used up: {message}.{later}")
    if status == 429:
        return ChatError(f"too many requests at once with this key: {message}.{later}")
    if status == 503:
        return ChatError(f"the appliance cannot take a request now: {message}.{later}")
    return ChatError(f"the appliance answered {status}: {message}.{later}")


class Api:
    """The few calls the chat makes, each on its own connection (a stopped reply's connection is dropped)."""

    def __init__(self, base_url: str, key: str, timeout: float = TIMEOUT_S) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ChatError(f"{base_url!r} is not an http(s) URL of the appliance", fatal=True)
        self.base_url = base_url.rstrip("/")
        self._parts = parts
        self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self._timeout = timeout

    def _open(self, method: str, path: str, body: dict[str, Any] | None = None) -> http.client.HTTPResponse:
        kind = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(self._parts.hostname or "", self._parts.port, timeout=self._timeout)
        try:
            conn.request(method, self._parts.path.rstrip("/") + path, json.dumps(body) if body else None, self._headers)
            response = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise ChatError(
                f"nothing answers at {self.base_url} ({exc}): is the appliance running? (`appliance status`)"
            ) from None
        if response.status != 200:
            error = explain(response.status, response.read(), response.getheader("Retry-After"))
            conn.close()
            raise error
        return response

    def model(self) -> str:
        """The served model's name (which also checks the key)."""
        response = self._open("GET", "/v1/models")
        with contextlib.closing(response):
            data = json.loads(response.read()).get("data") or []
        if not data:
            raise ChatError(f"{self.base_url} serves no model", fatal=True)
        return str(data[0]["id"])

    def stream(self, body: dict[str, Any]) -> Generator[str, None, None]:
        """The reply's text piece by piece; closing the iterator early drops the connection, which the server
        takes as a cancel."""
        response = self._open("POST", "/v1/chat/completions", {**body, "stream": True})
        with contextlib.closing(response):
            try:
                for data in _sse_data(response):
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:  # a failure after the stream began comes in-band
                        raise ChatError(f"the reply failed: {chunk['error'].get('message', chunk['error'])}")
                    for choice in chunk.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            yield piece
            except (OSError, http.client.HTTPException, ValueError, AttributeError, TypeError) as exc:
                raise ChatError(f"the reply broke off ({type(exc).__name__}: {exc})") from None
        raise ChatError("the reply was cut off before its end")


def _sse_data(response: http.client.HTTPResponse) -> Iterator[str]:
    """Each Server-Sent Event's data, joined across its data: lines."""
    lines: list[str] = []
    for raw in response:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
        elif not line and lines:
            yield "\n".join(lines)
            lines = []
    if lines:
        yield "\n".join(lines)


@dataclass
class Conversation:
    system: str = ""
    turns: list[dict[str, str]] = field(default_factory=list)

    def messages(self, user: str) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, *self.turns, {"role": "user", "content": user}]


@dataclass
class Chat:
    api: Api
    model: str
    out: TextIO
    max_tokens: int | None = None
    temperature: float | None = None
    conversation: Conversation = field(default_factory=Conversation)

    def say(self, text: str) -> None:
        """One reply streamed to the terminal; Ctrl-C stops it and keeps what came so far."""
        body: dict[str, Any] = {"model": self.model, "messages": self.conversation.messages(text)}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        reply: list[str] = []
        pieces = self.api.stream(body)
        try:
            for piece in pieces:
                reply.append(piece)
                self.out.write(printable(piece))
                self.out.flush()
            self.out.write("\n")
        except KeyboardInterrupt:
            self.out.write("\n[stopped]\n")
        except ChatError:
            if reply:
                self.out.write("\n")
            raise
        finally:
            pieces.close()  # when stopped: drop the connection now, so the server stops generating
        if reply:
            self.conversation.turns += [
                {"role": "user", "content": text},
                {"role": "assistant", "content": "".join(reply)},
            ]

    def command(self, line: str) -> bool:
        """Run a /command; False when it is /exit."""
        name, _, rest = line.partition(" ")
        if name in ("/exit", "/bye", "/quit"):
            return False
        if name == "/reset":
            self.conversation.turns.clear()
            self.out.write("conversation forgotten\n")
        elif name == "/system":
            self.conversation.system = rest.strip()
            self.out.write("system prompt set\n" if self.conversation.system else "system prompt cleared\n")
        else:
            self.out.write(f"unknown command {printable(name)}\n{HELP}\n")
        return True


def api_key(given: str | None, stdin: TextIO) -> str:
    key = given or os.environ.get(KEY_VARIABLE, "")
    if not key and stdin.isatty():
        key = getpass.getpass("API key: ")
    if not key.strip():
        raise ChatError(f"an API key is needed: --key, {KEY_VARIABLE}, or type it when asked", fatal=True)
    return key.strip()


def run(base_url: str, key: str | None, max_tokens: int | None = None, temperature: float | None = None) -> int:
    """The chat loop on this terminal; 0 when the user leaves, 1 when the appliance refuses to go on."""
    out, err = sys.stdout, sys.stderr
    # Ctrl-C stops a reply even when the chat was started with SIGINT ignored (from a script's background job,
    # which Python then leaves ignored): the terminal's user is the one to decide.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        api = Api(base_url, api_key(key, sys.stdin))
        chat = Chat(api, api.model(), out, max_tokens, temperature)
    except ChatError as exc:
        print(f"appliance: {exc}", file=err)
        return 1
    except KeyboardInterrupt:  # while asked for the key, or while the server is slow to answer
        out.write("\n")
        return 130
    if sys.stdin.isatty():
        import readline  # noqa: F401  # line editing and history for input()
    out.write(f"chatting with {printable(chat.model)} at {api.base_url}; /help lists the commands\n")
    while True:
        try:
            line = input(PROMPT).strip()
        except EOFError:
            out.write("\n")
            return 0
        except KeyboardInterrupt:
            out.write("\n(/exit or Ctrl-D leaves)\n")
            continue
        if not line:
            continue
        if line.startswith("/") and not line.startswith("//"):
            if line in ("/help", "/?"):
                out.write(HELP + "\n")
            elif not chat.command(line):
                return 0
            continue
        try:
            chat.say(line.removeprefix("/"))
        except ChatError as exc:
            print(f"appliance: {exc}", file=err)
            if exc.fatal:
                return 1
