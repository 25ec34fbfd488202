"""Keeps freed heap memory in the process (glibc): simulator runs do not fault their arrays in afresh.

A simulator plan allocates every op's output anew and frees them all when the run returns. glibc hands
the top of its heap back to the OS as soon as more than ``M_TRIM_THRESHOLD`` bytes are free there
(128 KiB at start; its dynamic mmap threshold raises it to twice the largest freed mmap chunk), so a
kernel whose intermediate arrays add up to more than that finds its heap trimmed at the end of every
run, and its next run touches fresh pages: one page fault per 4 KiB. On a small model the faults cost
more than the arithmetic — the default model's training step (benchmarks/bench_train.py) spent more
than half its time in them.

``keep_freed_memory`` sets the trim threshold to ``TRIM_THRESHOLD`` (freed memory up to that stays in the
process for the next run) and pins the mmap threshold at ``MMAP_THRESHOLD``, the upper bound of glibc's
dynamic threshold, because setting either parameter switches that dynamic adjustment off (mallopt(3),
M_MMAP_THRESHOLD: "Dynamic adjustment of the mmap threshold is disabled if any of the M_TOP_PAD,
M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, or M_MMAP_MAX parameters is set"; DEFAULT_MMAP_THRESHOLD_MAX is
4 * 1024 * 1024 * sizeof(long), 32 MiB on 64-bit systems). It changes where arrays are placed and when
memory is returned, never a value. Elsewhere than on glibc (macOS, musl) it does nothing;
``ANEKIT_KEEP_HEAP=0`` in the environment switches it off.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

M_TRIM_THRESHOLD = -1  # mallopt parameters (glibc malloc.h)
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 256 << 20  # freed memory kept at the top of the heap before glibc trims it
MMAP_THRESHOLD = 32 << 20  # allocations from this size on get their own mapping (glibc's dynamic maximum)

_lock = threading.Lock()
_done = False


def keep_freed_memory() -> bool:
    """Tune glibc's heap once per process as the module docstring says; True if it is (now or before)."""
    global _done
    with _lock:
        if _done:
            return True
        if os.environ.get("ANEKIT_KEEP_HEAP", "1").strip().lower() in ("0", "false", "no", "off"):
            return False
        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            return False
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            return False
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        )
        return _done
