"""The notify protocol's client: one datagram per message to a path or an abstract socket, nothing without
NOTIFY_SOCKET, and the watchdog interval read as systemd sets it."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from appliance.sdnotify import Notifier, watchdog_interval


def test_sends_one_datagram_to_a_socket_path(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(path))
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": str(path)})
        assert notifier.send("READY=1", "STATUS=serving")
        assert systemd.recv(1024) == b"READY=1\nSTATUS=serving"
        notifier.close()


def test_a_leading_at_sign_is_the_abstract_namespace() -> None:
    name = f"appliance-unit-{uuid.uuid4().hex[:8]}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind("\0" + name)
        notifier = Notifier("@" + name)
        assert notifier.send("WATCHDOG=1")
        assert systemd.recv(1024) == b"WATCHDOG=1"
        notifier.close()


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = Notifier.from_environment({})
    assert not notifier.enabled and not notifier.send("READY=1")


def test_a_vanished_socket_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier(str(tmp_path / "gone"))
    assert not notifier.send("WATCHDOG=1")
    assert "could not notify systemd" in caplog.text


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        ({"WATCHDOG_USEC": "60000000"}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "4242"}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_half_of_what_systemd_asks(environ: dict[str, str], interval: float | None) -> None:
    assert watchdog_interval(environ, pid=4242) == interval
