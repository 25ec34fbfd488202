"""An input surface whose values the simulator holds as float32 beside its fp16 bits: written by blocks,
read by the plan in place.

A dynamic kernel's input set (``Kernel.input_set``) keeps a layer's weights between runs and has only
its activation columns rewritten before each run (``Surface.write_block``). The plan computes on float32
arrays, so a plain fp16 surface would be decoded whole on every run, weights included, and scanned for
the engine's input NaN coercion. A ``HeldSurface`` instead keeps ``values``: the float32 value of every
element of the surface, each block rounded to fp16 once when it is written (the same rounding the
surface's fp16 store makes, so ``values`` is exactly what decoding the surface would give), its NaN count
and largest magnitude kept per block. The plan reads ``values`` as they are (``SimKernel._run``): no
decode, no copy, no scan.

The fp16 bits are made from ``values`` only when someone looks at them (``view``, ``read``); a caller
that writes through ``view`` or ``write`` changes the bits, and ``values`` is decoded again from them
before the next run or block write, so every way of writing a surface still works.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anekit import jit, pages
from anekit.fp16 import round_to_fp16
from anekit.runtime.base import Surface, _LockedView
from anekit.runtime.sim.kept import ColumnLog

# Blocks whose NaN counts and peaks are kept one by one: past this many (a generation cache written a
# column at a time) they are counted again as one, from the values.
MAX_BLOCKS = 64


class HeldSurface(Surface):
    """An fp16 [1, C, 1, W] surface whose float32 values are held beside its bits (module docstring)."""

    def __init__(self, shape: tuple[int, ...], dtype: str = "fp16", name: str = "") -> None:
        super().__init__(shape, dtype, name)
        # the decoded value of every element; its pages mapped now (``anekit.pages``): the weights and
        # activations written next cover most of it
        self.values = pages.zeros(self.shape, np.float32)
        self._bits_stale = False  # ``values`` holds blocks the bits do not have yet
        self._values_stale = False  # the bits were written directly: ``values`` must be decoded again
        # (row, column, rows, columns) -> (NaNs, largest |value|) of each block written; the whole surface
        # under one key after a decode. Zeros (the fresh surface) have neither.
        self._blocks: dict[tuple[int, int, int, int], tuple[int, float]] = {}
        # the columns each write touched, for the plans that keep values moved out of columns of it
        # (``runtime.sim.kept``): a block's own columns, every column for a write through the bits
        self.changes = ColumnLog(self.spatial)

    # -- the held values ----------------------------------------------------------------------------

    def held(self) -> tuple[np.ndarray, int, float]:
        """(the float32 values, read-only; how many are NaN; the largest |value| of the others) as the
        surface holds them now."""
        with self._lock:
            self._decode_if_stale()
            nans = sum(n for n, _ in self._blocks.values())
            peak = max((p for _, p in self._blocks.values()), default=0.0)
            out = self.values.view()
            out.flags.writeable = False  # the plan's input: no step writes into it
            return out, nans, peak

    def _decode_if_stale(self) -> None:
        if self._values_stale:
            np.copyto(self.values, self._data, casting="unsafe")  # fp16 -> float32, exact
            self._blocks = {(0, 0, self.channels, self.spatial): _nan_peak(self.values)}
            self._values_stale = False

    def _encode_if_stale(self) -> None:
        if self._bits_stale:
            with np.errstate(over="ignore"):  # fp16 values: the cast is exact (inf stays inf)
                np.copyto(self._data, self.values, casting="unsafe")
            self._bits_stale = False

    # -- writes -------------------------------------------------------------------------------------

    def write_block(self, block: Any, row: int = 0, column: int = 0) -> None:
        """``Surface.write_block``: the block rounded to fp16 values once, into ``values``; the bits follow
        when they are next looked at."""
        a = np.asarray(block, dtype=np.float32)
        self._check_block(a, row, column)
        rows, cols = a.shape
        with self._lock:
            self._decode_if_stale()
            grid = self.values.reshape(self.channels, self.spatial)
            # one compiled pass where it serves (rounded, stored and scanned together), else three: the
            # same values and counts either way
            found = jit.round_block_into(a, grid, row, column)
            if found is None:
                rounded = round_to_fp16(a)  # (rows, columns) fp16 values in float32, in a's memory order
                found = _nan_peak(rounded)
                grid[row : row + rows, column : column + cols] = rounded
            key = (row, column, rows, cols)
            if len(self._blocks) >= MAX_BLOCKS:  # many small blocks (a cache's columns): one again
                self._blocks = {(0, 0, self.channels, self.spatial): _nan_peak(self.values)}
            covered = [k for k in self._blocks if _inside(k, key)]
            for k in covered:  # blocks written over entirely no longer count
                del self._blocks[k]
            self._blocks[key] = found
            self._bits_stale = True
            self.changes.changed(column, column + cols)

    def write(self, array: Any, ch_offset: int = 0) -> None:
        with self._lock:
            self._encode_if_stale()
        super().write(array, ch_offset)
        with self._lock:
            self._values_stale = True
            self.changes.changed(0, self.spatial)

    def read(self, ch_offset: int = 0, channels: int | None = None) -> np.ndarray:
        with self._lock:
            self._encode_if_stale()
        return super().read(ch_offset, channels)

    def view(self) -> _LockedView:
        """The fp16 buffer (made up to date first); the values are decoded again before the next use,
        since the caller may write through it."""
        return _HeldView(self)


class _HeldView(_LockedView):
    """``view`` of a held surface: the bits brought up to date on entry, the values marked stale."""

    __slots__ = ()

    def __enter__(self) -> np.ndarray:
        surface = self.surface
        assert isinstance(surface, HeldSurface)
        buf = super().__enter__()
        surface._encode_if_stale()
        surface._values_stale = True
        surface.changes.changed(0, surface.spatial)  # the caller may write anywhere through it
        return buf


def _inside(inner: tuple[int, int, int, int], outer: tuple[int, int, int, int]) -> bool:
    """Whether block ``inner`` (row, column, rows, columns) lies within ``outer``."""
    r, c, nr, nc = inner
    top, left, height, width = outer
    return r >= top and r + nr <= top + height and c >= left and c + nc <= left + width


def _nan_peak(x: np.ndarray) -> tuple[int, float]:
    """(NaNs in float32 ``x``, the largest |value| of the others, inf included)."""
    found = jit.nan_peak(x) if x.flags.c_contiguous or x.flags.f_contiguous else None
    if found is None:
        nan = np.isnan(x)
        n = int(np.count_nonzero(nan))
        peak = float(np.max(np.abs(x), initial=0.0, where=~nan)) if x.size else 0.0
        return n, peak
    return found
