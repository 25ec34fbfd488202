"""IOSurface-backed surfaces: the ``Surface`` API over engine memory, and how big each one is allocated.

A surface is one IOSurface row (width = bytes-per-row = alloc size, height 1, 1 byte per element,
pixel format 0), as maderix/ANE training/ane_runtime.h and mechramc/Orion core/iosurface_tensor.m
create them. The tensor is PACKED at the start of the surface, row-major ([1, C, 1, S]: channel c at
byte c * S * itemsize), whatever the allocation size: the engine reads the first C * S values of the
flat buffer and uses no stride (mechramc/Orion docs/ane_constraints.md §14, rule surface.packed-data).
Reads hold a read-only IOSurface lock, writes and ``view()`` a read-write one; the numpy arrays are
views of the surface memory (zero-copy).

Allocation sizes (``uniform_allocation``), per direction of one kernel:

* every input surface gets the same allocation size, the largest any input needs; likewise every
  output surface. Different sizes fail at evaluation with "ANEProgramProcessRequestDirect() Failed
  with status=0x1d" (Orion docs/ane_constraints.md §12 for inputs, §2 for outputs; rules
  surface.uniform-input-size, surface.uniform-output-size);
* at least MIN_SURFACE_BYTES: Orion §4 saw status 0x1d below ~48 KB on M4 Max, while maderix ran
  smaller kernels (the book reads Orion's failures as rule surface.min-row-bytes); padding is free since
  data is packed, so
  every surface is padded up to it;
* a multiple of SURFACE_ALIGNMENT (reported for M5; harmless elsewhere).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence

import numpy as np

from anekit.errors import SurfaceCreationFailed
from anekit.runtime.ane.objc import ObjCRuntime
from anekit.runtime.base import Surface

MIN_SURFACE_BYTES = 49152  # Orion docs/ane_constraints.md §4 ([768, 16] fp32): the allocation floor
SURFACE_ALIGNMENT = 128  # reported requirement on M5; harmless on earlier chips


def align(n: int) -> int:
    """``n`` rounded up to a multiple of SURFACE_ALIGNMENT."""
    return -(-n // SURFACE_ALIGNMENT) * SURFACE_ALIGNMENT


def uniform_allocation(nbytes: Sequence[int]) -> int:
    """The one allocation size for every surface of a direction (inputs, or outputs) of a kernel.

    Rules surface.uniform-input-size / surface.uniform-output-size (Orion §12, §2): the largest tensor
    of the direction decides, at least MIN_SURFACE_BYTES, rounded up to SURFACE_ALIGNMENT.
    """
    return align(max([MIN_SURFACE_BYTES, *nbytes]))


class SurfaceLock:
    """The surface's mutex plus IOSurfaceLock / IOSurfaceUnlock; maps the memory as ``surface._data``."""

    def __init__(self, surface: AneSurface, mutex: threading.Lock, read_only: bool) -> None:
        self.surface = surface
        self.mutex = mutex
        self.read_only = read_only

    def __enter__(self) -> None:
        self.mutex.acquire()
        try:
            self.surface._map(self.read_only)
        except BaseException:
            self.mutex.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.surface._unmap(self.read_only)
        finally:
            self.mutex.release()


class AneSurface(Surface):
    """A Surface whose memory is an IOSurface: same API, numpy views of the surface under its lock.

    ``ref`` is the IOSurfaceRef, ``id`` its IOSurfaceGetID, ``nbytes`` the tensor's bytes and
    ``alloc_size`` the (larger) allocation. ``close()`` releases it; it cannot be used afterwards.
    """

    def __init__(
        self, runtime: ObjCRuntime, shape: tuple[int, ...], dtype: str, name: str, alloc_bytes: int
    ) -> None:
        super().__init__(shape, dtype, name)  # validates; its zero buffer is replaced below
        count = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        self._count = count
        self._nbytes = count * self.dtype.np.itemsize
        self._rt = runtime
        self.ref = runtime.iosurface_create(max(alloc_bytes, self._nbytes))
        self.alloc_size = int(runtime.call("IOSurfaceGetAllocSize", self.ref))
        self.id = int(runtime.call("IOSurfaceGetID", self.ref))
        mutex = threading.Lock()
        self._lock = SurfaceLock(self, mutex, read_only=False)  # type: ignore[assignment]
        self._read_lock = SurfaceLock(self, mutex, read_only=True)
        self._data = None  # type: ignore[assignment]  # mapped only while locked

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def _map(self, read_only: bool) -> None:
        if not self.ref:
            raise SurfaceCreationFailed(f"[surface] {self.name}: the IOSurface was released (kernel closed)")
        self._rt.iosurface_lock(self.ref, read_only)
        try:
            base = self._rt.call("IOSurfaceGetBaseAddress", self.ref)
            if not base:
                raise SurfaceCreationFailed(f"[surface] {self.name}: IOSurfaceGetBaseAddress returned NULL")
            memory = (ctypes.c_char * self._nbytes).from_address(base)
            data = np.frombuffer(memory, dtype=self.dtype.np, count=self._count).reshape(self.shape)  # type: ignore[call-overload]
            if read_only:
                data.flags.writeable = False
            self._data = data
        except BaseException:
            self._rt.iosurface_unlock(self.ref, read_only)
            raise

    def _unmap(self, read_only: bool) -> None:
        self._data = None  # type: ignore[assignment]
        self._rt.iosurface_unlock(self.ref, read_only)

    def read(self, ch_offset: int = 0, channels: int | None = None) -> np.ndarray:
        """As ``Surface.read``, under a read-only IOSurface lock."""
        lo, hi = self._span(ch_offset, channels)
        with self._read_lock:
            rows = self._rows()[lo:hi]
            return rows.astype(np.float32) if self.dtype.is_float else rows.copy()

    def close(self) -> None:
        ref, self.ref = self.ref, 0
        self._rt.cf_release(ref)

    def __repr__(self) -> str:
        return (
            f"AneSurface(#{self.id} {self.name}: {self.dtype.name} {list(self.shape)}, {self.alloc_size} B)"
        )


def copy_surface(src: Surface, dst: Surface) -> None:
    """Copy the tensor of ``src`` into ``dst`` (same element count) on the host."""
    with src.view() as a:
        data = a.copy()
    with dst.view() as b:
        b[...] = data.reshape(b.shape)
