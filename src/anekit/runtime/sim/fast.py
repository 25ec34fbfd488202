"""Pre-bound runners for the simulator plan's frequent ops: the references' numpy calls, no per-run lookups.

Running a step the plain way (``steps.run_step``) builds a dict of input values, wraps it in ``RefArgs``,
and the op's reference then reads its constant parameters back out of it (``a.ints("perm")``,
``a.bool("transpose_x")``, ...) on every run. On a small model that bookkeeping costs more than the
arithmetic. A runner made here reads those constant parameters once, when the plan is built, and on
each run only fetches the runtime inputs from their slots and makes the reference's own numpy calls,
in the reference's order, on the same arrays:

* reshape, transpose, slice_by_size, concat (``tensor_ops``) — the same view, then the same
  ``np.array(.., copy=True)`` or ``np.concatenate``, so results have the same values AND the same memory
  layout (which decides how later matmuls and reductions accumulate); a transposed view whose source rows
  lie a multiple of 4 KiB apart is copied by ``jit.copy_transposed``'s tiled loop (the same elements
  into the same fresh C-ordered array: a copy, so the same bits);
* matmul (``linear``) — the same ``np.swapaxes`` and ``np.matmul``;
* the elementwise binary ops and the ``reduce_*`` ops — the op's own ``compute`` method, then the
  reference's dtype handling (``like(r, np.result_type(x, y))``; ``np.asarray``);
* conv with a constant pointwise weight (1x1 kernel, stride 1, no padding, one group, no bias) — the
  reference's own ``conv_nd`` call with its parameters bound (where the store rounds the result into an
  array of its own, conv_nd's one matmul written into that array); where the weight is a signed
  permutation (RoPE's pair swap), a gather that gives the product's bits (``_conv``);
* the same conv in a plan whose convs sum in order (``runtime.sim.ordered.OrderedConv``) — the ordered
  loop on the weight's transpose where the plan stores it, into a fresh C-ordered array (``_ordered_conv``).

The result goes through ``finish``: the store ``run_step`` applies to it, made by the plan. The
reference's ``np.errstate(all="ignore")`` is the plan's own while it runs (it changes warnings, never
values).

A runner is made only for an op whose reference is still the one mirrored here (an op class that
overrides it gets none), with one output, and when every parameter it pre-binds is a constant of the
plan; where a parameter's meaning depends on the input's rank or shape, the runner checks the runtime
input against the declared one and runs the step the plain way when they differ. Otherwise
``fast_runner`` returns None and the plan runs the step the plain way.
``tests/test_sim_fast_runners.py`` runs every simulator test case and every kernel both ways and
compares every stored value bit for bit, layout included.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

import numpy as np

from anekit import jit
from anekit.mil import types as T
from anekit.mil.ops.elementwise import _Binary, like
from anekit.mil.ops.linear import conv, conv_nd, matmul, window_slices
from anekit.mil.ops.reduction import _ReduceAxes
from anekit.mil.ops.tensor_ops import concat, reshape, slice_by_size, transpose
from anekit.mil.registry import OpDef
from anekit.runtime.sim.ordered import (
    OrderedConv,
    OrderedMatmul,
    ordered_batched,
    ordered_into,
    pointwise_matrix_t,
)

# Runs one step on the slot list: reads its input slots, writes its output slot.
Runner = Callable[[list[Any]], None]
# Stores one output as ``run_step`` would: (the reference's result, the op's input values) -> stored value.
Finish = Callable[[Any, tuple[Any, ...]], np.ndarray]
_F32 = np.dtype(np.float32)
copy_transposed = jit.copy_transposed  # a transposed view's copy by the tiled loop where numpy's is slow


class Binding:
    """What a binder sees of one step: input slots and types, constants, its output slot, ``finish``, and
    ``plain`` (the step run the plain way, for runtime inputs the plan was not built for)."""

    def __init__(
        self,
        args: tuple[tuple[str, Any], ...],
        in_types: dict[str, T.Type],
        constants: dict[int, np.ndarray],
        out: int,
        finish: Finish,
        plain: Runner,
        contiguous_from: int | None = None,
        rounds: bool = False,
    ) -> None:
        self.slots = dict(args)
        self.in_types = in_types
        self.constants = constants
        self.out = out
        self.finish = finish
        self.plain = plain
        # For a step that only moves values (store.VALUE_MOVING_OPS): from how many elements on ``finish``
        # stores a float32 result C-contiguous (store.moved). None for other steps.
        self.contiguous_from = contiguous_from
        # True when ``finish`` stores every result in an array of its own (the fp16 store: rounded in place
        # when the result is fresh, else into a new array), so a result's own memory never shows.
        self.rounds = rounds

    def has(self, key: str) -> bool:
        return key in self.slots

    def is_const(self, *keys: str) -> bool:
        """True when every named input that is given is a constant of the plan."""
        for key in keys:
            slot = self.slots.get(key)
            if slot is not None and not (isinstance(slot, int) and slot in self.constants):
                return False
        return True

    def value(self, key: str) -> Any:
        return self.constants[self.slots[key]]

    def others(self, *runtime: str) -> tuple[Any, ...]:
        """The constant inputs' values (all inputs but ``runtime``), for ``finish``'s input tuple."""
        return tuple(self.constants[s] for k, s in self.slots.items() if k not in runtime)

    # As ``RefArgs`` reads a parameter (omitted: False / 0, the defaults of the ops bound here).
    def ints(self, key: str) -> list[int]:
        return [int(x) for x in np.asarray(self.value(key)).ravel()]

    def bool(self, key: str) -> bool:
        return self.has(key) and bool(np.asarray(self.value(key)).item())

    def int(self, key: str) -> int:
        return int(np.asarray(self.value(key)).item())

    def rank(self, key: str) -> builtins.int | None:
        t = self.in_types.get(key)
        return len(t.shape) if isinstance(t, T.TensorType) else None

    def shape(self, key: str) -> tuple[builtins.int, ...] | None:
        t = self.in_types.get(key)
        if isinstance(t, T.TensorType) and all(isinstance(d, int) for d in t.shape):
            return tuple(int(d) for d in t.shape)
        return None


# A value-moving op's reference copies a view of its input x: ``view(env)`` gives that view, or None when
# the runtime x is not what the plan was built for (the step then runs the plain way).
View = Callable[[list[Any]], "np.ndarray | None"]


def _reshape_view(b: Binding) -> View | None:
    """``reshape.reference``'s view, for a constant shape with no 0 entry (no dim copied from x's shape)."""
    if not b.is_const("shape"):
        return None
    dims = b.ints("shape")
    if 0 in dims:
        return None
    xs = b.slots["x"]

    def view(env: list[Any]) -> np.ndarray:
        return env[xs].reshape(dims)  # np.reshape's own call for an ndarray (order "C")

    return view


def _transpose_view(b: Binding) -> View | None:
    """``transpose.reference``'s view, ``perm`` taken modulo x's declared rank."""
    rank = b.rank("x")
    if rank is None or not b.is_const("perm"):
        return None
    perm = [p % max(rank, 1) for p in b.ints("perm")]
    xs = b.slots["x"]

    def view(env: list[Any]) -> np.ndarray | None:
        x = env[xs]
        return x.transpose(perm) if x.ndim == rank else None  # np.transpose's own call for an ndarray

    return view


def _slice_by_size_view(b: Binding) -> View | None:
    """``slice_by_size.reference``'s view, for constant begin and size, its slices made for x's declared
    shape."""
    shape = b.shape("x")
    if shape is None or not b.is_const("begin", "size") or not b.has("begin") or not b.has("size"):
        return None
    idx = []
    for d, begin, size in zip(shape, b.ints("begin"), b.ints("size")):
        begin = begin + d if begin < 0 else begin
        idx.append(slice(begin, d if size == -1 else begin + size))
    index = tuple(idx)
    xs = b.slots["x"]

    def view(env: list[Any]) -> np.ndarray | None:
        x = env[xs]
        return x[index] if x.shape == shape else None

    return view


def _copied(view: Callable[[Binding], View | None]) -> Callable[[Binding], Runner | None]:
    """The runner of a value-moving op: its reference's ``np.array(view, copy=True)``, then ``finish``."""

    def bind(b: Binding) -> Runner | None:
        get = view(b)
        if get is None:
            return None
        xs, out, finish, plain, rest = b.slots["x"], b.out, b.finish, b.plain, b.others("x")

        def run(env: list[Any]) -> None:
            v = get(env)
            if v is None:
                return plain(env)
            env[out] = finish(np.array(v, copy=True), (env[xs], *rest))

        return run

    return bind


def _transpose(b: Binding) -> Runner | None:
    """``transpose.reference``, with one copy where the plain way makes two.

    For a moved float32 value of ``contiguous_from`` elements or more whose transposed view of a
    C-contiguous x is not C-contiguous, the reference's copy (``np.array(view, copy=True)``, which keeps
    the view's memory order: not C either) is copied again by ``finish`` into C order;
    ``np.array(view, order="C")`` makes that final array directly (a fresh C-ordered array of the same
    shape: same strides, same values)."""
    get = _transpose_view(b)
    if get is None:
        return None
    xs, out, finish, plain, rest = b.slots["x"], b.out, b.finish, b.plain, b.others("x")
    big = b.contiguous_from

    def run(env: list[Any]) -> None:
        view = get(env)
        if view is None:
            return plain(env)
        x = env[xs]
        if (
            big is not None
            and view.size >= big
            and x.dtype == _F32
            and type(x) is np.ndarray
            and x.flags.c_contiguous
            and not view.flags.c_contiguous
        ):
            value = np.empty(view.shape, _F32)  # np.array(view, order="C")'s array, filled by the tiled loop
            if not copy_transposed(view, value):
                value[...] = view
            env[out] = value
        else:
            env[out] = finish(np.array(view, copy=True), (x, *rest))

    return run


def _concat(b: Binding) -> Runner | None:
    """``concat.reference`` without interleave, for inputs of rank >= 1 (axis modulo the declared rank)."""
    rank, slots = b.rank("values"), b.slots.get("values")
    if not rank or not isinstance(slots, tuple) or not b.is_const("axis", "interleave") or not b.has("axis"):
        return None
    if b.bool("interleave"):
        return None
    axis = b.int("axis") % rank
    out, finish, plain, rest = b.out, b.finish, b.plain, b.others("values")

    def run(env: list[Any]) -> None:
        values = tuple(env[s] for s in slots)
        if values[0].ndim != rank:
            return plain(env)
        env[out] = finish(np.concatenate(values, axis=axis), (values, *rest))

    return run


def _matmul(b: Binding) -> Runner | None:
    """``matmul.reference`` with constant transpose flags."""
    if not b.is_const("transpose_x", "transpose_y"):
        return None
    tx, ty = b.bool("transpose_x"), b.bool("transpose_y")
    xs, ys, out, finish, rest = b.slots["x"], b.slots["y"], b.out, b.finish, b.others("x", "y")
    swapaxes, mm = np.swapaxes, np.matmul

    def run(env: list[Any]) -> None:
        x0, y0 = env[xs], env[ys]
        x = swapaxes(x0, -1, -2) if tx and x0.ndim >= 2 else x0
        y = swapaxes(y0, -1, -2) if ty and y0.ndim >= 2 else y0
        env[out] = finish(np.asarray(mm(x, y)), (x0, y0, *rest))

    return run


def _binary(b: Binding, op: _Binary) -> Runner | None:
    """``_Binary.reference``: the op's ``compute``, then the result in ``np.result_type(x, y)``."""
    if op.out_bool:
        return None
    xs, ys, out, finish = b.slots["x"], b.slots["y"], b.out, b.finish
    compute, result_type = op.compute, np.result_type

    def run(env: list[Any]) -> None:
        x, y = env[xs], env[ys]
        env[out] = finish(like(compute(x, y), result_type(x, y)), (x, y))

    return run


def _reduce(b: Binding, op: _ReduceAxes) -> Runner | None:
    """``_ReduceAxes.reference`` with constant axes (modulo x's declared rank) and keep_dims, for a float x
    (the reference's integer branch is then never taken)."""
    rank = b.rank("x")
    if not rank or not b.has("axes") or not b.is_const("axes", "keep_dims"):
        return None
    axes = tuple(int(x) % rank for x in np.asarray(b.value("axes")).ravel())
    keep = b.bool("keep_dims")
    xs, out, finish, plain, rest = b.slots["x"], b.out, b.finish, b.plain, b.others("x")
    compute = op.compute

    def run(env: list[Any]) -> None:
        x = env[xs]
        if x.ndim != rank or x.dtype.kind != "f":
            return plain(env)
        env[out] = finish(np.asarray(compute(x, axes, keep)), (x, *rest))

    return run


def _signed_permutation(w: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(rows, signs) when every row of the (C_out, C_in) matrix ``w`` holds one +-1 and zeros elsewhere."""
    if w.ndim != 2 or w.dtype != _F32 or not np.isfinite(w).all():
        return None
    if not (np.count_nonzero(w, axis=1) == 1).all():
        return None
    rows = np.argmax(np.abs(w), axis=1)
    signs = w[np.arange(w.shape[0]), rows]
    if not (np.abs(signs) == 1.0).all():
        return None
    return rows, np.ascontiguousarray(signs.reshape(1, -1, 1, 1))


def _pointwise(b: Binding) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(x's shape, the weight's shape) of a 2-d conv with a constant 1 x 1 weight, stride and dilation 1, no
    padding, one group and no bias, all known when the plan is built; else None."""
    shape, wshape = b.shape("x"), b.shape("weight")
    keys = ("weight", "strides", "dilations", "groups", "pad", "pad_type")
    if shape is None or wshape is None or len(shape) != 4 or b.has("bias") or not b.is_const(*keys):
        return None
    if wshape[2:] != (1, 1) or (b.has("groups") and b.int("groups") != 1):
        return None
    for key in ("strides", "dilations"):
        if b.has(key) and any(v != 1 for v in b.ints(key)):
            return None
    if b.has("pad") and any(b.ints("pad")):
        return None
    pad_type = str(np.asarray(b.value("pad_type")).item()).lower() if b.has("pad_type") else "valid"
    if pad_type not in ("valid", "custom"):
        return None
    return shape, wshape


def _swapped(
    x: np.ndarray, perm: tuple[np.ndarray, np.ndarray] | None, rounds: bool, shape: tuple[int, ...]
) -> np.ndarray | None:
    """The product of a signed-permutation weight (``_conv``) as a gather, for a finite float32 x; None
    when it must be computed as a product."""
    if perm is None or x.dtype != _F32 or not np.isfinite(x).all():
        return None
    n, _, h, wd = shape
    y = np.take(x, perm[0], axis=1)
    np.multiply(y, perm[1], out=y)
    np.add(y, np.float32(0.0), out=y)
    if not rounds:  # stored as it is: a view, as conv_nd's reshaped matmul result is
        y = y.reshape(n, 1, -1, h * wd).reshape(y.shape)
    return y


def _conv(b: Binding) -> Runner | None:
    """``conv.reference`` for a pointwise conv with constant parameters: ``conv_nd`` with them bound.

    When the weight is a signed permutation (each output channel is +-1 times one input channel, as the
    RoPE pair swap of the kernels: ``kernels.blocks.pair_swap_matrix``), the output channel is that input
    channel times its sign, plus 0.0. That is the product's exact value: with a finite float32 x every
    other term of the dot product is a zero, which leaves a non-zero sum unchanged, and a sum of zeros
    starting from the +0 every matmul accumulates from is +0 (the ``+ 0.0`` turns the -0 of a negated
    zero into that +0). A non-finite x (where 0 * inf is NaN) takes ``conv_nd``. (The same holds for the
    ordered sum of ``_ordered_conv``, whatever the order of the zeros.)
    """
    shapes = _pointwise(b)
    if shapes is None:
        return None
    shape, wshape = shapes
    w = b.value("weight")
    n, c_in, h, wd = shape
    c_out = wshape[0]
    pads, outs = [(0, 0), (0, 0)], [h, wd]
    xs, out, finish = b.slots["x"], b.out, b.finish
    rest = b.others("x")
    perm = _signed_permutation(np.asarray(w).reshape(wshape[:2]))
    # conv_nd's operands for one group and the one kernel offset (0, 0): the weight's (1, C_out, C_in) view
    # and the window slices, which pick every input column
    w_view = np.asarray(w).reshape(1, c_out, c_in, 1, 1)[:, :, :, 0, 0]
    window = window_slices((0, 0), (1, 1), outs, (1, 1))
    # A result the store rounds into an array of its own may be made as one: conv_nd's view of its matmul
    # result would be copied by the store (the same values and layout); one stored as it comes may not.
    rounds = b.rounds and np.asarray(w).dtype == _F32

    def run(env: list[Any]) -> None:
        x = env[xs]
        if x.shape != shape:
            return b.plain(env)
        y = _swapped(x, perm, rounds, shape)
        if y is None and rounds and x.dtype == _F32:
            # conv_nd's one matmul, written into a fresh array of the conv's shape (the layout of its
            # reshaped result): the store rounds it where it lies instead of copying it
            y = np.empty((n, c_out, h, wd), _F32)
            np.matmul(w_view, x[window].reshape(n, 1, c_in, h * wd), out=y.reshape(n, 1, c_out, h * wd))
        elif y is None:
            y = conv_nd(x, w, (1, 1), (1, 1), pads, outs, 1)
        env[out] = finish(y, (x, *rest))

    return run


def _ordered_conv(b: Binding) -> Runner | None:
    """``OrderedConv.reference`` for a pointwise conv with constant parameters (``runtime.sim.ordered``):
    the ordered sums of each batch item's (C_in, H * W) matrix, the weight's transpose read where the plan
    stores it (``transposed_layout``), written into a fresh C-ordered array of the conv's shape, as the
    reference makes; a signed-permutation weight as a gather (``_conv``: the same bits)."""
    shapes = _pointwise(b)
    if shapes is None:
        return None
    shape, wshape = shapes
    w = np.asarray(b.value("weight"))
    if w.dtype != _F32:
        return None
    n, c_in, h, wd = shape
    c_out, columns = wshape[0], h * wd
    wt = pointwise_matrix_t(w)  # (C_in, C_out) C-contiguous
    xs, out, finish = b.slots["x"], b.out, b.finish
    rest = b.others("x")
    perm = _signed_permutation(w.reshape(wshape[:2]))

    def run(env: list[Any]) -> None:
        x = env[xs]
        if x.shape != shape or x.dtype != _F32:
            return b.plain(env)
        y = _swapped(x, perm, True, shape)  # an array of its own, as the reference's
        if y is None:
            y = np.empty((n, c_out, h, wd), _F32)
            for i in range(n):
                xi = x[i].reshape(c_in, columns)
                if columns == 1:  # (1, C_out) is the output's own layout
                    ordered_into(wt, xi, y[i].reshape(1, c_out))
                else:
                    sums = np.empty((columns, c_out), _F32)
                    ordered_into(wt, xi, sums)
                    y[i].reshape(c_out, columns)[...] = sums.T
        env[out] = finish(y, (x, *rest))

    return run


def _ordered_matmul(b: Binding) -> Runner | None:
    """``OrderedMatmul.reference`` with constant transpose flags and operands of the static shapes the plan
    was built for, with one batch shape (an attention's heads): every batch item's ordered sums in one
    compiled call (``jit.ordered_batched_product``), written into a fresh C-ordered array, as the
    reference makes; anything else runs the plain way."""
    if not b.is_const("transpose_x", "transpose_y"):
        return None
    xshape, yshape = b.shape("x"), b.shape("y")
    if xshape is None or yshape is None or len(xshape) < 2 or len(yshape) < 2 or len(xshape) != len(yshape):
        return None
    tx, ty = b.bool("transpose_x"), b.bool("transpose_y")
    xm = (*xshape[:-2], xshape[-1], xshape[-2]) if tx else xshape
    ym = (*yshape[:-2], yshape[-1], yshape[-2]) if ty else yshape
    shared_y = all(d == 1 for d in ym[:-2])  # one y for every batch item (a constant: RoPE's permutation)
    if (xm[:-2] != ym[:-2] and not shared_y) or xm[-1] != ym[-2]:
        return None  # other broadcasts: the reference's way
    m, k, n = xm[-2], xm[-1], ym[-1]
    batch = xm[:-2]
    items = int(np.prod(batch, dtype=np.int64))
    xs, ys, out, finish, plain = b.slots["x"], b.slots["y"], b.out, b.finish, b.plain
    rest = b.others("x", "y")
    swapaxes = np.swapaxes
    fixed: np.ndarray | None = None  # a constant y's rows for every batch item, made once
    y_value: Any = None
    if b.is_const("y") and shared_y:
        y_value = np.asarray(b.value("y"))
        if y_value.dtype == _F32 and y_value.shape == yshape:
            y_eff = swapaxes(y_value, -1, -2) if ty else y_value
            fixed = np.ascontiguousarray(np.broadcast_to(y_eff.reshape(k, n), (items, k, n)))

    def run(env: list[Any]) -> None:
        x0, y0 = env[xs], env[ys]
        if x0.shape != xshape or y0.shape != yshape or x0.dtype != _F32 or y0.dtype != _F32:
            return plain(env)
        x = swapaxes(x0, -1, -2) if tx else x0
        y = swapaxes(y0, -1, -2) if ty else y0
        result = np.empty((*batch, m, n), _F32)
        if fixed is not None and y0 is y_value:
            rows = fixed
        elif shared_y:
            rows = np.ascontiguousarray(np.broadcast_to(y.reshape(k, n), (items, k, n)))
        else:
            rows = np.ascontiguousarray(y).reshape(-1, k, n)  # the loop's weight rows, (K, N) each
        terms = x.reshape(-1, m, k).transpose(0, 2, 1)  # (B, K, M)
        if not jit.ordered_batched_product(rows, terms, result.reshape(-1, m, n)):
            result = ordered_batched(x, y)
        env[out] = finish(result, (x0, y0, *rest))

    return run


# op name -> (the reference mirrored, binder)
_NAMED: dict[str, tuple[Callable[..., Any], Callable[[Binding], Runner | None]]] = {
    "reshape": (reshape.reference, _copied(_reshape_view)),
    "transpose": (transpose.reference, _transpose),
    "slice_by_size": (slice_by_size.reference, _copied(_slice_by_size_view)),
    "concat": (concat.reference, _concat),
    "matmul": (matmul.reference, _matmul),
    "conv": (conv.reference, _conv),
}


def fast_runner(opdef: OpDef, b: Binding) -> Runner | None:
    """A pre-bound runner for the step, or None when it must run the plain way."""
    reference = type(opdef).reference
    if type(opdef) is OrderedConv:
        return _ordered_conv(b) if reference is conv.reference else None
    if type(opdef) is OrderedMatmul:
        return _ordered_matmul(b)
    if isinstance(opdef, conv) and type(opdef).convolve is not conv.convolve:
        return None  # a conv that sums its products otherwise
    named = _NAMED.get(opdef.name)
    if named is not None:
        return named[1](b) if reference is named[0] else None
    if isinstance(opdef, _Binary) and reference is _Binary.reference:
        return _binary(b, opdef)
    if isinstance(opdef, _ReduceAxes) and reference is _ReduceAxes.reference:
        return _reduce(b, opdef)
    return None


# Value-moving ops whose view a following reshape can take over (``fused_reshape``), with the reference each
# view is that of.
_VIEWS: dict[str, tuple[Callable[..., Any], Callable[[Binding], View | None]]] = {
    "reshape": (reshape.reference, _reshape_view),
    "transpose": (transpose.reference, _transpose_view),
    "slice_by_size": (slice_by_size.reference, _slice_by_size_view),
}


def fused_reshape(
    producer: OpDef,
    p: Binding,
    consumer: OpDef,
    c: Binding,
    out_shape: tuple[int, ...],
    run_both: Runner,
) -> Runner | None:
    """One runner for a value-moving step P whose only reader is a reshape C, both storing their float32
    results as they come (``Binding.contiguous_from`` set): C's value in one copy, P's never made.

    The plain way stores P's value ``a``, a copy of P's view: ``np.array(view, copy=True)``, moved into C
    order from ``contiguous_from`` elements on; it is C-contiguous when the view is that large or is
    C-contiguous itself (numpy copies a C-contiguous array in C order). C's reference then copies
    ``np.reshape(a, dims)``, for a C-contiguous ``a`` a C-contiguous view, so again in C order: a fresh
    C-ordered array of C's shape holding the view's elements in C order. Filling a fresh C-ordered array
    of C's shape (whose reshape to the view's shape is a view of it) from the view makes that array
    directly. In every other case (a smaller view in another memory order, whose copy keeps that order
    through the reshape; a runtime input that is not what the plan was built for; an x that is not
    float32) ``run_both`` runs P then C the usual way."""
    big = p.contiguous_from
    if big is None or c.contiguous_from is None:
        return None
    views, copies = _VIEWS.get(producer.name), _NAMED.get(consumer.name)
    if views is None or type(producer).reference is not views[0]:
        return None
    if consumer.name != "reshape" or copies is None or type(consumer).reference is not copies[0]:
        return None
    get = views[1](p)
    if get is None or _reshape_view(c) is None:
        return None
    dims = c.ints("shape")
    if len(dims) != len(out_shape) or any(d not in (-1, n) for d, n in zip(dims, out_shape)):
        return None
    xs, out, size = p.slots["x"], c.out, int(np.prod(out_shape, dtype=np.int64))

    def run(env: list[Any]) -> None:
        view = get(env)
        x = env[xs]
        if (
            view is None
            or view.size != size
            or not (view.size >= big or view.flags.c_contiguous)
            or x.dtype != _F32
            or type(x) is not np.ndarray
        ):
            return run_both(env)
        value = np.empty(out_shape, _F32)
        target = value.reshape(view.shape)
        if not copy_transposed(view, target):
            target[...] = view
        env[out] = value

    return run
