"""Bit-exact IEEE 754 binary16 and bfloat16 <-> float32 conversion, scalar and vectorised."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from anekit.errors import AnekitError

__all__ = [
    "BF16_MAX",
    "FP16_EPS",
    "FP16_MAX",
    "FP16_MIN_NORMAL",
    "FP16_MIN_SUBNORMAL",
    "Fp16Error",
    "bf16_bits_to_f32",
    "bf16_to_f32",
    "f16_bits_to_f32",
    "f32_to_bf16",
    "f32_to_bf16_bits",
    "f32_to_f16_bits",
    "f32_to_fp16",
    "fp16_to_f32",
    "from_fp16_array",
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
BF16_MAX = float(np.uint32(0x7F7F0000).view(np.float32))
"""Largest finite bfloat16 value, (2 - 2**-7) * 2**127."""


class Fp16Error(AnekitError, ValueError):
    """A half-precision conversion got an argument it cannot convert (bad bit pattern, dtype or shape)."""


# Work on blocks this many elements long so the temporaries stay in cache.
_CHUNK = 1 << 16
# Fix-ups touching more than 1/_DENSE_FRACTION of a block are done over the whole block.
_DENSE_FRACTION = 16

_F32_ABS = np.uint32(0x7FFFFFFF)
_F32_INF = np.uint32(0x7F800000)
_F32_QUIET = np.uint32(0x00400000)
# |x| below 2**-14 (0x38800000) gives a subnormal half or zero; the exponent rebias is 112 << 23.
_F16_SUBNORMAL_LIMIT = np.uint32(0x38800000)
_F16_REBIAS_MINUS_HALF = np.uint32(0x38000000 - 0x0FFF)
_F32_FP16_MAX = np.uint32(0x477FE000)


def _chunks(n: int) -> Iterator[slice]:
    """Yield consecutive slices covering range(n), each at most _CHUNK long."""
    for start in range(0, n, _CHUNK):
        yield slice(start, min(start + _CHUNK, n))


def _patch(r: np.ndarray, mask: np.ndarray, a: np.ndarray, fix: Callable[[np.ndarray], np.ndarray]) -> None:
    """Set ``r[i] = fix(a)[i]`` wherever ``mask[i]``; ``fix`` maps uint32 patterns elementwise.

    A few hits are gathered, fixed and scattered back; when there are many, ``fix`` runs over the whole
    block (it must accept any pattern) and the result is merged, which is then much cheaper.
    """
    hits = np.count_nonzero(mask)
    if hits == 0:
        return
    if hits * _DENSE_FRACTION < mask.size:
        idx = np.flatnonzero(mask)
        r[idx] = fix(a[idx])
    else:
        np.copyto(r, fix(a), where=mask)


def _as_f32(x: npt.ArrayLike) -> np.ndarray:
    """Convert the input to a float32 ndarray (float64 is rounded to float32, overflow going to inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float32)


def _contiguous(a: np.ndarray) -> np.ndarray:
    """Return ``a`` itself if C-contiguous, else a C-contiguous copy (keeping 0-d arrays 0-d)."""
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
        raise Fp16Error(
            f"out must be a float32 ndarray, got {type(out).__name__} {getattr(out, 'dtype', '')}"
        )
    if out.shape != shape:
        raise Fp16Error(f"out has shape {out.shape}, expected {shape}")
    if not out.flags.writeable:
        raise Fp16Error("out is read-only")
    return out


# --------------------------------------------------------------------------------------------------------
# binary16 kernels
# --------------------------------------------------------------------------------------------------------


def _encode_f16_small(s: np.ndarray) -> np.ndarray:
    """binary16 bit patterns (uint32) for |x| patterns ``s`` below 2**-14: subnormal halves and zero, RNE.

    The value in units of 2**-24 is m * 2**(e - 126), with m the 24-bit significand; shifting right by
    126 - e (at least 14) with round to nearest even gives the half mantissa, and a carry into bit 10
    lands exactly on the smallest normal half. Shifts of 25 or more always give 0, so they are capped at 31;
    the lower clip only keeps the result small (at most 1024) for patterns outside the intended range.
    """
    shift = np.clip(np.uint32(126) - (s >> np.uint32(23)), np.uint32(14), np.uint32(31))
    m = (s & np.uint32(0x007FFFFF)) | np.uint32(0x00800000)
    half_minus_one = (np.uint32(1) << (shift - np.uint32(1))) - np.uint32(1)
    return (m + half_minus_one + ((m >> shift) & np.uint32(1))) >> shift


def _encode_f16_small_minus_one(s: np.ndarray) -> np.ndarray:
    """``_encode_f16_small`` of ``s + 1``."""
    return _encode_f16_small(s + np.uint32(1))


def _encode_f16_nan(s: np.ndarray) -> np.ndarray:
    """binary16 NaN (uint32) for |x| NaN patterns ``s``: top 10 payload bits kept, quiet bit forced."""
    return np.uint32(0x7E00) | ((s >> np.uint32(13)) & np.uint32(0x03FF))


def _encode_f16_block(u: np.ndarray, dst: np.ndarray, a: np.ndarray, r: np.ndarray, mask: np.ndarray) -> None:
    """Encode float32 bit patterns ``u`` (uint32) as binary16 patterns into ``dst`` (uint16), RNE.

    ``a`` and ``r`` are uint32 scratch and ``mask`` bool scratch, all as long as ``u``.
    """
    r_signed = r.view(np.int32)
    np.bitwise_and(u, _F32_ABS, out=a)
    # Normal results: rebias the exponent and round the 13 dropped mantissa bits to nearest, ties to even.
    # A carry out of the mantissa bumps the exponent, which is exactly right, up to and including inf.
    # Below the rebias point the subtraction goes negative (as int32) and the clip gives +0.
    np.right_shift(a, 13, out=r)
    np.bitwise_and(r, 1, out=r)
    np.add(r, a, out=r)
    np.subtract(r, _F16_REBIAS_MINUS_HALF, out=r)
    np.right_shift(r_signed, 13, out=r_signed)
    np.clip(r_signed, 0, 0x7C00, out=r_signed)  # overflow and inf saturate to inf
    # NaN: keep the top 10 payload bits and force the quiet bit, so the result can never read as inf.
    np.greater(a, _F32_INF, out=mask)
    _patch(r, mask, a, _encode_f16_nan)
    # Subnormal results: 0 < |x| < 2**-14 (subtracting 1 first moves zero out of the range).
    np.subtract(a, 1, out=a)
    np.less(a, _F16_SUBNORMAL_LIMIT - np.uint32(1), out=mask)
    _patch(r, mask, a, _encode_f16_small_minus_one)
    # Sign.
    np.right_shift(u, 16, out=a)
    np.bitwise_and(a, 0x8000, out=a)
    np.bitwise_or(r, a, out=dst, casting="unsafe")


def _encode_f16(x: np.ndarray) -> np.ndarray:
    """Encode a float32 array as uint16 binary16 patterns of the same shape."""
    src = _contiguous(x).reshape(-1).view(np.uint32)
    dst = np.empty(x.shape, dtype=np.uint16)
    flat = dst.reshape(-1)
    n = src.size
    if n:
        block = min(n, _CHUNK)
        a = np.empty(block, np.uint32)
        r = np.empty(block, np.uint32)
        mask = np.empty(block, np.bool_)
        for sl in _chunks(n):
            k = sl.stop - sl.start
            _encode_f16_block(src[sl], flat[sl], a[:k], r[:k], mask[:k])
    return dst


def _decode_f16_table() -> np.ndarray:
    """Build the float32 bit pattern (uint32) of every one of the 65,536 binary16 patterns."""
    h = np.arange(1 << 16, dtype=np.uint32)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    em = h & np.uint32(0x7FFF)
    exp = em >> np.uint32(10)
    mant = em & np.uint32(0x03FF)
    # Normal: rebias the exponent by 127 - 15 = 112.
    bits = (em << np.uint32(13)) + np.uint32(112 << 23)
    # Inf and NaN: all-ones exponent; the whole 10-bit payload fits, quiet or signalling alike.
    special = exp == 31
    bits[special] = (em[special] << np.uint32(13)) + np.uint32(0x70000000)
    # Zero and subnormal: value = mant * 2**-24; normalise on the leading one at bit p = floor(log2(mant)).
    sub = exp == 0
    m = mant[sub]
    p = np.zeros_like(m)
    for k in range(1, 10):
        p += m >= np.uint32(1 << k)
    sub_bits = ((p + np.uint32(103)) << np.uint32(23)) | ((m << (np.uint32(23) - p)) & np.uint32(0x007FFFFF))
    bits[sub] = np.where(m == 0, np.uint32(0), sub_bits)
    return bits | sign


_F16_TO_F32_BITS = _decode_f16_table()
_F16_TO_F32_BITS.setflags(write=False)


# --------------------------------------------------------------------------------------------------------
# bfloat16 kernels
# --------------------------------------------------------------------------------------------------------


def _quiet(s: np.ndarray) -> np.ndarray:
    """Set the float32 quiet-NaN bit in patterns ``s``."""
    return s | _F32_QUIET


def _round_bf16_block(u: np.ndarray, dst: np.ndarray, xf: np.ndarray, t: np.ndarray, mask: np.ndarray) -> None:
    """Round float32 patterns ``u`` to bfloat16 precision, writing float32 patterns (low half zero) to ``dst``.

    ``xf`` is ``u`` viewed as float32; ``dst`` may be ``u`` itself. ``t`` is uint32 and ``mask`` bool scratch.
    """
    # Round to nearest, ties to even: add 0x7FFF plus the lsb that survives, then drop the low 16 bits.
    # Finite values carry into the exponent correctly, overflowing to inf; NaN is handled apart.
    np.right_shift(u, 16, out=t)
    np.bitwise_and(t, 1, out=t)
    np.add(t, 0x7FFF, out=t)
    np.add(t, u, out=t)
    np.isnan(xf, out=mask)
    _patch(t, mask, u, _quiet)
    np.bitwise_and(t, np.uint32(0xFFFF0000), out=dst)


def _round_bf16(x: np.ndarray, out: np.ndarray) -> None:
    """Round contiguous float32 ``x`` into contiguous float32 ``out`` (which may be ``x``)."""
    src = x.reshape(-1)
    dst = out.reshape(-1).view(np.uint32)
    n = src.size
    if n:
        block = min(n, _CHUNK)
        t = np.empty(block, np.uint32)
        mask = np.empty(block, np.bool_)
        src_u = src.view(np.uint32)
        for sl in _chunks(n):
            k = sl.stop - sl.start
            _round_bf16_block(src_u[sl], dst[sl], src[sl], t[:k], mask[:k])


# --------------------------------------------------------------------------------------------------------
# public bulk API
# --------------------------------------------------------------------------------------------------------


def f32_to_f16_bits(x: npt.ArrayLike) -> np.ndarray:
    """Round float32 values to binary16 (nearest, ties to even) and return the bit patterns as uint16.

    Accepts any shape and anything ``np.asarray(x, dtype=np.float32)`` accepts. Float64 input is first
    converted to float32 (itself a rounding step), so the result is that of rounding the float32 value, which
    in rare near-tie cases differs from rounding the float64 value directly. Magnitudes that round past
    65504 become +-inf, results below 2**-14 are subnormal, -0.0 keeps its sign, and NaN stays NaN with its
    sign, the top 10 payload bits and the quiet bit set.
    """
    return _encode_f16(_as_f32(x))


def f16_bits_to_f32(bits: npt.ArrayLike) -> np.ndarray:
    """Decode binary16 bit patterns (any integer array with values in 0..65535) to float32, exactly.

    Every binary16 value is representable in float32, so this is lossless; NaN keeps its sign and payload.
    Raises Fp16Error for non-integer input or values outside 0..65535.
    """
    b = _as_bits(bits, "fp16")
    return _F16_TO_F32_BITS[b.reshape(-1)].view(np.float32).reshape(b.shape)


def f32_to_bf16_bits(x: npt.ArrayLike) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest, ties to even) and return the bit patterns as uint16.

    Input handling is as for ``f32_to_f16_bits`` (float64 goes through float32 first). Overflow goes to +-inf,
    subnormals round like any other value, and NaN stays a quiet NaN with its sign and top payload bits.
    """
    xf = _contiguous(_as_f32(x))
    tmp = np.empty(xf.shape, dtype=np.float32)
    _round_bf16(xf, tmp)
    res = np.empty(xf.shape, dtype=np.uint16)
    np.right_shift(tmp.view(np.uint32), np.uint32(16), out=res, casting="unsafe")
    return res


def bf16_bits_to_f32(bits: npt.ArrayLike) -> np.ndarray:
    """Decode bfloat16 bit patterns (any integer array with values in 0..65535) to float32, exactly.

    bfloat16 is the top half of a float32, so this is a plain shift; NaN patterns are kept as they are.
    Raises Fp16Error for non-integer input or values outside 0..65535.
    """
    b = _as_bits(bits, "bf16")
    res = np.empty(b.shape, dtype=np.uint32)
    np.left_shift(b, np.uint32(16), out=res, dtype=np.uint32)
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


# --------------------------------------------------------------------------------------------------------
# rounding float32 -> float32
# --------------------------------------------------------------------------------------------------------


def _round_fp16_special(s: np.ndarray) -> np.ndarray:
    """Float32 patterns for |x| patterns ``s`` that round past 65504: inf, or NaN narrowed to binary16."""
    return np.where(s > _F32_INF, (s & np.uint32(0xFFFFE000)) | _F32_QUIET, _F32_INF)


def _round_fp16_small_minus_one(s: np.ndarray) -> np.ndarray:
    """Float32 patterns of the subnormal half nearest to |x| pattern ``s + 1``."""
    return _F16_TO_F32_BITS[_encode_f16_small(s + np.uint32(1))]


def _round_fp16_block(u: np.ndarray, dst: np.ndarray, a: np.ndarray, r: np.ndarray, mask: np.ndarray) -> None:
    """Round float32 patterns ``u`` to binary16 precision, writing float32 patterns to ``dst`` (uint32).

    Works in the float32 format throughout, so no encode/decode round trip is needed; ``dst`` may be ``u``.
    ``a`` and ``r`` are uint32 scratch and ``mask`` bool scratch, all as long as ``u``.
    """
    np.bitwise_and(u, _F32_ABS, out=a)
    # Normal range: round away the low 13 mantissa bits, nearest even; a carry bumps the exponent. This is
    # also exact for zero, and every value that needs more than that is fixed up below.
    np.right_shift(a, 13, out=r)
    np.bitwise_and(r, 1, out=r)
    np.add(r, 0x0FFF, out=r)
    np.add(r, a, out=r)
    np.bitwise_and(r, np.uint32(0xFFFFE000), out=r)
    # Past 65504 after rounding (overflow, inf) or NaN: inf, or the NaN narrowed and widened back.
    np.greater(r, _F32_FP16_MAX, out=mask)
    _patch(r, mask, a, _round_fp16_special)
    # Subnormal halves, 0 < |x| < 2**-14: the quantum is 2**-24, so go through the half encoding.
    np.subtract(a, 1, out=a)
    np.less(a, _F16_SUBNORMAL_LIMIT - np.uint32(1), out=mask)
    _patch(r, mask, a, _round_fp16_small_minus_one)
    np.bitwise_and(u, np.uint32(0x80000000), out=a)
    np.bitwise_or(r, a, out=dst)


def _round_fp16(x: np.ndarray, out: np.ndarray) -> None:
    """Round contiguous float32 ``x`` into contiguous float32 ``out`` (which may be ``x``)."""
    src = x.reshape(-1).view(np.uint32)
    dst = out.reshape(-1).view(np.uint32)
    n = src.size
    if n:
        block = min(n, _CHUNK)
        a = np.empty(block, np.uint32)
        r = np.empty(block, np.uint32)
        mask = np.empty(block, np.bool_)
        for sl in _chunks(n):
            k = sl.stop - sl.start
            _round_fp16_block(src[sl], dst[sl], a[:k], r[:k], mask[:k])


def round_to_fp16(x: npt.ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
    """Round float32 values to the nearest binary16 value (ties to even) and return them as float32.

    Same results, bit for bit, as ``f16_bits_to_f32(f32_to_f16_bits(x))`` (overflow to +-inf, subnormals,
    -0.0, quiet NaN), computed directly in the float32 format, which is faster than the round trip and than
    numpy's ``astype(np.float16).astype(np.float32)``. Float64 input goes through float32 first.
    ``out``, if given, must be a float32 array of the input's shape and receives the result (it may be
    the input itself for in-place rounding); it is also returned.
    """
    xf = _as_f32(x)
    if out is not None:
        _check_out(out, xf.shape)
    src = _contiguous(xf)
    res = out if out is not None and out.flags.c_contiguous else np.empty(src.shape, np.float32)
    _round_fp16(src, res)
    if out is not None and res is not out:
        out[...] = res
        return out
    return res


def round_to_bf16(x: npt.ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 value (ties to even) and return them as float32.

    Same results as ``bf16_bits_to_f32(f32_to_bf16_bits(x))``; NaN becomes a quiet NaN with its sign and top
    payload bits. ``out`` works as in ``round_to_fp16``.
    """
    xf = _as_f32(x)
    if out is not None:
        _check_out(out, xf.shape)
    src = _contiguous(xf)
    res = out if out is not None and out.flags.c_contiguous else np.empty(src.shape, np.float32)
    _round_bf16(src, res)
    if out is not None and res is not out:
        out[...] = res
        return out
    return res


# --------------------------------------------------------------------------------------------------------
# scalar API
# --------------------------------------------------------------------------------------------------------


def f32_to_fp16(value: float) -> int:
    """Round one value to binary16 (nearest, ties to even) and return its bit pattern as an int.

    The value is first converted to float32 (Python floats are float64), then rounded as in
    ``f32_to_f16_bits``: ``f32_to_fp16(1.0) == 0x3C00``, ``f32_to_fp16(65520.0) == 0x7C00`` (inf).
    """
    return int(_encode_f16(_as_f32(float(value)).reshape(1))[0])


def fp16_to_f32(bits: int) -> float:
    """Decode one binary16 bit pattern (an int in 0..65535) to its exact value as a Python float.

    Raises Fp16Error if ``bits`` is not an int in 0..65535.
    """
    b = _scalar_bits(bits, "fp16")
    return float(_F16_TO_F32_BITS[b : b + 1].view(np.float32)[0])


def f32_to_bf16(value: float) -> int:
    """Round one value to bfloat16 (nearest, ties to even) and return its bit pattern as an int.

    The value is first converted to float32, then rounded as in ``f32_to_bf16_bits``.
    """
    return int(f32_to_bf16_bits(float(value)))


def bf16_to_f32(bits: int) -> float:
    """Decode one bfloat16 bit pattern (an int in 0..65535) to its exact value as a Python float.

    Raises Fp16Error if ``bits`` is not an int in 0..65535.
    """
    b = _scalar_bits(bits, "bf16")
    return float(np.uint32(b << 16).view(np.float32))
