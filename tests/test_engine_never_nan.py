"""The engine never emits NaN (sbryngelson/ane-guide 03-numerics.md, 'Edge behavior'): under every chip's
profile, ops fed the special values (NaN, +/-inf, +/-0, subnormals, the fp16 extremes) return no NaN,
whatever the ideal machine would give. The list of NaN-free ops the simulator trusts is held to it too."""

from __future__ import annotations

import numpy as np
import pytest

from anekit.runtime.sim.numerics import NAN_FREE
from tests.numerics_probe import fp16, probe

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 2.0**-24, -(2.0**-20), 65504.0, -65504.0, 1.5, -2.0, 300.0]


def _row(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.permutation(np.array(SPECIAL * 4, dtype=np.float32)).reshape(1, 1, 1, -1)


UNARY = ["exp", "log", "sqrt", "rsqrt", "inverse", "sigmoid", "tanh", "relu", "gelu", "silu", "softplus",
         "softsign", "round", "floor", "ceil", "abs", "sign", "sin", "cos", "erf", "exp2", "square"]  # fmt: skip
BINARY = ["add", "sub", "mul", "real_div", "pow", "maximum", "minimum"]


@pytest.mark.parametrize("chip", ["m1", "m5", "any"])
@pytest.mark.parametrize("op", UNARY)
def test_unary_ops_emit_no_nan(chip, op):
    out = probe(lambda f, x: getattr(f, op)(x=x), chip, x=_row(1))
    assert not np.isnan(out).any(), out


@pytest.mark.parametrize("chip", ["m1", "m5", "any"])
@pytest.mark.parametrize("op", BINARY)
def test_binary_ops_emit_no_nan(chip, op):
    out = probe(lambda f, x, y: getattr(f, op)(x=x, y=y), chip, x=_row(2), y=_row(3))
    assert not np.isnan(out).any(), out


@pytest.mark.parametrize("chip", ["m1", "m5", "any"])
def test_reductions_products_and_softmax_emit_no_nan(chip):
    x = _row(4).reshape(1, 48)
    for body in (
        lambda f, v: f.reduce_sum(x=v, axes=[1], keep_dims=True),
        lambda f, v: f.reduce_mean(x=v, axes=[1], keep_dims=True),
        lambda f, v: f.reduce_max(x=v, axes=[1], keep_dims=True),
        lambda f, v: f.softmax(x=v, axis=-1),
        lambda f, v: f.matmul(x=v, y=fp16(np.ones((48, 3)))),
        lambda f, v: f.linear(x=v, weight=fp16(np.ones((3, 48)))),
    ):
        out = probe(body, chip, x=x)
        assert not np.isnan(out).any(), out


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_nan_free_ops_are_nan_free():
    """Every op the simulator lets skip the NaN pass gives no NaN from inputs without NaN (the engine
    coerces NaN inputs to +inf), here on the ideal machine itself."""
    x = np.nan_to_num(_row(5), nan=np.inf)
    for op in sorted(NAN_FREE & set(UNARY)):
        out = probe(lambda f, v, op=op: getattr(f, op)(x=v), "any", numerics="ieee", x=x)
        assert not np.isnan(out).any(), op
    for op in sorted(NAN_FREE & set(BINARY)):
        y = np.nan_to_num(_row(6), nan=-np.inf)
        out = probe(lambda f, v, w, op=op: getattr(f, op)(x=v, y=w), "any", numerics="ieee", x=x, y=y)
        assert not np.isnan(out).any(), op
