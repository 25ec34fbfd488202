"""Tests for anekit.fp16: exhaustive and randomised checks against numpy and independent references."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anekit import fp16
from anekit.errors import AnekitError
from anekit.fp16 import (
    Fp16Error,
    bf16_bits_to_f32,
    bf16_to_f32,
    f16_bits_to_f32,
    f32_to_bf16,
    f32_to_bf16_bits,
    f32_to_f16_bits,
    f32_to_fp16,
    fp16_to_f32,
    from_fp16_array,
    round_to_bf16,
    round_to_fp16,
    to_fp16_array,
)

pytestmark = pytest.mark.usefixtures("fp16_path")  # every test with and without the jit

ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
SIGN = np.uint32(0x80000000)


def u32(x: np.ndarray) -> np.ndarray:
    """float32 array as its bit patterns."""
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def f32(bits: np.ndarray) -> np.ndarray:
    """uint32 bit patterns as a float32 array."""
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def both_signs(bits: np.ndarray) -> np.ndarray:
    """Positive float32 patterns followed by the same patterns negated."""
    bits = np.asarray(bits, dtype=np.uint32)
    return np.concatenate([bits, bits | SIGN])


def numpy_f16_bits(x: np.ndarray) -> np.ndarray:
    """numpy's own float32 -> float16 cast, as bit patterns (the oracle)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def assert_f16_matches_numpy(x: np.ndarray) -> None:
    """f32_to_f16_bits(x) equals numpy's cast bit for bit, except that a NaN only has to stay a NaN."""
    got = f32_to_f16_bits(x)
    want = numpy_f16_bits(x)
    nan = np.isnan(x)
    bad = np.flatnonzero((got != want) & ~nan)
    assert bad.size == 0, [(hex(int(u32(x)[i])), hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]
    assert np.isnan(f16_bits_to_f32(got[nan])).all()


def half_midpoints() -> np.ndarray:
    """Patterns of every exact midpoint between adjacent positive finite halves (and 65504..inf), +-1 ulp."""
    lo = f16_bits_to_f32(np.arange(0x7C00, dtype=np.uint16)).astype(np.float64)
    hi = f16_bits_to_f32(np.arange(1, 0x7C01, dtype=np.uint16)).astype(np.float64)
    hi[-1] = 65536.0  # the next step past 65504, had the exponent range gone on
    mid = u32(((lo + hi) / 2).astype(np.float32))  # exact: a midpoint has at most 12 significant bits
    return both_signs(np.concatenate([mid - np.uint32(1), mid, mid + np.uint32(1)]))


# --------------------------------------------------------------------------------------------------------
# binary16, exhaustive
# --------------------------------------------------------------------------------------------------------


def test_f16_decode_exhaustive_matches_numpy() -> None:
    got = f16_bits_to_f32(ALL16)
    want = ALL16.view(np.float16).astype(np.float32)
    assert got.dtype == np.float32 and got.shape == (1 << 16,)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(u32(got)[~nan], u32(want)[~nan])
    # NaN widening is exact: sign and the whole payload, signalling or quiet.
    assert np.array_equal(
        u32(got)[nan],
        (ALL16[nan].astype(np.uint32) & 0x8000) << 16
        | 0x7F800000
        | ((ALL16[nan].astype(np.uint32) & 0x3FF) << 13),
    )


def test_f16_round_trip_exhaustive() -> None:
    widened = f16_bits_to_f32(ALL16)
    back = f32_to_f16_bits(widened)
    nan = np.isnan(widened)
    assert back.dtype == np.uint16
    assert np.array_equal(back[~nan], ALL16[~nan])
    # NaN stays NaN, keeps sign and payload, and comes back quiet (0x7E00 set).
    assert np.array_equal(back[nan] | 0x0200, ALL16[nan] | 0x0200)
    assert np.all(back[nan] & 0x7E00 == 0x7E00)


def test_f16_all_halves_match_numpy() -> None:
    assert_f16_matches_numpy(f16_bits_to_f32(ALL16))


# --------------------------------------------------------------------------------------------------------
# binary16, float32 inputs against numpy
# --------------------------------------------------------------------------------------------------------


def test_f16_random_bit_patterns_match_numpy() -> None:
    rng = np.random.default_rng(20240611)
    x = rng.integers(0, 2**32, size=3_000_000, dtype=np.uint32).view(np.float32)
    assert_f16_matches_numpy(x)


def test_f16_overflow_threshold_exhaustive() -> None:
    # Every float32 from 65504 up to 65536 (65520 and above round to inf), plus some way beyond.
    bits = np.arange(0x477FE000, 0x47800001, dtype=np.uint32)
    assert_f16_matches_numpy(f32(both_signs(bits)))
    x = f32_to_f16_bits(np.float32([65504, 65519.996, 65520, 65535, 65536, 1e9, 3.4e38, np.inf]))
    assert list(x) == [0x7BFF, 0x7BFF, 0x7C00, 0x7C00, 0x7C00, 0x7C00, 0x7C00, 0x7C00]


def test_f16_subnormal_range_matches_numpy() -> None:
    rng = np.random.default_rng(7)
    # |x| from below 2**-25 (rounds to 0) up to the smallest normal half, 2**-14, where results are subnormal.
    bits = rng.integers(0x32800000, 0x38800000, size=500_000, dtype=np.uint32)
    edges = np.arange(0x387FF000, 0x38801000, dtype=np.uint32)  # around 2**-14, exhaustive
    tiny = np.arange(0x32FFF000, 0x33801000, dtype=np.uint32)  # around 2**-25 and 2**-24, exhaustive
    f32_subnormals = rng.integers(0, 0x00800000, size=10_000, dtype=np.uint32)
    assert_f16_matches_numpy(f32(both_signs(np.concatenate([bits, edges, tiny, f32_subnormals]))))


def test_f16_ties_match_numpy() -> None:
    assert_f16_matches_numpy(f32(half_midpoints()))


def test_f16_ties_go_to_even() -> None:
    one = 1.0
    ulp = 2.0**-10
    assert f32_to_fp16(one + ulp / 2) == 0x3C00  # tie between 0x3C00 and 0x3C01: even wins
    assert f32_to_fp16(one + 3 * ulp / 2) == 0x3C02  # tie between 0x3C01 and 0x3C02
    assert f32_to_fp16(2.0**-25) == 0x0000  # tie between 0 and the smallest subnormal
    assert f32_to_fp16(3 * 2.0**-25) == 0x0002
    assert f32_to_fp16(-(2.0**-25)) == 0x8000


def test_f16_nan_handling() -> None:
    pats = np.array(
        [
            0x7F800001,
            0x7F801FFF,
            0x7F802000,
            0x7F812000,
            0x7FBFFFFF,
            0x7FC00000,
            0x7FFFFFFF,
            0xFF800001,
            0xFFFFFFFF,
        ],
        dtype=np.uint32,
    )
    got = f32_to_f16_bits(f32(pats))
    assert [hex(v) for v in got] == [
        "0x7e00",  # payload only in the dropped bits: quiet bit keeps it a NaN, not inf
        "0x7e00",
        "0x7e01",
        "0x7e09",
        "0x7fff",
        "0x7e00",
        "0x7fff",
        "0xfe00",
        "0xffff",
    ]
    assert np.isnan(f16_bits_to_f32(got)).all()


def test_f16_signed_zero_and_infinities() -> None:
    assert list(f32_to_f16_bits([0.0, -0.0, np.inf, -np.inf])) == [0x0000, 0x8000, 0x7C00, 0xFC00]
    assert np.signbit(f16_bits_to_f32(0x8000))
    assert np.signbit(round_to_fp16(np.float32(-1e-30)))  # underflow keeps the sign


# --------------------------------------------------------------------------------------------------------
# bfloat16
# --------------------------------------------------------------------------------------------------------


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 patterns by comparing distances to both neighbours in float64.

    Independent of the implementation: the candidates are the bfloat16 values just below and just above |x|
    (the one above 2**128 - 2**120 being 2**128 itself, as if the exponent range went on, which then means
    inf); the nearer wins, a tie going to the candidate with an even last bit. NaN maps to NaN.
    """
    with np.errstate(invalid="ignore"):  # widening a signalling NaN raises the invalid flag
        return _bf16_reference(x)


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    bits = u32(x)
    mag = bits & np.uint32(0x7FFFFFFF)
    lo_bits = mag >> np.uint32(16)
    hi_bits = lo_bits + np.uint32(1)
    lo = (lo_bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    hi = np.where(
        hi_bits == 0x7F80,
        2.0**128,
        (hi_bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64),
    )
    v = mag.view(np.float32).astype(np.float64)
    d_lo, d_hi = v - lo, hi - v
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (lo_bits % 2 == 1))
    out = np.where(take_hi, hi_bits, lo_bits).astype(np.uint16)
    out |= ((bits >> np.uint32(16)) & np.uint32(0x8000)).astype(np.uint16)
    nan = np.isnan(x)
    out[nan] = 0x7FC0  # only NaN-ness is compared for these
    return out


def assert_bf16_matches_reference(x: np.ndarray) -> None:
    got = f32_to_bf16_bits(x)
    want = bf16_reference(x)
    nan = np.isnan(x)
    bad = np.flatnonzero((got != want) & ~nan)
    assert bad.size == 0, [(hex(int(u32(x)[i])), hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]
    assert np.isnan(bf16_bits_to_f32(got[nan])).all()
    # NaN keeps its sign and is quiet.
    assert np.array_equal(got[nan] >> 15, (u32(x)[nan] >> 31).astype(np.uint16))
    assert np.all(got[nan] & 0x7FC0 == 0x7FC0)


def test_bf16_decode_exhaustive_is_a_shift() -> None:
    got = bf16_bits_to_f32(ALL16)
    assert got.dtype == np.float32
    assert np.array_equal(u32(got), ALL16.astype(np.uint32) << 16)


def test_bf16_round_trip_exhaustive() -> None:
    widened = bf16_bits_to_f32(ALL16)
    back = f32_to_bf16_bits(widened)
    nan = np.isnan(widened)
    assert np.array_equal(back[~nan], ALL16[~nan])
    assert np.array_equal(back[nan], ALL16[nan] | 0x0040)  # signalling NaNs come back quiet


def test_bf16_random_against_reference() -> None:
    rng = np.random.default_rng(99)
    x = rng.integers(0, 2**32, size=2_000_000, dtype=np.uint32)
    assert_bf16_matches_reference(f32(x))


def test_bf16_ties_and_edges_against_reference() -> None:
    rng = np.random.default_rng(5)
    high = rng.integers(0, 1 << 16, size=200_000, dtype=np.uint32) << np.uint32(16)
    ties = high | np.uint32(0x8000)
    near = np.concatenate([ties - np.uint32(1), ties, ties + np.uint32(1)])
    overflow = np.arange(0x7F7F0000, 0x7F800001, dtype=np.uint32)  # up to inf, exhaustive
    subnormal = np.arange(0, 0x00020000, dtype=np.uint32)  # float32 subnormals round like any other value
    assert_bf16_matches_reference(f32(np.concatenate([near, both_signs(overflow), both_signs(subnormal)])))


def test_bf16_known_values() -> None:
    assert f32_to_bf16(1.0) == 0x3F80
    assert f32_to_bf16(-2.0) == 0xC000
    assert f32_to_bf16(1.0 + 2.0**-8) == 0x3F80  # tie: stays even
    assert f32_to_bf16(1.0 + 3 * 2.0**-8) == 0x3F82  # tie: rounds up to even
    assert f32_to_bf16(fp16.BF16_MAX) == 0x7F7F
    assert f32_to_bf16(3.4028235e38) == 0x7F80  # float32 max rounds to inf
    assert f32_to_bf16(-0.0) == 0x8000
    assert f32_to_bf16(float("nan")) & 0x7FC0 == 0x7FC0
    assert bf16_to_f32(0x3F80) == 1.0
    assert bf16_to_f32(0x7F7F) == fp16.BF16_MAX
    assert np.isnan(bf16_to_f32(0x7F81))
    assert list(f32_to_bf16_bits(f32([0x7F800001, 0xFF800001]))) == [0x7FC0, 0xFFC0]


# --------------------------------------------------------------------------------------------------------
# round_to_fp16 / round_to_bf16
# --------------------------------------------------------------------------------------------------------


def mixed_inputs() -> np.ndarray:
    """A large input spanning several blocks, with sparse and dense stretches of every kind of fix-up."""
    rng = np.random.default_rng(3)
    n = 3 * fp16._CHUNK + 1234
    normal = rng.standard_normal(n, dtype=np.float32)
    sprinkled = normal.copy()
    sprinkled[::97] *= np.float32(1e-6)  # a few subnormal halves per block
    sprinkled[::501] = np.float32(np.nan)
    sprinkled[::703] *= np.float32(1e6)  # a few overflows
    sprinkled[::1009] = 0.0
    tiny = normal * np.float32(3e-6)  # almost all subnormal halves
    huge = normal * np.float32(1e6)  # almost all overflow
    bits = rng.integers(0, 2**32, size=n, dtype=np.uint32).view(np.float32)
    specials = np.float32([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 65504, 65520, -65520, 2**-24, 2**-25])
    return np.concatenate(
        [normal, sprinkled, tiny, huge, bits, f16_bits_to_f32(ALL16), f32(half_midpoints()), specials]
    )


def test_round_to_fp16_equals_bit_path() -> None:
    x = mixed_inputs()
    got = round_to_fp16(x)
    want = f16_bits_to_f32(f32_to_f16_bits(x))
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.array_equal(u32(got), u32(want))  # NaN payloads included


def test_round_to_fp16_matches_numpy_cast() -> None:
    x = mixed_inputs()
    got = round_to_fp16(x)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    nan = np.isnan(x)
    assert np.array_equal(u32(got)[~nan], u32(want)[~nan])
    assert np.isnan(got[nan]).all()


def test_round_to_bf16_equals_bit_path() -> None:
    x = mixed_inputs()
    got = round_to_bf16(x)
    want = bf16_bits_to_f32(f32_to_bf16_bits(x))
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.array_equal(u32(got), u32(want))


@pytest.mark.parametrize("fn", [round_to_fp16, round_to_bf16])
def test_round_out_in_place(fn) -> None:
    x = mixed_inputs()
    want = fn(x)
    y = x.copy()
    assert fn(y, out=y) is y
    assert np.array_equal(u32(y), u32(want))
    out = np.empty_like(x)
    assert fn(x, out=out) is out
    assert np.array_equal(u32(out), u32(want))
    # A strided out and a strided input.
    grid = x[: 40 * 30].reshape(40, 30)
    out_t = np.zeros((30, 40), dtype=np.float32).T
    assert fn(grid, out=out_t) is out_t
    assert np.array_equal(u32(out_t), u32(want[: 40 * 30].reshape(40, 30)))
    assert np.array_equal(u32(fn(grid[:, ::3])), u32(want[: 40 * 30].reshape(40, 30)[:, ::3]))


@pytest.mark.parametrize("fn", [round_to_fp16, round_to_bf16])
def test_round_out_overlapping_input(fn) -> None:
    x = mixed_inputs()[: 3 * fp16._CHUNK]
    want = fn(x)
    buf = np.concatenate([x, [np.float32(0)]])
    assert fn(buf[:-1], out=buf[1:]) is not None  # out is the input shifted by one element
    assert np.array_equal(u32(buf[1:]), u32(want))
    buf = np.concatenate([[np.float32(0)], x])
    fn(buf[1:], out=buf[:-1])
    assert np.array_equal(u32(buf[:-1]), u32(want))


@pytest.mark.parametrize("fn", [round_to_fp16, round_to_bf16])
def test_round_out_is_checked(fn) -> None:
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(Fp16Error, match="float32"):
        fn(x, out=np.empty(4, dtype=np.float64))
    with pytest.raises(Fp16Error, match="shape"):
        fn(x, out=np.empty(5, dtype=np.float32))
    with pytest.raises(Fp16Error, match="float32"):
        fn(x, out=[0.0] * 4)
    ro = np.empty(4, dtype=np.float32)
    ro.setflags(write=False)
    with pytest.raises(Fp16Error, match="read-only"):
        fn(x, out=ro)


def test_rounding_is_idempotent() -> None:
    x = mixed_inputs()
    once = round_to_fp16(x)
    assert np.array_equal(u32(round_to_fp16(once)), u32(once))
    once_bf = round_to_bf16(x)
    assert np.array_equal(u32(round_to_bf16(once_bf)), u32(once_bf))


@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_round_to_fp16_picks_nearest_half(v: float) -> None:
    x = np.float32(v)
    r = float(round_to_fp16(x))
    if abs(x) >= 65520.0:
        assert r == np.copysign(np.inf, x)
        return
    # Every half between the neighbours of x is at least as far away as the chosen one.
    h = f32_to_fp16(float(x))
    assert fp16_to_f32(h) == r
    for other in (h - 1, h + 1, h ^ 0x8000):
        if 0 <= other <= 0xFFFF and (other & 0x7C00) != 0x7C00:
            assert abs(fp16_to_f32(other) - float(x)) >= abs(r - float(x))


# --------------------------------------------------------------------------------------------------------
# scalar API, shapes, conversions, errors
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "bits"),
    [
        (1.0, 0x3C00),
        (-1.0, 0xBC00),
        (65504.0, 0x7BFF),
        (65520.0, 0x7C00),
        (-65520.0, 0xFC00),
        (2.0**-24, 0x0001),
        (2.0**-14, 0x0400),
        (-0.0, 0x8000),
        (0.0, 0x0000),
        (0.1, 0x2E66),
        (1.0 / 3.0, 0x3555),
        (float("inf"), 0x7C00),
        (1e300, 0x7C00),  # float64 overflow to float32 inf first
    ],
)
def test_scalar_known_values(value: float, bits: int) -> None:
    assert f32_to_fp16(value) == bits
    assert isinstance(f32_to_fp16(value), int)


def test_scalar_decode() -> None:
    assert fp16_to_f32(0x3C00) == 1.0
    assert fp16_to_f32(0x7BFF) == 65504.0
    assert fp16_to_f32(0x0001) == 2.0**-24
    assert fp16_to_f32(0x7C00) == float("inf")
    assert np.isnan(fp16_to_f32(0x7E00))
    assert str(fp16_to_f32(0x8000)) == "-0.0"
    assert fp16_to_f32(np.uint16(0x3C00)) == 1.0
    assert isinstance(fp16_to_f32(0x3C00), float)
    assert isinstance(bf16_to_f32(0x3F80), float)
    assert f32_to_fp16(float("nan")) & 0x7E00 == 0x7E00


@pytest.mark.parametrize("fn", [fp16_to_f32, bf16_to_f32])
@pytest.mark.parametrize("bad", [-1, 65536, 1 << 40, 1.5, "1", None, True])
def test_scalar_bad_bits(fn, bad) -> None:
    with pytest.raises(Fp16Error) as info:
        fn(bad)
    assert isinstance(info.value, ValueError) and isinstance(info.value, AnekitError)
    assert "0..65535" in str(info.value)


@pytest.mark.parametrize("fn", [f16_bits_to_f32, bf16_bits_to_f32])
def test_bulk_bits_validation(fn) -> None:
    assert fn(np.array([0, 0xFFFF], dtype=np.int64)).shape == (2,)
    with pytest.raises(Fp16Error, match=r"0\.\.65535"):
        fn(np.array([1, 70000]))
    with pytest.raises(Fp16Error, match=r"0\.\.65535"):
        fn([-1])
    with pytest.raises(Fp16Error, match="integer"):
        fn(np.array([1.0]))


def test_shapes_and_inputs() -> None:
    assert f32_to_f16_bits(1.0).shape == ()
    assert f32_to_f16_bits(1.0).dtype == np.uint16
    assert round_to_fp16(0.1).shape == ()
    assert round_to_bf16([[1.0, 2.0], [3.0, 4.0]]).shape == (2, 2)
    assert f32_to_bf16_bits(np.zeros((0, 3))).shape == (0, 3)
    assert f16_bits_to_f32(np.zeros((2, 0), dtype=np.uint16)).shape == (2, 0)
    assert f16_bits_to_f32(0x3C00).shape == ()
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    assert np.array_equal(f32_to_f16_bits(x.T), f32_to_f16_bits(x).T)  # non-contiguous input
    assert np.array_equal(f16_bits_to_f32(f32_to_f16_bits(x).T), round_to_fp16(x).T)


def test_float64_goes_through_float32() -> None:
    # Just above a half tie in float64, exactly on it after rounding to float32: ties-to-even then rounds
    # down, where rounding the float64 value directly would round up.
    v = 1.0 + 2.0**-11 + 2.0**-40
    assert np.float32(v) == 1.0 + 2.0**-11
    assert f32_to_fp16(v) == 0x3C00
    assert f32_to_f16_bits(np.array([v]))[0] == 0x3C00
    assert np.array([v]).astype(np.float16).view(np.uint16)[0] == 0x3C01
    assert float(round_to_fp16(np.array(v))) == 1.0


def test_fp16_array_helpers() -> None:
    x = np.array([[1.0, 0.1], [65520.0, -0.0]], dtype=np.float32)
    h = to_fp16_array(x)
    assert h.dtype == np.float16 and h.shape == (2, 2)
    assert np.array_equal(h.view(np.uint16), f32_to_f16_bits(x))
    back = from_fp16_array(h)
    assert back.dtype == np.float32
    assert np.array_equal(u32(back), u32(round_to_fp16(x)))
    with pytest.raises(Fp16Error, match="float16"):
        from_fp16_array(np.zeros(2, dtype=np.float32))


def test_constants() -> None:
    info = np.finfo(np.float16)
    assert fp16.FP16_MAX == 65504.0 == float(info.max)
    assert float(info.smallest_normal) == fp16.FP16_MIN_NORMAL == 2.0**-14
    assert float(info.smallest_subnormal) == fp16.FP16_MIN_SUBNORMAL == 2.0**-24
    assert float(info.eps) == fp16.FP16_EPS == 2.0**-10
    assert fp16_to_f32(0x7BFF) == fp16.FP16_MAX
    assert bf16_to_f32(0x7F7F) == fp16.BF16_MAX
    for name in fp16.__all__:
        assert getattr(fp16, name).__doc__


def test_no_warnings_on_special_values() -> None:
    x = np.float32([np.nan, np.inf, -np.inf, 1e38, -1e38, 1e-45, 65520])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f32_to_f16_bits(x)
        f32_to_bf16_bits(x)
        round_to_fp16(x)
        round_to_bf16(x)
        f32_to_f16_bits(np.array([1e300, -1e300, 1e-300]))
        f32_to_fp16(1e300)
