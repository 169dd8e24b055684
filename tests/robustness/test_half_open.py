"""Half-open connections from one LAN host (issue 17, S1): sockets that never finish their request must not take
the server away from everyone else, and the server closes them itself. Loopback only, bounded in count and time."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.web.server import Server, start_server

# systemd's default soft limit when a unit sets no LimitNOFILE=, and the count: just above it.
DEFAULT_SOFT_LIMIT = 1024
HALF_OPEN = 1100


@contextmanager
def open_file_soft_limit(soft: int) -> Iterator[None]:
    """Run the block (and so what it starts) with this soft limit on open files, then put it back."""
    old_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (old_soft, hard))


@pytest.fixture(autouse=True)
def room_for_the_sockets() -> None:
    """This process holds every half-open socket itself: raise its own soft limit, or skip where it cannot."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = HALF_OPEN + 200
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the hard limit on open files ({hard}) leaves no room for {HALF_OPEN} sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))


def started(tmp_path: Path, **settings: str) -> Server:
    with open_file_soft_limit(DEFAULT_SOFT_LIMIT):
        server = start_server(tmp_path, **settings)
    server.wait_ready()
    return server


def half_open(stack: ExitStack, server: Server, count: int) -> list[socket.socket]:
    """`count` connections that each sent half a request line and then nothing."""
    port = int(server.url.rsplit(":", 1)[1])
    sockets = []
    for _ in range(count):
        sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
        sock.sendall(b"GET /hea")
        sockets.append(sock)
    return sockets


def test_half_open_connections_leave_health_answering(tmp_path: Path) -> None:
    server = started(tmp_path)
    try:
        with ExitStack() as stack:
            half_open(stack, server, HALF_OPEN)
            response = httpx.get(server.url + "/health", timeout=10)
            assert response.status_code == 200
    finally:
        server.kill()


def closed_by_the_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes this connection (after any answer of its own) within `within` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def ask_health(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body): the server may send them in two writes, and a partial
    read would leave the body to be taken for the next request's answer."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: appliance\r\n\r\n")
    response = b""
    while b"\r\n\r\n" not in response:
        chunk = sock.recv(4096)
        if not chunk:
            return response
        response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_the_server_closes_what_never_finishes_and_keeps_idle_connections(tmp_path: Path) -> None:
    timeout = 2.0
    server = started(tmp_path, max_connections="100", request_read_timeout=str(timeout))
    port = int(server.url.rsplit(":", 1)[1])
    try:
        with ExitStack() as stack:
            idle = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
            assert ask_health(idle).startswith(b"HTTP/1.1 200")
            body = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
            body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: appliance\r\nContent-Length: 100\r\n\r\n{")
            # Past the cap: a newcomer replaces the oldest idle connection, so the server keeps answering.
            stalled = half_open(stack, server, 150)
            assert httpx.get(server.url + "/health", timeout=10).status_code == 200
            assert closed_by_the_server(idle, 1)
            started_at = time.monotonic()
            assert all(closed_by_the_server(sock, timeout + 5) for sock in [*stalled, body])
            assert time.monotonic() - started_at < timeout + 5
        with socket.create_connection(("127.0.0.1", port), timeout=10) as kept:
            assert ask_health(kept).startswith(b"HTTP/1.1 200")
            time.sleep(timeout + 1)  # idle between requests is the keep-alive timeout's (75 s), not the deadline's
            assert ask_health(kept).startswith(b"HTTP/1.1 200")
    finally:
        server.kill()
