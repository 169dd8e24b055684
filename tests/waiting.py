"""Waiting for a state instead of for a time: on a loaded 2-core box (two lanes, one of them niced) a fixed sleep
may end before a request has reached the point a test means."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll `check` (without blocking the loop between polls) until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)
    return value
