"""systemd's notify protocol without a dependency: one datagram per message to $NOTIFY_SOCKET (READY=1,
WATCHDOG=1, STOPPING=1, STATUS=...), and the watchdog interval systemd asks for."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("appliance.sdnotify")


class Notifier:
    """Sends to the socket systemd named; without one (not under systemd) every send is a no-op."""

    def __init__(self, address: str | None) -> None:
        self.address = address or None
        self._socket: socket.socket | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        return cls(env.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *assignments: str) -> bool:
        """Send "KEY=value" lines as one message; False (logged once per failure) when it could not be sent."""
        if self.address is None:
            return False
        # A leading @ names a socket in the abstract namespace, which starts with a NUL byte.
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._socket.sendto("\n".join(assignments).encode(), target)
        except OSError as exc:
            log.warning("could not notify systemd at %s: %s", self.address, exc)
            return False
        return True

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def watchdog_interval(environ: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC, as systemd advises), or None when no watchdog
    is asked for this process (unset, zero, malformed, or WATCHDOG_PID names another process)."""
    env = os.environ if environ is None else environ
    watchdog_pid = env.get("WATCHDOG_PID")
    if watchdog_pid and watchdog_pid != str(os.getpid() if pid is None else pid):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None
