"""A worker entry point (engine.worker) whose module imports triton, as the engine's does through torch's
compiler: for tests/engine/test_worker.py."""

from __future__ import annotations

from typing import Any

import triton  # noqa: F401  (imported before the worker freezes its heap, as the engine's imports are)


def run(config: Any, inbox: Any, outbox: Any) -> None:
    """Nothing to do: the worker ends as soon as it has started."""
