"""Tensor shape and data-movement ops: reshape, transpose, concat, split, slicing, gather, pad, shuffles."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from anekit.mil import types as T
from anekit.mil.ops._util import norm_axes, norm_axis
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op

# Element types accepted by the data-movement ops: the union of coremltools' iOS15 (fp16, fp32, int32,
# bool) and iOS17 (adds int8, uint8, int16, uint16) domains.
DATA_T = frozenset({"fp16", "fp32", "int8", "uint8", "int16", "uint16", "int32", "bool"})
# Shape-like integer inputs (shape, begin, end, size, reps, pad): iOS17's ``U`` domain.
SHAPE_INT_T = frozenset({"int8", "int16", "int32"})
# Gather indices: iOS16+ ``I`` domain (int16, uint16, int32) plus the 8-bit integers.
INDEX_T = frozenset({"int8", "uint8", "int16", "uint16", "int32"})
INT32 = "int32"
BOOL = "bool"
STRING = "string"

UNKNOWN: T.Dim = "?"


# -- helpers -----------------------------------------------------------------------------------------


def _opt_ints(a: InferArgs, name: str) -> tuple[int, ...] | None:
    """The values of an integer vector input when it is a known constant, else None."""
    if not a.has(name):
        return None
    v = a.value(name)
    if v is None:
        return None
    return tuple(int(x) for x in np.asarray(v).ravel())


def _opt_bools(a: InferArgs, name: str, rank: int) -> tuple[bool, ...]:
    """A const bool mask input of length ``rank``; all False when omitted."""
    if not a.has(name):
        return (False,) * rank
    vals = tuple(bool(x) for x in np.asarray(a.const(name)).ravel())
    if len(vals) != rank:
        raise a.error(f"'{name}' has {len(vals)} entries; expected one per dimension of x ({rank})")
    return vals


def _vector_len(a: InferArgs, name: str, rank: int) -> None:
    """Check that a rank-1 input has ``rank`` entries when its length is static."""
    t = a.tensor(name)
    if t.rank != 1:
        raise a.error(f"'{name}' must be a 1-D tensor, got rank {t.rank}")
    n = t.shape[0]
    if isinstance(n, int) and n != rank:
        raise a.error(f"'{name}' has {n} entries; expected one per dimension of x ({rank})")


def _mul(d: T.Dim, k: int) -> T.Dim:
    if isinstance(d, int):
        return d * k
    return d if k == 1 else UNKNOWN


def _prod(dims: Sequence[T.Dim]) -> T.Dim:
    """Product of dims: an int when all are static, the symbol when it is the only non-1 dim, else '?'."""
    syms = [d for d in dims if not isinstance(d, int)]
    if not syms:
        n = 1
        for d in dims:
            n *= int(d)
        return n
    if len(syms) == 1 and syms[0] != UNKNOWN and all(d == 1 for d in dims if isinstance(d, int)):
        return syms[0]
    return UNKNOWN


def _split_dims(dims: Sequence[T.Dim]) -> tuple[int, Counter[str], bool]:
    """(static product, multiset of symbols, has an unknown '?' dim)."""
    n = 1
    syms: Counter[str] = Counter()
    unknown = False
    for d in dims:
        if isinstance(d, int):
            n *= d
        elif d == UNKNOWN:
            unknown = True
        else:
            syms[d] += 1
    return n, syms, unknown


def _copy(x: Any) -> np.ndarray:
    return np.array(x, copy=True)


def _check_rank(a: InferArgs, t: T.TensorType, rank: int, what: str = "x") -> None:
    if t.rank != rank:
        raise a.error(f"'{what}' must have rank {rank}, got rank {t.rank} (shape {list(t.shape)})")


def _positive(a: InferArgs, name: str) -> int:
    v = a.int(name)
    if v < 1:
        raise a.error(f"'{name}' must be a positive integer, got {v}")
    return v


# -- reshape / transpose / expand / squeeze ----------------------------------------------------------


def _fill_zeros(target: Sequence[Any], xshape: Sequence[Any]) -> list[Any]:
    """iOS17 rule: each 0 in ``target`` copies the x dim aligned from the right (1 when there is none)."""
    out = list(target)
    k, r = len(out), len(xshape)
    for j in range(k):
        if out[j] == 0:
            src = r - (k - j)
            out[j] = xshape[src] if src >= 0 else 1
    return out


@register_op
class reshape(OpDef):
    """reshape(x, shape): the values of ``x`` in row-major order, with shape ``shape``.

    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}, any rank (scalar allowed).
    shape: tensor<U, [K]>, U in {int8, int16, int32}; need not be constant (a non-constant shape of
    static length K gives K unknown dims). Entries:
      * positive: that size;
      * -1 (at most one): inferred so the element count is unchanged;
      * 0: copies the dimension of ``x`` aligned from the right (``shape[i]`` pairs with
        ``x.shape[j]`` when ``K - i == rank(x) - j``); a 0 with no aligned x dim becomes 1.
        This is the iOS17 rule; it agrees with iOS15/16 (where 0 copies ``x.shape[i]`` and requires
        ``K == rank(x)``) on every program iOS15/16 accept.
    Output: tensor<T, shape> with the same element count as ``x``.
    """

    inputs = {"x": Input(DATA_T), "shape": Input(SHAPE_INT_T, rank=1)}

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        k = a.tensor("shape").shape[0]
        target = _opt_ints(a, "shape")
        if target is None:
            if not isinstance(k, int):
                raise a.error("'shape' is not constant and has an unknown length: the output rank is unknown")
            return T.TensorType(x.dtype, (UNKNOWN,) * k)
        if target.count(-1) > 1:
            raise a.error(f"shape {list(target)} has more than one -1")
        bad = [d for d in target if d < -1]
        if bad:
            raise a.error(f"shape {list(target)} has negative entries other than -1: {bad}")
        dims: list[T.Dim] = _fill_zeros(target, x.shape)
        xn, xsyms, xunk = _split_dims(x.shape)
        if -1 in dims:
            i = dims.index(-1)
            rest = dims[:i] + dims[i + 1 :]
            rn, rsyms, runk = _split_dims(rest)
            if xunk or runk:
                dims[i] = UNKNOWN
            elif rsyms == xsyms:
                if rn == 0 or xn % rn:
                    raise a.error(
                        f"cannot reshape x of shape {list(x.shape)} to {list(target)}: "
                        f"{xn} elements do not divide into groups of {rn}"
                    )
                dims[i] = xn // rn
            else:
                extra = xsyms - rsyms
                if sum(extra.values()) == 1 and not (rsyms - xsyms) and rn == xn:
                    dims[i] = next(iter(extra))
                else:
                    dims[i] = UNKNOWN
        else:
            rn, rsyms, runk = _split_dims(dims)
            if not (xunk or runk) and rsyms == xsyms and rn != xn:
                raise a.error(
                    f"cannot reshape x of shape {list(x.shape)} to {list(target)}: element counts differ"
                )
        return T.TensorType(x.dtype, tuple(dims))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        dims = _fill_zeros([int(v) for v in np.asarray(a["shape"]).ravel()], x.shape)
        return _copy(np.reshape(x, dims))


@register_op
class transpose(OpDef):
    """transpose(x, perm): permute the dimensions of ``x``: ``out.shape[i] = x.shape[perm[i]]``.

    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}.
    perm: const tensor<int32, [rank(x)]>, a permutation of the axes (negative entries count from the end).
    """

    inputs = {"x": Input(DATA_T), "perm": Input(INT32, rank=1, const=True)}

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        perm = a.ints("perm")
        if len(perm) != x.rank:
            raise a.error(f"perm {list(perm)} has {len(perm)} entries; x has rank {x.rank}")
        p = norm_axes(a, perm, x.rank, "perm")
        return T.TensorType(x.dtype, tuple(x.shape[i] for i in p))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        return _copy(np.transpose(x, [p % max(x.ndim, 1) for p in a.ints("perm")]))


@register_op
class expand_dims(OpDef):
    """expand_dims(x, axes): insert size-1 dimensions at ``axes`` (positions in the output).

    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}, scalar or tensor.
    axes: const tensor<int32, [K]>; each in ``[-(rank(x)+K), rank(x)+K)``, no repeats. Negative axes
    count from the end of the output. Output rank ``rank(x) + K``.
    """

    inputs = {"x": Input(DATA_T), "axes": Input(INT32, rank=(0, 1), const=True)}

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        axes = a.ints("axes")
        if not axes:
            raise a.error("'axes' must name at least one axis")
        out_rank = x.rank + len(axes)
        ax = sorted(norm_axes(a, axes, out_rank))
        shape = list(x.shape)
        for i in ax:
            shape.insert(i, 1)
        return T.TensorType(x.dtype, tuple(shape))

    def reference(self, a: RefArgs) -> np.ndarray:
        return _copy(np.expand_dims(np.asarray(a["x"]), tuple(a.ints("axes"))))


@register_op
class squeeze(OpDef):
    """squeeze(x, axes?): remove size-1 dimensions.

    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}, rank >= 1.
    axes: const tensor<int32, [K]> (optional): the axes to remove; each must have size 1 (symbolic
    dims are assumed to be 1). When omitted, every static size-1 dim is removed (symbolic dims are
    assumed not to be 1). Removing every dim gives a scalar.
    """

    inputs = {"x": Input(DATA_T), "axes": Input(INT32, rank=(0, 1), const=True, optional=True)}

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        if x.rank == 0:
            raise a.error("x must have rank >= 1")
        if not a.has("axes"):
            return T.TensorType(x.dtype, tuple(d for d in x.shape if d != 1))
        ax = norm_axes(a, a.ints("axes"), x.rank)
        for i in ax:
            if isinstance(x.shape[i], int) and x.shape[i] != 1:
                raise a.error(f"cannot squeeze axis {i}: it has size {x.shape[i]}, not 1")
        return T.TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in ax))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        if a.has("axes") and a["axes"] is not None:
            return _copy(np.squeeze(x, axis=tuple(v % x.ndim for v in a.ints("axes"))))
        return _copy(np.squeeze(x))


@register_op
class flatten2d(OpDef):
    """flatten2d(x, axis=1): reshape to ``[prod(x.shape[:axis]), prod(x.shape[axis:])]``.

    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}, rank >= 1.
    axis: const int32 in ``[-rank, rank]`` (negative adds rank). Examples: shape (3,) axis -1 ->
    (1, 3); axis 1 -> (3, 1); (2, 3, 2) axis -1 -> (6, 2).
    """

    inputs = {"x": Input(DATA_T), "axis": Input(INT32, rank=0, const=True, default=1)}

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        if x.rank == 0:
            raise a.error("x must have rank >= 1")
        axis = a.int("axis")
        if not -x.rank <= axis <= x.rank:
            raise a.error(f"axis {axis} is out of range for rank {x.rank} (expected {-x.rank}..{x.rank})")
        axis = axis + x.rank if axis < 0 else axis
        return T.TensorType(x.dtype, (_prod(x.shape[:axis]), _prod(x.shape[axis:])))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        axis = a.int("axis")
        axis = axis + x.ndim if axis < 0 else axis
        pre = int(np.prod(x.shape[:axis], dtype=np.int64))
        post = int(np.prod(x.shape[axis:], dtype=np.int64))
        return _copy(x.reshape(pre, post))


# -- concat / split / stack ---------------------------------------------------------------------------


@register_op
class concat(OpDef):
    """concat(values, axis, interleave=False): join tensors along ``axis``.

    values: tuple of tensors sharing one dtype T in {fp16, fp32, int8, uint8, int16, uint16, int32,
    bool} and one rank; every dim except ``axis`` must match.
    axis: const int32 in ``[-rank, rank)``.
    interleave: const bool. False: the inputs follow one another (``out[0:d0] = values[0]``, ...).
    True: all inputs must have the same shape and are interleaved one slice at a time:
    ``out[..., i*N + k, ...] = values[k][..., i, ...]`` for N inputs (e.g. two (3, 2) inputs on
    axis 0 give rows in1[0], in2[0], in1[1], in2[1], in1[2], in2[2]).
    Scalars (rank 0) are stacked into a vector of length N.
    Output dim along axis: the sum of the inputs' dims ('?' if any is unknown).
    """

    inputs = {
        "values": Input(DATA_T, variadic=True),
        "axis": Input(INT32, rank=0, const=True),
        "interleave": Input(BOOL, rank=0, const=True, default=False),
    }
    same_dtype = ("values",)

    def infer(self, a: InferArgs) -> T.Type:
        ts = a.types("values")
        rank = ts[0].rank
        for t in ts[1:]:
            if t.rank != rank:
                raise a.error(f"values must share one rank, got shapes {[list(v.shape) for v in ts]}")
        if rank == 0:
            return T.TensorType(ts[0].dtype, (len(ts),))
        axis = norm_axis(a, a.int("axis"), rank)
        interleave = a.bool("interleave")
        out = list(ts[0].shape)
        for t in ts[1:]:
            for i in range(rank):
                d0, d1 = out[i], t.shape[i]
                if i == axis and not interleave:
                    continue
                if isinstance(d0, int) and isinstance(d1, int) and d0 != d1:
                    what = (
                        "with interleave=True all inputs must have the same shape"
                        if interleave
                        else (f"dims other than axis {axis} must match")
                    )
                    raise a.error(f"{what}; got shapes {[list(v.shape) for v in ts]}")
                if not isinstance(d0, int) and isinstance(d1, int):
                    out[i] = d1
        dims = [t.shape[axis] for t in ts]
        if all(isinstance(d, int) for d in dims):
            out[axis] = sum(int(d) for d in dims)
        elif interleave and isinstance(out[axis], int):
            out[axis] = out[axis] * len(ts)
        else:
            out[axis] = UNKNOWN
        return T.TensorType(ts[0].dtype, tuple(out))

    def reference(self, a: RefArgs) -> np.ndarray:
        vals = [np.asarray(v) for v in (a["values"] if isinstance(a["values"], tuple) else (a["values"],))]
        if vals[0].ndim == 0:
            return np.stack(vals)
        axis = a.int("axis") % vals[0].ndim
        if a.bool("interleave"):
            stacked = np.stack(vals, axis=axis + 1)
            shape = list(vals[0].shape)
            shape[axis] *= len(vals)
            return stacked.reshape(shape)
        return np.concatenate(vals, axis=axis)


@register_op
class split(OpDef):
    """split(x, num_splits?, split_sizes?, axis): cut ``x`` along ``axis`` into several outputs.

    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}.
    num_splits: const int32: N equal parts (``x.shape[axis]`` must divide by N) when ``split_sizes``
    is omitted; if both are given, ``len(split_sizes) == num_splits``.
    split_sizes: const tensor<int32, [S]>: the sizes (>= 0) of the parts; they must sum to
    ``x.shape[axis]``. At least one of num_splits / split_sizes is required.
    axis: const int32 in ``[-rank, rank)``.
    Outputs: one tensor<T> per part, equal to ``x`` except along axis.
    """

    inputs = {
        "x": Input(DATA_T),
        "num_splits": Input(INT32, rank=0, const=True, optional=True),
        "split_sizes": Input(INT32, rank=(0, 1), const=True, optional=True),
        "axis": Input(INT32, rank=0, const=True),
    }

    def _sizes(self, a: InferArgs, dim: T.Dim) -> list[T.Dim]:
        has_n, has_s = a.has("num_splits"), a.has("split_sizes")
        if not has_n and not has_s:
            raise a.error("one of 'num_splits' or 'split_sizes' is required")
        if has_s:
            sizes = list(a.ints("split_sizes"))
            if not sizes:
                raise a.error("'split_sizes' is empty")
            if any(s < 0 for s in sizes):
                raise a.error(f"split_sizes {sizes} has negative entries")
            if has_n and a.int("num_splits") != len(sizes):
                raise a.error(f"num_splits {a.int('num_splits')} != len(split_sizes) {len(sizes)}")
            if isinstance(dim, int) and sum(sizes) != dim:
                raise a.error(f"split_sizes {sizes} sum to {sum(sizes)}, but the split dim has size {dim}")
            return list(sizes)
        n = a.int("num_splits")
        if n < 1:
            raise a.error(f"num_splits must be >= 1, got {n}")
        if isinstance(dim, int):
            if dim % n:
                raise a.error(f"num_splits {n} does not divide the split dim (size {dim})")
            return [dim // n] * n
        return [dim if n == 1 else UNKNOWN] * n

    def infer(self, a: InferArgs) -> tuple[T.Type, ...]:
        x = a.tensor("x")
        axis = norm_axis(a, a.int("axis"), x.rank)
        outs = []
        for s in self._sizes(a, x.shape[axis]):
            shape = list(x.shape)
            shape[axis] = s
            outs.append(T.TensorType(x.dtype, tuple(shape)))
        return tuple(outs)

    def reference(self, a: RefArgs) -> tuple[np.ndarray, ...]:
        x = np.asarray(a["x"])
        axis = a.int("axis") % x.ndim
        if a.get("split_sizes") is not None:
            sizes = a.ints("split_sizes")
        else:
            n = a.int("num_splits")
            sizes = (x.shape[axis] // n,) * n
        cuts = np.cumsum(sizes)[:-1]
        return tuple(_copy(p) for p in np.split(x, cuts, axis=axis))


@register_op
class stack(OpDef):
    """stack(values, axis): stack same-shape tensors along a new dimension ``axis``.

    values: tuple of tensors of one dtype T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}
    and one shape. axis: const int32 in ``[-(rank+1), rank]`` (position of the new dim in the output).
    Output: rank + 1, with ``len(values)`` at ``axis``.
    """

    inputs = {"values": Input(DATA_T, variadic=True), "axis": Input(INT32, rank=0, const=True)}
    same_dtype = ("values",)

    def infer(self, a: InferArgs) -> T.Type:
        ts = a.types("values")
        shape = list(ts[0].shape)
        for t in ts[1:]:
            if t.rank != len(shape):
                raise a.error(f"values must share one shape, got {[list(v.shape) for v in ts]}")
            for i, d in enumerate(t.shape):
                if isinstance(d, int) and isinstance(shape[i], int) and d != shape[i]:
                    raise a.error(f"values must share one shape, got {[list(v.shape) for v in ts]}")
                if isinstance(d, int):
                    shape[i] = d
        axis = norm_axis(a, a.int("axis"), len(shape) + 1)
        shape.insert(axis, len(ts))
        return T.TensorType(ts[0].dtype, tuple(shape))

    def reference(self, a: RefArgs) -> np.ndarray:
        vals = [np.asarray(v) for v in (a["values"] if isinstance(a["values"], tuple) else (a["values"],))]
        return np.stack(vals, axis=a.int("axis") % (vals[0].ndim + 1))


# -- slicing ------------------------------------------------------------------------------------------


@register_op
class slice_by_size(OpDef):
    """slice_by_size(x, begin, size): ``x[begin[i] : begin[i] + size[i]]`` on every dimension.

    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}.
    begin, size: tensor<U, [rank(x)]>, U in {int8, int16, int32}; they need not be constant (unknown
    values give '?' dims). A negative begin counts from the end. ``size[i] == -1`` takes everything
    from ``begin[i]`` to the end. The slice must lie inside ``x``.
    """

    inputs = {"x": Input(DATA_T), "begin": Input(SHAPE_INT_T, rank=1), "size": Input(SHAPE_INT_T, rank=1)}

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        _vector_len(a, "begin", x.rank)
        _vector_len(a, "size", x.rank)
        begin = _opt_ints(a, "begin")
        size = _opt_ints(a, "size")
        for name, vals in (("begin", begin), ("size", size)):
            if vals is not None and len(vals) != x.rank:
                raise a.error(f"'{name}' has {len(vals)} entries; expected {x.rank}")
        out: list[T.Dim] = []
        for i, d in enumerate(x.shape):
            s = None if size is None else size[i]
            b = None if begin is None else begin[i]
            if s is not None and s < -1:
                raise a.error(f"size[{i}] = {s} is invalid (sizes are >= 0, or -1 for 'to the end')")
            if b is not None and isinstance(d, int):
                bn = b + d if b < 0 else b
                if not 0 <= bn <= d:
                    raise a.error(f"begin[{i}] = {b} is out of range for dim {i} of size {d}")
                if s is not None and s != -1 and bn + s > d:
                    raise a.error(f"slice {bn}:{bn + s} on dim {i} exceeds its size {d}")
            if s is not None and s != -1:
                out.append(s)
            elif s is None or b is None:
                out.append(UNKNOWN)
            elif isinstance(d, int):
                out.append(d - (b + d if b < 0 else b))
            else:
                out.append(d if b == 0 else UNKNOWN)
        return T.TensorType(x.dtype, tuple(out))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        idx = []
        for d, b, s in zip(x.shape, a.ints("begin"), a.ints("size")):
            b = b + d if b < 0 else b
            idx.append(slice(b, d if s == -1 else b + s))
        return _copy(x[tuple(idx)])


@register_op
class slice_by_index(OpDef):
    """slice_by_index(x, begin, end, stride?, begin_mask?, end_mask?, squeeze_mask?): numpy slicing.

    ``out = x[begin[0]:end[0]:stride[0], begin[1]:end[1]:stride[1], ...]`` with Python/numpy slice
    semantics (negative indices count from the end; out-of-range bounds are clamped).
    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}.
    begin, end: tensor<U, [rank(x)]>, U in {int8, int16, int32}; need not be constant.
    stride: const tensor<U, [rank(x)]> (optional, default all 1; no zeros).
    begin_mask[i] (const bool, default False): ignore begin[i] (slice from the start; from the end
    for a negative stride). end_mask[i]: ignore end[i] (slice to the end).
    squeeze_mask[i]: take the single element at begin[i] and drop dim i (index 0 when begin_mask[i]
    is also set, -1 for a negative stride); squeezing every dim gives a scalar.
    """

    inputs = {
        "x": Input(DATA_T),
        "begin": Input(SHAPE_INT_T, rank=1),
        "end": Input(SHAPE_INT_T, rank=1),
        "stride": Input(SHAPE_INT_T, rank=1, const=True, optional=True),
        "begin_mask": Input(BOOL, rank=1, const=True, optional=True),
        "end_mask": Input(BOOL, rank=1, const=True, optional=True),
        "squeeze_mask": Input(BOOL, rank=1, const=True, optional=True),
    }

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        r = x.rank
        _vector_len(a, "begin", r)
        _vector_len(a, "end", r)
        begin = _opt_ints(a, "begin")
        end = _opt_ints(a, "end")
        stride = _opt_ints(a, "stride") if a.has("stride") else (1,) * r
        for name, vals in (("begin", begin), ("end", end), ("stride", stride)):
            if vals is not None and len(vals) != r:
                raise a.error(f"'{name}' has {len(vals)} entries; expected one per dimension of x ({r})")
        assert stride is not None
        if 0 in stride:
            raise a.error(f"stride {list(stride)} has a zero entry")
        bm = _opt_bools(a, "begin_mask", r)
        em = _opt_bools(a, "end_mask", r)
        sm = _opt_bools(a, "squeeze_mask", r)
        out: list[T.Dim] = []
        for i, d in enumerate(x.shape):
            st = stride[i]
            if sm[i]:
                if begin is not None and not bm[i] and isinstance(d, int) and not -d <= begin[i] < d:
                    raise a.error(f"squeeze index begin[{i}] = {begin[i]} is out of range for size {d}")
                continue
            b = None if bm[i] else (UNKNOWN if begin is None else begin[i])
            e = None if em[i] else (UNKNOWN if end is None else end[i])
            if UNKNOWN in (b, e):
                out.append(UNKNOWN)
            elif isinstance(d, int):
                out.append(len(range(*slice(b, e, st).indices(d))))
            elif b is None and e is None and abs(st) == 1:
                out.append(d)
            else:
                out.append(UNKNOWN)
        return T.TensorType(x.dtype, tuple(out))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        r = x.ndim
        begin, end = a.ints("begin"), a.ints("end")
        stride = a.ints("stride") if a.get("stride") is not None else (1,) * r

        def mask(name: str) -> tuple[bool, ...]:
            v = a.get(name)
            return (False,) * r if v is None else tuple(bool(m) for m in np.asarray(v).ravel())

        bm, em, sm = mask("begin_mask"), mask("end_mask"), mask("squeeze_mask")
        idx: list[Any] = []
        for i in range(r):
            if sm[i]:
                idx.append((0 if stride[i] > 0 else -1) if bm[i] else begin[i])
            else:
                idx.append(slice(None if bm[i] else begin[i], None if em[i] else end[i], stride[i]))
        return _copy(x[tuple(idx)])


@register_op
class crop(OpDef):
    """crop(x, crop_height, crop_width): remove rows/columns from the last two dims.

    x: tensor<T, [*D, H, W]>, T in {fp16, fp32}, rank >= 3.
    crop_height: const tensor<int32, [2]>: (top, bottom) amounts; crop_width: (left, right).
    Output ``[*D, H - top - bottom, W - left - right]``; amounts are >= 0 and must leave >= 1 element.
    """

    inputs = {
        "x": Input(T.FLOATS),
        "crop_height": Input(INT32, rank=1, const=True),
        "crop_width": Input(INT32, rank=1, const=True),
    }

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        if x.rank < 3:
            raise a.error(f"x must have rank >= 3, got rank {x.rank}")
        shape = list(x.shape)
        for name, ax in (("crop_height", -2), ("crop_width", -1)):
            c = a.ints(name)
            if len(c) != 2:
                raise a.error(f"'{name}' must have 2 entries, got {len(c)}")
            if min(c) < 0:
                raise a.error(f"'{name}' {list(c)} has negative entries")
            d = shape[ax]
            if isinstance(d, int):
                if d - sum(c) < 1:
                    raise a.error(f"'{name}' {list(c)} removes all of the dim of size {d}")
                shape[ax] = d - sum(c)
            elif sum(c):
                shape[ax] = UNKNOWN
        return T.TensorType(x.dtype, tuple(shape))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        t, b = a.ints("crop_height")
        left, right = a.ints("crop_width")
        h, w = x.shape[-2:]
        return _copy(x[..., t : h - b, left : w - right])


# -- tile / reverse / pad ----------------------------------------------------------------------------


@register_op
class tile(OpDef):
    """tile(x, reps): repeat ``x`` ``reps[i]`` times along each dim i (numpy.tile).

    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}, rank >= 1.
    reps: tensor<int32, [rank(x)]>, entries >= 1; need not be constant (unknown reps give '?' dims).
    """

    inputs = {"x": Input(DATA_T), "reps": Input(SHAPE_INT_T, rank=1)}

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        if x.rank == 0:
            raise a.error("x must have rank >= 1")
        _vector_len(a, "reps", x.rank)
        reps = _opt_ints(a, "reps")
        if reps is None:
            return T.TensorType(x.dtype, (UNKNOWN,) * x.rank)
        if len(reps) != x.rank:
            raise a.error(f"reps {list(reps)} has {len(reps)} entries; x has rank {x.rank}")
        if min(reps) < 1:
            raise a.error(f"reps {list(reps)} must all be >= 1")
        return T.TensorType(x.dtype, tuple(_mul(d, r) for d, r in zip(x.shape, reps)))

    def reference(self, a: RefArgs) -> np.ndarray:
        return np.tile(np.asarray(a["x"]), a.ints("reps"))


@register_op
class reverse(OpDef):
    """reverse(x, axes?): flip ``x`` along ``axes`` (all dims when omitted).

    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}.
    axes: const tensor<int32, [K]> (optional), each in ``[-rank, rank)``, no repeats.
    """

    inputs = {"x": Input(DATA_T), "axes": Input(INT32, rank=(0, 1), const=True, optional=True)}

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        if a.has("axes"):
            norm_axes(a, a.ints("axes"), x.rank)
        return x

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        if a.get("axes") is None:
            return _copy(np.flip(x))
        return _copy(np.flip(x, axis=tuple(v % x.ndim for v in a.ints("axes"))))


# MIL's pad modes and numpy's names for them.
_PAD_MODES: dict[str, Literal["constant", "reflect", "edge"]] = {
    "constant": "constant",
    "reflect": "reflect",
    "replicate": "edge",
}


@register_op
class pad(OpDef):
    """pad(x, pad, mode="constant", constant_val=0): pad the last N dims of ``x``.

    x: T in {fp16, fp32}.
    pad: tensor<int32, [2N]>, N <= rank(x), entries >= 0: ``pad[2k]`` elements before and
    ``pad[2k+1]`` after dim ``rank - N + k``. A non-constant pad must have 2 * rank(x) entries (its
    padded dims are then unknown).
    mode: const string: "constant" (fill with constant_val), "reflect" (mirror without repeating the
    edge; pads <= dim - 1) or "replicate" (repeat the edge value; pads <= dim).
    constant_val: const T (same dtype as x), used by "constant" mode.
    """

    inputs = {
        "x": Input(T.FLOATS),
        "pad": Input(SHAPE_INT_T, rank=1),
        "mode": Input(STRING, rank=0, const=True, default="constant"),
        "constant_val": Input(T.FLOATS, rank=0, const=True, default=0.0),
    }
    same_dtype = ("x", "constant_val")

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        mode = a.str("mode")
        if mode not in _PAD_MODES:
            raise a.error(f"mode '{mode}' is not one of {', '.join(_PAD_MODES)}")
        pads = _opt_ints(a, "pad")
        n = a.tensor("pad").shape[0]
        if pads is None:
            if n != 2 * x.rank:
                raise a.error(f"a non-constant 'pad' must have 2 * rank(x) = {2 * x.rank} entries, got {n}")
            return T.TensorType(x.dtype, (UNKNOWN,) * x.rank)
        if len(pads) % 2:
            raise a.error(f"pad {list(pads)} must have an even number of entries")
        if len(pads) // 2 > x.rank:
            raise a.error(f"pad {list(pads)} pads {len(pads) // 2} dims, but x has rank {x.rank}")
        if pads and min(pads) < 0:
            raise a.error(f"pad {list(pads)} has negative entries")
        shape = list(x.shape)
        first = x.rank - len(pads) // 2
        for k in range(len(pads) // 2):
            i = first + k
            before, after = pads[2 * k], pads[2 * k + 1]
            d = shape[i]
            if isinstance(d, int):
                limit = d - 1 if mode == "reflect" else d if mode == "replicate" else None
                if limit is not None and max(before, after) > limit:
                    raise a.error(f"{mode} pad ({before}, {after}) on dim {i} of size {d} exceeds {limit}")
                shape[i] = d + before + after
            elif before or after:
                shape[i] = UNKNOWN
        return T.TensorType(x.dtype, tuple(shape))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        pads = a.ints("pad")
        n = len(pads) // 2
        width = [(0, 0)] * (x.ndim - n) + [(pads[2 * k], pads[2 * k + 1]) for k in range(n)]
        mode = _PAD_MODES[a.str("mode")]
        if mode == "constant":
            return np.pad(x, width, mode="constant", constant_values=np.asarray(a["constant_val"]).item())
        return np.pad(x, width, mode=mode)


# -- gather ------------------------------------------------------------------------------------------


def _check_index_bounds(a: InferArgs, dim: T.Dim) -> None:
    """With validate_indices=True and constant indices, reject indices outside [0, dim)."""
    if not a.bool("validate_indices"):
        return
    idx = a.value("indices")
    if idx is None or not isinstance(dim, int):
        return
    idx = np.asarray(idx)
    if idx.size and (idx.min() < 0 or idx.max() >= dim):
        raise a.error(f"indices must lie in [0, {dim}) with validate_indices=True")


def _wrap(idx: np.ndarray, dim: int) -> np.ndarray:
    idx = np.asarray(idx).astype(np.int64)
    return np.where(idx < 0, idx + dim, idx)


@register_op
class gather(OpDef):
    """gather(x, indices, axis=0, batch_dims=0, validate_indices=False): take slices along ``axis``.

    ``out[p..., i..., q...] = x[p..., indices[b..., i...], q...]`` (tf.gather): the output shape is
    ``x.shape[:axis] + indices.shape[batch_dims:] + x.shape[axis+1:]``; the first ``batch_dims`` dims
    of x and indices are batch dims walked together (requires ``batch_dims <= axis``).
    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}.
    indices: tensor<I>, I in {int8, uint8, int16, uint16, int32}; need not be constant. Negative
    indices count from the end (iOS15/16; iOS17 leaves them undefined).
    axis, batch_dims: const int32 (negative batch_dims counts from rank(indices)).
    validate_indices: const bool (iOS17); when True and indices are constant, out-of-range indices
    are a type error.
    """

    inputs = {
        "x": Input(DATA_T),
        "indices": Input(INDEX_T),
        "axis": Input(INT32, rank=0, const=True, default=0),
        "batch_dims": Input(INT32, rank=0, const=True, default=0),
        "validate_indices": Input(BOOL, rank=0, const=True, default=False),
    }

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        idx = a.tensor("indices")
        axis = norm_axis(a, a.int("axis"), x.rank)
        b = a.int("batch_dims")
        if b < 0:
            b += idx.rank
        if not 0 <= b <= idx.rank:
            raise a.error(f"batch_dims {a.int('batch_dims')} is out of range for indices of rank {idx.rank}")
        if b > axis:
            raise a.error(f"batch_dims ({b}) must be <= axis ({axis})")
        for i in range(b):
            dx, di = x.shape[i], idx.shape[i]
            if isinstance(dx, int) and isinstance(di, int) and dx != di:
                raise a.error(f"batch dim {i} differs between x ({dx}) and indices ({di})")
        _check_index_bounds(a, x.shape[axis])
        out = tuple(x.shape[:axis]) + tuple(idx.shape[b:]) + tuple(x.shape[axis + 1 :])
        return T.TensorType(x.dtype, out)

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        idx = np.asarray(a["indices"])
        axis = a.int("axis") % x.ndim
        b = a.int("batch_dims")
        b = b + idx.ndim if b < 0 else b
        idx = _wrap(idx, x.shape[axis])
        if b == 0:
            return np.take(x, idx, axis=axis)
        nb = int(np.prod(x.shape[:b], dtype=np.int64))
        xb = x.reshape((nb, *x.shape[b:]))
        ib = idx.reshape((nb, *idx.shape[b:]))
        inner = tuple(x.shape[b:axis]) + tuple(idx.shape[b:]) + tuple(x.shape[axis + 1 :])
        if nb == 0:
            return np.zeros(tuple(x.shape[:b]) + inner, dtype=x.dtype)
        parts = [np.take(xb[n], ib[n], axis=axis - b) for n in range(nb)]
        return np.stack(parts).reshape(tuple(x.shape[:b]) + inner)


@register_op
class gather_along_axis(OpDef):
    """gather_along_axis(x, indices, axis=0, validate_indices=False): numpy.take_along_axis.

    ``out[p..., i, q...] = x[p..., indices[p..., i, q...], q...]``; rank(indices) == rank(x) and every
    dim except ``axis`` matches. Output: tensor<T, indices.shape>.
    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool}; indices: I in {int8, uint8, int16,
    uint16, int32}; negative indices count from the end. validate_indices as for ``gather``.
    """

    inputs = {
        "x": Input(DATA_T),
        "indices": Input(INDEX_T),
        "axis": Input(INT32, rank=0, const=True, default=0),
        "validate_indices": Input(BOOL, rank=0, const=True, default=False),
    }

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        idx = a.tensor("indices")
        if x.rank != idx.rank:
            raise a.error(f"indices must have the rank of x ({x.rank}), got rank {idx.rank}")
        axis = norm_axis(a, a.int("axis"), x.rank)
        for i, (dx, di) in enumerate(zip(x.shape, idx.shape)):
            if i != axis and isinstance(dx, int) and isinstance(di, int) and dx != di:
                raise a.error(f"dim {i} differs between x ({dx}) and indices ({di}); only axis {axis} may")
        _check_index_bounds(a, x.shape[axis])
        return T.TensorType(x.dtype, idx.shape)

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        axis = a.int("axis") % x.ndim
        return np.take_along_axis(x, _wrap(a["indices"], x.shape[axis]), axis=axis)


# -- depth/space shuffles, upsampling ----------------------------------------------------------------


def _nchw(a: InferArgs) -> T.TensorType:
    x = a.tensor("x")
    _check_rank(a, x, 4)
    return x


def _divide(a: InferArgs, d: T.Dim, k: int, what: str) -> T.Dim:
    if isinstance(d, int):
        if d % k:
            raise a.error(f"{what} ({d}) must be divisible by {k}")
        return d // k
    return d if k == 1 else UNKNOWN


def _to_space(a: InferArgs, f: int) -> T.Type:
    x = _nchw(a)
    n, c, h, w = x.shape
    return T.TensorType(x.dtype, (n, _divide(a, c, f * f, "the channel dim"), _mul(h, f), _mul(w, f)))


def _to_depth(a: InferArgs, f: int) -> T.Type:
    x = _nchw(a)
    n, c, h, w = x.shape
    return T.TensorType(
        x.dtype, (n, _mul(c, f * f), _divide(a, h, f, "the height dim"), _divide(a, w, f, "the width dim"))
    )


@register_op
class depth_to_space(OpDef):
    """depth_to_space(x, block_size): move channel blocks into space, DCR order (TensorFlow's).

    x: tensor<T, [n, C, H, W]>, T in {fp16, fp32}; C divisible by b*b (b = block_size >= 1).
    Output [n, C/(b*b), H*b, W*b] with ``out[n, c, h*b + i, w*b + j] = x[n, (i*b + j)*(C/(b*b)) + c, h, w]``.
    """

    inputs = {"x": Input(T.FLOATS), "block_size": Input(INT32, rank=0, const=True)}

    def infer(self, a: InferArgs) -> T.Type:
        return _to_space(a, _positive(a, "block_size"))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        b = a.int("block_size")
        n, c, h, w = x.shape
        oc = c // (b * b)
        t = x.reshape(n, b, b, oc, h, w).transpose(0, 3, 4, 1, 5, 2)
        return t.reshape(n, oc, h * b, w * b)


@register_op
class space_to_depth(OpDef):
    """space_to_depth(x, block_size): the inverse of ``depth_to_space`` (DCR order).

    x: tensor<T, [n, C, H, W]>, T in {fp16, fp32}; H and W divisible by b = block_size.
    Output [n, C*b*b, H/b, W/b] with ``out[n, (i*b + j)*C + c, h, w] = x[n, c, h*b + i, w*b + j]``.
    """

    inputs = {"x": Input(T.FLOATS), "block_size": Input(INT32, rank=0, const=True)}

    def infer(self, a: InferArgs) -> T.Type:
        return _to_depth(a, _positive(a, "block_size"))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        b = a.int("block_size")
        n, c, h, w = x.shape
        t = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
        return t.reshape(n, c * b * b, h // b, w // b)


@register_op
class pixel_shuffle(OpDef):
    """pixel_shuffle(x, upscale_factor): PyTorch PixelShuffle (CRD order).

    x: tensor<T, [n, C*f*f, H, W]>, T in {fp16, fp32}; f = upscale_factor (const int32 >= 1).
    Output [n, C, H*f, W*f] with ``out[n, c, h*f + i, w*f + j] = x[n, c*f*f + i*f + j, h, w]``.
    """

    inputs = {"x": Input(T.FLOATS), "upscale_factor": Input(INT32, rank=0, const=True)}

    def infer(self, a: InferArgs) -> T.Type:
        return _to_space(a, _positive(a, "upscale_factor"))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        f = a.int("upscale_factor")
        n, c, h, w = x.shape
        oc = c // (f * f)
        return x.reshape(n, oc, f, f, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, oc, h * f, w * f)


@register_op
class pixel_unshuffle(OpDef):
    """pixel_unshuffle(x, downscale_factor): PyTorch PixelUnshuffle, the inverse of ``pixel_shuffle``.

    x: tensor<T, [n, C, H, W]>, T in {fp16, fp32}; H, W divisible by f = downscale_factor
    (const uint32 per iOS16, int32 also accepted; >= 1).
    Output [n, C*f*f, H/f, W/f] with ``out[n, c*f*f + i*f + j, h, w] = x[n, c, h*f + i, w*f + j]``.
    """

    inputs = {"x": Input(T.FLOATS), "downscale_factor": Input({"uint32", INT32}, rank=0, const=True)}

    def infer(self, a: InferArgs) -> T.Type:
        return _to_depth(a, _positive(a, "downscale_factor"))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        f = a.int("downscale_factor")
        n, c, h, w = x.shape
        t = x.reshape(n, c, h // f, f, w // f, f).transpose(0, 1, 3, 5, 2, 4)
        return t.reshape(n, c * f * f, h // f, w // f)


def _scaled(d: T.Dim, s: float) -> T.Dim:
    if isinstance(d, int):
        return int(np.floor(d * s))
    return d if s == 1 else UNKNOWN


def _nearest_index(n_in: int, n_out: int, s: float) -> np.ndarray:
    return np.minimum(np.floor(np.arange(n_out) / s).astype(np.int64), n_in - 1)


@register_op
class upsample_nearest_neighbor(OpDef):
    """upsample_nearest_neighbor(x, scale_factor_height=1, scale_factor_width=1): nearest upsampling.

    x: tensor<T, [*D, H, W]>, T in {fp16, fp32}, rank >= 3.
    scale_factor_height / _width: const U in {fp32, int32}, > 0 (may be fractional).
    Output [*D, floor(H * sh), floor(W * sw)] with ``out[..., i, j] = x[..., src(i, sh, H), src(j, sw, W)]``
    where ``src(i, s, n) = min(floor(i / s), n - 1)`` (integer factors repeat each pixel s times).
    """

    inputs = {
        "x": Input(T.FLOATS),
        "scale_factor_height": Input({"fp32", INT32}, rank=0, const=True, default=1),
        "scale_factor_width": Input({"fp32", INT32}, rank=0, const=True, default=1),
    }

    def infer(self, a: InferArgs) -> T.Type:
        x = a.tensor("x")
        if x.rank < 3:
            raise a.error(f"x must have rank >= 3, got rank {x.rank}")
        sh, sw = a.float("scale_factor_height"), a.float("scale_factor_width")
        if sh <= 0 or sw <= 0:
            raise a.error(f"scale factors must be > 0, got ({sh}, {sw})")
        shape = list(x.shape)
        shape[-2] = _scaled(shape[-2], sh)
        shape[-1] = _scaled(shape[-1], sw)
        if 0 in shape[-2:]:
            raise a.error(f"scale factors ({sh}, {sw}) give an empty output from {list(x.shape)}")
        return T.TensorType(x.dtype, tuple(shape))

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        sh, sw = a.float("scale_factor_height"), a.float("scale_factor_width")
        h, w = x.shape[-2:]
        rows = _nearest_index(h, int(np.floor(h * sh)), sh)
        cols = _nearest_index(w, int(np.floor(w * sw)), sw)
        return x[..., rows[:, None], cols[None, :]]


# -- fill / shape / identity -------------------------------------------------------------------------


@register_op
class fill(OpDef):
    """fill(shape, value=0.0): a tensor of shape ``shape`` with every element ``value``.

    shape: tensor<int32, [K]> (entries >= 0); need not be constant (then K unknown dims).
    value: const T in {fp16, fp32, int32, bool}; the output dtype is value's (fp32 when omitted).
    """

    inputs = {
        "shape": Input(SHAPE_INT_T, rank=1),
        "value": Input({"fp16", "fp32", INT32, BOOL}, rank=0, const=True, default=0.0),
    }

    def infer(self, a: InferArgs) -> T.Type:
        dt = a.tensor("value").dtype if a.has("value") else T.fp32
        dims = _opt_ints(a, "shape")
        if dims is None:
            k = a.tensor("shape").shape[0]
            if not isinstance(k, int):
                raise a.error("'shape' is not constant and has an unknown length: the output rank is unknown")
            return T.TensorType(dt, (UNKNOWN,) * k)
        if dims and min(dims) < 0:
            raise a.error(f"shape {list(dims)} has negative entries")
        return T.TensorType(dt, dims)

    def reference(self, a: RefArgs) -> np.ndarray:
        return np.full(a.ints("shape"), np.asarray(a["value"]).item())


@register_op
class shape(OpDef):
    """shape(x): the shape of ``x`` as tensor<int32, [rank(x)]>. x: any dtype."""

    inputs = {"x": Input(T.ANY_DTYPE)}

    def infer(self, a: InferArgs) -> T.Type:
        return T.TensorType(T.int32, (a.tensor("x").rank,))

    def reference(self, a: RefArgs) -> np.ndarray:
        return np.asarray(np.shape(a["x"]), dtype=np.int32).reshape(-1)


@register_op
class identity(OpDef):
    """identity(x): a copy of ``x`` (same type). x: any dtype."""

    inputs = {"x": Input(T.ANY_DTYPE)}

    def infer(self, a: InferArgs) -> T.Type:
        return a.tensor("x")

    def reference(self, a: RefArgs) -> np.ndarray:
        return _copy(a["x"])
