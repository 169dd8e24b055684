"""Logging set-up for the server and the engine process alike: when stderr is the journal (systemd says so in
JOURNAL_STREAM), each line carries its syslog priority (<3> error ... <7> debug) and no timestamp, which journald
adds itself; elsewhere, plain timestamped lines."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

LEVELS = ("debug", "info", "warning", "error")
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JOURNAL_FORMAT = "%(name)s: %(message)s"


def journal_priority(levelno: int) -> int:
    """sd-daemon(3)'s priorities: 2 critical, 3 error, 4 warning, 6 info, 7 debug."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    return 6 if levelno >= logging.INFO else 7


class JournalFormatter(logging.Formatter):
    """Every line gets the prefix, so that a traceback's lines are errors in the journal too."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{journal_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


def stderr_is_journal(stream: TextIO | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """systemd sets JOURNAL_STREAM=<device>:<inode> of the stream it connected; a child whose stderr was
    redirected elsewhere inherits the variable, hence the comparison with stderr itself (systemd.exec(5))."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    try:
        stat = os.fstat((stream or sys.stderr).fileno())
        return (stat.st_dev, stat.st_ino) == (int(device), int(inode))
    except (ValueError, OSError):
        return False


def no_hub_kernel_hint(record: logging.LogRecord) -> bool:
    """False for bitsandbytes' warning, at every 4-bit start on a CPU, that its optional `kernels` package is
    missing: that package fetches compiled code from the Hugging Face Hub at run time, which the appliance never
    does (it runs offline), and bitsandbytes computes with its own CPU code without it. The hint asks the operator
    to install it: advice to ignore, in the log of every start."""
    return "kernels-community" not in record.getMessage()


def configure_logging(level: str) -> None:
    """Root logging to stderr at `level` (one of LEVELS), in the journal's form when stderr is the journal."""
    handler = logging.StreamHandler()
    journal = stderr_is_journal()
    handler.setFormatter(JournalFormatter(JOURNAL_FORMAT) if journal else logging.Formatter(PLAIN_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(no_hub_kernel_hint)
