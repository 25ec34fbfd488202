"""anekit.pages: zeroed arrays mapped at once, values untouched; the allocator told to keep freed memory.

Whether the pages are mapped is read from the process's resident memory (``/proc/self/status``), which
grows by an array's size when its pages are mapped and not when ``np.zeros`` only reserves them.
"""

from __future__ import annotations

import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anekit import pages

linux_only = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="resident memory is read from Linux's /proc"
)


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def test_zeros_are_zeros_of_the_shape_and_dtype_asked_for() -> None:
    for shape, dtype in (((3, 5), np.float32), ((1 << 19,), np.float32), ((512, 1024), np.float64)):
        a = pages.zeros(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        assert not a.any()


def fresh_memory(size: int) -> np.ndarray:
    """``size`` bytes of anonymous memory mapped just now, none of it touched: unlike an allocation, which
    may reuse memory the process freed before (and so is resident already)."""
    return np.frombuffer(mmap.mmap(-1, size), np.uint8)


@linux_only
def test_populating_maps_the_pages_of_untouched_memory_and_an_untouched_mapping_has_none() -> None:
    size = 64 << 20
    before = resident_bytes()
    untouched = fresh_memory(size)
    lazy_growth = resident_bytes() - before  # the reference: a fresh mapping holds no pages yet
    target = fresh_memory(size)
    before = resident_bytes()
    done = pages.populate(target)
    growth = resident_bytes() - before
    if not done and not pages._works:
        pytest.skip("this kernel refuses MADV_POPULATE_WRITE (Linux 5.14 and later have it)")
    assert done
    assert lazy_growth < size // 8
    assert growth > size * 7 // 8
    assert not target.any() and not untouched.any()


def test_zeros_populates_large_arrays_and_leaves_small_ones_to_the_heap(monkeypatch) -> None:
    asked: list[int] = []
    monkeypatch.setattr(pages, "populate", lambda a: asked.append(a.nbytes) or True)
    pages.zeros((1024, 1024), np.float32)  # 4 MiB
    pages.zeros((100, 100), np.float32)  # 40 kB: under POPULATE_MIN_BYTES
    assert asked == [4 << 20]


@linux_only
def test_populating_an_array_leaves_what_it_holds() -> None:
    a = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    want = a.copy()
    pages.populate(a)
    np.testing.assert_array_equal(a, want)
    strided = a[::2]  # not one block of memory: declined
    assert pages.populate(strided) is False
    np.testing.assert_array_equal(a, want)


@linux_only
def test_the_allocator_takes_both_settings_on_glibc() -> None:
    if "glibc" not in " ".join(__import__("platform").libc_ver()):
        pytest.skip("the tunings are glibc's")
    code = "from anekit import pages; import numpy as np; print(pages.keep_freed_memory()); np.ones(1 << 24)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
