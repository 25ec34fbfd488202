"""Optional compiled loops for the simulator's hot paths, with numpy as the fallback.

With numba installed (``pip install -e '.[fast]'`` in the checkout) the fp16 rounding of every stored
value and the encoding of fp16 surfaces run as one compiled pass per array (``anekit._jit_loops``)
instead of several numpy passes; without it, or with ``ANEKIT_JIT=0`` in the environment, every function
here returns False and the caller takes its numpy path. Both paths give the same bits (tests compare
them), so the choice changes speed only, never a result.

numba is imported on first use, not when anekit is imported: commands that never touch large arrays
start as fast as before. The loops take 1-d views in memory order (``flat``), so a C- or Fortran-ordered
array of any rank uses one compiled signature.
"""

from __future__ import annotations

import os
import threading
from types import ModuleType

import numpy as np

_lock = threading.Lock()
_loops: ModuleType | None = None
_tried = False


def _load() -> ModuleType | None:
    global _loops, _tried
    if _tried:
        return _loops
    with _lock:
        if not _tried:
            if os.environ.get("ANEKIT_JIT", "1").strip().lower() not in ("0", "false", "no", "off"):
                loops: ModuleType | None
                try:
                    from anekit import _jit_loops as loops
                except Exception:  # numba absent, broken, or with nowhere to cache: the numpy paths serve
                    loops = None
                _loops = loops
            _tried = True
    return _loops


def loops() -> ModuleType | None:
    """The compiled loops module itself (None when not in use), for callers that check their own arrays."""
    return _load()


def preload() -> None:
    """Import numba and load from its cache the loops a training step calls (``_jit_loops.step_signatures``),
    so the first step does not wait for them: about 0.4 s of import and 0.3 s of loading on this project's
    2-core machine. Meant for a thread started before a run's other preparation (``anekit train`` starts
    one); a loop called meanwhile waits for numba's compiler lock, then finds itself loaded. Nothing when
    the loops are not in use; an error here is left for the loop's first real call to meet (a preload
    changes no result)."""
    loops = _load()
    if loops is None:
        return
    try:
        for name, signatures in loops.step_signatures().items():
            for signature in signatures:
                getattr(loops, name).compile(signature)
    except Exception:  # e.g. a cache numba cannot read: the first call compiles, as without a preload
        return


_preloading: threading.Thread | None = None


def preload_in_background() -> None:
    """``preload`` on a daemon thread, started once per process however often this is called (the
    ``anekit`` command starts it as soon as it knows it trains, before its own imports)."""
    global _preloading
    with _lock:
        if _preloading is not None:
            return
        _preloading = threading.Thread(target=preload, name="anekit-preload", daemon=True)
    _preloading.start()


def available() -> bool:
    """True when the compiled loops are in use (numba importable and not switched off)."""
    return _load() is not None


def reset() -> None:
    """Forget the decision so the next call looks at ``ANEKIT_JIT`` again (for tests)."""
    global _loops, _tried
    with _lock:
        _loops, _tried = None, False


def flat(a: np.ndarray) -> np.ndarray | None:
    """A 1-d view of ``a`` in memory order if its memory is one dense block (C or Fortran order)."""
    if a.flags.c_contiguous:
        return a.reshape(-1)
    if a.flags.f_contiguous:
        return a.T.reshape(-1)
    return None


def _same_order(a: np.ndarray, b: np.ndarray) -> bool:
    """True if ``a`` and ``b`` are dense blocks walked in the same element order."""
    return (a.flags.c_contiguous and b.flags.c_contiguous) or (a.flags.f_contiguous and b.flags.f_contiguous)


def _in_place(x: np.ndarray) -> tuple[ModuleType, np.ndarray] | None:
    """(the loops, a 1-d view of ``x`` in memory order) for a loop that rewrites float32 ``x`` in place;
    None without the loops, or for an ``x`` that is not float32, writeable and one block of memory."""
    loops = _load()
    if loops is None or x.dtype != np.float32 or not x.flags.writeable:
        return None
    v = flat(x)
    return None if v is None else (loops, v)


def round_fp16_inplace(x: np.ndarray) -> bool:
    """Round float32 ``x`` to binary16 values in place (``fp16.round_to_fp16`` bits); False if not done."""
    found = _in_place(x)
    if found is None:
        return False
    loops, v = found
    loops.round_fp16_inplace(v)
    return True


def round_fp16_into(x: np.ndarray, out: np.ndarray) -> bool:
    """Write ``x`` rounded to binary16 values into ``out`` (same shape and memory order, no overlap)."""
    loops = _load()
    if loops is None or x.dtype != np.float32 or out.dtype != np.float32 or x.shape != out.shape:
        return False
    if not _same_order(x, out) or np.may_share_memory(x, out):
        return False
    src, dst = flat(x), flat(out)
    assert src is not None and dst is not None
    loops.round_fp16_into(src, dst)
    return True


def scale_all_finite(x: np.ndarray, factor: float) -> bool | None:
    """``x *= factor`` in place (``factor`` rounded to float32 first, as numpy takes a Python float for a
    float32 array) and whether every element is then finite, in one pass; None if not done (no loops, or
    an array that is not float32, writeable and one block of memory)."""
    found = _in_place(x)
    if found is None:
        return None
    loops, v = found
    return bool(loops.scale_all_finite(v, np.float32(factor)))


def round_block_into(block: np.ndarray, grid: np.ndarray, row: int, column: int) -> tuple[int, float] | None:
    """Write float32 ``block`` rounded to binary16 values into ``grid[row:row + rows, column:column +
    columns]`` (``grid`` C-ordered 2-d float32) and return (its NaNs, the largest |value| of the others),
    in one pass; None if not done (no loops, or a block that is not C-ordered 2-d: a transposed weight,
    a broadcast column)."""
    loops = _load()
    if loops is None or block.dtype != np.float32 or grid.dtype != np.float32 or block.ndim != 2:
        return None
    if grid.ndim != 2 or not grid.flags.c_contiguous or not grid.flags.writeable:
        return None
    rows, columns = block.shape
    if row < 0 or column < 0 or row + rows > grid.shape[0] or column + columns > grid.shape[1]:
        return None
    if np.may_share_memory(block, grid):
        return None
    if not block.flags.c_contiguous:  # a transposed block walks the grid down its columns: numpy's
        return None  # three passes in the block's own order are faster there (measured, 288 x 768: 4x)
    nans, peak = loops.round_block_into(block, grid, row, column)
    return int(nans), float(peak)


def encode_fp16_values(x: np.ndarray, out: np.ndarray) -> bool | None:
    """Encode float32 ``x`` (finite binary16 values) as uint16 half patterns into ``out``.

    True when done, False when ``x`` holds a value that is not a finite half (``out`` is then partly
    written), None when the loops are not in use or the layouts do not match (nothing written).
    """
    loops = _load()
    if loops is None or x.dtype != np.float32 or out.dtype != np.uint16 or x.shape != out.shape:
        return None
    if not _same_order(x, out):
        return None
    src, dst = flat(x), flat(out)
    assert src is not None and dst is not None
    return bool(loops.encode_fp16_values(src, dst))


def round_encode_into(x: np.ndarray, values: np.ndarray, halves: np.ndarray) -> bool | None:
    """``round_fp16_into(x, values)`` then ``encode_fp16_values(values, halves)``, in one pass: True when
    done, False when a rounded value is not a finite half (both outputs partly written), None when the
    loops are not in use or the arrays do not fit (nothing written)."""
    loops = _load()
    if loops is None or x.dtype != np.float32 or values.dtype != np.float32 or halves.dtype != np.uint16:
        return None
    if not (x.shape == values.shape == halves.shape):
        return None
    if not (_same_order(x, values) and _same_order(x, halves)):
        return None
    if np.may_share_memory(x, values) or np.may_share_memory(x, halves):
        return None
    src, dst, enc = flat(x), flat(values), flat(halves)
    assert src is not None and dst is not None and enc is not None
    return bool(loops.round_encode_into(src, dst, enc))


def adamw_update(
    w: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    b1: np.float32,
    b2: np.float32,
    decay: np.float32,
    step: np.float32,
    bias2: np.float32,
    eps: np.float32,
    gscale: float = 1.0,
) -> bool:
    """One AdamW step in one pass over float32 arrays of one shape and order (see ``cpu_ops``); a
    ``gscale`` other than 1 scales ``g`` in place first (the gradient clip, fused into the pass)."""
    loops = _load()
    arrays = (w, g, m, v)
    if loops is None or any(a.dtype != np.float32 or a.shape != w.shape for a in arrays):
        return False
    flats = [flat(a) for a in arrays]
    if any(f is None for f in flats) or not all(_same_order(w, a) for a in arrays[1:]):
        return False
    if any(np.may_share_memory(a, b) for i, a in enumerate(arrays) for b in arrays[i + 1 :]):
        return False
    loops.adamw_update(*flats, b1, b2, decay, step, bias2, eps, np.float32(gscale))
    return True


def _f32(x: np.ndarray, writes: bool) -> tuple[ModuleType, np.ndarray] | None:
    """(the loops, a 1-d view of float32 ``x`` in memory order) when the loops are in use and can take it
    (``writes``: they change it in place, so it must be writeable), else None."""
    loops = _load()
    if loops is None or x.dtype != np.float32 or (writes and not x.flags.writeable):
        return None
    v = flat(x)
    return None if v is None else (loops, v)


def _into(x: np.ndarray, loop: str) -> np.ndarray | None:
    """A new array of ``x``'s shape and layout written by the loop ``loop(x, out)``, or None."""
    found = _f32(x, writes=False)
    if found is None:
        return None
    loops, src = found
    out = np.empty_like(x)
    dst = flat(out)
    if dst is None or not _same_order(x, out):
        return None
    getattr(loops, loop)(src, dst)
    return out


def scan_operand(x: np.ndarray) -> tuple[int, float] | None:
    """(fp16 subnormals in float32 ``x``, its largest finite |value|), or None without the loops."""
    found = _f32(x, writes=False)
    if found is None:
        return None
    n, big = found[0].scan_operand(found[1])
    return int(n), float(big)


def flush_subnormals(x: np.ndarray) -> np.ndarray | None:
    """A copy of float32 ``x`` with fp16 subnormals set to +0 (same layout), or None without the loops."""
    return _into(x, "flush_into")


def mac_port(x: np.ndarray, ceiling: float, flush: bool) -> tuple[int, int, float, int] | None:
    """The MAC output port on float32 fp16 values in place (``_jit_loops.mac_port``), or None."""
    found = _f32(x, writes=True)
    if found is None:
        return None
    nans, over, largest, flushed = found[0].mac_port(found[1], np.float32(ceiling), bool(flush))
    return int(nans), int(over), float(largest), int(flushed)


def nan_to_zero(x: np.ndarray) -> int | None:
    """NaN -> +0 in float32 ``x`` in place: how many, or None when the loops are not in use."""
    found = _f32(x, writes=True)
    return None if found is None else int(found[0].nan_to_zero(found[1]))


def saturate_over(x: np.ndarray, limit: float) -> tuple[int, float] | None:
    """|v| > ``limit`` -> +/-inf in float32 ``x`` in place: (how many, the largest), or None."""
    found = _f32(x, writes=True)
    if found is None:
        return None
    n, largest = found[0].saturate_over(found[1], np.float32(limit))
    return int(n), float(largest)


def nan_peak(x: np.ndarray) -> tuple[int, float] | None:
    """(NaNs in float32 ``x``, the largest |value| of the others, inf included), or None without the
    loops (or for a strided ``x``)."""
    found = _f32(x, writes=False)
    if found is None:
        return None
    n, peak = found[0].nan_peak(found[1])
    return int(n), float(peak)


def count_nan(x: np.ndarray) -> int | None:
    """How many NaNs float32 ``x`` holds, or None when the loops are not in use."""
    found = _f32(x, writes=False)
    return None if found is None else int(found[0].count_nan(found[1]))


def round_fp16_away(x: np.ndarray) -> np.ndarray | None:
    """float32 ``x`` rounded to binary16 values with ties away from zero (a new array), or None."""
    return _into(x, "round_fp16_away_into")


# A source row stride that is a multiple of this many bytes puts every source row on the same cache sets:
# numpy's element-by-element transposed copy then misses on nearly every read (measured: a 768 x 2048
# float32 matrix transposed in 6.3-9.3 ms by numpy, 1.5 ms by the tiled loop; a 2048 x 256 one, row stride
# 1 KiB, in 0.6-0.7 ms either way).
ALIASED_STRIDE = 4096


def copy_transposed(view: np.ndarray, out: np.ndarray) -> bool:
    """Fill C-contiguous float32 ``out`` (``view``'s shape) with ``view``'s elements, for a float32 ``view``
    whose two non-unit axes are a row-major matrix's columns then rows (a transposed view) with a row
    stride that is a multiple of ``ALIASED_STRIDE`` bytes; False (nothing written) in every other case,
    where numpy's own copy is as fast. A copy: the same values as ``out[...] = view``."""
    loops = _load()
    if loops is None or view.dtype != np.float32 or out.dtype != np.float32 or out.shape != view.shape:
        return False
    if not out.flags.c_contiguous or not out.flags.writeable or np.may_share_memory(view, out):
        return False
    axes = [(n, s) for n, s in zip(view.shape, view.strides) if n != 1]
    if len(axes) != 2:
        return False
    (n0, s0), (n1, s1) = axes
    if s0 != view.itemsize or s1 < n0 * s0 or s1 % ALIASED_STRIDE:
        return False
    matrix = np.squeeze(view)  # (n0, n1), strides (s0, s1): a view, unit axes dropped
    loops.transpose_into(matrix.T, out.reshape(n0, n1))
    return True


_GRID_MODES = {"truncate": 0, "even": 1, "away": 2}  # _jit_loops' codes of the fp16 grid's rounding


def tiled_matmul(
    a: np.ndarray, b: np.ndarray, ceiling: float, flush: bool, tile_rounding: str, ties: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """``runtime.sim.mac.tiled_product`` of 2-d float ``a`` (M, K) and ``b`` (K, N) compiled (the same
    bits): (the output as float64, where a partial reached ``ceiling``), or None without the loops."""
    loops = _load()
    if loops is None or a.ndim != 2 or b.ndim != 2:
        return None
    m, n = a.shape[0], b.shape[1]
    out = np.empty((m, n), np.float32)
    over = np.zeros((m, n), np.bool_)
    loops.tiled_matmul(
        np.ascontiguousarray(a, np.float32),
        np.ascontiguousarray(b, np.float32),
        out,
        over,
        float(ceiling),
        bool(flush),
        _GRID_MODES[tile_rounding],
        _GRID_MODES[ties],
    )
    return out.astype(np.float64), over


def ordered_batched_product(wt: np.ndarray, x: np.ndarray, out: np.ndarray) -> bool:
    """``ordered_product`` of every batch item at once: ``wt`` (B, K, M) and ``out`` (B, N, M) C-contiguous
    float32, ``x`` (B, K, N) float32 (any strides); False (nothing written) without the loops or for other
    arrays. The same bits as ``ordered_product`` of each item."""
    loops = _load()
    if loops is None or not _product_operands(wt, x, out, 3):
        return False
    b, k, m = wt.shape
    if x.shape[:2] != (b, k) or out.shape != (b, x.shape[2], m):
        return False
    loops.ordered_batched_product(wt, x, out)
    return True


def _product_operands(wt: np.ndarray, x: np.ndarray, out: np.ndarray, ndim: int) -> bool:
    """Whether the ordered products' loops take these arrays: each of ``ndim`` axes, float32, ``wt`` and
    ``out`` C-contiguous, ``out`` writable and sharing no memory with the others."""
    if wt.ndim != ndim or x.ndim != ndim or out.ndim != ndim:
        return False
    if wt.dtype != np.float32 or x.dtype != np.float32 or out.dtype != np.float32:
        return False
    if not (wt.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        return False
    return not (np.may_share_memory(out, wt) or np.may_share_memory(out, x))


def ordered_product(wt: np.ndarray, x: np.ndarray, out: np.ndarray) -> bool:
    """``runtime.sim.ordered``'s product compiled: fill ``out`` (N, M) with the float32 sums over k, in
    ascending order, of ``wt[k, i] * x[k, n]`` for float32 ``wt`` (K, M) and ``out`` C-contiguous and
    ``x`` (K, N); False (nothing written) without the loops or for other arrays. The same bits as the
    numpy path there (``runtime.sim.ordered.ordered_matmul``)."""
    loops = _load()
    if loops is None or not _product_operands(wt, x, out, 2):
        return False
    if out.shape != (x.shape[1], wt.shape[1]) or x.shape[0] != wt.shape[0]:
        return False
    loops.ordered_product(wt, x, out)
    return True
