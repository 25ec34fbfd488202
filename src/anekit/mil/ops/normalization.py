"""Normalization: batch_norm, instance_norm, layer_norm, l2_norm and local_response_norm."""

from __future__ import annotations

import numpy as np

from anekit.mil import types as T
from anekit.mil.ops._util import norm_axes
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op

INT32 = frozenset({"int32"})


def _known(*dims: T.Dim) -> bool:
    return all(isinstance(d, int) for d in dims)


def _check_channel_vectors(a: InferArgs, names: tuple[str, ...]) -> None:
    """Each named input that is present must be a 1-D tensor of length C (x's dim 1)."""
    c = a.tensor("x").shape[1]
    for name in names:
        if a.has(name):
            t = a.tensor(name)
            if t.rank != 1 or (_known(t.shape[0], c) and t.shape[0] != c):
                raise a.error(
                    f"{name} must have shape [{c}] (one value per channel of x), got {list(t.shape)}"
                )


def _check_scalars(a: InferArgs, names: tuple[str, ...]) -> None:
    for name in names:
        if a.has(name) and a.tensor(name).rank != 0:
            raise a.error(f"{name} must be a scalar, got shape {list(a.tensor(name).shape)}")


def _per_channel(v: object, ndim: int) -> np.ndarray:
    arr = np.asarray(v)
    return arr.reshape((1, arr.size) + (1,) * (ndim - 2))


def _scale_shift(y: np.ndarray, gamma: object, beta: object, shape: tuple[int, ...]) -> np.ndarray:
    if gamma is not None:
        y = y * np.asarray(gamma).reshape(shape)
    if beta is not None:
        y = y + np.asarray(beta).reshape(shape)
    return y


@register_op
class batch_norm(OpDef):
    """batch_norm(x, mean, variance, gamma?, beta?, epsilon=1e-5): per-channel affine normalisation.

    y = gamma[c] * (x - mean[c]) / sqrt(variance[c] + epsilon) + beta[c], c the axis-1 index.
    x: T in {fp16, fp32}, [N, C, *D] with rank 3..5. mean, variance, gamma (default ones), beta
    (default zeros): U in {fp16, fp32} (U may differ from T, iOS17+), shape [C]; coremltools declares
    them const, anekit also accepts runtime values. epsilon: const fp16/fp32 scalar. Output: x's type.
    """

    inputs = {
        "x": Input(T.FLOATS, rank=(3, 4, 5)),
        "mean": Input(T.FLOATS),
        "variance": Input(T.FLOATS),
        "gamma": Input(T.FLOATS, optional=True),
        "beta": Input(T.FLOATS, optional=True),
        "epsilon": Input(T.FLOATS, const=True, default=1e-5),
    }
    same_dtype = ("mean", "variance", "gamma", "beta")

    def infer(self, a: InferArgs) -> T.Type:
        _check_channel_vectors(a, ("mean", "variance", "gamma", "beta"))
        _check_scalars(a, ("epsilon",))
        return a.tensor("x")

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        mean = _per_channel(a["mean"], x.ndim)
        var = _per_channel(a["variance"], x.ndim)
        y = (x - mean) / np.sqrt(var + a.float("epsilon"))
        shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        return _scale_shift(y, a.get("gamma"), a.get("beta"), shape)


@register_op
class instance_norm(OpDef):
    """instance_norm(x, gamma?, beta?, epsilon=1e-5): normalise each (n, c) slice over the spatial dims.

    y = gamma[c] * (x - mean) / sqrt(var + epsilon) + beta[c], mean and (biased) var taken over axes
    2.. for each n, c. x: T in {fp16, fp32}, [N, C, *D] with rank 3..5. gamma (default ones), beta
    (default zeros): U in {fp16, fp32}, [C]. epsilon: const fp16/fp32 scalar. Output: x's type.
    """

    inputs = {
        "x": Input(T.FLOATS, rank=(3, 4, 5)),
        "gamma": Input(T.FLOATS, optional=True),
        "beta": Input(T.FLOATS, optional=True),
        "epsilon": Input(T.FLOATS, const=True, default=1e-5),
    }
    same_dtype = ("gamma", "beta")

    def infer(self, a: InferArgs) -> T.Type:
        _check_channel_vectors(a, ("gamma", "beta"))
        _check_scalars(a, ("epsilon",))
        return a.tensor("x")

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        axes = tuple(range(2, x.ndim))
        d = x - np.mean(x, axis=axes, keepdims=True)
        var = np.mean(d * d, axis=axes, keepdims=True)
        y = d / np.sqrt(var + a.float("epsilon"))
        shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        return _scale_shift(y, a.get("gamma"), a.get("beta"), shape)


@register_op
class layer_norm(OpDef):
    """layer_norm(x, axes?, gamma?, beta?, epsilon=1e-5): normalise over axes.

    y = gamma * (x - mean) / sqrt(var + epsilon) + beta, mean and (biased) var over axes.
    x: T in {fp16, fp32}, any rank. axes: const int32 list, default all axes. gamma (default ones),
    beta (default zeros): U in {fp16, fp32}, shape [x.shape[i] for i in sorted(axes)]. epsilon: const
    fp16/fp32 scalar. Output: x's type.
    """

    inputs = {
        "x": Input(T.FLOATS),
        "axes": Input(INT32, optional=True, const=True),
        "gamma": Input(T.FLOATS, optional=True),
        "beta": Input(T.FLOATS, optional=True),
        "epsilon": Input(T.FLOATS, const=True, default=1e-5),
    }
    same_dtype = ("gamma", "beta")

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        _check_scalars(a, ("epsilon",))
        axes_v = a.value("axes")
        if axes_v is None:
            axes = tuple(range(x.rank))
        else:
            if np.ndim(axes_v) > 1:
                raise a.error(f"axes must be a 1-D list of ints, got shape {list(np.shape(axes_v))}")
            axes = norm_axes(a, np.asarray(axes_v).ravel().tolist(), x.rank)
        normalized = [x.shape[i] for i in sorted(axes)]
        for name in ("gamma", "beta"):
            if a.has(name):
                s = a.tensor(name).shape
                if len(s) != len(normalized) or any(_known(p, q) and p != q for p, q in zip(s, normalized)):
                    raise a.error(
                        f"{name} must have shape {normalized} (x's sizes on axes {sorted(axes)}), "
                        f"got {list(s)}"
                    )
        return x

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        ax = a.get("axes")
        axes = tuple(range(x.ndim)) if ax is None else tuple(int(i) % x.ndim for i in np.asarray(ax).ravel())
        d = x - np.mean(x, axis=axes, keepdims=True)
        var = np.mean(d * d, axis=axes, keepdims=True)
        y = d / np.sqrt(var + a.float("epsilon"))
        shape = tuple(n if i in axes else 1 for i, n in enumerate(x.shape))
        return _scale_shift(y, a.get("gamma"), a.get("beta"), shape)


@register_op
class l2_norm(OpDef):
    """l2_norm(x, epsilon=1e-6): divide by the L2 norm of the last three dims.

    y = x / sqrt(sum(x^2) + epsilon), the sum over the last three axes, separately for every index of
    the leading axes. x: T in {fp16, fp32}, rank >= 3. epsilon: const U in {fp16, fp32} (U may differ
    from T, iOS17+). coremltools' l2_norm (iOS15 and iOS17) has no axes input. Output: x's type.
    """

    inputs = {"x": Input(T.FLOATS), "epsilon": Input(T.FLOATS, const=True, default=1e-6)}

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        if x.rank < 3:
            raise a.error(f"x must have rank 3 or more (the last three axes are normalised), got {x.rank}")
        _check_scalars(a, ("epsilon",))
        return x

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        ss = np.sum(x * x, axis=(-3, -2, -1), keepdims=True)
        return x / np.sqrt(ss + a.float("epsilon"))


@register_op
class local_response_norm(OpDef):
    """local_response_norm(x, size, alpha=1e-4, beta=0.75, k=1.0): normalise across neighbouring channels.

    y[c] = x[c] / (k + alpha / size * sum(x[j]^2 for j in [c - size//2, c + (size-1)//2]))^beta,
    channels outside [0, C) count as zero (PyTorch's LocalResponseNorm window). x: T in {fp16, fp32},
    [N, C, *D] with rank 3..5. size: const int32 >= 1. alpha, beta, k: const fp16/fp32 scalars.
    Output: x's type.
    """

    inputs = {
        "x": Input(T.FLOATS, rank=(3, 4, 5)),
        "size": Input(INT32, const=True),
        "alpha": Input(T.FLOATS, const=True, default=1e-4),
        "beta": Input(T.FLOATS, const=True, default=0.75),
        "k": Input(T.FLOATS, const=True, default=1.0),
    }

    def infer(self, a: InferArgs) -> T.Type:
        _check_scalars(a, ("size", "alpha", "beta", "k"))
        if a.int("size") < 1:
            raise a.error(f"size must be >= 1, got {a.int('size')}")
        return a.tensor("x")

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        size = a.int("size")
        c = x.shape[1]
        sq = np.pad(x * x, [(0, 0), (size // 2, (size - 1) // 2)] + [(0, 0)] * (x.ndim - 2))
        window = sq[:, 0:c].copy()
        for j in range(1, size):
            window += sq[:, j : j + c]
        div = (a.float("k") + a.float("alpha") / size * window) ** a.float("beta")
        return x / div
