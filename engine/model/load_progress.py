"""A model load's progress as log lines: library progress bars become percentage lines when stderr is not a
terminal (a journal or a file keeps every carriage-return redraw on one endless line), a long step that has no
bar of its own says every few seconds that it is still running, and a step that fails says which step it was."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import auto as tqdm_auto
from transformers import modeling_gguf_pytorch_utils as gguf_utils
from transformers.utils import logging as hf_logging

from engine.errors import ModelLoadError

Progress = Callable[[str], None]

BAR_INTERVAL_S = 5.0  # at most one line per bar this often, besides its first and last
HEARTBEAT_S = 5.0
BAR_FORMAT = "{desc}: {percentage:3.0f}% ({n_fmt}/{total_fmt}, {elapsed} elapsed)"


class _Lines:
    """A file for tqdm that hands each redraw to `report` as one line, skipping blanks and repeats (tqdm draws
    the final state again when it closes)."""

    def __init__(self, report: Progress) -> None:
        self._report = report
        self._last = ""

    def write(self, text: str) -> int:
        line = text.strip("\r\n ")
        if line and line != self._last:
            self._last = line
            self._report(line)
        return len(text)

    def flush(self) -> None:
        """Lines are handed over whole; there is nothing to flush."""


@contextmanager
def bars_as_lines(report: Progress) -> Iterator[None]:
    """While the block runs, transformers' progress bars report through `report` unless stderr is a terminal."""
    if sys.stderr.isatty():
        yield
        return
    as_lines = {"file": _Lines(report), "mininterval": BAR_INTERVAL_S, "bar_format": BAR_FORMAT, "ascii": True}

    def hook(factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if factory is not tqdm_auto.tqdm:  # bars disabled (HF_HUB_DISABLE_PROGRESS_BARS): stay silent
            return factory(*args, **kwargs)
        return factory(*args, **{**kwargs, **as_lines})

    previous = hf_logging.set_tqdm_hook(hook)
    # The GGUF converter calls tqdm.auto directly, past transformers' hook: for the block's duration (a load runs
    # on one thread) its module's name points at transformers' own wrapper, which honours the hook.
    gguf_tqdm = gguf_utils.tqdm
    gguf_utils.tqdm = hf_logging.tqdm
    try:
        yield
    finally:
        gguf_utils.tqdm = gguf_tqdm
        hf_logging.set_tqdm_hook(previous)


@contextmanager
def heartbeat(report: Progress, what: str, every: float = HEARTBEAT_S) -> Iterator[None]:
    """Report `what` at the start, "still <what> (N s)" every `every` seconds, and how long it took."""
    started = time.monotonic()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every):
            report(f"still {what} ({time.monotonic() - started:.0f} s)")

    report(f"{what} …")
    thread = threading.Thread(target=beat, name="load-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    report(f"{what}: done in {time.monotonic() - started:.0f} s")


@contextmanager
def step(what: str) -> Iterator[None]:
    """Turn whatever a library raises during one step into a ModelLoadError that names the step."""
    try:
        yield
    except ModelLoadError:
        raise
    except Exception as exc:  # torch, transformers, gguf and bitsandbytes raise many unrelated types
        raise ModelLoadError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
