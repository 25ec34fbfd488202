"""Activation ops: sigmoid and relu families, gelu, softplus, clip and friends, and softmax."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from anekit.mil import types as T
from anekit.mil.ops._util import norm_axis
from anekit.mil.ops.elementwise import FLOAT_T, erf_np, like, param_fits
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op

INT_FLOAT_T = frozenset({"fp16", "fp32", "int32"})
GELU_MODES = ("EXACT", "TANH_APPROXIMATION", "SIGMOID_APPROXIMATION")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without overflow for large |x|: e = exp(-|x|), then 1 / (1 + e) for x >= 0 and
    e / (1 + e) below (one division of the chosen numerator, in few passes over the data).

    The numerator is max(e, [x >= 0]): e lies in [0, 1], so the max is 1 where x >= 0 and e elsewhere
    (NaN stays NaN) — the values ``np.where`` would pick, several times faster."""
    e = np.abs(x)
    if not isinstance(e, np.ndarray) or not np.issubdtype(e.dtype, np.floating):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    np.negative(e, out=e)
    np.exp(e, out=e)
    den = e + 1.0
    num = np.maximum(e, x >= 0, dtype=e.dtype)
    np.divide(num, den, out=num)
    return num


def _softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))."""
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


class _Activation(OpDef):
    """An activation of x with constant parameters (scalars unless said otherwise); output has x's type.

    Subclasses list their scalar parameters in ``params`` and implement ``compute(x, **params)``.
    """

    inputs = {"x": Input(FLOAT_T)}
    params: tuple[str, ...] = ()

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        for p in self.params:
            param_fits(a, p)
        return x

    # Each subclass names its own ``params``; a base taking ``*args: Any, **params: Any`` lets it.
    def compute(self, x: np.ndarray, *args: Any, **params: Any) -> np.ndarray:
        raise NotImplementedError

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        params = {p: np.asarray(a[p]).astype(x.dtype) for p in self.params}
        with np.errstate(all="ignore"):
            r = self.compute(x, **params)
        return like(r, x.dtype)


_ALPHA = Input(FLOAT_T, const=True)
_BETA = Input(FLOAT_T, const=True)


@register_op
class sigmoid(_Activation):
    """sigmoid(x): 1 / (1 + exp(-x)) elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return _sigmoid(x)


@register_op
class sigmoid_hard(_Activation):
    """sigmoid_hard(x, alpha, beta): min(max(alpha * x + beta, 0), 1) elementwise.

    x: tensor<T>, T in {fp16, fp32}. alpha, beta: required const scalars in {fp16, fp32} (iOS15: x's
    dtype; iOS17+: either). Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "alpha": _ALPHA, "beta": _BETA}
    params = ("alpha", "beta")

    def compute(self, x: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
        return np.minimum(np.maximum(alpha * x + beta, 0), 1)


@register_op
class relu(_Activation):
    """relu(x): max(x, 0) elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x, 0)


@register_op
class relu6(_Activation):
    """relu6(x): min(max(x, 0), 6) elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.minimum(np.maximum(x, 0), 6)


@register_op
class leaky_relu(_Activation):
    """leaky_relu(x, alpha): x where x >= 0, else alpha * x, elementwise.

    x: tensor<T>, T in {fp16, fp32}. alpha: required const scalar in {fp16, fp32} (iOS15: x's dtype;
    iOS17+: either). Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "alpha": _ALPHA}
    params = ("alpha",)

    def compute(self, x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, x, alpha * x)


@register_op
class elu(_Activation):
    """elu(x, alpha): x where x > 0, else alpha * (exp(x) - 1), elementwise.

    x: tensor<T>, T in {fp16, fp32}. alpha: required const scalar in {fp16, fp32} (iOS15: x's dtype;
    iOS17+: either). Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "alpha": _ALPHA}
    params = ("alpha",)

    def compute(self, x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        return np.where(x > 0, x, alpha * np.expm1(x))


@register_op
class silu(_Activation):
    """silu(x): x * sigmoid(x) elementwise (swish). x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return x * _sigmoid(x)


@register_op
class gelu(_Activation):
    """gelu(x, mode = "EXACT"): the Gaussian error linear unit elementwise.

    x: tensor<T>, T in {fp16, fp32}. mode: optional const string, one of
      * "EXACT": 0.5 * x * (1 + erf(x / sqrt(2)));
      * "TANH_APPROXIMATION": 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)));
      * "SIGMOID_APPROXIMATION": x * sigmoid(1.702 * x).
    Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "mode": Input("string", const=True, default="EXACT")}

    def infer(self, a: InferArgs) -> T.Type:
        mode = a.str("mode")
        if mode not in GELU_MODES:
            raise a.error(f"unknown mode '{mode}' (expected one of {', '.join(GELU_MODES)})")
        return a.tensor("x")

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        mode = a.str("mode")
        with np.errstate(all="ignore"):
            if mode == "TANH_APPROXIMATION":
                r = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
            elif mode == "SIGMOID_APPROXIMATION":
                r = x * _sigmoid(1.702 * x)
            else:
                r = 0.5 * x * (1.0 + erf_np(x / math.sqrt(2.0)))
        return like(r, x.dtype)


@register_op
class softplus(_Activation):
    """softplus(x): log(1 + exp(x)) elementwise (computed without overflow).
    x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return _softplus(x)


def _channel_params(a: InferArgs, names: tuple[str, ...], ranks: tuple[int, ...] | None) -> T.TensorType:
    """Check x (rank in ``ranks``, or >= 3 when None) and per-channel rank-1 params of length C."""
    x = a.tensor("x")
    if ranks is not None and x.rank not in ranks:
        raise a.error(f"x must have rank {' or '.join(map(str, ranks))} ([B, C, ...]), got rank {x.rank}")
    if ranks is None and x.rank < 3:
        raise a.error(f"x must have rank >= 3 ([B, C, ...]), got rank {x.rank}")
    c = x.shape[1]
    for n in names:
        p = a.tensor(n)
        if p.rank != 1:
            raise a.error(f"'{n}' must be a rank-1 tensor of length C, got rank {p.rank}")
        if isinstance(c, int) and isinstance(p.shape[0], int) and p.shape[0] != c:
            raise a.error(f"'{n}' has length {p.shape[0]} but x has {c} channels (dimension 1)")
    return x


def _per_channel(p: np.ndarray, rank: int, dtype: np.dtype) -> np.ndarray:
    """A length-C vector shaped to broadcast along dimension 1 of a rank-``rank`` tensor."""
    return np.asarray(p).astype(dtype).reshape((1, -1) + (1,) * (rank - 2))


@register_op
class prelu(OpDef):
    """prelu(x, alpha): x where x > 0, else alpha[c] * x, with c the channel (dimension 1) index.

    x: tensor<T, [B, C, ...]> of rank 3, 4 or 5, T in {fp16, fp32}. alpha: required const
    tensor<U, [C]>, U in {fp16, fp32} (iOS15: U = T). For rank 3 and 5 all alpha values must be equal
    (within 1e-5), as coremltools requires. Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "alpha": Input(FLOAT_T, const=True)}

    def infer(self, a: InferArgs) -> T.Type:
        x = _channel_params(a, ("alpha",), (3, 4, 5))
        alpha = a.value("alpha")
        if x.rank in (3, 5) and alpha is not None:
            al = np.asarray(alpha, dtype=np.float64).ravel()
            if al.size and float(np.max(np.abs(al - al[0]))) > 1e-5:
                raise a.error(
                    f"rank-{x.rank} x needs all alpha values equal (only rank 4 takes per-channel alpha)"
                )
        return x

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        alpha = _per_channel(a["alpha"], x.ndim, x.dtype)
        return like(np.where(x > 0, x, alpha * x), x.dtype)


@register_op
class softplus_parametric(OpDef):
    """softplus_parametric(x, alpha, beta): alpha[c] * log(1 + exp(beta[c] * x)), c the channel index.

    x: tensor<T, [B, C, ...]> of rank >= 3, T in {fp16, fp32}. alpha, beta: required const
    tensor<U, [C]>, U in {fp16, fp32} (iOS15: U = T). Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "alpha": Input(FLOAT_T, const=True), "beta": Input(FLOAT_T, const=True)}

    def infer(self, a: InferArgs) -> T.Type:
        return _channel_params(a, ("alpha", "beta"), None)

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        alpha = _per_channel(a["alpha"], x.ndim, x.dtype)
        beta = _per_channel(a["beta"], x.ndim, x.dtype)
        with np.errstate(all="ignore"):
            r = alpha * _softplus(beta * x)
        return like(r, x.dtype)


@register_op
class softsign(_Activation):
    """softsign(x): x / (1 + |x|) elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return x / (1.0 + np.abs(x))


@register_op
class scaled_tanh(_Activation):
    """scaled_tanh(x, alpha, beta): alpha * tanh(beta * x) elementwise.

    x: tensor<T>, T in {fp16, fp32}. alpha, beta: required const scalars in {fp16, fp32} (iOS15: x's
    dtype; iOS17+: either). Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "alpha": _ALPHA, "beta": _BETA}
    params = ("alpha", "beta")

    def compute(self, x: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
        return alpha * np.tanh(beta * x)


@register_op
class clip(_Activation):
    """clip(x, alpha, beta): min(max(x, alpha), beta) elementwise.

    x: tensor<T>, T in {fp16, fp32}. alpha, beta: required const scalars of dtype T. Output has x's
    type. iOS17 rejects alpha >= beta while iOS15 accepts any pair; following the union, any pair is
    accepted here and alpha > beta yields beta everywhere.
    """

    inputs = {"x": Input(FLOAT_T), "alpha": Input(FLOAT_T, const=True), "beta": Input(FLOAT_T, const=True)}
    same_dtype = ("x", "alpha", "beta")
    params = ("alpha", "beta")

    def compute(self, x: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
        return np.minimum(np.maximum(x, alpha), beta)


@register_op
class clamped_relu(_Activation):
    """clamped_relu(x, alpha, beta): min(x, beta) where x >= 0, else min(alpha * x, beta), elementwise.

    x: tensor<T>, T in {fp16, fp32}. alpha, beta: required const scalars in {fp16, fp32} (iOS15: x's
    dtype; iOS17+: either). Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "alpha": _ALPHA, "beta": _BETA}
    params = ("alpha", "beta")

    def compute(self, x: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
        return np.minimum(np.where(x >= 0, x, alpha * x), beta)


@register_op
class threshold(_Activation):
    """threshold(x, alpha): max(x, alpha) elementwise (a lower bound).

    x: tensor<T>, T in {fp16, fp32, int32}. alpha: required const scalar of dtype T. Output has x's type.
    """

    inputs = {"x": Input(INT_FLOAT_T), "alpha": Input(INT_FLOAT_T, const=True)}
    same_dtype = ("x", "alpha")
    params = ("alpha",)

    def compute(self, x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        return np.maximum(x, alpha)


@register_op
class thresholded_relu(_Activation):
    """thresholded_relu(x, alpha): x where x >= alpha, else 0, elementwise.

    x: tensor<T>, T in {fp16, fp32}. alpha: required const scalar in {fp16, fp32} (iOS15: x's dtype;
    iOS17+: either). Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "alpha": _ALPHA}
    params = ("alpha",)

    def compute(self, x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        return np.where(x >= alpha, x, 0)


@register_op
class linear_activation(_Activation):
    """linear_activation(x, alpha, beta): alpha * x + beta elementwise.

    x: tensor<T>, T in {fp16, fp32}. alpha, beta: required const scalars in {fp16, fp32} (iOS15: x's
    dtype; iOS17+: either). Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "alpha": _ALPHA, "beta": _BETA}
    params = ("alpha", "beta")

    def compute(self, x: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
        return alpha * x + beta


@register_op
class softmax(OpDef):
    """softmax(x, axis = -1): exp(x) / sum(exp(x), axis), computed as exp(x - max) / sum(...).

    x: tensor<T> of rank >= 1, T in {fp16, fp32}. axis: optional const int32 in [-rank, rank),
    default -1. Output has x's type. A slice containing +inf gives NaN (as exp(inf - inf) does).
    The sum along the axis is numpy's (``axis_sum``: a simulator may sum in another order).
    """

    inputs = {"x": Input(FLOAT_T), "axis": Input("int32", const=True, default=-1)}

    @staticmethod
    def axis_sum(e: np.ndarray, axis: int) -> np.ndarray:
        """The sum of the exponentials along ``axis``, the axis kept: numpy's (pairwise along a
        contiguous axis)."""
        return np.asarray(np.sum(e, axis=axis, keepdims=True))

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        if x.rank == 0:
            raise a.error("x must have rank >= 1")
        norm_axis(a, a.int("axis"), x.rank)
        return x

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        axis = a.int("axis")
        with np.errstate(all="ignore"):
            e = np.subtract(x, np.max(x, axis=axis, keepdims=True))
            if isinstance(e, np.ndarray) and np.issubdtype(e.dtype, np.floating):  # in place: one array
                np.exp(e, out=e)
                np.divide(e, self.axis_sum(e, axis), out=e)
                r = e
            else:
                e = np.exp(e)
                r = e / self.axis_sum(e, axis)
        return like(r, x.dtype)
