"""Bit-exact IEEE 754 binary16 and bfloat16 <-> float32 conversion, scalar and vectorised."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from anekit import jit
from anekit.errors import AnekitError
from anekit.fp16_bits import (
    F16_LOW_BITS,
    F16_REBIAS_SHIFTED,
    F16_SUBNORMAL_LIMIT,
    F32_ABS,
    F32_EXP,
    F32_FP16_MAX,
    F32_HALF_BITS,
    F32_INF,
    F32_QUIET,
    F32_SIGN,
    FP16_ROUND_LIMIT,
    MAGIC_MIN,
    MAGIC_OFFSET,
)

__all__ = [
    "BF16_MAX",
    "FP16_EPS",
    "FP16_MAX",
    "FP16_MIN_NORMAL",
    "FP16_MIN_SUBNORMAL",
    "Fp16Error",
    "bf16_bits_to_f32",
    "bf16_to_f32",
    "encode_fp16_values",
    "f16_bits_to_f32",
    "f32_to_bf16",
    "f32_to_bf16_bits",
    "f32_to_f16_bits",
    "f32_to_fp16",
    "fp16_to_f32",
    "from_fp16_array",
    "round_f64_to_bf16",
    "round_to_bf16",
    "round_to_fp16",
    "to_fp16_array",
]

FP16_MAX = 65504.0
"""Largest finite binary16 value, (2 - 2**-10) * 2**15."""
FP16_MIN_NORMAL = 2.0**-14
"""Smallest positive normal binary16 value."""
FP16_MIN_SUBNORMAL = 2.0**-24
"""Smallest positive subnormal binary16 value."""
FP16_EPS = 2.0**-10
"""Gap between 1.0 and the next binary16 value."""
BF16_MAX = (2.0 - 2.0**-7) * 2.0**127
"""Largest finite bfloat16 value."""


class Fp16Error(AnekitError, ValueError):
    """A half-precision conversion got an argument it cannot convert (bad bit pattern, dtype or shape)."""


# The bulk kernels walk the data in blocks of this many elements, with every intermediate in preallocated
# scratch: a temporary per numpy call would cost more than the arithmetic.
_CHUNK = 1 << 15
# A fix-up hitting more than 1/_DENSE_FRACTION of a block runs over the whole block instead of gathering.
_DENSE_FRACTION = 16

_U32 = np.uint32
# Exponent rebias 127 - 15 = 112, i.e. 112 << 23, less the 0x0FFF rounding bias added in the same step.
_F16_REBIAS_MINUS_HALF = _U32(0x38000000 - 0x0FFF)


# --------------------------------------------------------------------------------------------------------
# argument handling
# --------------------------------------------------------------------------------------------------------


def _as_f32(x: npt.ArrayLike) -> np.ndarray:
    """Convert the input to a float32 ndarray (float64 is rounded to float32, overflowing to inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float32)


def _contiguous(a: np.ndarray) -> np.ndarray:
    """Return ``a`` itself if C-contiguous, else a C-contiguous copy (0-d arrays stay 0-d)."""
    return a if a.flags.c_contiguous else a.copy(order="C")


def _as_bits(bits: npt.ArrayLike, what: str) -> np.ndarray:
    """Validate 16-bit patterns given as any integer array and return them as uint16."""
    arr = np.asarray(bits)
    if arr.dtype == np.uint16:
        return arr
    if arr.dtype.kind not in "iu":
        raise Fp16Error(f"{what} bit patterns must be an integer array, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 0xFFFF):
        bad = arr[(arr < 0) | (arr > 0xFFFF)].flat[0]
        raise Fp16Error(f"{what} bit patterns must lie in 0..65535, got {int(bad)}")
    return arr.astype(np.uint16)


def _scalar_bits(bits: Any, what: str) -> int:
    """Validate one 16-bit pattern given as an int."""
    if isinstance(bits, bool):
        raise Fp16Error(f"{what} bit pattern must be an int in 0..65535, got {bits!r}")
    try:
        value = operator.index(bits)
    except TypeError:
        raise Fp16Error(f"{what} bit pattern must be an int in 0..65535, got {bits!r}") from None
    if not 0 <= value <= 0xFFFF:
        raise Fp16Error(f"{what} bit pattern must lie in 0..65535, got {value} ({value:#x})")
    return value


def _check_out(out: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Validate an ``out=`` argument: a writeable float32 ndarray of the given shape."""
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        kind = f"ndarray of {out.dtype}" if isinstance(out, np.ndarray) else type(out).__name__
        raise Fp16Error(f"out must be a float32 ndarray, got {kind}")
    if out.shape != shape:
        raise Fp16Error(f"out has shape {out.shape}, expected {shape}")
    if not out.flags.writeable:
        raise Fp16Error("out is read-only")
    return out


# --------------------------------------------------------------------------------------------------------
# block machinery
# --------------------------------------------------------------------------------------------------------


class _Scratch(NamedTuple):
    """Scratch buffers for one block: five uint32 and two bool arrays of the block's length."""

    a: np.ndarray
    r: np.ndarray
    t1: np.ndarray
    t2: np.ndarray
    t3: np.ndarray
    m1: np.ndarray
    m2: np.ndarray


def _scratch(size: int) -> _Scratch:
    """Allocate scratch for blocks of up to ``size`` elements."""
    words = np.empty((5, size), dtype=np.uint32)
    flags = np.empty((2, size), dtype=np.bool_)
    return _Scratch(*words, *flags)


# A fix-up: (patterns, out, uint32 scratch, uint32 scratch, bool scratch) -> None, all the same length.
_Fix = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
# A block kernel: (float32 patterns as uint32, destination, scratch) -> None.
_Kernel = Callable[[np.ndarray, np.ndarray, _Scratch], None]


def _run(kernel: _Kernel, src: np.ndarray, dst: np.ndarray) -> None:
    """Apply ``kernel`` block by block to 1-d uint32 ``src``, writing 1-d ``dst`` (may alias ``src``)."""
    n = src.size
    if n == 0:
        return
    full = _scratch(min(n, _CHUNK))
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        w = full if stop - start == full.a.size else _Scratch(*(b[: stop - start] for b in full))
        kernel(src[start:stop], dst[start:stop], w)


def _patch(r: np.ndarray, mask: np.ndarray, a: np.ndarray, fix: _Fix, w: _Scratch) -> None:
    """Set ``r[i]`` to ``fix`` of ``a[i]`` wherever ``mask[i]``; ``mask`` must not be ``w.m2``.

    A few hits are gathered, fixed and scattered back. Many hits run ``fix`` over the whole block (it must
    accept any pattern) and merge with ``r ^= (r ^ fixed) * mask``, which avoids a slow masked copy.
    """
    hits = int(np.count_nonzero(mask))
    if hits == 0:
        return
    if hits * _DENSE_FRACTION < mask.size:
        idx = np.flatnonzero(mask)
        s = a[idx]
        out = np.empty_like(s)
        fix(s, out, np.empty_like(s), np.empty_like(s), np.empty(hits, dtype=np.bool_))
        r[idx] = out
    else:
        fix(a, w.t1, w.t2, w.t3, w.m2)
        np.bitwise_xor(w.t1, r, out=w.t1)
        np.multiply(w.t1, mask, out=w.t1)
        np.bitwise_xor(r, w.t1, out=r)


# --------------------------------------------------------------------------------------------------------
# binary16 kernels
# --------------------------------------------------------------------------------------------------------


def _fix_f16_nan(s: np.ndarray, out: np.ndarray, t: np.ndarray, t2: np.ndarray, mb: np.ndarray) -> None:
    """Half NaN for |x| NaN patterns: the top 10 payload bits kept and the quiet bit forced, so never inf."""
    np.right_shift(s, 13, out=out)
    np.bitwise_and(out, 0x03FF, out=out)
    np.bitwise_or(out, 0x7E00, out=out)


def _fix_f16_small(s: np.ndarray, out: np.ndarray, shift: np.ndarray, m: np.ndarray, mb: np.ndarray) -> None:
    """Half patterns for |x| patterns below 2**-14: subnormal halves and zero, round to nearest even.

    With e the biased exponent and m the 24-bit significand, the value in units of 2**-24 is
    m * 2**(e - 126); shifting right by 126 - e (at least 14) with rounding gives the half mantissa, and a
    carry into bit 10 lands exactly on the smallest normal half. Shifts of 25 or more always give 0, so
    they are capped at 31; the floor of 14 only bounds the result (to at most 1024) for larger patterns.
    """
    np.right_shift(s, 23, out=shift)
    np.subtract(126, shift, out=shift)  # wraps for exponents above 126; the clip catches that
    np.clip(shift, 14, 31, out=shift)
    np.bitwise_and(s, 0x007FFFFF, out=m)
    np.bitwise_or(m, 0x00800000, out=m)
    np.right_shift(m, shift, out=out)
    np.bitwise_and(out, 1, out=out)  # lsb of the kept part: ties go to even
    np.add(out, m, out=out)
    np.subtract(shift, 1, out=m)
    np.left_shift(1, m, out=m)  # half a unit of the kept part
    np.add(out, m, out=out)
    np.subtract(out, 1, out=out)
    np.right_shift(out, shift, out=out)


def _encode_f16_kernel(u: np.ndarray, dst: np.ndarray, w: _Scratch) -> None:
    """Encode float32 patterns ``u`` as binary16 patterns into uint16 ``dst``, round to nearest even."""
    a, r = w.a, w.r
    r_signed = r.view(np.int32)
    np.bitwise_and(u, F32_ABS, out=a)
    # Normal results: rebias the exponent and round away 13 mantissa bits, ties to even. A carry out of the
    # mantissa bumps the exponent, which is exactly right, up to and including inf (clipped below). Under
    # the rebias point the difference goes negative as int32 and the clip makes it +0.
    np.right_shift(a, 13, out=r)
    np.bitwise_and(r, 1, out=r)
    np.add(r, a, out=r)
    np.subtract(r, _F16_REBIAS_MINUS_HALF, out=r)
    np.right_shift(r_signed, 13, out=r_signed)
    np.clip(r_signed, 0, 0x7C00, out=r_signed)
    np.greater(a, F32_INF, out=w.m1)
    _patch(r, w.m1, a, _fix_f16_nan, w)
    # 0 < |x| < 2**-14 (subtracting 1 first moves zero out of the range; zero is already right).
    np.subtract(a, 1, out=w.t1)
    np.less(w.t1, F16_SUBNORMAL_LIMIT - _U32(1), out=w.m1)
    _patch(r, w.m1, a, _fix_f16_small, w)
    np.right_shift(u, 16, out=a)
    np.bitwise_and(a, 0x8000, out=a)
    np.bitwise_or(r, a, out=dst, casting="unsafe")


def _fix_round_fp16_special(
    s: np.ndarray, out: np.ndarray, t: np.ndarray, t2: np.ndarray, mb: np.ndarray
) -> None:
    """float32 patterns for |x| patterns past the half range: inf, or NaN narrowed to a quiet half NaN."""
    np.maximum(s, F32_INF, out=out)
    np.bitwise_and(out, _U32(0xFFFFE000), out=out)
    np.greater(s, F32_INF, out=mb)
    np.multiply(mb, F32_QUIET, out=t)
    np.bitwise_or(out, t, out=out)


def _fix_round_fp16_small(
    s: np.ndarray, out: np.ndarray, t: np.ndarray, t2: np.ndarray, mb: np.ndarray
) -> None:
    """float32 patterns of the subnormal half (or zero) nearest to |x| patterns below 2**-14."""
    _fix_f16_small(s, t, t2, out, mb)
    np.take(_F16_TO_F32_BITS, t, out=out, mode="clip")


def _round_fp16_kernel(u: np.ndarray, dst: np.ndarray, w: _Scratch) -> None:
    """Round float32 patterns ``u`` to binary16 precision, writing float32 patterns to uint32 ``dst``.

    Stays in the float32 format, so there is no encode/decode round trip; ``dst`` may alias ``u``.
    """
    a, r = w.a, w.r
    np.bitwise_and(u, F32_ABS, out=a)
    # Round away the low 13 mantissa bits, nearest even, a carry bumping the exponent: right for every
    # half-normal result and for zero. Results past 65504, NaN and subnormal halves are fixed up below.
    np.right_shift(a, 13, out=r)
    np.bitwise_and(r, 1, out=r)
    np.add(r, 0x0FFF, out=r)
    np.add(r, a, out=r)
    np.bitwise_and(r, _U32(0xFFFFE000), out=r)
    np.greater(r, F32_FP16_MAX, out=w.m1)
    _patch(r, w.m1, a, _fix_round_fp16_special, w)
    np.subtract(a, 1, out=w.t1)
    np.less(w.t1, F16_SUBNORMAL_LIMIT - _U32(1), out=w.m1)
    _patch(r, w.m1, a, _fix_round_fp16_small, w)
    np.bitwise_and(u, F32_SIGN, out=a)
    np.bitwise_or(r, a, out=dst)


# The one-pass-per-step path of round_to_fp16 (see _round_fp16_fast): the constants are fp16_bits'.


def _round_fp16_fast(x: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    """Round float32 ``x`` to binary16 precision in float32 arithmetic, or None if ``x`` holds NaN, inf or a
    magnitude of 65520 or more (the caller then takes the blocked bit path, which handles those).

    For x in the binade [2**e, 2**(e+1)), e >= -14, add C = 1.5 * 2**(e + 13): x + C lies in
    [2**(e+13), 2**(e+14)), where the float32 ulp is 2**(e - 10), the half's ulp at 2**e, and C is an
    even multiple of it, so the float32 addition (round to nearest even) rounds x exactly as binary16
    does; x + C - C is then exact. Below 2**-14, C = 0.75 gives the fixed subnormal step 2**-24. A result
    of zero comes back as +0, so the sign of x is put back with an OR (negative results already carry
    it). No operation yields or reads a float32 subnormal except x itself, so flush-to-zero modes cannot
    change the result. ``out`` may be ``x`` (in place) or None; it must not overlap ``x`` otherwise.
    """
    if x.ndim == 0 or x.size == 0:  # numpy hands back scalars for 0-d operands: not worth a special case
        return None
    lo, hi = np.minimum.reduce(x, axis=None), np.maximum.reduce(x, axis=None)
    if not (lo > -FP16_ROUND_LIMIT and hi < FP16_ROUND_LIMIT):  # also False for NaN
        return None
    u = x.view(_U32)
    c = np.bitwise_and(u, F32_EXP)
    sign = np.bitwise_and(u, F32_SIGN) if out is x else None  # in place: keep the sign before overwriting
    np.add(c, MAGIC_OFFSET, out=c)
    np.maximum(c, MAGIC_MIN, out=c)
    cf = c.view(np.float32)
    r = np.add(x, cf, out=np.empty(x.shape, dtype=np.float32) if out is None else out)
    np.subtract(r, cf, out=r)
    if sign is None:
        sign = np.bitwise_and(u, F32_SIGN, out=c)
    rb = r.view(_U32)
    np.bitwise_or(rb, sign, out=rb)
    return r


# Below this many elements numpy's own cast costs less than the encoder's fixed calls.
_SMALL_ENCODE = 2048
# Elements per block of encode_fp16_values: its three scratch words per element stay in cache.
_ENCODE_CHUNK = 1 << 16
_SUBNORMAL_CAP = np.full(_ENCODE_CHUNK, 0x0400, dtype=np.int32)
_SUBNORMAL_CAP.setflags(write=False)


def encode_fp16_values(x: np.ndarray, out: np.ndarray) -> bool:
    """Write the binary16 patterns of float32 ``x`` into uint16 ``out`` if every value is a finite half.

    For values binary16 represents exactly (what the simulator stores; any ``round_to_fp16`` result) the
    encoding is a rebias: a normal half is the float32 pattern shifted right by 13 less 112 << 10, zero
    (negative there) is cleared, and subnormal halves are gathered and scaled by 2**24. About twice as
    fast as numpy's cast, which has no vector loop for float16.

    Returns False, leaving ``out`` partly written, when ``x`` holds NaN, inf, a magnitude past 65504 or a
    value between halves, when it is small or either array is not C-contiguous; the caller then casts
    with numpy, which gives these same patterns wherever this function succeeds. ``x`` and ``out`` must
    have the same size; ``x`` is only read.
    """
    if x.dtype != np.float32 or out.dtype != np.uint16 or x.size != out.size:
        raise Fp16Error(
            f"encode_fp16_values takes float32 -> uint16 of one size, got {x.dtype} -> {out.dtype}"
        )
    done = jit.encode_fp16_values(x, out)
    if done is not None:
        return done
    if x.size < _SMALL_ENCODE or not (x.flags.c_contiguous and out.flags.c_contiguous):
        return False
    u, dst = x.reshape(-1).view(_U32), out.reshape(-1)
    n = u.size
    # Blocks through two scratch words per element, kept in cache: fresh full-size temporaries would cost
    # more in page faults than the arithmetic.
    scratch = np.empty((3, min(n, _ENCODE_CHUNK)), dtype=_U32)
    for start in range(0, n, _ENCODE_CHUNK):
        stop = min(start + _ENCODE_CHUNK, n)
        if not _encode_f16_exact_block(u[start:stop], dst[start:stop], *scratch[:, : stop - start]):
            return False
    return True


def _encode_f16_exact_block(
    u: np.ndarray, dst: np.ndarray, a: np.ndarray, t: np.ndarray, s: np.ndarray
) -> bool:
    """``encode_fp16_values`` on one block of float32 patterns ``u`` (``a``, ``t``, ``s``: uint32 scratch)."""
    np.bitwise_and(u, F32_ABS, out=a)
    if np.maximum.reduce(a) > F32_FP16_MAX:  # inf, NaN or past the half range
        return False
    np.bitwise_and(a, F16_LOW_BITS, out=t)
    if np.maximum.reduce(t):  # bits a half does not have
        return False
    r = t.view(np.int32)
    np.right_shift(a, _U32(13), out=t)
    np.subtract(r, F16_REBIAS_SHIFTED, out=r)  # a normal half's exponent and mantissa, at least 0x400
    if np.minimum.reduce(r) < 0x0400:  # zero or subnormal halves: below 0x400 here, negative for zero
        # |x| + 0.5 rounds |x| to the subnormal step 2**-24 (the float32 ulp in [0.5, 1)), ties to even,
        # so its pattern less 0.5's is the subnormal half (or zero, or 0x400 for the smallest normal), and
        # at least that for every |x| from 2**-14 on. Under 2**-14 it is at least ``r``, so with it capped
        # at 0x400 the larger of the two is right everywhere. (numpy's maximum / minimum against a scalar
        # take a slow loop: the cap is a constant array.)
        sf = s.view(np.float32)
        np.add(a.view(np.float32), np.float32(0.5), out=sf)
        sub = s.view(np.int32)
        np.subtract(sub, F32_HALF_BITS, out=sub)
        np.minimum(sub, _SUBNORMAL_CAP[: sub.size], out=sub)
        np.maximum(r, sub, out=r)
    np.right_shift(u, _U32(16), out=a)
    np.bitwise_and(a, _U32(0x8000), out=a)  # the sign, moved to bit 15
    np.bitwise_or(a, t, out=a)
    np.copyto(dst, a, casting="unsafe")
    return True


def _decode_f16_table() -> np.ndarray:
    """The float32 pattern (uint32) of each of the 65,536 binary16 patterns, read-only."""
    h = np.arange(1 << 16, dtype=np.uint32)
    sign = (h & _U32(0x8000)) << _U32(16)
    em = h & _U32(0x7FFF)
    exp = em >> _U32(10)
    # Normal: rebias the exponent by 127 - 15 = 112.
    bits = (em << _U32(13)) + _U32(112 << 23)
    # Inf and NaN: all-ones exponent; the whole 10-bit payload fits, quiet or signalling alike.
    special = exp == 31
    bits[special] = (em[special] << _U32(13)) + _U32(0x70000000)
    # Zero and subnormal: mant * 2**-24, normalised on its leading one at bit p = floor(log2(mant)).
    sub = exp == 0
    mant = em[sub]
    p = np.zeros_like(mant)
    for k in range(1, 10):
        p += mant >= _U32(1 << k)
    normalised = ((p + _U32(103)) << _U32(23)) | ((mant << (_U32(23) - p)) & _U32(0x007FFFFF))
    bits[sub] = np.where(mant == 0, _U32(0), normalised)
    bits |= sign
    bits.setflags(write=False)
    return bits


_F16_TO_F32_BITS = _decode_f16_table()


# --------------------------------------------------------------------------------------------------------
# bfloat16 kernels
# --------------------------------------------------------------------------------------------------------


def _fix_bf16_nan(s: np.ndarray, out: np.ndarray, t: np.ndarray, t2: np.ndarray, mb: np.ndarray) -> None:
    """NaN patterns with the quiet bit set, so truncating the payload can never leave inf."""
    np.bitwise_or(s, F32_QUIET, out=out)


def _round_bf16_common(u: np.ndarray, w: _Scratch) -> np.ndarray:
    """float32 patterns ``u`` rounded to bfloat16 in the high half (low half garbage); returns ``w.r``."""
    r = w.r
    # Round to nearest, ties to even: add 0x7FFF plus the lsb that survives, then the caller drops the low
    # 16 bits. Finite values carry into the exponent correctly, overflowing to inf; NaN is fixed up.
    np.right_shift(u, 16, out=r)
    np.bitwise_and(r, 1, out=r)
    np.add(r, 0x7FFF, out=r)
    np.add(r, u, out=r)
    np.isnan(u.view(np.float32), out=w.m1)
    _patch(r, w.m1, u, _fix_bf16_nan, w)
    return r


def _round_bf16_kernel(u: np.ndarray, dst: np.ndarray, w: _Scratch) -> None:
    """Round float32 patterns ``u`` to bfloat16 precision as float32 patterns in ``dst`` (may alias ``u``)."""
    np.bitwise_and(_round_bf16_common(u, w), _U32(0xFFFF0000), out=dst)


def _encode_bf16_kernel(u: np.ndarray, dst: np.ndarray, w: _Scratch) -> None:
    """Encode float32 patterns ``u`` as bfloat16 patterns into uint16 ``dst``."""
    np.right_shift(_round_bf16_common(u, w), 16, out=dst, casting="unsafe")


# --------------------------------------------------------------------------------------------------------
# public bulk API
# --------------------------------------------------------------------------------------------------------


def _encode(kernel: _Kernel, x: npt.ArrayLike) -> np.ndarray:
    """Run an encoding kernel over ``x`` (as float32) into a new uint16 array of its shape."""
    xf = _contiguous(_as_f32(x))
    dst = np.empty(xf.shape, dtype=np.uint16)
    _run(kernel, xf.reshape(-1).view(np.uint32), dst.reshape(-1))
    return dst


def _round(kernel: _Kernel, x: npt.ArrayLike, out: np.ndarray | None) -> np.ndarray:
    """Run a float32 -> float32 rounding kernel over ``x``, into ``out`` if given."""
    xf = _as_f32(x)
    if out is not None:
        _check_out(out, xf.shape)
    src = _contiguous(xf)
    if out is not None and src is not out and np.may_share_memory(src, out):
        src = src.copy()  # out overlaps the input other than exactly: blocks would read what they wrote
    res = out if out is not None and out.flags.c_contiguous else np.empty(src.shape, dtype=np.float32)
    _run(kernel, src.reshape(-1).view(np.uint32), res.reshape(-1).view(np.uint32))
    if out is not None and res is not out:
        out[...] = res
        return out
    return res


def f32_to_f16_bits(x: npt.ArrayLike) -> np.ndarray:
    """Round float32 values to binary16 (nearest, ties to even) and return the bit patterns as uint16.

    Accepts any shape and anything ``np.asarray(x, dtype=np.float32)`` accepts. Float64 input is first
    converted to float32 (itself a rounding step), so the result is that of rounding the float32 value, which
    in rare near-tie cases differs from rounding the float64 value directly. Magnitudes that round past
    65504 become +-inf, results below 2**-14 are subnormal, -0.0 keeps its sign, and NaN stays NaN with its
    sign, the top 10 payload bits and the quiet bit set.
    """
    return _encode(_encode_f16_kernel, x)


def f16_bits_to_f32(bits: npt.ArrayLike) -> np.ndarray:
    """Decode binary16 bit patterns (any integer array with values in 0..65535) to float32, exactly.

    Every binary16 value is representable in float32, so this is lossless; NaN keeps its sign and payload.
    Raises Fp16Error for non-integer input or values outside 0..65535.
    """
    b = _contiguous(_as_bits(bits, "fp16"))
    res = np.empty(b.shape, dtype=np.uint32)
    src, dst = b.reshape(-1), res.reshape(-1)
    n = src.size
    # A table lookup, in blocks through one index buffer: numpy would otherwise widen all indices at once.
    idx = np.empty(min(n, _CHUNK), dtype=np.intp)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        k = stop - start
        idx[:k] = src[start:stop]
        np.take(_F16_TO_F32_BITS, idx[:k], out=dst[start:stop], mode="clip")
    return res.view(np.float32)


def f32_to_bf16_bits(x: npt.ArrayLike) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest, ties to even) and return the bit patterns as uint16.

    Input handling is as for ``f32_to_f16_bits`` (float64 goes through float32 first). Overflow goes to +-inf,
    subnormals round like any other value, and NaN stays a quiet NaN with its sign and top payload bits.
    """
    return _encode(_encode_bf16_kernel, x)


def bf16_bits_to_f32(bits: npt.ArrayLike) -> np.ndarray:
    """Decode bfloat16 bit patterns (any integer array with values in 0..65535) to float32, exactly.

    bfloat16 is the top half of a float32, so this is a plain shift; NaN patterns are kept as they are.
    Raises Fp16Error for non-integer input or values outside 0..65535.
    """
    b = _as_bits(bits, "bf16")
    res = np.empty(b.shape, dtype=np.uint32)
    np.left_shift(b, 16, out=res, dtype=np.uint32)
    return res.view(np.float32)


def to_fp16_array(x: npt.ArrayLike) -> np.ndarray:
    """Round float32 values to binary16 as in ``f32_to_f16_bits`` and return them as a float16 array."""
    return f32_to_f16_bits(x).view(np.float16)


def from_fp16_array(a: npt.ArrayLike) -> np.ndarray:
    """Widen a float16 array to float32 exactly, as in ``f16_bits_to_f32``.

    Raises Fp16Error if ``a`` is not float16; use ``f16_bits_to_f32`` for raw uint16 bit patterns.
    """
    arr = np.asarray(a)
    if arr.dtype != np.float16:
        raise Fp16Error(f"from_fp16_array expects a float16 array, got dtype {arr.dtype}")
    return f16_bits_to_f32(arr.view(np.uint16))


def round_to_fp16(x: npt.ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
    """Round float32 values to the nearest binary16 value (ties to even) and return them as float32.

    Bit for bit ``f16_bits_to_f32(f32_to_f16_bits(x))`` (overflow to +-inf, subnormals, -0.0, quiet NaN),
    computed directly in the float32 format, which is faster than that round trip and than numpy's
    ``astype(np.float16).astype(np.float32)``. Float64 input goes through float32 first. ``out``, if given,
    must be a writeable float32 array of the input's shape; it receives the result and is returned. It may be
    the input itself, for rounding in place.
    """
    xf = _as_f32(x)
    if out is not None:
        _check_out(out, xf.shape)
        if out is xf:
            if jit.round_fp16_inplace(xf):
                return xf
        elif np.may_share_memory(xf, out):
            return _round(_round_fp16_kernel, xf, out)  # partial overlap: the blocked path copies first
        elif jit.round_fp16_into(xf, out):
            return out
    elif xf.ndim and jit.available():
        fresh = np.empty_like(xf)
        if jit.round_fp16_into(xf, fresh):
            return fresh
    fast = _round_fp16_fast(xf, out)
    if fast is not None:
        return fast
    return _round(_round_fp16_kernel, xf, out)


def round_to_bf16(x: npt.ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 value (ties to even) and return them as float32.

    Bit for bit ``bf16_bits_to_f32(f32_to_bf16_bits(x))``: overflow to +-inf, and NaN becomes a quiet NaN
    with its sign and top payload bits. Float64 input goes through float32 first; ``out`` works as in
    ``round_to_fp16``.
    """
    return _round(_round_bf16_kernel, x, out)


# --------------------------------------------------------------------------------------------------------
# scalar API
# --------------------------------------------------------------------------------------------------------


def f32_to_fp16(value: float) -> int:
    """Round one value to binary16 (nearest, ties to even) and return its bit pattern as an int.

    The value is first converted to float32 (Python floats are float64), then rounded as in
    ``f32_to_f16_bits``: ``f32_to_fp16(1.0) == 0x3C00``, ``f32_to_fp16(65520.0) == 0x7C00`` (inf).
    """
    return int(f32_to_f16_bits(float(value)))


def fp16_to_f32(bits: int) -> float:
    """Decode one binary16 bit pattern (an int in 0..65535) to its exact value as a Python float.

    Raises Fp16Error if ``bits`` is not an int in 0..65535.
    """
    return float(_F16_TO_F32_BITS[_scalar_bits(bits, "fp16")].view(np.float32))


def f32_to_bf16(value: float) -> int:
    """Round one value to bfloat16 (nearest, ties to even) and return its bit pattern as an int.

    The value is first converted to float32, then rounded as in ``f32_to_bf16_bits``.
    """
    return int(f32_to_bf16_bits(float(value)))


def bf16_to_f32(bits: int) -> float:
    """Decode one bfloat16 bit pattern (an int in 0..65535) to its exact value as a Python float.

    Raises Fp16Error if ``bits`` is not an int in 0..65535.
    """
    return float(_U32(_scalar_bits(bits, "bf16") << 16).view(np.float32))


def round_f64_to_bf16(x: npt.ArrayLike) -> np.ndarray:
    """Round float64 values to the nearest bfloat16 value (ties to even) in ONE rounding; float32 result.

    ``round_to_bf16`` takes float32, so float64 input would be rounded twice (to float32, then to bf16)
    and land on the wrong side of a tie that float32 cannot see. Here the 8 significant bits are kept
    straight from the float64 bit pattern; below bf16's normal range values round on its subnormal grid
    (2**-133), past its largest finite value they overflow to +-inf, NaN stays NaN.
    """
    a = np.asarray(x, dtype=np.float64)
    bits = np.ascontiguousarray(a).view(np.uint64)
    drop = np.uint64(45)  # 53 significant bits of float64 -> 8 of bfloat16
    half = np.uint64((1 << 44) - 1)
    odd = (bits >> drop) & np.uint64(1)
    rounded = ((bits + half + odd) >> drop << drop).view(np.float64)
    small = np.abs(a) < 2.0**-126
    if small.any():  # bf16 subnormals share float32's grid: round there, ties to even
        rounded = np.where(small, np.round(a * 2.0**133) * 2.0**-133, rounded)
    with np.errstate(over="ignore"):
        out = rounded.astype(np.float32)
    out[np.abs(rounded) > BF16_MAX] = np.copysign(np.inf, rounded[np.abs(rounded) > BF16_MAX])
    nan = np.isnan(a)
    if nan.any():
        out[nan] = np.nan
    return out.reshape(a.shape)
