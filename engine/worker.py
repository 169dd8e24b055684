"""The engine's worker processes (the engine core, the embedding model): `python -m engine.worker MODULE:FUNCTION
IN_FD OUT_FD`, fed a pickled config on its input pipe, then FUNCTION(config, inbox, outbox).

Not multiprocessing's spawn: that child first imports the parent's main module (the whole gateway, when the
parent is `appliance serve`: seconds of imports and a hundred MB it never uses). This one imports only the worker's
module, which imports torch itself.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import Any


class Worker:
    """A started worker process: what its client needs of it (the subset of multiprocessing.Process it used)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        """None while it runs; its exit status, or minus the signal that killed it."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def kill(self) -> None:
        if self._popen.poll() is None:
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        """Wait for it to end, at most `timeout` seconds (it may still run after)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)


def start_worker(entry: str, config: object) -> tuple[Worker, Connection, Connection]:
    """Start `entry` ("module:function") with `config`; the worker, the pipe to it and the pipe from it."""
    to_worker_r, to_worker_w = os.pipe()
    from_worker_r, from_worker_w = os.pipe()
    command = [sys.executable, "-m", "engine.worker", entry, str(to_worker_r), str(from_worker_w)]
    try:
        popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, pass_fds=(to_worker_r, from_worker_w))
    except BaseException:
        for fd in (to_worker_r, to_worker_w, from_worker_r, from_worker_w):
            os.close(fd)
        raise
    os.close(to_worker_r)
    os.close(from_worker_w)
    inbox, outbox = Connection(to_worker_w, readable=False), Connection(from_worker_r, writable=False)
    inbox.send(config)
    return Worker(popen), inbox, outbox


def main(argv: list[str]) -> None:
    entry, in_fd, out_fd = argv
    inbox, outbox = Connection(int(in_fd), writable=False), Connection(int(out_fd), readable=False)
    try:
        config: Any = inbox.recv()
    except EOFError:
        return  # the client went away before it sent the config
    module, _, function = entry.partition(":")
    entry_point = getattr(importlib.import_module(module), function)
    # What the imports made (torch, transformers: most of the process's objects) lives as long as the process:
    # frozen, no full collection walks it again. Unfrozen, the load ran a dozen such collections (0.2 s each, 1.7 s
    # of a random:tiny start here); one while serving would stall a step as long.
    gc.freeze()
    try:
        entry_point(config, inbox, outbox)
    finally:
        # Thawed for the interpreter's last collection: what stays frozen is never freed, and nanobind (triton's
        # bindings, which torch imports) then reports each of its objects as leaked, some thirty lines at every stop.
        gc.unfreeze()


if __name__ == "__main__":
    main(sys.argv[1:])
