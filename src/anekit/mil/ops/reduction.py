"""Reductions over axes (reduce_sum, reduce_mean, ...), arg-reductions and cumsum."""

from __future__ import annotations

import numpy as np

from anekit.mil import types as T
from anekit.mil.ops._util import norm_axes, norm_axis, reduced_shape
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op

REDUCE_T = frozenset({"fp16", "fp32", "int32"})
INT32 = frozenset({"int32"})
BOOL = frozenset({"bool"})
STRING = frozenset({"string"})


def _check_scalars(a: InferArgs, *names: str) -> None:
    for name in names:
        if a.has(name) and a.tensor(name).rank != 0:
            raise a.error(f"{name} must be a scalar, got shape {list(a.tensor(name).shape)}")


def _reduce_axes(a: InferArgs, rank: int) -> tuple[int, ...]:
    """The normalised ``axes`` of a reduction; every axis when omitted."""
    axes = a.value("axes")
    if axes is None:
        return tuple(range(rank))
    if np.ndim(axes) > 1:
        raise a.error(f"axes must be a scalar or a 1-D list of ints, got shape {list(np.shape(axes))}")
    return norm_axes(a, np.asarray(axes).ravel().tolist(), rank)


def _ref_axes(a: RefArgs, ndim: int) -> tuple[int, ...]:
    axes = a.get("axes")
    if axes is None:
        return tuple(range(ndim))
    return tuple(int(x) % ndim for x in np.asarray(axes).ravel())


class _ReduceAxes(OpDef):
    """Shared spec and type rule of the ``reduce_*`` ops over a set of axes."""

    inputs = {
        "x": Input(REDUCE_T),
        "axes": Input(INT32, optional=True, const=True),
        "keep_dims": Input(BOOL, const=True, default=False),
    }

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        _check_scalars(a, "keep_dims")
        axes = _reduce_axes(a, x.rank)
        return T.TensorType(x.dtype, reduced_shape(x.shape, axes, a.bool("keep_dims")))

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        raise NotImplementedError

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        axes = _ref_axes(a, x.ndim)
        out = np.asarray(self.compute(x, axes, a.bool("keep_dims")))
        if x.dtype.kind in "iu" and out.dtype != x.dtype:
            with np.errstate(invalid="ignore", divide="ignore"):
                out = np.trunc(out).astype(x.dtype) if out.dtype.kind == "f" else out.astype(x.dtype)
        return out


_AXES_DOC = """
    x: T in {fp16, fp32, int32}. axes: const int32 list, optional (default: every axis; an empty list
    reduces nothing). keep_dims: const bool, default False (True keeps reduced axes with size 1).
    Output: T, x's shape with the axes removed (a scalar when all are removed). Integer inputs give
    integer outputs (fractional results truncate toward zero)."""


@register_op
class reduce_sum(_ReduceAxes):
    __doc__ = "reduce_sum(x, axes?, keep_dims=False): sum over axes." + _AXES_DOC

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        return np.sum(x, axis=axes, keepdims=keep)


@register_op
class reduce_mean(_ReduceAxes):
    __doc__ = "reduce_mean(x, axes?, keep_dims=False): arithmetic mean over axes." + _AXES_DOC

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        return np.mean(x, axis=axes, keepdims=keep)


@register_op
class reduce_max(_ReduceAxes):
    __doc__ = "reduce_max(x, axes?, keep_dims=False): maximum over axes." + _AXES_DOC

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        return np.max(x, axis=axes, keepdims=keep)


@register_op
class reduce_min(_ReduceAxes):
    __doc__ = "reduce_min(x, axes?, keep_dims=False): minimum over axes." + _AXES_DOC

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        return np.min(x, axis=axes, keepdims=keep)


@register_op
class reduce_prod(_ReduceAxes):
    __doc__ = "reduce_prod(x, axes?, keep_dims=False): product over axes." + _AXES_DOC

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        return np.prod(x, axis=axes, keepdims=keep)


@register_op
class reduce_l1_norm(_ReduceAxes):
    __doc__ = "reduce_l1_norm(x, axes?, keep_dims=False): sum(|x|) over axes." + _AXES_DOC

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        return np.sum(np.abs(x), axis=axes, keepdims=keep)


@register_op
class reduce_l2_norm(_ReduceAxes):
    __doc__ = "reduce_l2_norm(x, axes?, keep_dims=False): sqrt(sum(x^2)) over axes." + _AXES_DOC

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        x = x.astype(np.float64) if x.dtype.kind in "iu" else x
        return np.sqrt(np.sum(x * x, axis=axes, keepdims=keep))


@register_op
class reduce_sum_square(_ReduceAxes):
    __doc__ = "reduce_sum_square(x, axes?, keep_dims=False): sum(x^2) over axes." + _AXES_DOC

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        return np.sum(x * x, axis=axes, keepdims=keep)


@register_op
class reduce_log_sum(_ReduceAxes):
    __doc__ = "reduce_log_sum(x, axes?, keep_dims=False): log(sum(x)) over axes." + _AXES_DOC

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        x = x.astype(np.float64) if x.dtype.kind in "iu" else x
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(np.sum(x, axis=axes, keepdims=keep))


@register_op
class reduce_log_sum_exp(_ReduceAxes):
    __doc__ = (
        "reduce_log_sum_exp(x, axes?, keep_dims=False): log(sum(exp(x))) over axes, computed stably "
        "as m + log(sum(exp(x - m))) with m the maximum over the axes." + _AXES_DOC
    )

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        x = x.astype(np.float64) if x.dtype.kind in "iu" else x
        if x.size == 0 or not axes:
            with np.errstate(divide="ignore"):
                return np.log(np.sum(np.exp(x), axis=axes, keepdims=keep))
        m = np.max(x, axis=axes, keepdims=True)
        m = np.where(np.isfinite(m), m, np.zeros_like(m))
        s = np.sum(np.exp(x - m), axis=axes, keepdims=True)
        with np.errstate(divide="ignore"):
            out = np.log(s) + m
        return out if keep else np.squeeze(out, axis=axes)


class _ReduceArg(OpDef):
    """Shared spec of reduce_argmax / reduce_argmin."""

    inputs = {
        "x": Input(REDUCE_T),
        "axis": Input(INT32, const=True, default=-1),
        "keep_dims": Input(BOOL, const=True, default=False),
        "output_dtype": Input(STRING, const=True, default="int32"),
    }

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        if x.rank < 1:
            raise a.error("x must have rank 1 or more")
        _check_scalars(a, "axis", "keep_dims", "output_dtype")
        axis = norm_axis(a, a.int("axis"), x.rank)
        out_dt = a.str("output_dtype").lower()
        if out_dt not in ("int32", "uint16"):
            raise a.error(f"output_dtype must be 'int32' or 'uint16', got '{out_dt}'")
        return T.TensorType(T.dtype(out_dt), reduced_shape(x.shape, (axis,), a.bool("keep_dims")))

    def pick(self, x: np.ndarray, axis: int) -> np.ndarray:
        raise NotImplementedError

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        axis = a.int("axis") % x.ndim
        idx = self.pick(x, axis)
        if a.bool("keep_dims"):
            idx = np.expand_dims(idx, axis)
        return np.asarray(idx).astype(T.dtype(a.str("output_dtype").lower()).np)


@register_op
class reduce_argmax(_ReduceArg):
    """reduce_argmax(x, axis=-1, keep_dims=False, output_dtype="int32"): index of the maximum along axis.

    x: T in {fp16, fp32, int32}, rank >= 1. axis: const int32 (negative counts from the end).
    keep_dims: const bool. output_dtype: const string, "int32" (default) or "uint16" (iOS17+).
    Output: indices of x's shape without axis (kept as 1 with keep_dims). Ties give the first index.
    """

    def pick(self, x: np.ndarray, axis: int) -> np.ndarray:
        return np.argmax(x, axis=axis)


@register_op
class reduce_argmin(_ReduceArg):
    """reduce_argmin(x, axis=-1, keep_dims=False, output_dtype="int32"): index of the minimum along axis.

    x: T in {fp16, fp32, int32}, rank >= 1. axis: const int32 (negative counts from the end).
    keep_dims: const bool. output_dtype: const string, "int32" (default) or "uint16" (iOS17+).
    Output: indices of x's shape without axis (kept as 1 with keep_dims). Ties give the first index.
    """

    def pick(self, x: np.ndarray, axis: int) -> np.ndarray:
        return np.argmin(x, axis=axis)


@register_op
class cumsum(OpDef):
    """cumsum(x, axis=0, exclusive=False, reverse=False): cumulative sum along axis.

    x: T in {fp16, fp32, int32}, rank >= 1. axis: const int32 in [-rank, rank). exclusive: const
    bool: element i sums the elements before i (the first output is 0). reverse: const bool: sum
    from the end of the axis toward the start. Output: T, x's shape.
    """

    inputs = {
        "x": Input(REDUCE_T),
        "axis": Input(INT32, const=True, default=0),
        "exclusive": Input(BOOL, const=True, default=False),
        "reverse": Input(BOOL, const=True, default=False),
    }

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        if x.rank < 1:
            raise a.error("x must have rank 1 or more")
        _check_scalars(a, "axis", "exclusive", "reverse")
        norm_axis(a, a.int("axis"), x.rank)
        return x

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        axis = a.int("axis") % x.ndim
        if a.bool("reverse"):
            x = np.flip(x, axis)
        out = np.cumsum(x, axis=axis, dtype=x.dtype)
        if a.bool("exclusive"):
            shifted = np.zeros_like(out)
            src = [slice(None)] * x.ndim
            dst = [slice(None)] * x.ndim
            src[axis], dst[axis] = slice(0, -1), slice(1, None)
            shifted[tuple(dst)] = out[tuple(src)]
            out = shifted
        if a.bool("reverse"):
            out = np.flip(out, axis)
        return np.ascontiguousarray(out)
