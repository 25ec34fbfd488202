"""The float32-arithmetic path of round_to_fp16 against numpy's float16 cast and the blocked bit path.

``fp16._round_fp16_fast`` is called directly, so a divergence cannot hide behind the fallback: every
finite pattern below the overflow limit must take it and give numpy's cast bit for bit (sign of zero
included); NaN, inf and overflowing magnitudes must be refused, and ``round_to_fp16`` must then give the
blocked path's bits (NaN payloads included).
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit import fp16
from anekit.fp16 import round_to_fp16

pytestmark = pytest.mark.usefixtures("fp16_path")  # every test with and without the jit

U32 = np.uint32
SIGN = U32(0x80000000)


def numpy_round(x: np.ndarray) -> np.ndarray:
    """The independent oracle: numpy's float32 -> float16 -> float32 casts, as float32 bit patterns."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).astype(np.float32).view(U32)


def blocked_round(x: np.ndarray) -> np.ndarray:
    """The blocked bit path (the one taken for NaN / inf / overflow), as float32 bit patterns."""
    return fp16._round(fp16._round_fp16_kernel, x, None).view(U32)


def check_patterns(bits: np.ndarray) -> None:
    """Every pattern: the fast path where it applies equals numpy; round_to_fp16 equals the blocked path."""
    x = np.ascontiguousarray(bits, dtype=U32).view(np.float32)
    finite = np.isfinite(x) & (np.abs(x) < 65520.0)
    ok = x[finite]
    got = fp16._round_fp16_fast(ok, None)
    if ok.size:
        assert got is not None
        want = numpy_round(ok)
        bad = np.flatnonzero(got.view(U32) != want)
        assert bad.size == 0, (
            f"{bad.size} mismatches, first: x=0x{ok.view(U32)[bad[0]]:08x} "
            f"fast=0x{got.view(U32)[bad[0]]:08x} numpy=0x{want[bad[0]]:08x}"
        )
    np.testing.assert_array_equal(round_to_fp16(x).view(U32), blocked_round(x))


def test_every_exponent_every_low_mantissa() -> None:
    """All 256 exponents x both signs x all 2**14 low mantissa bits (the rounded-away bits and the lsb kept)
    x high mantissa bits all clear, all set and random: 25 million patterns."""
    rng = np.random.default_rng(1)
    low = np.arange(1 << 14, dtype=U32)
    for exponent in range(256):
        highs = [U32(0), U32(0x7FC000), U32(rng.integers(0, 1 << 9)) << U32(14)]
        for high in highs:
            bits = (U32(exponent) << U32(23)) | high | low
            check_patterns(np.concatenate([bits, bits | SIGN]))


def test_subnormal_binades_every_mantissa() -> None:
    """Below 2**-14 more bits are rounded away: every mantissa of the binades 2**-25, 2**-24 and 2**-15,
    every 5th of the others down to 2**-26, both signs."""
    mant = np.arange(1 << 23, dtype=U32)
    for exponent in range(127 - 26, 127 - 13):
        full = exponent - 127 in (-25, -24, -15)
        bits = (U32(exponent) << U32(23)) | (mant if full else mant[exponent % 5 :: 5])
        check_patterns(bits)
        check_patterns(bits[::7] | SIGN)


def test_random_bit_patterns() -> None:
    """64 million random patterns: uniform over all of float32, and concentrated on the half range."""
    rng = np.random.default_rng(2)
    for _ in range(4):
        check_patterns(rng.integers(0, 1 << 32, 1 << 23, dtype=np.uint64).astype(U32))
        exponent = rng.integers(127 - 26, 127 + 17, 1 << 23, dtype=np.uint64).astype(U32)
        mant = rng.integers(0, 1 << 23, 1 << 23, dtype=np.uint64).astype(U32)
        sign = rng.integers(0, 2, 1 << 23, dtype=np.uint64).astype(U32) << U32(31)
        check_patterns(sign | (exponent << U32(23)) | mant)


def test_boundaries() -> None:
    """Overflow limit, largest half, smallest subnormal and normal, zero and their neighbours."""
    edges = np.array(
        [0.0, 2.0**-25, 2.0**-24, 1.5 * 2.0**-24, 2.0**-14, 2.0**-14 - 2.0**-25, 65504.0, 65519.0, 65520.0],
        dtype=np.float32,
    ).view(U32)
    near = (edges[:, None].astype(np.int64) + np.arange(-4, 5)).ravel()
    near = near[(near >= 0) & (near < 1 << 31)].astype(U32)
    check_patterns(np.concatenate([near, near | SIGN]))
    specials = np.array([0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x7FBFFFFF, 0x477FF000], U32)
    check_patterns(np.concatenate([specials, specials | SIGN]))


def test_refuses_what_it_cannot_round() -> None:
    for bad in (np.nan, np.inf, -np.inf, 65520.0, -65520.0, 1e30):
        x = np.array([1.0, bad, 2.0], dtype=np.float32)
        assert fp16._round_fp16_fast(x, None) is None
    assert fp16._round_fp16_fast(np.array([65519.0, -65519.0], np.float32), None) is not None


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "in place", "out"])
def test_layouts_and_out(layout: str) -> None:
    rng = np.random.default_rng(3)
    base = (rng.standard_normal((64, 96)) * np.exp(rng.uniform(-20, 11, (64, 96)))).astype(np.float32)
    want = numpy_round(np.ascontiguousarray(base))
    if layout == "contiguous":
        got = round_to_fp16(base)
    elif layout == "transposed":
        got = round_to_fp16(base.T).T
    elif layout == "strided":
        got = round_to_fp16(base[:, ::2])
        want = numpy_round(np.ascontiguousarray(base[:, ::2]))
    elif layout == "in place":
        x = base.copy()
        got = round_to_fp16(x, out=x)
        assert got is x
    else:
        out = np.empty_like(base)
        got = round_to_fp16(base, out=out)
        assert got is out
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(U32), want)
