"""The compiled loops behind ``anekit.jit`` (imported only through it, and only when numba is installed).

Each loop walks a 1-d C-contiguous array once, element by element, in float32 / uint32 arithmetic that
numpy's vectorised paths in ``anekit.fp16`` perform in several passes; they compute the same bits (the
tests compare them over random and special bit patterns). Separate in-place variants exist because a
loop reading and writing two arguments that may overlap is not vectorised by the compiler.

Compiled on first call and cached on disk by numba (``cache=True``); ``nogil`` lets a BLAS call in
another thread run meanwhile.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

# The bit layout constants are fp16_bits', which anekit.fp16 reads too, so both paths read one definition.
from anekit.fp16_bits import F16_LOW_BITS as _LOW13
from anekit.fp16_bits import F16_REBIAS_SHIFTED as _REBIAS
from anekit.fp16_bits import F16_SUBNORMAL_LIMIT as _MIN_NORMAL
from anekit.fp16_bits import F32_ABS as _ABS
from anekit.fp16_bits import F32_EXP as _EXP
from anekit.fp16_bits import F32_FP16_MAX as _FP16_MAX
from anekit.fp16_bits import F32_HALF_BITS as _HALF_BITS
from anekit.fp16_bits import F32_INF as _INF
from anekit.fp16_bits import F32_QUIET as _QUIET
from anekit.fp16_bits import F32_SIGN as _SIGN
from anekit.fp16_bits import FP16_ROUND_LIMIT as _FP16_ROUND_LIMIT
from anekit.fp16_bits import MAGIC_MIN as _MAGIC_MIN
from anekit.fp16_bits import MAGIC_OFFSET as _MAGIC_OFFSET

_LOW13_CLEAR = np.uint32(0xFFFFE000)
# |x| of 65520 and more rounds to inf (NaN patterns lie above too): fp16's limit as a float32 pattern.
_ROUND_LIMIT = np.float32(_FP16_ROUND_LIMIT).view(np.uint32)


@njit(cache=True)
def _round(v: np.float32) -> np.float32:
    """v rounded to binary16 precision (ties to even, overflow to inf, quiet NaN)."""
    b = np.float32(v).view(np.uint32)
    a = np.uint32(b & _ABS)
    s = np.uint32(b & _SIGN)
    c = np.uint32(max(np.uint32(np.uint32(b & _EXP) + _MAGIC_OFFSET), _MAGIC_MIN))
    cf = np.uint32(c).view(np.float32)
    r = np.float32(np.float32(v + cf) - cf)
    rounded = np.uint32(np.float32(r).view(np.uint32) | s)
    quiet = _QUIET if a > _INF else np.uint32(0)
    special = np.uint32(np.uint32(np.uint32(max(a, _INF) & _LOW13_CLEAR) | quiet) | s)
    return np.uint32(special if a >= _ROUND_LIMIT else rounded).view(np.float32)


@njit(nogil=True, cache=True)
def round_fp16_inplace(x: np.ndarray) -> None:  # pragma: no cover - compiled
    for i in range(x.size):
        x[i] = _round(x[i])


@njit(nogil=True, cache=True)
def round_fp16_into(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = _round(x[i])


@njit(cache=True)
def _half(v: np.float32) -> tuple[np.uint16, np.uint32]:
    """(the half pattern of float32 ``v``, nonzero when ``v`` is not a finite half: past 65504, or with
    bits a half lacks)."""
    b = np.float32(v).view(np.uint32)
    a = np.uint32(b & _ABS)
    normal = np.int32(np.int32(a >> np.uint32(13)) - _REBIAS)
    # Under 2**-14: |x| + 0.5 rounds to the subnormal step 2**-24, its pattern less 0.5's is the half.
    af = np.uint32(a).view(np.float32)
    t = np.float32(af + np.float32(0.5))
    sub = np.int32(np.float32(t).view(np.int32) - _HALF_BITS)
    h = normal if a >= _MIN_NORMAL else sub
    # As fp16.encode_fp16_values: patterns with low bits set are refused, others under 2**-14 rounded
    # to the subnormal step (ties to even, as a cast would).
    bad = np.uint32(a > _FP16_MAX) | np.uint32(a & _LOW13)
    return np.uint16(np.uint32(h) | np.uint32(np.uint32(b >> np.uint32(16)) & np.uint32(0x8000))), bad


@njit(nogil=True, cache=True)
def encode_fp16_values(x: np.ndarray, out: np.ndarray) -> bool:  # pragma: no cover - compiled
    """Half patterns of float32 values; False if one is not finite, past 65504 or has bits a half lacks."""
    bad = np.uint32(0)
    for i in range(x.size):
        h, b = _half(x[i])
        bad |= b
        out[i] = h
    return bad == 0


@njit(nogil=True, cache=True)
def round_encode_into(x: np.ndarray, values: np.ndarray, halves: np.ndarray) -> bool:  # pragma: no cover
    """``round_fp16_into(x, values)`` and ``encode_fp16_values(values, halves)`` in one pass (x read once,
    the rounded values not read again); False when a value rounds to one that is not a finite half."""
    bad = np.uint32(0)
    for i in range(x.size):
        r = _round(x[i])
        values[i] = r
        h, b = _half(r)
        bad |= b
        halves[i] = h
    return bad == 0


# error_model="numpy": a float division by zero gives inf / NaN as numpy's does instead of raising, so the
# loop has no exit and LLVM vectorises it (sqrt and division stay IEEE-exact per lane: the same bits).
@njit(nogil=True, cache=True, error_model="numpy")
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
    gscale: np.float32,
) -> None:  # pragma: no cover - compiled
    """``llama.cpu_ops.adamw_update``'s float32 operations, in its order, one element at a time.

    A ``gscale`` other than 1 first scales the gradient in place (``g *= gscale``, the clip).
    """
    one_b1 = np.float32(np.float32(1.0) - b1)
    one_b2 = np.float32(np.float32(1.0) - b2)
    scaled = gscale != np.float32(1.0)
    for i in range(w.size):
        gi = g[i]
        if scaled:
            gi = np.float32(gi * gscale)
            g[i] = gi
        mi = np.float32(np.float32(m[i] * b1) + np.float32(one_b1 * gi))
        vi = np.float32(np.float32(v[i] * b2) + np.float32(one_b2 * np.float32(gi * gi)))
        m[i] = mi
        v[i] = vi
        wi = np.float32(w[i] * decay)
        denom = np.float32(np.float32(np.sqrt(vi) / bias2) + eps)
        w[i] = np.float32(wi - np.float32(step * np.float32(mi / denom)))


# -- the engine numerics' passes (``runtime.sim.numerics``) ---------------------------------------

_MIN_NORMAL_F = np.float32(2.0**-14)
_MIN_NORMAL_BITS = np.uint32(0x38800000)  # 2**-14 as a float32 pattern: fp16's smallest normal
_INF_BITS = np.uint32(0x7F800000)
_ABS_BITS = np.uint32(0x7FFFFFFF)


# These passes read the float32 patterns as integers: compares and maxima of uint32 vectorise where the
# float forms (with their NaN rules) would not, and for non-negative floats the order is the same.
@njit(nogil=True, cache=True)
def scan_operand(x: np.ndarray) -> tuple[int, float]:  # pragma: no cover - compiled
    """(how many values are fp16 subnormals, the largest finite |value|) of float32 ``x``."""
    bits = x.view(np.uint32)
    n = 0
    big = np.uint32(0)
    for i in range(bits.size):
        a = bits[i] & _ABS_BITS
        n += np.int64((a < _MIN_NORMAL_BITS) & (a > np.uint32(0)))
        big = max(big, a if a < _INF_BITS else np.uint32(0))
    return n, float(np.uint32(big).view(np.float32))


@njit(nogil=True, cache=True)
def flush_into(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out`` = ``x`` with fp16 subnormals set to +0."""
    for i in range(x.size):
        v = x[i]
        out[i] = np.float32(0.0) if abs(v) < _MIN_NORMAL_F else v


@njit(nogil=True, cache=True)
def _needs_port(bits: np.ndarray, limit: np.uint32, low: np.uint32) -> bool:  # pragma: no cover - compiled
    """Whether any value is NaN, at or over the ceiling, or a subnormal under ``low``: one read-only pass
    of integer maxima and counts (it vectorises), so the common case of nothing to do costs one read."""
    big = np.uint32(0)
    lows = 0
    for i in range(bits.size):
        a = bits[i] & _ABS_BITS
        big = max(big, a)
        lows += np.int64((a < low) & (a > np.uint32(0)))
    return big >= limit or lows > 0


@njit(nogil=True, cache=True)
def mac_port(
    x: np.ndarray, ceiling: np.float32, flush: bool
) -> tuple[int, int, float, int]:  # pragma: no cover - compiled
    """The MAC output port on fp16 values in place: NaN -> +0, (flush) subnormals -> +0, |v| >= ceiling
    -> +/-inf. Returns (NaNs, values over the ceiling, the largest of them, subnormals flushed)."""
    bits = x.view(np.uint32)
    limit = np.float32(min(ceiling, np.float32(np.inf))).view(np.uint32)
    low = _MIN_NORMAL_BITS if flush else np.uint32(0)
    if not _needs_port(bits, min(limit, _INF_BITS + np.uint32(1)), low):
        return 0, 0, 0.0, 0
    nans = 0
    over = 0
    flushed = 0
    largest = np.uint32(0)
    for i in range(bits.size):
        b = bits[i]
        a = b & _ABS_BITS
        is_nan = a > _INF_BITS
        is_over = (a >= limit) & (a < _INF_BITS)
        is_low = (a < low) & (a > np.uint32(0))
        nans += np.int64(is_nan)
        over += np.int64(is_over)
        flushed += np.int64(is_low)
        largest = max(largest, a if is_over else np.uint32(0))
        signed_inf = (b & np.uint32(0x80000000)) | _INF_BITS
        bits[i] = np.uint32(0) if (is_nan | is_low) else (signed_inf if is_over else b)
    return nans, over, float(np.uint32(largest).view(np.float32)), flushed


@njit(nogil=True, cache=True)
def nan_to_zero(x: np.ndarray) -> int:  # pragma: no cover - compiled
    """NaN -> +0 in place; how many there were."""
    bits = x.view(np.uint32)
    n = 0
    for i in range(bits.size):
        b = bits[i]
        nan = (b & _ABS_BITS) > _INF_BITS
        n += np.int64(nan)
        bits[i] = np.uint32(0) if nan else b
    return n


@njit(nogil=True, cache=True)
def saturate_over(x: np.ndarray, limit: np.float32) -> tuple[int, float]:  # pragma: no cover - compiled
    """|v| > limit -> +/-inf in place (finite values only); (how many, the largest of them)."""
    bits = x.view(np.uint32)
    lim = np.float32(limit).view(np.uint32)
    n = 0
    largest = np.uint32(0)
    for i in range(bits.size):
        b = bits[i]
        a = b & _ABS_BITS
        hit = (a > lim) & (a < _INF_BITS)
        n += np.int64(hit)
        largest = max(largest, a if hit else np.uint32(0))
        bits[i] = ((b & np.uint32(0x80000000)) | _INF_BITS) if hit else b
    return n, float(np.uint32(largest).view(np.float32))


@njit(nogil=True, cache=True)
def nan_peak(x: np.ndarray) -> tuple[int, float]:  # pragma: no cover - compiled
    """(how many NaNs, the largest |value| of the others, inf included) of float32 ``x``."""
    bits = x.view(np.uint32)
    n = 0
    peak = np.uint32(0)
    for i in range(bits.size):
        a = bits[i] & _ABS_BITS
        nan = a > _INF_BITS
        n += np.int64(nan)
        peak = max(peak, np.uint32(0) if nan else a)
    return n, float(np.uint32(peak).view(np.float32))


@njit(nogil=True, cache=True, boundscheck=False)
def round_block_into(
    src: np.ndarray, grid: np.ndarray, row: int, column: int
) -> tuple[int, float]:  # pragma: no cover - compiled
    """The block ``src`` (C-ordered 2-d) rounded to binary16 values into ``grid[row:, column:]`` (C-ordered
    2-d) in one pass, row by row: ``round_fp16_into``'s values, and (how many are NaN, the largest |value|
    of the others, inf included) as ``nan_peak`` reads them."""
    n = 0
    peak = np.uint32(0)
    for i in range(src.shape[0]):
        s = src[i]
        d = grid[row + i, column : column + s.shape[0]]
        for j in range(s.shape[0]):
            r = _round(s[j])
            d[j] = r
            a = np.uint32(np.float32(r).view(np.uint32) & _ABS_BITS)
            nan = a > _INF_BITS
            n += np.int64(nan)
            peak = max(peak, np.uint32(0) if nan else a)
    return n, float(np.uint32(peak).view(np.float32))


@njit(nogil=True, cache=True)
def scale_all_finite(x: np.ndarray, factor: np.float32) -> bool:  # pragma: no cover - compiled
    """``x *= factor`` (float32 products), then whether every product is finite, in one pass."""
    bad = np.uint32(0)
    for i in range(x.size):
        v = np.float32(x[i] * factor)
        x[i] = v
        bad |= np.uint32(np.uint32(np.float32(v).view(np.uint32) & _ABS_BITS) >= np.uint32(0x7F800000))
    return bad == 0


@njit(nogil=True, cache=True)
def count_nan(x: np.ndarray) -> int:  # pragma: no cover - compiled
    bits = x.view(np.uint32)
    n = 0
    for i in range(bits.size):
        n += np.int64((bits[i] & _ABS_BITS) > _INF_BITS)
    return n


@njit(cache=True)
def _round_tie(v: np.float32, away: bool) -> np.float32:
    """``v`` rounded to a binary16 value (``_round``), a tie away from zero when ``away``.

    Where ties-to-even rounded toward zero (|r| < |v|) and 2|v| - |r| is itself a half, v sat exactly
    halfway between |r| and that half (no half lies between them), so it goes there instead.
    """
    r = _round(v)
    if away:
        a = abs(v)
        ra = abs(r)
        if ra < a and a < np.float32(65520.0):
            hc = np.float32(np.float32(a - ra) + a)
            if _round(hc) == hc:
                r = hc if v > 0 else -hc
    return r


@njit(nogil=True, cache=True)
def round_fp16_away_into(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``x`` rounded to binary16 values with ties away from zero (``_round_tie``)."""
    for i in range(x.size):
        out[i] = _round_tie(x[i], True)


@njit(nogil=True, cache=True)
def scan_flush_inplace(x: np.ndarray) -> tuple[int, float]:  # pragma: no cover - compiled
    """``scan_operand`` that also sets the fp16 subnormals it counts to +0, in place (a second, writing
    pass only when there are some)."""
    n, big = scan_operand(x)
    if n:
        bits = x.view(np.uint32)
        for i in range(bits.size):
            b = bits[i]
            a = b & _ABS_BITS
            bits[i] = np.uint32(0) if (a < _MIN_NORMAL_BITS) & (a > np.uint32(0)) else b
    return n, big


@njit(nogil=True, cache=True)
def round_fp16_nan0_inplace(x: np.ndarray, away: bool) -> int:  # pragma: no cover - compiled
    """Round float32 ``x`` to binary16 values in place, NaN -> +0 (the engine's indeterminate forms), ties
    away from zero when ``away``; how many NaNs there were. One pass: the store and the correction."""
    n = 0
    for i in range(x.size):
        v = x[i]
        if v != v:
            x[i] = np.float32(0.0)
            n += 1
            continue
        x[i] = _round_tie(v, away)
    return n


@njit(nogil=True, cache=True)
def round_port_inplace(
    x: np.ndarray, ceiling: np.float32, flush: bool, away: bool
) -> tuple[int, int, float, int]:  # pragma: no cover - compiled
    """A MAC op's store and output port in one pass: round to binary16 values in place (ties away from zero
    when ``away``: ``_round_tie``), then ``mac_port``'s NaN -> +0, subnormals -> +0
    (``flush``) and |v| >= ceiling -> +/-inf."""
    for i in range(x.size):
        x[i] = _round_tie(x[i], away)
    return mac_port(x, ceiling, flush)


# -- the MAC's 4-lane first stage (anekit.runtime.sim.mac.tiled_product, compiled) ----------------------

_F64_EXP_BIAS = 1023
_F64_FRACTION_BITS = 52
_TILE_GUARD = 11  # fp16's 10 fraction bits and one guard bit: the in-tile adder's grid
_FP16_MIN_EXP = -14
_TRUNCATE, _EVEN, _AWAY = 0, 1, 2  # how a value is brought onto the fp16 grid (tile and output modes)


@njit(cache=True, inline="always")
def _fp16_grid(v: float, mode: int) -> float:
    """v (float64) onto the fp16 grid: truncated toward zero (inf-free: at most 65504), to even or away;
    inf and NaN stay. Selects, no branches on the value (the callers' loops vectorise)."""
    a = abs(v)
    scale = _scale_bits(a)
    g = np.int64(scale - np.int64(10 << _F64_FRACTION_BITS)).view(np.float64)  # fp16's spacing at |v|
    q = a / g  # exact: a power of two
    even = abs(_on_grid(a, scale, 10))
    r = np.floor(q) * g if mode == _TRUNCATE else (even if mode == _EVEN else np.floor(q + 0.5) * g)
    r = r if r <= 65504.0 else (65504.0 if mode == _TRUNCATE else np.inf)
    return np.copysign(r, v) if a < np.inf else v


_F64_EXP_MASK = np.int64(0x7FF0000000000000)
_F64_MIN_EXP_BITS = np.int64((_F64_EXP_BIAS + _FP16_MIN_EXP) << _F64_FRACTION_BITS)  # 2^-14's pattern


@njit(cache=True, inline="always")
def _scale_bits(v: float) -> np.int64:
    """The bit pattern of 2^floor(log2 |v|) (float64), no lower than 2^-14's (a zero's too)."""
    return max(np.float64(v).view(np.int64) & _F64_EXP_MASK, _F64_MIN_EXP_BITS)


@njit(cache=True, inline="always")
def _on_grid(v: float, scale_bits: np.int64, bits: int) -> float:
    """v rounded (ties to even) to multiples of 2^(e - bits), 2^e the scale whose pattern is given."""
    shift = np.int64((_F64_FRACTION_BITS - bits) << _F64_FRACTION_BITS)
    magic = np.int64(scale_bits + shift).view(np.float64) * 1.5
    return (v + magic) - magic


@njit(nogil=True, cache=True, parallel=True, error_model="numpy")
def tiled_matmul(
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    over: np.ndarray,
    ceiling: float,
    flush: bool,
    tile_mode: int,
    out_mode: int,
) -> None:  # pragma: no cover - compiled
    """out[m, n] = the first-stage model of a[m, :] . b[:, n] (a (M, K), b (K, N) float32 fp16 values),
    rows in parallel, each row's outputs side by side: each product rounded to fp16 (flushed where
    ``flush``), the lanes of each 4-lane tile added in order on the grid one bit below fp16's at the
    larger operand's exponent (ties to even), the tile brought to fp16 by ``tile_mode``, the tiles summed
    in float64, the sum brought to fp16 by ``out_mode``; where a tile or running sum reached ``ceiling``,
    over[m, n] is set and out[m, n] is inf of its sign. The bits of ``mac.tiled_product``'s numpy model."""
    m_rows, k = a.shape
    n_cols = b.shape[1]
    tiny = 2.0**-14
    for i in prange(m_rows):
        part = np.zeros(n_cols)
        acc = np.zeros(n_cols)
        sign = np.zeros(n_cols)
        for t in range(0, k, 4):
            part[:] = 0.0
            for q in range(t, min(t + 4, k)):
                aq = np.float64(a[i, q])
                bq = b[q]
                for j in range(n_cols):  # selects, no branches: the loop vectorises
                    p = aq * np.float64(bq[j])  # exact: two fp16 values
                    p = _on_grid(p, _scale_bits(p), 10)  # the product rounded to fp16
                    p = p if abs(p) <= 65504.0 else p * np.inf
                    p = 0.0 if flush and abs(p) < tiny else p
                    x = part[j]
                    total = x + p
                    rounded = _on_grid(total, max(_scale_bits(x), _scale_bits(p)), _TILE_GUARD)
                    part[j] = rounded if abs(total) < np.inf else total  # inf / NaN stay what they are
            for j in range(n_cols):
                tile = _fp16_grid(part[j], tile_mode)
                if flush and abs(tile) < tiny:
                    tile = 0.0
                acc[j] += tile
                if sign[j] == 0.0:
                    if abs(tile) >= ceiling:
                        sign[j] = 1.0 if tile > 0 else -1.0
                    elif abs(acc[j]) >= ceiling:
                        sign[j] = 1.0 if acc[j] > 0 else -1.0
        for j in range(n_cols):
            r = _fp16_grid(acc[j], out_mode)
            if flush and abs(r) < tiny:
                r = 0.0
            over[i, j] = sign[j] != 0.0
            out[i, j] = sign[j] * np.inf if sign[j] != 0.0 else r


# -- input surfaces kept decoded between runs (``runtime.sim.kernel``) -----------------------------------


@njit(nogil=True, cache=True)
def block_stats(
    bits: np.ndarray, nans: np.ndarray, peaks: np.ndarray, block: int
) -> None:  # pragma: no cover
    """Per block of ``block`` half patterns of ``bits``: its NaN count into ``nans`` and its largest non-NaN
    magnitude pattern into ``peaks``."""
    size = bits.size
    for b in range(nans.size):
        count = 0
        peak = np.uint16(0)
        for i in range(b * block, min(size, (b + 1) * block)):
            a = np.uint16(bits[i] & np.uint16(0x7FFF))
            count += np.int64(a > np.uint16(0x7C00))
            peak = max(peak, a if a <= np.uint16(0x7C00) else np.uint16(0))
        nans[b] = count
        peaks[b] = peak


@njit(nogil=True, cache=True)
def refresh_fp16_mirror(
    now: np.ndarray,
    seen: np.ndarray,
    values: np.ndarray,
    table: np.ndarray,
    nans: np.ndarray,
    peaks: np.ndarray,
    block: int,
    width: int,
) -> tuple[int, int, int, int, int]:  # pragma: no cover - compiled
    """Bring ``values`` (float32) up to the half patterns ``now`` (uint16) where they differ from ``seen``
    (the patterns last decoded, updated too): each changed element decoded by ``table`` (the float32 of
    every half pattern). ``nans`` / ``peaks``: per block of ``block`` patterns of ``seen`` (a multiple of
    4: whole 64-bit words), its NaN count and largest non-NaN magnitude pattern (``block_stats``), brought
    up to date for the blocks that changed. Returns (elements changed, NaNs in ``now``, the largest non-NaN
    magnitude pattern, and the columns [lo, hi) that hold every changed element, reading the patterns as rows
    of ``width``: (width, 0) when none changed). A block is compared four patterns at a time; only a block
    that differs is walked element by element."""
    changed = 0
    lo, hi = width, 0
    size = now.size
    words = size // 4  # the patterns compared four at a time, as 64-bit words
    now_w = now[: 4 * words].view(np.uint64)
    seen_w = seen[: 4 * words].view(np.uint64)
    per = block // 4
    for b in range(nans.size):
        i0, i1 = b * block, min(size, (b + 1) * block)
        differ = np.uint64(0)
        w1 = min(words, (b + 1) * per)
        for w in range(b * per, w1):
            differ |= now_w[w] ^ seen_w[w]
        for i in range(max(i0, 4 * w1), i1):  # the patterns past the last whole word
            differ |= np.uint64(now[i] ^ seen[i])
        if differ:
            count = 0
            peak = np.uint16(0)
            for i in range(i0, i1):
                h = now[i]
                if h != seen[i]:
                    seen[i] = h
                    values[i] = table[h]
                    changed += 1
                    column = i % width
                    lo = min(lo, column)
                    hi = max(hi, column + 1)
                a = np.uint16(h & np.uint16(0x7FFF))
                count += np.int64(a > np.uint16(0x7C00))
                peak = max(peak, a if a <= np.uint16(0x7C00) else np.uint16(0))
            nans[b] = count
            peaks[b] = peak
    total = 0
    top = np.uint16(0)
    for b in range(nans.size):
        total += nans[b]
        top = max(top, peaks[b])
    return changed, total, int(top), lo, hi


# -- transposed copies (``runtime.sim.fast``) -------------------------------------------------------------


@njit(nogil=True, cache=True, boundscheck=False)
def transpose_into(src: np.ndarray, dst: np.ndarray) -> None:  # pragma: no cover - compiled
    """dst[j, i] = src[i, j] for a 2-d ``src`` (R, C) of any strides and a C-contiguous ``dst`` (C, R), in
    8 x 8 tiles, a block of 8 output rows at a time: each tile reads 8 source rows and writes 8 output
    rows, so a source whose row stride is a multiple of 4 KiB (every source row on the same cache sets)
    holds only 8 of them in cache at once."""
    rows, cols = src.shape
    for j0 in range(0, cols, 8):
        j1 = min(j0 + 8, cols)
        for i0 in range(0, rows, 8):
            i1 = min(i0 + 8, rows)
            for j in range(j0, j1):
                for i in range(i0, i1):
                    dst[j, i] = src[i, j]


# -- products summed in a fixed order (``runtime.sim.ordered``) -----------------------------------------

ORDERED_BLOCK = 1024  # output rows per block: a block of every column's sums stays in the L1 / L2 cache


@njit(nogil=True, cache=True, boundscheck=False)
def _add_scaled(acc: np.ndarray, row: np.ndarray, scale: np.float32) -> None:  # pragma: no cover - compiled
    """acc[i] = acc[i] + row[i] * scale, the product rounded to float32, then the sum (no fused
    multiply-add: the compiler is not allowed to contract them)."""
    for i in range(acc.size):
        acc[i] = acc[i] + row[i] * scale


@njit(nogil=True, cache=True, boundscheck=False)
def _add_scaled4(
    acc: np.ndarray,
    r0: np.ndarray,
    r1: np.ndarray,
    r2: np.ndarray,
    r3: np.ndarray,
    s0: np.float32,
    s1: np.float32,
    s2: np.float32,
    s3: np.float32,
) -> None:  # pragma: no cover - compiled
    """``_add_scaled`` of four rows in turn, each element loaded and stored once: acc[i] + r0[i] s0, then
    + r1[i] s1, + r2[i] s2, + r3[i] s3, each product and each sum rounded to float32 in that order."""
    for i in range(acc.size):
        v = acc[i]
        v = v + r0[i] * s0
        v = v + r1[i] * s1
        v = v + r2[i] * s2
        v = v + r3[i] * s3
        acc[i] = v


@njit(nogil=True, cache=True, boundscheck=False)
def ordered_product(wt: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """out[n, i] = the float32 sum over k = 0, 1, ... K-1, in that order, of wt[k, i] * x[k, n], from +0:
    each product rounded to float32, then each sum. ``wt`` (K, M) and ``out`` (N, M) are C-contiguous
    float32, ``x`` (K, N) float32. Every output is its own chain of sums, so column n's values do not depend
    on how many columns ``x`` has; the chains of a block of rows run side by side (vectorised across rows)."""
    kk, m = wt.shape
    nn = x.shape[1]
    k4 = kk - kk % 4
    for i0 in range(0, m, ORDERED_BLOCK):
        i1 = min(m, i0 + ORDERED_BLOCK)
        for n in range(nn):
            out[n, i0:i1] = np.float32(0.0)
        for k in range(0, k4, 4):  # four terms at a time, still in ascending order for every output
            r0, r1, r2, r3 = wt[k, i0:i1], wt[k + 1, i0:i1], wt[k + 2, i0:i1], wt[k + 3, i0:i1]
            for n in range(nn):
                _add_scaled4(out[n, i0:i1], r0, r1, r2, r3, x[k, n], x[k + 1, n], x[k + 2, n], x[k + 3, n])
        for k in range(k4, kk):
            row = wt[k, i0:i1]
            for n in range(nn):
                _add_scaled(out[n, i0:i1], row, x[k, n])


@njit(nogil=True, cache=True, boundscheck=False)
def ordered_batched_product(wt: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """``ordered_product`` of each batch item b in one call: out[b] from wt[b] (K, M) and x[b] (K, N), for
    ``wt`` (B, K, M) and ``out`` (B, N, M) C-contiguous float32, ``x`` (B, K, N) float32 of any strides
    (an attention's heads: one call, not one per head)."""
    for b in range(wt.shape[0]):
        ordered_product(wt[b], x[b], out[b])


# -- what a training step calls, loaded ahead (``anekit.jit.preload``) ------------------------------------


def step_signatures() -> dict[str, list[tuple[object, ...]]]:
    """Each loop's signatures that a training step of the simulator calls (every array 1-d, C-contiguous,
    float32 unless named): ``jit.preload`` loads them from numba's cache before the first step needs
    them (tests/test_jit.py checks a step calls no other)."""
    from numba import types

    f32 = types.Array(types.float32, 1, "C")
    u16 = types.Array(types.uint16, 1, "C")
    s32, flag = types.float32, types.boolean
    one: list[tuple[object, ...]] = [(f32,)]
    f32_2d = types.Array(types.float32, 2, "C")
    return {
        "adamw_update": [(f32, f32, f32, f32, *(s32,) * 7)],
        "count_nan": one,
        "encode_fp16_values": [(f32, u16)],
        "flush_into": [(f32, f32)],
        "nan_peak": one,
        "nan_to_zero": one,
        "round_block_into": [(f32_2d, f32_2d, types.int64, types.int64)],
        "round_encode_into": [(f32, f32, u16)],
        "round_fp16_inplace": one,
        "round_fp16_into": [(f32, f32)],
        "round_fp16_nan0_inplace": [(f32, flag)],
        "round_port_inplace": [(f32, s32, flag, flag)],
        "scale_all_finite": [(f32, s32)],
        "scan_flush_inplace": one,
        "scan_operand": one,
    }
