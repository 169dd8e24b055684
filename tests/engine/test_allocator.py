"""The engine process raises glibc's malloc thresholds (engine.cpu.allocator) where it runs on glibc."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_thresholds_take_on_glibc() -> None:
    # In a child: the setting is process-wide and would outlive the test here.
    code = "from engine.cpu.allocator import keep_freed_memory; raise SystemExit(0 if keep_freed_memory() else 1)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
