"""Pooling: max_pool, avg_pool and l2_pool over 1-3 spatial dims."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from anekit.mil import types as T
from anekit.mil.ops.linear import (
    BOOL,
    INT32,
    STRING,
    check_scalars,
    custom_pads,
    int_vector,
    kernel_offsets,
    pad_type_of,
    positive,
    ref_vector,
    resolve_pads,
    spatial_out,
    window_count,
    window_slices,
)
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op

_POOL_DOC = """
    x: T in {fp16, fp32}, [N, C, *D_in] with 1..3 spatial dims (l2_pool: 1..2). kernel_sizes: const
    int32 [S], required. strides: const int32 [S], default all 1. pad_type: const string, required:
    "valid", "same" (out = ceil(in/stride), extra padding after), "same_lower" (extra padding before)
    or "custom" (use pad). pad: const int32 [2*S], before/after per spatial dim, read only for custom.
    ceil_mode: const bool, default False: round the window count up, as PyTorch does (the last window
    is dropped when it would start in the trailing padding); not allowed with same padding.
    Output: T, [N, C, *D_out], D_out = floor((D_in + pad_before + pad_after - kernel) / stride) + 1
    (ceil instead of floor with ceil_mode)."""


class _Pool(OpDef):
    """Shared spec and type rule of the pooling ops."""

    inputs = {
        "x": Input(T.FLOATS, rank=(3, 4, 5)),
        "kernel_sizes": Input(INT32, const=True),
        "strides": Input(INT32, optional=True, const=True),
        "pad_type": Input(STRING, const=True),
        "pad": Input(INT32, optional=True, const=True),
        "ceil_mode": Input(BOOL, const=True, default=False),
    }

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        nsp = x.rank - 2
        check_scalars(a, "pad_type", "ceil_mode", "exclude_padding_from_average")
        ks = int_vector(a, "kernel_sizes", nsp, 1)
        positive(a, "kernel_sizes", ks)
        strides = int_vector(a, "strides", nsp, 1)
        positive(a, "strides", strides)
        pad_type = pad_type_of(a)
        ceil_mode = a.bool("ceil_mode")
        if ceil_mode and pad_type in ("same", "same_lower"):
            raise a.error(f"ceil_mode must be False when pad_type is '{pad_type}'")
        pad = custom_pads(a, pad_type, nsp)
        outs = spatial_out(a, x.shape[2:], ks, strides, pad_type, pad, ceil_mode)
        return T.TensorType(x.dtype, (*x.shape[:2], *outs))

    def geometry(
        self, a: RefArgs, x: np.ndarray
    ) -> tuple[list[int], list[int], list[tuple[int, int]], list[int]]:
        """Kernel, strides, explicit (before, after) pads and output sizes."""
        nsp = x.ndim - 2
        ks = list(ref_vector(a, "kernel_sizes", nsp, 1))
        strides = list(ref_vector(a, "strides", nsp, 1))
        pads = resolve_pads(a.str("pad_type").lower(), x.shape[2:], ks, strides, a.get("pad"))
        ceil_mode = a.bool("ceil_mode")
        outs = [
            window_count(d, k, s, b, e, ceil_mode) for d, k, s, (b, e) in zip(x.shape[2:], ks, strides, pads)
        ]
        return ks, strides, pads, outs


def _overhang(
    dims: Sequence[int],
    ks: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[tuple[int, int]],
    outs: Sequence[int],
) -> list[int]:
    """Extra elements past the explicit padding that ceil-mode windows reach."""
    return [
        max(0, (n - 1) * s + k - (d + b + e)) for d, k, s, (b, e), n in zip(dims, ks, strides, pads, outs)
    ]


def _pad(x: np.ndarray, widths: Sequence[tuple[int, int]], value: float) -> np.ndarray:
    if not any(b or e for b, e in widths):
        return x
    return np.pad(x, [(0, 0), (0, 0), *widths], constant_values=value)


def _window_sum(xp: np.ndarray, ks: Sequence[int], strides: Sequence[int], outs: Sequence[int]) -> np.ndarray:
    ones = [1] * len(ks)
    acc: np.ndarray | None = None
    for off in kernel_offsets(ks):
        part = xp[window_slices(off, ones, outs, strides)]
        acc = part.copy() if acc is None else acc + part
    assert acc is not None
    return acc


@register_op
class max_pool(_Pool):
    __doc__ = (
        "max_pool(x, kernel_sizes, strides?, pad_type, pad?, ceil_mode=False): maximum over each window; "
        "padding never wins (it counts as -inf)." + _POOL_DOC
    )

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        ks, strides, pads, outs = self.geometry(a, x)
        extra = _overhang(x.shape[2:], ks, strides, pads, outs)
        xp = _pad(x, [(b, e + o) for (b, e), o in zip(pads, extra)], -np.inf)
        ones = [1] * len(ks)
        acc: np.ndarray | None = None
        for off in kernel_offsets(ks):
            part = xp[window_slices(off, ones, outs, strides)]
            acc = part.copy() if acc is None else np.maximum(acc, part)
        assert acc is not None
        return acc


@register_op
class avg_pool(_Pool):
    __doc__ = (
        "avg_pool(x, kernel_sizes, strides?, pad_type, pad?, exclude_padding_from_average=False, "
        "ceil_mode=False): mean over each window. Padding holds zeros; exclude_padding_from_average "
        "(const bool) leaves padded positions out of the divisor. Window parts that ceil_mode adds past "
        "the padding are never counted." + _POOL_DOC
    )

    inputs = {**_Pool.inputs, "exclude_padding_from_average": Input(BOOL, const=True, default=False)}

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        ks, strides, pads, outs = self.geometry(a, x)
        extra = _overhang(x.shape[2:], ks, strides, pads, outs)
        widths = [(b, e + o) for (b, e), o in zip(pads, extra)]
        total = _window_sum(_pad(x, widths, 0.0), ks, strides, outs)
        ones = np.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
        if not a.bool("exclude_padding_from_average"):
            ones = _pad(ones, pads, 1.0)
            widths = [(0, o) for o in extra]
        count = _window_sum(_pad(ones, widths, 0.0), ks, strides, outs)
        with np.errstate(invalid="ignore", divide="ignore"):
            return total / count


@register_op
class l2_pool(_Pool):
    __doc__ = (
        "l2_pool(x, kernel_sizes, strides?, pad_type, pad?, ceil_mode=False): sqrt of the sum of squares "
        "over each window (padding holds zeros)." + _POOL_DOC
    )

    inputs = {**_Pool.inputs, "x": Input(T.FLOATS, rank=(3, 4))}

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        ks, strides, pads, outs = self.geometry(a, x)
        extra = _overhang(x.shape[2:], ks, strides, pads, outs)
        xp = _pad(x * x, [(b, e + o) for (b, e), o in zip(pads, extra)], 0.0)
        return np.sqrt(_window_sum(xp, ks, strides, outs))
