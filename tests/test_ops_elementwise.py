"""Tests of the elementwise ops: binary arithmetic, comparisons, logical ops, select and unary math."""

from __future__ import annotations

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

RNG = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _seed_rng(request: pytest.FixtureRequest) -> None:
    """Seed the module generator from the test's id, so each test's data does not depend on test order."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def pointwise(fn: Callable[..., Any], *arrays: Any, dtype: Any = np.float64) -> np.ndarray:
    """Apply a Python scalar function to broadcast elements one at a time (independent of numpy ufuncs)."""
    bs = np.broadcast_arrays(*[np.asarray(a) for a in arrays])
    flat = [fn(*[v.item() for v in vals]) for vals in zip(*[b.ravel() for b in bs])]
    return np.array(flat, dtype=dtype).reshape(bs[0].shape)


def raises(op: str) -> Any:
    return pytest.raises(MilTypeError, match=re.escape(f"[{op}]"))


SHAPE_PAIRS = [
    ((2, 3, 4), (2, 3, 4)),
    ((2, 3, 4), (4,)),
    ((2, 1, 4), (3, 1)),
    ((), (2, 3)),
    ((1, 4, 1, 5), ()),
    ((), ()),
]


# -- binary arithmetic -------------------------------------------------------------------------------

FLOAT_BINARY: dict[str, Callable[[float, float], float]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "real_div": lambda a, b: a / b,
    "floor_div": lambda a, b: a // b,
    "pow": lambda a, b: a**b,
    "maximum": lambda a, b: a if a > b else b,
    "minimum": lambda a, b: a if a < b else b,
    "mod": lambda a, b: a % b,
}


def _binary_inputs(op: str, sx: tuple[int, ...], sy: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    x = RNG.uniform(-3, 3, sx)
    y = RNG.uniform(-3, 3, sy)
    if op == "pow":
        x = RNG.uniform(0.1, 3, sx)
    if op in ("real_div", "floor_div", "mod"):
        y = np.where(np.abs(y) < 0.25, 0.5, y)
    return np.asarray(x), np.asarray(y)


@pytest.mark.parametrize("sx,sy", SHAPE_PAIRS)
@pytest.mark.parametrize("op", sorted(FLOAT_BINARY))
def test_binary_float_reference(op: str, sx: tuple[int, ...], sy: tuple[int, ...]) -> None:
    x, y = _binary_inputs(op, sx, sy)
    (out,) = run_op(op, x=x, y=y)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_allclose(out, pointwise(FLOAT_BINARY[op], x, y), rtol=1e-12, atol=1e-12)


INT_BINARY: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "real_div": lambda a, b: 0 if b == 0 else math.trunc(a / b),
    "floor_div": lambda a, b: 0 if b == 0 else a // b,
    "pow": lambda a, b: math.trunc(float(a) ** b) if a != 0 or b >= 0 else 0,
    "maximum": lambda a, b: max(a, b),
    "minimum": lambda a, b: min(a, b),
    "mod": lambda a, b: 0 if b == 0 else a % b,
}


@pytest.mark.parametrize("op", sorted(INT_BINARY))
def test_binary_int_reference(op: str) -> None:
    x = np.arange(-7, 8).reshape(3, 5)
    y = np.array([-3, -2, 0, 2, 3]) if op != "pow" else np.array([-1, 0, 1, 2, 3])
    if op == "pow":
        x = np.clip(x, -4, 4)
    (out,) = run_op(op, x=x, y=y)
    assert out.dtype.kind == "i"
    np.testing.assert_array_equal(out, pointwise(INT_BINARY[op], x, y, dtype=np.int64))


def test_int_division_by_zero_gives_zero() -> None:
    zero = np.array([0, 0, 0])
    for op in ("real_div", "floor_div", "mod"):
        (out,) = run_op(op, x=np.array([5, -5, 0]), y=zero)
        np.testing.assert_array_equal(out, zero)
    (out,) = run_op("pow", x=np.array([0, 0, 0]), y=np.array([-1, 0, 2]))
    np.testing.assert_array_equal(out, [0, 1, 0])


def test_real_div_float_by_zero_is_ieee() -> None:
    (out,) = run_op("real_div", x=np.array([1.0, -1.0, 0.0]), y=np.array(0.0))
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


def test_pow_rsqrt_style_scalar_exponent() -> None:
    t = RNG.uniform(0.5, 4.0, (1, 8, 1, 4))
    (out,) = run_op("pow", "fp16", x=t, y=-0.5)
    np.testing.assert_allclose(out, pointwise(lambda v: 1.0 / math.sqrt(v), t), rtol=1e-12)
    (ty,) = infer_op("pow", "fp16", x=var("fp16", [1, 8, 1, 4]), y=-0.5)
    assert ty == T.tensor("fp16", [1, 8, 1, 4])


def test_mod_and_floor_div_are_consistent() -> None:
    x = RNG.uniform(-10, 10, 50)
    y = np.where(RNG.random(50) < 0.5, -1.0, 1.0) * RNG.uniform(0.5, 3, 50)
    (q,) = run_op("floor_div", x=x, y=y)
    (r,) = run_op("mod", x=x, y=y)
    np.testing.assert_allclose(q * y + r, x, atol=1e-9)
    assert np.all((r == 0) | (np.sign(r) == np.sign(y)))


@pytest.mark.parametrize("op", sorted(FLOAT_BINARY))
def test_binary_infer(op: str) -> None:
    # The ANE kernel idioms: tensor op fp16 scalar const, and scalar const op tensor.
    (t,) = infer_op(op, "fp16", x=var("fp16", [1, 64, 1, 16]), y=2.0)
    assert t == T.tensor("fp16", [1, 64, 1, 16])
    (t,) = infer_op(op, "fp16", x=1.0, y=var("fp16", [1, 64, 1, 16]))
    assert t == T.tensor("fp16", [1, 64, 1, 16])
    (t,) = infer_op(op, x=var("fp32", [2, 1, 4]), y=var("fp32", [3, 1]))
    assert t == T.tensor("fp32", [2, 3, 4])
    (t,) = infer_op(op, x=var("int32", [5]), y=var("int32", []))
    assert t == T.tensor("int32", [5])
    (t,) = infer_op(op, x=var("fp32", [1, "s", 1, 16]), y=var("fp32", [1, 1, "t", 16]))
    assert t == T.tensor("fp32", [1, "s", "t", 16])
    (t,) = infer_op(op, x=var("fp32", ["s", 4]), y=var("fp32", [1, 4]))
    assert t == T.tensor("fp32", ["s", 4])


@pytest.mark.parametrize("op", sorted(FLOAT_BINARY))
def test_binary_bad_inputs(op: str) -> None:
    with raises(op):
        infer_op(op, x=var("fp32", [2, 3]), y=var("fp32", [4]))
    with raises(op):
        infer_op(op, x=var("fp16", [2, 3]), y=var("fp32", [2, 3]))
    with raises(op):
        infer_op(op, x=var("bool", [2]), y=var("bool", [2]))
    with raises(op):
        infer_op(op, x=var("fp32", [2]))
    with raises(op):
        infer_op(op, x=var("fp32", [2]), y=var("fp32", [2]), z=var("fp32", [2]))


# -- comparisons ---------------------------------------------------------------------------------------

COMPARE: dict[str, Callable[[float, float], bool]] = {
    "equal": lambda a, b: a == b,
    "not_equal": lambda a, b: a != b,
    "greater": lambda a, b: a > b,
    "greater_equal": lambda a, b: a >= b,
    "less": lambda a, b: a < b,
    "less_equal": lambda a, b: a <= b,
}


@pytest.mark.parametrize("sx,sy", SHAPE_PAIRS)
@pytest.mark.parametrize("op", sorted(COMPARE))
def test_compare_reference(op: str, sx: tuple[int, ...], sy: tuple[int, ...]) -> None:
    x = np.asarray(RNG.integers(-2, 3, sx).astype(np.float64))  # small integers: plenty of ties
    y = np.asarray(RNG.integers(-2, 3, sy).astype(np.float64))
    (out,) = run_op(op, x=x, y=y)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, pointwise(COMPARE[op], x, y, dtype=bool))
    (out,) = run_op(op, x=x.astype(np.int64), y=y.astype(np.int64))
    np.testing.assert_array_equal(out, pointwise(COMPARE[op], x, y, dtype=bool))


@pytest.mark.parametrize("op", sorted(COMPARE))
def test_compare_infer_and_errors(op: str) -> None:
    (t,) = infer_op(op, "fp16", x=var("fp16", [1, "s", 8]), y=0.0)
    assert t == T.tensor("bool", [1, "s", 8])
    (t,) = infer_op(op, x=var("int32", [3, 1]), y=var("int32", [4]))
    assert t == T.tensor("bool", [3, 4])
    with raises(op):
        infer_op(op, x=var("fp32", [3]), y=var("fp32", [4]))
    with raises(op):
        infer_op(op, x=var("bool", [3]), y=var("bool", [3]))
    with raises(op):
        infer_op(op, x=var("int32", [3]), y=var("fp32", [3]))


# -- logical ops ------------------------------------------------------------------------------------------

LOGICAL: dict[str, Callable[[bool, bool], bool]] = {
    "logical_and": lambda a, b: a and b,
    "logical_or": lambda a, b: a or b,
    "logical_xor": lambda a, b: a != b,
}


@pytest.mark.parametrize("sx,sy", SHAPE_PAIRS)
@pytest.mark.parametrize("op", sorted(LOGICAL))
def test_logical_reference(op: str, sx: tuple[int, ...], sy: tuple[int, ...]) -> None:
    x = np.asarray(RNG.random(sx) < 0.5)
    y = np.asarray(RNG.random(sy) < 0.5)
    (out,) = run_op(op, x=x, y=y)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, pointwise(LOGICAL[op], x, y, dtype=bool))


@pytest.mark.parametrize("op", sorted(LOGICAL))
def test_logical_infer_and_errors(op: str) -> None:
    (t,) = infer_op(op, x=var("bool", ["n", 1]), y=var("bool", [4]))
    assert t == T.tensor("bool", ["n", 4])
    with raises(op):
        infer_op(op, x=var("fp32", [2]), y=var("fp32", [2]))
    with raises(op):
        infer_op(op, x=var("bool", [2]), y=var("bool", [3]))


def test_logical_not() -> None:
    x = RNG.random((3, 4)) < 0.5
    (out,) = run_op("logical_not", x=x)
    np.testing.assert_array_equal(out, pointwise(lambda v: not v, x, dtype=bool))
    (out,) = run_op("logical_not", x=np.bool_(True))
    assert out.shape == () and not out
    (t,) = infer_op("logical_not", x=var("bool", [2, "s"]))
    assert t == T.tensor("bool", [2, "s"])
    with raises("logical_not"):
        infer_op("logical_not", x=var("fp16", [2]))


# -- select -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sc,sa,sb",
    [
        ((2, 3), (2, 3), (2, 3)),
        ((3,), (2, 3), ()),
        ((2, 1), (1, 4), (4,)),
        ((2, 2, 3), (3,), (1, 3)),
        ((), (2,), (2,)),
    ],
)
def test_select_reference(sc: tuple[int, ...], sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    cond = np.asarray(RNG.random(sc) < 0.5)
    a = np.asarray(RNG.standard_normal(sa))
    b = np.asarray(RNG.standard_normal(sb))
    (out,) = run_op("select", cond=cond, a=a, b=b)
    np.testing.assert_array_equal(out, pointwise(lambda c, p, q: p if c else q, cond, a, b))


def test_select_int_and_bool() -> None:
    cond = np.array([True, False, True])
    (out,) = run_op("select", cond=cond, a=np.array([1, 2, 3]), b=np.array(-1))
    np.testing.assert_array_equal(out, [1, -1, 3])
    (out,) = run_op("select", cond=cond, a=np.array([True, True, True]), b=np.array(False))
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, [True, False, True])


def test_select_infer_and_errors() -> None:
    (t,) = infer_op("select", "fp16", cond=var("bool", [1, "s", 1]), a=var("fp16", [1, "s", 8]), b=0.0)
    assert t == T.tensor("fp16", [1, "s", 8])
    (t,) = infer_op("select", cond=var("bool", [2, 3]), a=var("int32", [3]), b=var("int32", []))
    assert t == T.tensor("int32", [2, 3])
    with raises("select"):
        infer_op("select", cond=var("fp32", [3]), a=var("fp32", [3]), b=var("fp32", [3]))
    with raises("select"):
        infer_op("select", cond=var("bool", [3]), a=var("fp32", [3]), b=var("fp16", [3]))
    with raises("select"):
        infer_op("select", cond=var("bool", [4]), a=var("fp32", [3]), b=var("fp32", [3]))
    with raises("select"):
        infer_op("select", cond=var("bool", [3]), a=var("fp32", [3]))


# -- unary math ---------------------------------------------------------------------------------------------

UNARY: dict[str, tuple[Callable[[float], float], tuple[float, float]]] = {
    "abs": (lambda v: -v if v < 0 else v, (-5, 5)),
    "exp": (math.exp, (-5, 5)),
    "exp2": (lambda v: 2.0**v, (-5, 5)),
    "log": (lambda v: math.log(v + 1e-45), (0.01, 10)),
    "sqrt": (math.sqrt, (0, 10)),
    "rsqrt": (lambda v: 1.0 / math.sqrt(v + 1e-12), (0.01, 10)),
    "inverse": (lambda v: 1.0 / (v + 1e-4), (0.1, 10)),
    "sin": (math.sin, (-7, 7)),
    "cos": (math.cos, (-7, 7)),
    "tan": (math.tan, (-1.5, 1.5)),
    "tanh": (math.tanh, (-5, 5)),
    "atan": (math.atan, (-10, 10)),
    "asin": (math.asin, (-1, 1)),
    "acos": (math.acos, (-1, 1)),
    "atanh": (math.atanh, (-0.99, 0.99)),
    "sinh": (math.sinh, (-5, 5)),
    "cosh": (math.cosh, (-5, 5)),
    "erf": (math.erf, (-4, 4)),
    "sign": (lambda v: float((v > 0) - (v < 0)), (-3, 3)),
    "floor": (math.floor, (-5, 5)),
    "ceil": (math.ceil, (-5, 5)),
    "round": (round, (-5, 5)),  # Python's round() rounds half to even
    "square": (lambda v: v * v, (-5, 5)),
}


@pytest.mark.parametrize("shape", [(2, 3, 4), ()])
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_reference(op: str, shape: tuple[int, ...]) -> None:
    fn, (lo, hi) = UNARY[op]
    x = np.asarray(RNG.uniform(lo, hi, shape))
    (out,) = run_op(op, x=x)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == shape
    np.testing.assert_allclose(out, pointwise(fn, x), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_keeps_float32(op: str) -> None:
    fn, (lo, hi) = UNARY[op]
    x = RNG.uniform(lo, hi, (16,)).astype(np.float32)
    (out,) = run_op(op, x=x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, pointwise(fn, x), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_infer_and_errors(op: str) -> None:
    (t,) = infer_op(op, x=var("fp16", [1, "s", 1, 16]))
    assert t == T.tensor("fp16", [1, "s", 1, 16])
    (t,) = infer_op(op, x=var("fp32", []))
    assert t == T.scalar("fp32")
    with raises(op):
        infer_op(op, x=var("bool", [2]))
    with raises(op):
        infer_op(op, x=var("fp32", [2]), y=var("fp32", [2]))


INT_UNARY: dict[str, Callable[[int], int]] = {
    "abs": lambda v: -v if v < 0 else v,
    "sign": lambda v: (v > 0) - (v < 0),
    "square": lambda v: v * v,
    "exp2": lambda v: math.trunc(2.0**v),
}


@pytest.mark.parametrize("op", sorted(INT_UNARY))
def test_unary_int(op: str) -> None:
    x = np.arange(-6, 7)
    (out,) = run_op(op, x=x)
    assert out.dtype.kind == "i"
    np.testing.assert_array_equal(out, pointwise(INT_UNARY[op], x, dtype=np.int64))
    (t,) = infer_op(op, x=var("int32", [3, "n"]))
    assert t == T.tensor("int32", [3, "n"])


@pytest.mark.parametrize("op", sorted(set(UNARY) - set(INT_UNARY)))
def test_unary_float_only_rejects_int(op: str) -> None:
    with raises(op):
        infer_op(op, x=var("int32", [3]))


def test_round_ties_to_even() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49, 2.51])
    (out,) = run_op("round", x=x)
    np.testing.assert_array_equal(out, [0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 0.0, 3.0])


@pytest.mark.parametrize(
    "op,eps,fn",
    [
        ("log", 0.5, lambda v: math.log(v + 0.5)),
        ("rsqrt", 1e-3, lambda v: 1.0 / math.sqrt(v + 1e-3)),
        ("inverse", 2.0, lambda v: 1.0 / (v + 2.0)),
    ],
)
def test_epsilon_ops(op: str, eps: float, fn: Callable[[float], float]) -> None:
    x = RNG.uniform(0.0, 5.0, (3, 4))
    (out,) = run_op(op, x=x, epsilon=eps)
    np.testing.assert_allclose(out, pointwise(fn, x), rtol=1e-12)
    # iOS17+: epsilon may have another float dtype than x.
    (t,) = infer_op(op, "fp32", x=var("fp16", [1, "s"]), epsilon=eps)
    assert t == T.tensor("fp16", [1, "s"])
    with raises(op):
        infer_op(op, x=var("fp32", [3]), epsilon=var("fp32", []))  # not a constant
    with raises(op):
        infer_op(op, x=var("fp32", [3]), epsilon=np.array([1.0, 2.0]))  # does not fit x
    with raises(op):
        infer_op(op, x=var("fp32", [3]), epsilon=1)  # int32


def test_log_zero_and_defaults() -> None:
    (out,) = run_op("log", x=np.array([0.0, 1.0]), epsilon=0.0)
    assert out[0] == -np.inf and out[1] == 0.0
    (out,) = run_op("inverse", x=np.array([0.0]))
    np.testing.assert_allclose(out, [1e4])


def test_erf_accuracy_and_specials() -> None:
    grid = np.concatenate([np.linspace(-7, 7, 2801), [1e-300, -1e-12, 30.0, -30.0]])
    (out,) = run_op("erf", x=grid)
    np.testing.assert_allclose(out, pointwise(math.erf, grid), rtol=1e-14, atol=3e-15)
    (out,) = run_op("erf", x=np.array([np.inf, -np.inf, np.nan, 0.0]))
    assert out[0] == 1.0 and out[1] == -1.0 and np.isnan(out[2]) and out[3] == 0.0
    (out,) = run_op("erf", x=grid.astype(np.float32))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, pointwise(math.erf, grid.astype(np.float32)), rtol=2e-7, atol=1e-7)
