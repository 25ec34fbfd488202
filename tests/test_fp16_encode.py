"""fp16.encode_fp16_values against numpy's float32 -> float16 cast: where it succeeds, the same bits.

It is a fast path with a fallback, so every test states both halves: the patterns it must take (every
finite half, zeros of both signs, every subnormal), and those it must refuse (NaN, inf, past 65504,
normal-range values between halves, small or non-contiguous arrays) so the caller casts with numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit import fp16
from anekit.fp16 import encode_fp16_values

pytestmark = pytest.mark.usefixtures("fp16_path")  # every test with and without the jit

U16, U32 = np.uint16, np.uint32
BIG = 1 << 17  # several encoder blocks, and past the small-array cut-off


def numpy_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).view(U16)


def encode(x: np.ndarray) -> np.ndarray | None:
    out = np.empty(x.shape, dtype=U16)
    return out if encode_fp16_values(x, out) else None


def every_finite_half() -> np.ndarray:
    """All 63,490 finite binary16 values (both zeros, every subnormal and normal, both signs) as float32."""
    h = np.arange(1 << 16, dtype=U16).view(np.float16)
    return h[np.isfinite(h)].astype(np.float32)


def test_every_finite_half_exhaustively() -> None:
    x = every_finite_half()
    got = encode(x)
    assert got is not None
    np.testing.assert_array_equal(got, numpy_bits(x))
    assert got[x.view(U32) == U32(0x80000000)].tolist() == [0x8000]  # -0.0 keeps its sign


@pytest.mark.parametrize("seed", range(4))
def test_random_halves_in_blocks(seed: int) -> None:
    """Shuffled halves across several blocks, some blocks without zero or subnormals, some with."""
    rng = np.random.default_rng(seed)
    x = rng.choice(every_finite_half(), size=3 * BIG + 123)
    x[: BIG // 2] = np.abs(x[: BIG // 2]) + np.float32(1.0)  # a block of normals only
    x = x.astype(np.float16).astype(np.float32)
    got = encode(x)
    assert got is not None
    np.testing.assert_array_equal(got, numpy_bits(x))


def test_below_the_normal_range_it_rounds_like_numpy() -> None:
    """Every float32 under 2**-14 whose low 13 bits are clear (what the low-bit check lets through): the
    subnormal step rounds them to nearest even, as numpy does, ties and the carry to 2**-14 included."""
    bits = np.arange(0x38800000 >> 13, dtype=U32) << U32(13)
    for sign in (U32(0), U32(0x80000000)):
        x = (bits | sign).view(np.float32)
        got = encode(x)
        assert got is not None
        np.testing.assert_array_equal(got, numpy_bits(x))


@pytest.mark.parametrize(
    "bad",
    [np.inf, -np.inf, np.nan, -np.nan, 65520.0, 1e6, 1.0 + 2.0**-20, -(2.0**-15) * (1 + 2.0**-20)],
)
def test_refuses_what_it_cannot_encode(bad: float) -> None:
    x = np.full(BIG, 0.5, dtype=np.float32)
    x[BIG - 7] = bad
    assert encode(x) is None


def test_refuses_nan_payloads_and_keeps_numpy_for_them() -> None:
    x = np.ones(BIG, dtype=np.float32)
    x.view(U32)[[3, 99]] = [0x7FC00001, 0xFF812345]  # quiet and signalling NaN with payloads
    assert encode(x) is None


def test_small_and_non_contiguous_arrays_are_left_to_numpy(fp16_path: str) -> None:
    x = every_finite_half()
    small = encode(x[:100].copy())
    if fp16_path == "numpy":  # numpy's own cast costs less than the vectorised passes' fixed calls
        assert small is None
    else:  # one compiled call costs less than numpy's cast even here
        assert small is not None
        np.testing.assert_array_equal(small, numpy_bits(x[:100]))
    assert not encode_fp16_values(x[::2], np.empty(x[::2].size, dtype=U16))
    assert not encode_fp16_values(x[: x.size // 2 * 2], np.empty((x.size // 2, 4), dtype=U16)[:, ::2])


def test_non_contiguous_surface_shapes() -> None:
    """Multi-dimensional C-contiguous arrays (a surface's [1, C, 1, S]) encode as their flat data."""
    x = np.ascontiguousarray(every_finite_half()[: 64 * 512].reshape(1, 64, 1, 512))
    got = encode(x)
    assert got is not None and got.shape == x.shape
    np.testing.assert_array_equal(got, numpy_bits(x))


def test_argument_errors() -> None:
    with pytest.raises(fp16.Fp16Error, match="float32 -> uint16"):
        encode_fp16_values(np.zeros(4096, dtype=np.float64), np.empty(4096, dtype=U16))
    with pytest.raises(fp16.Fp16Error, match="one size"):
        encode_fp16_values(np.zeros(4096, dtype=np.float32), np.empty(4095, dtype=U16))
