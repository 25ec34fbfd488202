"""Behaviours a mutation audit found untested, stated as tests: each fails when the planted bug is back.

- softmax's reference normalises over its ``axis`` (the audit planted the last axis instead);
- the simulator rounds every fp16 input to a half, small arrays too (the audit skipped rounding under
  the size where the vector path takes over);
- the fp16 encoder refuses a float32 value midway between two halves (the audit let it through), so the
  caller rounds it to even as a cast does.
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.fp16 import encode_fp16_values, round_to_fp16
from anekit.mil import tensor

pytestmark = pytest.mark.usefixtures("fp16_path")  # with the compiled loops and with numpy alone


def _softmax64(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
def test_softmax_normalises_over_its_axis(axis):
    x = np.random.default_rng(axis + 5).uniform(-3, 3, (2, 3, 5)).astype(np.float32)

    @mil.program(inputs={"x": tensor("fp32", [2, 3, 5])})
    def prog(f, x):
        return f.softmax(x=x, axis=axis)

    got = runtime.open("sim", strict=False, numerics="ieee").compile(prog)(x=x)
    [y] = got.values()
    np.testing.assert_allclose(y, _softmax64(x, axis), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y.sum(axis=axis), 1.0, rtol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 31, 64, 2047, 2048, 4097])
def test_round_to_fp16_rounds_arrays_of_every_size(n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 3  # almost none is a half
    want = x.astype(np.float16).astype(np.float32)  # numpy's cast: round to nearest, ties to even
    np.testing.assert_array_equal(round_to_fp16(x), want)
    np.testing.assert_array_equal(round_to_fp16(x.reshape(1, n)), want.reshape(1, n))


@pytest.mark.parametrize("n", [1, 3, 32, 5000])
def test_the_simulator_stores_fp16_inputs_rounded_whatever_their_size(n):
    x = np.random.default_rng(n).standard_normal((1, 1, 1, n)).astype(np.float32)

    @mil.program(inputs={"x": tensor("fp16", [1, 1, 1, n])})
    def prog(f, x):
        return f.mul(x=x, y=1.0)

    [y] = runtime.open("sim", strict=False, numerics="ieee").compile(prog)(x=x).values()
    np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("n", [1, 4096])
def test_the_fp16_encoder_refuses_a_value_midway_between_halves(n):
    halves = np.full(n, 1.0, np.float32)
    out = np.zeros(n, np.uint16)
    assert encode_fp16_values(halves, out) or n < 2048  # small arrays may be left to the numpy cast
    for midway in (1.0 + 2.0**-11, 1000.25, -3.0 - 2.0**-10):  # each exactly between two halves
        x = halves.copy()
        x[-1] = midway
        assert not encode_fp16_values(x, np.zeros(n, np.uint16)), midway
