"""Tests of the activation ops: sigmoid/relu families, gelu, softplus, clip and friends, softmax."""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from anekit.errors import MilTypeError
from anekit.mil import types as T
from tests.op_harness import infer_op, run_op, var

RNG = np.random.default_rng(4321)


@pytest.fixture(autouse=True)
def _seed_rng(request: pytest.FixtureRequest) -> None:
    """Seed the module generator from the test's id, so each test's data does not depend on test order."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def pointwise(fn: Callable[[float], float], x: np.ndarray) -> np.ndarray:
    """Apply a Python scalar function element by element (independent of numpy ufuncs)."""
    x = np.asarray(x)
    return np.array([fn(v) for v in x.ravel().tolist()], dtype=np.float64).reshape(x.shape)


def raises(op: str) -> Any:
    return pytest.raises(MilTypeError, match=re.escape(f"[{op}]"))


def _sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


# op -> (params, scalar formula taking (v, **params))
ACTIVATIONS: dict[str, tuple[dict[str, float], Callable[..., float]]] = {
    "sigmoid": ({}, _sig),
    "relu": ({}, lambda v: v if v > 0 else 0.0),
    "relu6": ({}, lambda v: 0.0 if v < 0 else (6.0 if v > 6 else v)),
    "silu": ({}, lambda v: v / (1.0 + math.exp(-v))),
    "softplus": ({}, lambda v: math.log(1.0 + math.exp(v))),
    "softsign": ({}, lambda v: v / (1.0 + (v if v >= 0 else -v))),
    "sigmoid_hard": (
        {"alpha": 0.2, "beta": 0.5},
        lambda v, alpha, beta: min(1.0, max(0.0, alpha * v + beta)),
    ),
    "leaky_relu": ({"alpha": 0.1}, lambda v, alpha: v if v >= 0 else alpha * v),
    "elu": ({"alpha": 1.5}, lambda v, alpha: v if v > 0 else alpha * (math.exp(v) - 1.0)),
    "scaled_tanh": ({"alpha": 1.7, "beta": 0.66}, lambda v, alpha, beta: alpha * math.tanh(beta * v)),
    "clip": (
        {"alpha": -1.0, "beta": 2.0},
        lambda v, alpha, beta: alpha if v < alpha else (beta if v > beta else v),
    ),
    "clamped_relu": (
        {"alpha": 0.3, "beta": 1.5},
        lambda v, alpha, beta: min(beta, v if v >= 0 else alpha * v),
    ),
    "threshold": ({"alpha": 0.25}, lambda v, alpha: max(v, alpha)),
    "thresholded_relu": ({"alpha": 0.5}, lambda v, alpha: v if v >= alpha else 0.0),
    "linear_activation": ({"alpha": 2.0, "beta": -1.0}, lambda v, alpha, beta: alpha * v + beta),
}


@pytest.mark.parametrize("shape", [(2, 3, 5), ()])
@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_activation_reference(op: str, shape: tuple[int, ...]) -> None:
    params, fn = ACTIVATIONS[op]
    x = np.asarray(RNG.uniform(-8, 8, shape))
    (out,) = run_op(op, x=x, **params)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == shape
    np.testing.assert_allclose(out, pointwise(lambda v: fn(v, **params), x), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_activation_keeps_float32(op: str) -> None:
    params, fn = ACTIVATIONS[op]
    x = RNG.uniform(-8, 8, (32,)).astype(np.float32)
    (out,) = run_op(op, x=x, **params)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, pointwise(lambda v: fn(v, **params), x), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_activation_infer(op: str) -> None:
    params, _ = ACTIVATIONS[op]
    (t,) = infer_op(op, "fp16", x=var("fp16", [1, "s", 1, 64]), **params)
    assert t == T.tensor("fp16", [1, "s", 1, 64])
    (t,) = infer_op(op, x=var("fp32", []), **params)
    assert t == T.scalar("fp32")
    # A parameter may also be a one-element tensor that broadcasts into x.
    ones = {k: np.array([[v]]) for k, v in params.items()}
    (t,) = infer_op(op, x=var("fp32", [2, 3]), **ones)
    assert t == T.tensor("fp32", [2, 3])


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_activation_bad_inputs(op: str) -> None:
    params, _ = ACTIVATIONS[op]
    with raises(op):
        infer_op(op, x=var("bool", [2]), **params)
    with raises(op):
        infer_op(op, x=var("fp32", [2]), bogus=1.0, **params)
    for name in params:
        missing = {k: v for k, v in params.items() if k != name}
        with raises(op):
            infer_op(op, x=var("fp32", [2]), **missing)
        with raises(op):  # not a compile-time constant
            infer_op(op, x=var("fp32", [2]), **{**params, name: var("fp32", [])})
        with raises(op):  # does not fit x's shape
            infer_op(op, x=var("fp32", [2, 3]), **{**params, name: np.ones(4)})
        with raises(op):  # wrong dtype
            infer_op(op, x=var("fp32", [2]), **{**params, name: True})


@pytest.mark.parametrize("op", ["leaky_relu", "elu", "sigmoid_hard", "scaled_tanh", "clamped_relu"])
def test_params_may_differ_in_float_dtype(op: str) -> None:
    # iOS17+: alpha/beta in {fp16, fp32} regardless of x's dtype.
    params, _ = ACTIVATIONS[op]
    (t,) = infer_op(op, "fp32", x=var("fp16", [4]), **params)
    assert t == T.tensor("fp16", [4])


@pytest.mark.parametrize("op", ["clip", "threshold"])
def test_params_must_match_dtype(op: str) -> None:
    params, _ = ACTIVATIONS[op]
    with raises(op):
        infer_op(op, "fp32", x=var("fp16", [4]), **params)


def test_threshold_int32() -> None:
    x = np.arange(-5, 6)
    (out,) = run_op("threshold", x=x, alpha=np.int32(2))
    np.testing.assert_array_equal(out, [max(v, 2) for v in range(-5, 6)])
    (t,) = infer_op("threshold", x=var("int32", ["n"]), alpha=2)
    assert t == T.tensor("int32", ["n"])


def test_clamped_relu_negative_beta() -> None:
    x = np.array([-2.0, -0.5, 0.0, 0.5, 2.0])
    (out,) = run_op("clamped_relu", x=x, alpha=0.5, beta=-0.75)
    np.testing.assert_allclose(out, [-1.0, -0.75, -0.75, -0.75, -0.75])


def test_clip_reversed_bounds_accepted() -> None:
    (out,) = run_op("clip", x=np.array([-3.0, 0.0, 3.0]), alpha=1.0, beta=-1.0)
    np.testing.assert_allclose(out, [-1.0, -1.0, -1.0])


@pytest.mark.parametrize("op", ["sigmoid", "silu", "softplus", "softsign", "elu"])
def test_extreme_inputs_stay_finite(op: str) -> None:
    params = ACTIVATIONS[op][0]
    x = np.array([-1e4, -700.0, 0.0, 700.0, 1e4])
    with np.errstate(all="raise"):
        (out,) = run_op(op, x=x, **params)
    assert np.all(np.isfinite(out))
    if op == "sigmoid":
        np.testing.assert_allclose(out, [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-300)
    if op == "softplus":
        np.testing.assert_allclose(out, [0.0, 0.0, math.log(2.0), 700.0, 1e4], atol=1e-300)


# -- gelu -----------------------------------------------------------------------------------------------

GELU: dict[str, Callable[[float], float]] = {
    "EXACT": lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))),
    "TANH_APPROXIMATION": lambda v: (
        0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
    ),
    "SIGMOID_APPROXIMATION": lambda v: v * _sig(1.702 * v),
}


@pytest.mark.parametrize("mode", sorted(GELU))
def test_gelu_reference(mode: str) -> None:
    x = np.concatenate([RNG.uniform(-6, 6, 200), [0.0, -10.0, 10.0]]).reshape(7, 29)
    (out,) = run_op("gelu", x=x, mode=mode)
    # 1 + erf(x / sqrt(2)) cancels for negative x: compare absolutely there.
    np.testing.assert_allclose(out, pointwise(GELU[mode], x), rtol=1e-13, atol=1e-14)
    (out32,) = run_op("gelu", x=x.astype(np.float32), mode=mode)
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, pointwise(GELU[mode], x.astype(np.float32)), rtol=3e-6, atol=1e-6)


def test_gelu_default_is_exact_and_infer() -> None:
    x = RNG.uniform(-3, 3, (4, 5))
    (out,) = run_op("gelu", x=x)
    np.testing.assert_allclose(out, pointwise(GELU["EXACT"], x), rtol=1e-13, atol=1e-15)
    (t,) = infer_op("gelu", x=var("fp16", [1, "s", 768]), mode="TANH_APPROXIMATION")
    assert t == T.tensor("fp16", [1, "s", 768])
    with raises("gelu"):
        infer_op("gelu", x=var("fp16", [2]), mode="tanh")
    with raises("gelu"):
        infer_op("gelu", x=var("int32", [2]))
    with raises("gelu"):
        infer_op("gelu", x=var("fp32", [2]), mode=var("string", []))


# -- prelu / softplus_parametric --------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5), (1, 3, 2, 2, 3)])
def test_prelu_reference(shape: tuple[int, ...]) -> None:
    x = RNG.standard_normal(shape)
    alpha = np.array([0.1, 0.2, 0.3]) if len(shape) == 4 else np.full(3, 0.25)
    (out,) = run_op("prelu", x=x, alpha=alpha)
    want = np.empty_like(x)
    for idx in itertools.product(*(range(d) for d in shape)):
        v = float(x[idx])
        want[idx] = v if v > 0 else float(alpha[idx[1]]) * v
    np.testing.assert_allclose(out, want, rtol=1e-14)


def test_prelu_infer_and_errors() -> None:
    (t,) = infer_op("prelu", "fp16", x=var("fp16", ["b", 3, 8, 8]), alpha=np.array([0.1, 0.2, 0.3]))
    assert t == T.tensor("fp16", ["b", 3, 8, 8])
    (t,) = infer_op("prelu", x=var("fp32", [1, "c", 8, 8]), alpha=np.array([0.1, 0.2]))
    assert t == T.tensor("fp32", [1, "c", 8, 8])
    with raises("prelu"):  # channel count mismatch
        infer_op("prelu", x=var("fp32", [1, 4, 8, 8]), alpha=np.array([0.1, 0.2, 0.3]))
    with raises("prelu"):  # rank 2
        infer_op("prelu", x=var("fp32", [4, 3]), alpha=np.array([0.1, 0.2, 0.3]))
    with raises("prelu"):  # rank 3 needs equal alphas
        infer_op("prelu", x=var("fp32", [1, 3, 8]), alpha=np.array([0.1, 0.2, 0.3]))
    with raises("prelu"):  # alpha must be rank 1
        infer_op("prelu", x=var("fp32", [1, 3, 8, 8]), alpha=0.1)
    with raises("prelu"):  # alpha must be constant
        infer_op("prelu", x=var("fp32", [1, 3, 8, 8]), alpha=var("fp32", [3]))


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 3, 2, 5)])
def test_softplus_parametric_reference(shape: tuple[int, ...]) -> None:
    x = RNG.uniform(-5, 5, shape)
    alpha, beta = np.array([0.5, 1.0, 2.0]), np.array([1.5, -1.0, 0.25])
    (out,) = run_op("softplus_parametric", x=x, alpha=alpha, beta=beta)
    want = np.empty_like(x)
    for idx in itertools.product(*(range(d) for d in shape)):
        c = idx[1]
        want[idx] = float(alpha[c]) * math.log1p(math.exp(float(beta[c]) * float(x[idx])))
    np.testing.assert_allclose(out, want, rtol=1e-13)


def test_softplus_parametric_infer_and_errors() -> None:
    a3 = np.array([1.0, 2.0, 3.0])
    (t,) = infer_op("softplus_parametric", x=var("fp32", ["b", 3, 4, 4]), alpha=a3, beta=a3)
    assert t == T.tensor("fp32", ["b", 3, 4, 4])
    with raises("softplus_parametric"):
        infer_op("softplus_parametric", x=var("fp32", [3, 3]), alpha=a3, beta=a3)
    with raises("softplus_parametric"):
        infer_op("softplus_parametric", x=var("fp32", [1, 3, 4]), alpha=a3, beta=np.ones(2))
    with raises("softplus_parametric"):
        infer_op("softplus_parametric", x=var("fp32", [1, 3, 4]), alpha=a3)


# -- softmax ------------------------------------------------------------------------------------------------


def _softmax_loops(x: np.ndarray, axis: int) -> np.ndarray:
    axis %= x.ndim
    out = np.empty_like(x)
    others = [range(d) if i != axis else [slice(None)] for i, d in enumerate(x.shape)]
    for idx in itertools.product(*others):
        row = [float(v) for v in x[idx]]
        m = max(row)
        ex = [math.exp(v - m) for v in row]
        s = math.fsum(ex)
        out[idx] = [e / s for e in ex]
    return out


@pytest.mark.parametrize(
    "shape,axis", [((2, 3, 4), -1), ((2, 3, 4), 1), ((2, 3, 4), 0), ((5,), 0), ((1, 4, 1, 6), -3)]
)
def test_softmax_reference(shape: tuple[int, ...], axis: int) -> None:
    x = RNG.uniform(-10, 10, shape)
    (out,) = run_op("softmax", x=x, axis=axis)
    np.testing.assert_allclose(out, _softmax_loops(x, axis), rtol=1e-13, atol=1e-300)


def test_softmax_default_axis_large_values_and_float32() -> None:
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -1000.0]])
    (out,) = run_op("softmax", x=x)
    np.testing.assert_allclose(out, _softmax_loops(x, -1), rtol=1e-13)
    (out32,) = run_op("softmax", x=x.astype(np.float32))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, _softmax_loops(x, -1), rtol=1e-6)


def test_softmax_infer_and_errors() -> None:
    (t,) = infer_op("softmax", x=var("fp16", [1, 8, "s", "s"]), axis=-1)
    assert t == T.tensor("fp16", [1, 8, "s", "s"])
    (t,) = infer_op("softmax", x=var("fp32", [2, 3]))
    assert t == T.tensor("fp32", [2, 3])
    with raises("softmax"):
        infer_op("softmax", x=var("fp32", [2, 3]), axis=2)
    with raises("softmax"):
        infer_op("softmax", x=var("fp32", [2, 3]), axis=-3)
    with raises("softmax"):
        infer_op("softmax", x=var("fp32", []))
    with raises("softmax"):
        infer_op("softmax", x=var("fp32", [2, 3]), axis=var("int32", []))
    with raises("softmax"):
        infer_op("softmax", x=var("fp32", [2, 3]), axis=1.0)
    with raises("softmax"):
        infer_op("softmax", x=var("int32", [2, 3]))
