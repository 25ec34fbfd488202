"""Ordered sums: a program shaped as a decode kernel sums every output of its MAC ops, softmax and
one-axis reductions in one fixed order.

The engine accumulates a MAC op's products in float32 (fp16 storage, fp32 accumulation), in an order no
public measurement gives; the simulator's ideal machine leaves the order open, and its convs and matmuls
take numpy's BLAS product, whose order of summation depends on the shape of the call
(``runtime.sim.columns``): with the OpenBLAS of numpy's wheels on x86-64, column 0 of a 1-column product (a
GEMV) differs from column 0 of the 32-column one. Numpy's own sums too: a softmax row is summed pairwise,
so 481 keys and 512 keys that end in 31 exact zeros give other bits, and the channels of a 1-column tensor
are summed pairwise where those of a wider one are summed channel after channel. A decode kernel is 32
columns wide and its caller reads one; the simulator runs it narrowed to the columns read only where that
gives the full run's bits.

So in a program shaped as a decode kernel at most ``ORDERED_WIDTH`` columns wide (``decode_width``: its
outputs end in one width W, and so does an input, or a slice reads an input's first W columns, a dynamic
kernel's activations, its weights in the columns after them; the decode width is the engine's narrowest
fp16 surface), decided by its shapes alone:

- every conv and matmul sums each output over its terms in ascending order, starting from +0, each product
  rounded to float32 and then each sum (``ordered_matmul``, ``ordered_batched``);
- softmax sums its exponentials term after term (``OrderedSoftmax``);
- reduce_sum / reduce_mean over one axis sum term after term (``OrderedReduceSum``): numpy's own bits for
  a tensor of two or more columns, now a 1-column one's too.

A column's sums are then the same whatever the number of columns, and a key a causal copy drops (masked:
an exponential of exactly 0, its product 0, added after the kept ones) changes no sum: a run narrowed to
one column gives the full run's bits (``NarrowRuns`` still measures the whole run before it trusts a
narrowing). A chip whose MAC ties round away from zero (M5) sums in the same order and rounds each
float32 sum away in the store (``engine_steps.engine_mac_step``). The products of two fp16 values are
exact in float32, so a fused multiply-add would give the same bits; the loops do not fuse them, so that
float32 operands that are not fp16 values (the fp32 precision of the order probe) get the numpy path's
bits too. A wider program (training kernels, prefill) or one whose outputs end in no input's width and
that reads no input's first W columns keeps numpy's sums, whose speed matters there and whose bits it has
always had.

The compiled loop (``anekit.jit.ordered_product``) reads the weight transposed, (K, M) C-contiguous: the
plan stores the constant weight of such a conv in that layout (its Fortran order: ``transposed_layout``),
so neither the runner nor the weight's memory is doubled. A 1-column product streams the weight once, as a
GEMV does; 32 columns cost several times the BLAS product, which only a caller reading every column pays
(benchmarks/bench_generate.py prints both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from anekit import jit
from anekit.engine.generation import DECODE_WIDTH
from anekit.mil import types as T
from anekit.mil.ir import Function, Var
from anekit.mil.ops.activation import softmax
from anekit.mil.ops.linear import conv, conv_nd, conv_operands, kernel_offsets, matmul, window_slices
from anekit.mil.ops.reduction import reduce_mean, reduce_sum
from anekit.mil.registry import OpDef, RefArgs
from anekit.runtime.sim.columns import input_widths

ORDERED_WIDTH = DECODE_WIDTH  # 32: the widest decode-shaped program whose sums are taken in order
_F32 = np.dtype(np.float32)


def decode_width(fn: Function) -> int | None:
    """The width of a program shaped as a decode kernel: every output a tensor ending in one axis W, and
    some input ending in W too (the others, a cache, end as they may) or whose first W columns a slice
    reads as one block (a kernel whose weights travel in its input's columns after its W activation
    columns: ``dynamic_activations``); None for any other program."""
    ends = set()
    for v in fn.outputs:
        shape = getattr(v.type, "shape", None)
        if not isinstance(v.type, T.TensorType) or not shape or not isinstance(shape[-1], int):
            return None
        ends.add(int(shape[-1]))
    if len(ends) != 1:
        return None
    (width,) = ends
    return width if width in input_widths(fn) or dynamic_activations(fn, width) else None


def dynamic_activations(fn: Function, width: int) -> bool:
    """Whether a slice reads a block of the first ``width`` columns of a wider input (rows of it, in any
    other axes): the activation columns of a kernel whose weights follow them in the same input."""
    inputs = {v.name: v for v in fn.inputs}
    for op in fn.ops:
        if op.op_type != "slice_by_size":
            continue
        x = op.inputs.get("x")
        if not isinstance(x, Var) or x.name not in inputs:
            continue
        (out,) = op.outputs
        shape_in, shape_out = getattr(x.type, "shape", None), getattr(out.type, "shape", None)
        if not shape_in or not shape_out or shape_out[-1] != width or shape_in[-1] == width:
            continue
        begin = op.inputs.get("begin")
        literal = begin.const if isinstance(begin, Var) else begin
        value = getattr(literal, "value", None)
        if isinstance(value, (np.ndarray, list, tuple)) and not np.asarray(value).reshape(-1)[-1:].any():
            return True
    return False


def ordered_program(fn: Function) -> bool:
    """Whether ``fn``'s MAC ops, softmax sums and one-axis reductions sum in order: it is shaped as a decode
    kernel (``decode_width``) at most ``ORDERED_WIDTH`` wide, whether it keeps its columns apart (a head
    tile, a projection) or attends over its own chunk (``SimKernel.causal``). Decided by the program's
    shapes alone, so a program's bits on a chip never depend on who runs it or whether a run is narrowed."""
    width = decode_width(fn)
    return width is not None and width <= ORDERED_WIDTH


def ordered_into(wt: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out`` (N, M) with the ordered sums of float32 ``wt`` (K, M, C-contiguous) times ``x`` (K, N):
    ``out[n, i]`` = (((+0 + wt[0, i] x[0, n]) + wt[1, i] x[1, n]) + ...), each step rounded to float32."""
    if jit.ordered_product(wt, x, out):
        return
    out[...] = 0.0
    for k in range(wt.shape[0]):  # the product of each k rounded (a float32 multiply), then the sum
        out += x[k][:, None] * wt[k][None, :]


def ordered_matmul(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The float32 product of ``w`` (M, K) and ``x`` (K, N), each output summed over k in ascending order:
    a fresh C-contiguous (M, N) array."""
    out = np.empty((x.shape[1], w.shape[0]), _F32)
    ordered_into(_c_transpose(w), x, out)
    return np.ascontiguousarray(out.T)


def ordered_conv(
    x: np.ndarray,
    w: np.ndarray,
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[tuple[int, int]],
    outs: Sequence[int],
    groups: int,
) -> np.ndarray:
    """``conv_nd`` with every product of a kernel offset summed in order (``ordered_matmul``), the offsets
    then added in ``conv_nd``'s order; float32 operands only (any other dtype takes ``conv_nd``)."""
    if x.dtype != _F32 or w.dtype != _F32:
        return conv_nd(x, w, strides, dilations, pads, outs, groups)
    n = x.shape[0]
    x, wg, npos = conv_operands(x, w, pads, outs, groups)
    y = np.empty((n, w.shape[0], *outs), _F32)  # an array of its own, C-ordered, as the fast runner makes
    acc = y.reshape(n, groups, wg.shape[1], npos)
    for i, off in enumerate(kernel_offsets(w.shape[2:])):
        xs = x[window_slices(off, dilations, outs, strides)].reshape(n, groups, wg.shape[2], npos)
        part = acc if i == 0 else np.empty_like(acc)
        for b in range(n):
            for g in range(groups):
                index: tuple[Any, ...] = (g, slice(None), slice(None), *off)
                part[b, g] = ordered_matmul(wg[index], xs[b, g])
        if i:
            np.add(acc, part, out=acc)  # conv_nd's ``acc + part``: the same sums
    return y


def ordered_batched(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``np.matmul(x, y)`` of float32 ``x`` (..., M, K) and ``y`` (..., K, N), batch axes broadcast, each
    output summed over k in ascending order from +0 (``ordered_into``, with ``y``'s rows as the loop's
    weight rows: vectorised along N): a fresh C-contiguous array. A rank-1 operand is a row (x) or a column
    (y), its added axis dropped from the result, as numpy does."""
    vx, vy = x.ndim == 1, y.ndim == 1
    x2 = x[None, :] if vx else x
    y2 = y[:, None] if vy else y
    batch = np.broadcast_shapes(x2.shape[:-2], y2.shape[:-2])
    (m, k), n = x2.shape[-2:], y2.shape[-1]
    out = np.empty((*batch, m, n), _F32)
    xs = np.broadcast_to(x2, (*batch, m, k)).reshape(-1, m, k)
    ys = np.broadcast_to(y2, (*batch, k, n)).reshape(-1, k, n)
    flat = out.reshape(-1, m, n)
    if not jit.ordered_batched_product(np.ascontiguousarray(ys), xs.transpose(0, 2, 1), flat):
        for b in range(flat.shape[0]):
            ordered_into(np.ascontiguousarray(ys[b]), xs[b].T, flat[b])
    if vx:
        out = out[..., 0, :]
    if vy:
        out = out[..., 0]
    return np.ascontiguousarray(out)


def sequential_sum(e: np.ndarray, axis: int) -> np.ndarray:
    """The sum along ``axis`` (kept) taken term after term from the first, in ascending order: the running
    sum's last value (numpy's accumulate is sequential), whatever the axis' length or layout."""
    return np.take(np.cumsum(e, axis=axis), [-1], axis=axis)


class OrderedConv(conv):
    """``conv`` whose products are summed in order (``ordered_conv``): the op a plan of an ordered program
    (``ordered_program``) binds to its conv steps. Not registered: the MIL op is still ``conv``."""

    convolve = staticmethod(ordered_conv)


class OrderedMatmul(matmul):
    """``matmul`` whose float32 products are summed in order (``ordered_batched``); other dtypes take
    numpy's product. Not registered."""

    def reference(self, a: RefArgs) -> np.ndarray:
        x, y = np.asarray(a["x"]), np.asarray(a["y"])
        if x.dtype != _F32 or y.dtype != _F32:
            return super().reference(a)
        if a.bool("transpose_x") and x.ndim >= 2:
            x = np.swapaxes(x, -1, -2)
        if a.bool("transpose_y") and y.ndim >= 2:
            y = np.swapaxes(y, -1, -2)
        return ordered_batched(x, y)


class OrderedSoftmax(softmax):
    """``softmax`` whose sum along the axis is taken in order (``sequential_sum``), so that terms of exactly
    0 appended to a row (keys a causal copy drops, ``runtime.sim.columns``) leave its bits as they are.
    Not registered."""

    axis_sum = staticmethod(sequential_sum)


def _one_axis_sum(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray | None:
    """The sequential sum of float ``x`` over its one reduced axis (``keep``: the axis kept), else None."""
    if len(axes) != 1 or x.dtype.kind != "f":
        return None
    total = sequential_sum(x, axes[0])
    return total if keep else np.squeeze(total, axis=axes[0])


class OrderedReduceSum(reduce_sum):
    """``reduce_sum`` over one axis taken in order (``sequential_sum``): numpy sums the channels of a
    tensor of two or more columns channel after channel, which is these bits, and those of a 1-column one
    pairwise, which is not; so a norm's sum of one column is its sum in a wider run. Several axes, or an
    integer tensor: numpy's. Not registered."""

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        total = _one_axis_sum(x, axes, keep)
        return super().compute(x, axes, keep) if total is None else total


class OrderedReduceMean(reduce_mean):
    """``reduce_mean`` as ``OrderedReduceSum``'s sum divided by the count, as numpy's mean divides its sum.
    Not registered."""

    def compute(self, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        total = _one_axis_sum(x, axes, keep)
        return super().compute(x, axes, keep) if total is None else total / x.shape[axes[0]]


ORDERED_CONV = OrderedConv()
# the op each MIL op of an ordered plan is bound to (``Plan``)
ORDERED_OPS: dict[str, OpDef] = {
    "conv": ORDERED_CONV,
    "matmul": OrderedMatmul(),
    "softmax": OrderedSoftmax(),
    "reduce_sum": OrderedReduceSum(),
    "reduce_mean": OrderedReduceMean(),
}


def transposed_layout(weight: Any) -> Any:
    """A pointwise conv's constant float32 weight (C_out, C_in, 1 ...) in Fortran order along its first two
    axes (the same values: its (C_in, C_out) transpose C-contiguous underneath), which the ordered loop
    reads without a copy; any other value as it is."""
    if not isinstance(weight, np.ndarray) or weight.dtype != _F32 or weight.ndim < 3:
        return weight
    if any(k != 1 for k in weight.shape[2:]) or not weight.flags.c_contiguous:
        return weight
    c_out, c_in = weight.shape[:2]
    if c_out == 1 or c_in == 1:
        return weight  # a vector: the same memory either way
    wt = np.ascontiguousarray(weight.reshape(c_out, c_in).T)
    return wt.T.reshape(weight.shape)


def pointwise_matrix_t(weight: np.ndarray) -> np.ndarray:
    """The (C_in, C_out) C-contiguous transpose of a pointwise weight: a view when it is stored as
    ``transposed_layout`` makes it, else a copy."""
    return _c_transpose(weight.reshape(weight.shape[0], weight.shape[1]))


def _c_transpose(matrix: np.ndarray) -> np.ndarray:
    """A 2-d array's transpose, C-contiguous: a view where it already is, else a copy."""
    t = matrix.T
    return t if t.flags.c_contiguous else np.ascontiguousarray(t)
