"""Large zeroed arrays whose memory pages are mapped when they are made, not one fault at a time.

``np.zeros`` of a large array takes fresh pages from the system, mapped lazily: each 4 KiB page costs a
page fault the first time it is written. Where page faults are dear (measured on this project's Linux
virtual machine: 120 MB of fresh float32 zeros written by ``fill`` in 136-141 ms, of which about 130 are
faults; the same 120 MB mapped first by ``madvise(MADV_POPULATE_WRITE)`` in 17-19 ms, then written in
5-6 ms), an array that is certain to be written whole soon (a training run's Adam moments and gradient
totals, a kernel's input set) is cheaper mapped at once. ``MADV_POPULATE_WRITE`` (Linux 5.14 and
later) maps the pages of a range as a write would, without changing what they hold, so it is safe on any
array, shared or not, at any time; memory that is already mapped is left as it is.

``zeros`` is ``np.zeros`` followed by that, for arrays of ``POPULATE_MIN_BYTES`` or more; elsewhere
(another system, an older kernel, no C library to call) it is ``np.zeros`` alone. The values are zeros
either way: only the moment the system does its part of the work changes.

``keep_freed_memory`` asks glibc's allocator to serve blocks up to ``HEAP_BLOCK_BYTES`` from its heap and
to keep what is freed there, instead of mapping each large block afresh and unmapping it when freed (its
default from 128 KiB up, until its dynamic threshold has risen past a size): a training step makes and
drops the same arrays every step, and from the heap they come back with their pages mapped. Measured on
stories15M (``anekit train``, 4 steps, two runs each way): the first optimizer step 32-44 ms instead of
110-121 ms, the steps after it unchanged. A process's memory then stays at its high-water mark (up to
``TRIM_BYTES`` more than it uses), which a training process reaches every step anyway; so only
``anekit train`` asks for it, not the library.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np

# Below this, an allocation comes from the C heap (glibc's mmap threshold starts at 128 KiB and rises to
# 32 MiB as large blocks are freed), whose pages are mostly mapped already: nothing to gain.
POPULATE_MIN_BYTES = 1 << 20
_MADV_POPULATE_WRITE = 23  # linux/mman.h
HEAP_BLOCK_BYTES = 64 << 20  # blocks below this come from the heap (a stories15M step's largest: 32 MB)
TRIM_BYTES = 512 << 20  # free memory at the heap's top kept up to this much
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h
_PAGE = 4096

_madvise: Any = None  # the C library's madvise, or False where there is none to call
_works = True  # False once the kernel has refused the advice (too old: EINVAL)


def _libc(name: str) -> Any:
    """The C library's function ``name`` on Linux (glibc's, where these tunings mean what they say), else
    None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None


def _libc_madvise() -> Any:
    global _madvise
    if _madvise is None:
        fn = _libc("madvise")
        if fn is not None:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
        _madvise = fn if fn is not None else False
    return _madvise


def keep_freed_memory() -> bool:
    """Have glibc serve blocks under ``HEAP_BLOCK_BYTES`` from its heap and keep up to ``TRIM_BYTES`` of
    freed memory (module docstring); True if it took both settings, False elsewhere (another C library,
    another system: nothing is changed there)."""
    mallopt = _libc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    took = mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES) == 1
    return took and mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES) == 1


def populate(a: np.ndarray) -> bool:
    """Map every whole page of ``a``'s memory for writing now (its values unchanged); True if the system
    did. Only C- or Fortran-ordered arrays (one block of memory); nothing for others."""
    global _works
    if not _works or not (a.flags.c_contiguous or a.flags.f_contiguous) or a.nbytes < _PAGE:
        return False
    madvise = _libc_madvise()
    if not madvise:
        return False
    start = (a.ctypes.data + _PAGE - 1) // _PAGE * _PAGE
    end = (a.ctypes.data + a.nbytes) // _PAGE * _PAGE
    if end <= start:
        return False
    if madvise(start, end - start, _MADV_POPULATE_WRITE) != 0:
        _works = False  # an older kernel (EINVAL) or a system that refuses it: not asked again
        return False
    return True


def zeros(shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """``np.zeros(shape, dtype)``, its pages mapped at once when it is large (module docstring)."""
    a = np.zeros(shape, dtype)
    if a.nbytes >= POPULATE_MIN_BYTES:
        populate(a)
    return a
