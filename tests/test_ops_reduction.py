"""Reductions, arg-reductions and cumsum: references against loop/math implementations, type rules, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anekit.errors import MilTypeError
from anekit.mil import types as T
from tests.op_harness import infer_op, run_op, var

RNG = np.random.default_rng(1234)


def _rows(x: np.ndarray, axes: list[int] | None) -> tuple[list[int], list[int], np.ndarray]:
    """Kept axes, reduced axes, and x as one row per output element."""
    red = list(range(x.ndim)) if axes is None else sorted(a % x.ndim for a in axes)
    kept = [i for i in range(x.ndim) if i not in red]
    out_n = math.prod(x.shape[i] for i in kept)
    return kept, red, np.transpose(x, kept + red).reshape(out_n, -1)


def loop_reduce(x: np.ndarray, axes: list[int] | None, keep: bool, fn) -> np.ndarray:
    kept, red, rows = _rows(x, axes)
    vals = np.array([fn([float(v) for v in row]) for row in rows])
    if keep:
        return vals.reshape([1 if i in red else x.shape[i] for i in range(x.ndim)])
    return vals.reshape([x.shape[i] for i in kept])


FNS = {
    "reduce_sum": math.fsum,
    "reduce_mean": lambda v: math.fsum(v) / len(v),
    "reduce_max": max,
    "reduce_min": min,
    "reduce_prod": math.prod,
    "reduce_l1_norm": lambda v: math.fsum(abs(e) for e in v),
    "reduce_l2_norm": lambda v: math.sqrt(math.fsum(e * e for e in v)),
    "reduce_sum_square": lambda v: math.fsum(e * e for e in v),
    "reduce_log_sum": lambda v: math.log(math.fsum(v)),
    "reduce_log_sum_exp": lambda v: math.log(math.fsum(math.exp(e) for e in v)),
}

AXES_CASES = [None, [1], [0, 2], [-1], [2, 0, 1]]


@pytest.mark.parametrize("op", sorted(FNS))
@pytest.mark.parametrize("axes", AXES_CASES)
@pytest.mark.parametrize("keep", [False, True])
def test_reduce_reference(op: str, axes: list[int] | None, keep: bool) -> None:
    x = RNG.uniform(0.5, 1.5, size=(2, 3, 4))
    if op not in ("reduce_log_sum",):
        x = x * np.where(RNG.random(x.shape) < 0.3, -1.0, 1.0)
    kwargs = {} if axes is None else {"axes": axes}
    (out,) = run_op(op, x=x, keep_dims=keep, **kwargs)
    np.testing.assert_allclose(out, loop_reduce(x, axes, keep, FNS[op]), rtol=1e-12, atol=1e-12)


def test_reduce_log_sum_exp_is_stable() -> None:
    x = np.array([[1000.0, 1000.0], [-1000.0, -1001.0]])
    (out,) = run_op("reduce_log_sum_exp", x=x, axes=[1])
    np.testing.assert_allclose(out, [1000.0 + math.log(2.0), -1000.0 + math.log1p(math.exp(-1.0))])


def test_reduce_integer_inputs_stay_integer() -> None:
    x = np.array([[1, 2, 4], [-3, 5, 7]], dtype=np.int32)
    (s,) = run_op("reduce_sum", x=x, axes=[1])
    assert s.dtype == np.int32 and s.tolist() == [7, 9]
    (m,) = run_op("reduce_mean", x=x, axes=[1])
    assert m.dtype == np.int32 and m.tolist() == [2, 3]  # 7/3 and 9/3 truncated
    assert infer_op("reduce_mean", x=x, axes=[1])[0] == T.tensor("int32", [2])


def test_reduce_empty_axes_reduces_nothing() -> None:
    x = RNG.normal(size=(2, 3))
    (out,) = run_op("reduce_sum", x=x, axes=np.array([], dtype=np.int32))
    np.testing.assert_allclose(out, x)


@pytest.mark.parametrize(
    ("axes", "keep", "shape"),
    [
        (None, False, ()),
        (None, True, (1, 1, 1)),
        ([1], False, ("B", "S")),
        ([1], True, ("B", 1, "S")),
        ([0, -1], False, (8,)),
    ],
)
def test_reduce_infer_symbolic(axes: list[int] | None, keep: bool, shape: tuple) -> None:
    kwargs = {} if axes is None else {"axes": axes}
    for op in FNS:
        (t,) = infer_op(op, x=var("fp16", ["B", 8, "S"]), keep_dims=keep, **kwargs)
        assert t == T.tensor("fp16", shape), op


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"x": var("fp16", [2, 3]), "axes": [2]}, "out of range"),
        ({"x": var("fp16", [2, 3]), "axes": [0, -2]}, "repeat"),
        ({"x": var("bool", [2, 3])}, "dtype bool"),
        ({"x": var("fp16", [2, 3]), "axes": var("int32", [1])}, "constant"),
        ({"x": var("fp16", [2, 3]), "keep_dims": np.array([True, False])}, "scalar"),
        ({"x": var("fp16", [2, 3]), "axis": 0}, "unexpected input"),
    ],
)
def test_reduce_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(MilTypeError, match=r"\[reduce_mean\].*" + needle):
        infer_op("reduce_mean", **kwargs)


# -- arg reductions ---------------------------------------------------------------------------------


def loop_arg(x: np.ndarray, axis: int, keep: bool, pick_max: bool) -> np.ndarray:
    axis %= x.ndim
    xt = np.moveaxis(x, axis, -1)
    out = np.zeros(xt.shape[:-1], dtype=np.int64)
    for idx in np.ndindex(*xt.shape[:-1]):
        row = list(xt[idx])
        best = 0
        for j, v in enumerate(row):
            if (v > row[best]) if pick_max else (v < row[best]):
                best = j
        out[idx] = best
    return np.expand_dims(out, axis) if keep else out


@pytest.mark.parametrize("op", ["reduce_argmax", "reduce_argmin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keep", [False, True])
def test_reduce_arg_reference(op: str, axis: int, keep: bool) -> None:
    x = RNG.integers(-3, 4, size=(3, 4, 5)).astype(np.float64)  # ties: the first index wins
    (out,) = run_op(op, x=x, axis=axis, keep_dims=keep)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, loop_arg(x, axis, keep, op == "reduce_argmax"))


def test_reduce_arg_default_axis_and_uint16() -> None:
    x = RNG.normal(size=(2, 6))
    (out,) = run_op("reduce_argmax", x=x, output_dtype="uint16")
    assert out.dtype == np.uint16
    np.testing.assert_array_equal(out, loop_arg(x, -1, False, True))
    (t,) = infer_op("reduce_argmin", x=var("fp16", ["B", "S", 4]), axis=1, keep_dims=True)
    assert t == T.tensor("int32", ["B", 1, 4])
    (t,) = infer_op("reduce_argmax", x=var("int32", [5]), output_dtype="UINT16")
    assert t == T.tensor("uint16", [])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"x": var("fp16", [2, 3]), "axis": 2}, "out of range"),
        ({"x": var("fp16", [2, 3]), "output_dtype": "int8"}, "output_dtype"),
        ({"x": var("fp16", [])}, "rank 1"),
        ({"x": var("fp16", [2, 3]), "axis": [0]}, "scalar"),
    ],
)
def test_reduce_arg_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(MilTypeError, match=r"\[reduce_argmax\].*" + needle):
        infer_op("reduce_argmax", **kwargs)


# -- cumsum ------------------------------------------------------------------------------------------


def loop_cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    axis %= x.ndim
    xt = np.moveaxis(x, axis, -1)
    out = np.zeros_like(xt)
    n = xt.shape[-1]
    for idx in np.ndindex(*xt.shape[:-1]):
        for i in range(n):
            js = range(i, n) if reverse else range(i + 1)
            out[(*idx, i)] = math.fsum(xt[(*idx, j)] for j in js if not (exclusive and j == i))
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_reference(axis: int, exclusive: bool, reverse: bool) -> None:
    x = RNG.normal(size=(3, 4, 2))
    (out,) = run_op("cumsum", x=x, axis=axis, exclusive=exclusive, reverse=reverse)
    np.testing.assert_allclose(out, loop_cumsum(x, axis, exclusive, reverse), rtol=1e-12, atol=1e-12)


def test_cumsum_defaults_int_and_infer() -> None:
    x = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int32)
    (out,) = run_op("cumsum", x=x)
    assert out.dtype == np.int32 and out.tolist() == [[1, 2], [4, 6], [9, 12]]
    (t,) = infer_op("cumsum", x=var("fp16", ["B", 7]), axis=-1, reverse=True)
    assert t == T.tensor("fp16", ["B", 7])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"x": var("fp16", [2, 3]), "axis": -3}, "out of range"),
        ({"x": var("fp16", [])}, "rank 1"),
        ({"x": var("bool", [3])}, "dtype"),
        ({"x": var("fp16", [3]), "exclusive": var("bool", [])}, "constant"),
    ],
)
def test_cumsum_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(MilTypeError, match=r"\[cumsum\].*" + needle):
        infer_op("cumsum", **kwargs)
