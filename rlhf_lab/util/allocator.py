"""Keep the memory a training step frees for the next step (glibc's malloc, on Linux).

Every RL step allocates and frees the same tensors of a few hundred KiB: activations, their
gradients, logits. By default glibc gives such memory back to the system: a block over
M_MMAP_THRESHOLD (128 KiB at first) is a fresh mmap, unmapped when freed, and the top of the heap is
trimmed whenever more than M_TRIM_THRESHOLD is free. Memory handed back comes back zeroed, one 4 KiB
page fault at a time, so the next step pays for it again (bench/RESULTS.md, "RL step time", measures
it). Raising both thresholds keeps the freed memory in the process, where the next step
reuses it. The price: up to TRIM_THRESHOLD_BYTES of freed memory stays with the process instead of
returning to the system. Numbers are unchanged; only where memory comes from.

This is what PyTorch's CPU performance guide gets from swapping in jemalloc or tcmalloc, done with
glibc's own `mallopt` (the MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ environment variables
set the same two numbers at start-up).
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (glibc's malloc.h)
MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's largest allowed value on 64-bit (4 MiB * sizeof(long))
TRIM_THRESHOLD_BYTES = 64 * 2**20
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory(trim_threshold_bytes: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Set glibc's mmap and trim thresholds so that freed memory stays in the process (see above).

    Returns True when they were set. Does nothing and returns False off Linux, without glibc, or when
    the environment sets either threshold itself: the user's choice wins (to keep glibc's behaviour,
    start Python with MALLOC_TRIM_THRESHOLD_=131072, its default). Calling it again with the same
    threshold changes nothing. `trim_threshold_bytes`: how much freed memory may stay (a profiler that
    reserves more heap than the default keeps, bench/profile_step.py, raises it).
    """
    if not sys.platform.startswith("linux") or any(name in os.environ for name in ENVIRONMENT):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # another C library (musl): leave it alone
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(
        M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) & bool(mallopt(M_TRIM_THRESHOLD, trim_threshold_bytes))
