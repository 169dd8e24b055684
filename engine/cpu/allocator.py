"""glibc's malloc told to keep a step's large temporaries: without it a CPU step pays page faults on every one.

glibc serves an allocation above its mmap threshold (128 KiB at start, raised to the size of what was last freed,
up to 32 MiB) with a fresh mmap, which the kernel zero-fills page by page on first touch, and unmaps it on free; and
it returns free memory at the heap's top to the system past a trim threshold. A decode step's temporaries are
megabytes each (the sampler's fp32 logits alone are 25 MB at 128 rows of the bundled model's 49,152 words), and
their sizes change from step to step, so the dynamic threshold keeps missing and every step faults its
temporaries in again. Measured on a 2-core EPYC, one thread, bundled model: temperature sampling of 128 rows
37-40 -> 15-16 ms; a decode step of 64 requests of long-tailed contexts in one padded group 1,290-1,560 ->
440-490 ms.

With both thresholds raised the freed blocks stay in the heap and the next step reuses them; the process keeps up
to TRIM_THRESHOLD of free heap it no longer needs. Only on glibc (elsewhere nothing happens).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 20  # above a step's largest temporary (an 8B model's logits: 256 rows x 128k x 4 B)
TRIM_THRESHOLD = 512 << 20

log = logging.getLogger("engine.cpu.allocator")


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True when it took."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    took = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if took:
        log.debug(
            "malloc keeps freed blocks up to %d MiB and trims past %d MiB", MMAP_THRESHOLD >> 20, TRIM_THRESHOLD >> 20
        )
    return took
