"""An fp16 input surface kept decoded between runs: only the elements the host changed are decoded again.

A generation kernel's "cache" input is large (every layer's keys and values over the whole context) and
the host changes a few of its columns between runs (``Surface.view``, in place). Decoding the whole
surface to float32 on every run, and scanning it for the engine's input NaN coercion, cost more than the
kernel's work at decode sizes; ``Mirror.refresh`` compares the surface's half patterns with those it last
decoded, block by block of ``BLOCK`` patterns, and decodes only the ones that differ
(``_jit_loops.refresh_fp16_mirror``). The NaN count and the largest magnitude the engine's input coercion
needs are kept per block and read again only in a block that changed (a decode step changes one column of
the cache: one element in each row). Its values are the surface's decoded exactly as the plan's fp16 input
store decodes them (``astype(np.float32)``, the table is that cast of every pattern).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anekit import jit
from anekit.runtime.sim.kept import ColumnLog

# Below this many elements a plain decode costs less than keeping a second copy.
MIRROR_FROM = 1 << 16
# Half patterns compared as one block: a row of a decode cache (hundreds of slots) spans several, so the
# column a step writes marks a few blocks of each row changed, not every one.
BLOCK = 16
_F16 = np.dtype(np.float16)
_TABLE: np.ndarray | None = None


def decode_table() -> np.ndarray:
    """The float32 value of every half pattern (the plan's fp16 input store, element by element)."""
    global _TABLE
    if _TABLE is None:
        _TABLE = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    return _TABLE


class Mirror:
    """One fp16 surface's buffer decoded to float32, with the patterns it was decoded from."""

    def __init__(self, buf: np.ndarray, loops: Any) -> None:
        self.loops = loops
        self.seen = buf.reshape(-1).view(np.uint16).copy()
        self._flat = buf.astype(np.float32, order="C").reshape(-1)  # the store's values and layout
        self.values = self._flat.reshape(buf.shape).view()
        self.values.flags.writeable = False  # the plan's input: no step writes into it
        blocks = -(-self.seen.size // BLOCK)
        self._nans = np.zeros(blocks, np.int64)  # per block of ``seen``: its NaNs and largest magnitude
        self._peaks = np.zeros(blocks, np.uint16)
        loops.block_stats(self.seen, self._nans, self._peaks, BLOCK)
        self.nans = int(self._nans.sum())
        self.peak = float(decode_table()[int(self._peaks.max(initial=0))])
        self.worth = True  # whether keeping it pays (``refresh``)
        # the columns each refresh changed, for the plans that keep values moved out of columns of it
        # (``runtime.sim.kept``)
        self.changes = ColumnLog(int(buf.shape[-1]) if buf.ndim else 1)

    def refresh(self, buf: np.ndarray) -> bool:
        """Bring the values up to ``buf`` (the surface's buffer, of the mirrored shape); False when it holds
        a NaN, which the engine coerces (the caller then takes the plain way). ``worth`` turns False when
        more than half of the surface changed: a surface rewritten whole between runs (a training step's
        packed weights) gains nothing from a second copy."""
        width = int(buf.shape[-1]) if buf.ndim else 1
        changed, nans, peak, lo, hi = self.loops.refresh_fp16_mirror(
            buf.reshape(-1).view(np.uint16),
            self.seen,
            self._flat,
            decode_table(),
            self._nans,
            self._peaks,
            BLOCK,
            width,
        )
        if changed:
            self.changes.changed(int(lo), int(hi))
        self.worth = 2 * int(changed) <= self.seen.size
        self.nans, self.peak = int(nans), float(decode_table()[peak])
        return self.nans == 0


def mirror_for(buf: np.ndarray, have: Mirror | None) -> Mirror | None:
    """The mirror of an fp16 surface's buffer (``have`` when it is one of the same shape), or None when
    the surface is small, not fp16 or the compiled loops are not in use."""
    loops = jit.loops()
    if loops is None or buf.dtype != _F16 or buf.size < MIRROR_FROM or not buf.flags.c_contiguous:
        return None
    if have is not None and have.values.shape == buf.shape and have.loops is loops:
        return have
    return Mirror(buf, loops)
