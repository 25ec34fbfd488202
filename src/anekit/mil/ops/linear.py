"""Linear algebra and convolution: matmul, linear, einsum, conv, conv_transpose."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np

from anekit.mil import types as T
from anekit.mil.ir import Var
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op
from anekit.mil.values import Literal

MM_T = frozenset({"fp16", "fp32", "int32"})
INT32 = frozenset({"int32"})
BOOL = frozenset({"bool"})
STRING = frozenset({"string"})
PAD_TYPES = ("valid", "same", "same_lower", "custom")


def _is_const(a: InferArgs, name: str) -> bool:
    """Whether an input is a compile-time value: an inline literal, a const or a constexpr_* output."""
    arg = a.args.get(name)
    if isinstance(arg, Literal):
        return True
    if isinstance(arg, Var):
        if arg.const is not None:
            return True
        return arg.op is not None and arg.op.op_type.startswith("constexpr_")
    return False


def _known(*dims: T.Dim) -> bool:
    return all(isinstance(d, int) for d in dims)


def check_scalars(a: InferArgs, *names: str) -> None:
    """The named inputs, when present, must be scalars (flags, counts, mode strings)."""
    for name in names:
        if a.has(name) and a.tensor(name).rank != 0:
            raise a.error(f"{name} must be a scalar, got shape {list(a.tensor(name).shape)}")


# -- matmul / linear -------------------------------------------------------------------------------


@register_op
class matmul(OpDef):
    """matmul(x, y, transpose_x=False, transpose_y=False): batched matrix product, numpy semantics.

    x: T, y: U with T, U in {fp16, fp32, int32}, both rank >= 1. transpose_x / transpose_y: const bool,
    swap the last two axes of x / y first (transpose_x on a rank-1 x is an error; transpose_y on a
    rank-1 y has no effect). Batch axes (all but the last two) broadcast numpy-style. A rank-1 x is
    treated as [1, K] and a rank-1 y as [K, 1], and the added axis is removed from the result (two
    vectors give a scalar). Output dtype: x's when x and y share a dtype; otherwise (iOS17+, only
    when exactly one of them is a compile-time constant) the dtype of the non-constant one.
    """

    inputs = {
        "x": Input(MM_T),
        "y": Input(MM_T),
        "transpose_x": Input(BOOL, const=True, default=False),
        "transpose_y": Input(BOOL, const=True, default=False),
    }

    def infer(self, a: InferArgs) -> T.Type:
        x, y = a.tensor("x"), a.tensor("y")
        if x.rank < 1 or y.rank < 1:
            raise a.error("x and y must have rank 1 or more")
        check_scalars(a, "transpose_x", "transpose_y")
        if x.dtype == y.dtype:
            dt = x.dtype
        else:
            xc, yc = _is_const(a, "x"), _is_const(a, "y")
            if xc == yc:
                kind = "constants" if xc else "runtime values"
                raise a.error(f"x ({x.dtype}) and y ({y.dtype}) must share one dtype when both are {kind}")
            dt = y.dtype if xc else x.dtype
        tx, ty = a.bool("transpose_x"), a.bool("transpose_y")
        if tx and x.rank == 1:
            raise a.error("transpose_x is True but x has rank 1")
        xs, ys = list(x.shape), list(y.shape)
        if tx:
            xs[-1], xs[-2] = xs[-2], xs[-1]
        if ty and y.rank >= 2:
            ys[-1], ys[-2] = ys[-2], ys[-1]
        if x.rank == 1:
            xs = [1, *xs]
        if y.rank == 1:
            ys = [*ys, 1]
        kx, ky = xs[-1], ys[-2]
        if _known(kx, ky) and kx != ky:
            raise a.error(
                f"inner dimensions do not match: x {list(x.shape)} gives K={kx}, "
                f"y {list(y.shape)} gives K={ky} (transpose_x={tx}, transpose_y={ty})"
            )
        batch = T.broadcast_shapes(tuple(xs[:-2]), tuple(ys[:-2]))
        if batch is None:
            raise a.error(f"batch dimensions do not broadcast: x {list(x.shape)}, y {list(y.shape)}")
        out = list(batch)
        if x.rank > 1:
            out.append(xs[-2])
        if y.rank > 1:
            out.append(ys[-1])
        return T.TensorType(dt, tuple(out))

    def reference(self, a: RefArgs) -> np.ndarray:
        x, y = np.asarray(a["x"]), np.asarray(a["y"])
        if a.bool("transpose_x") and x.ndim >= 2:
            x = np.swapaxes(x, -1, -2)
        if a.bool("transpose_y") and y.ndim >= 2:
            y = np.swapaxes(y, -1, -2)
        return np.asarray(np.matmul(x, y))


@register_op
class linear(OpDef):
    """linear(x, weight, bias?): x @ weight^T + bias.

    x: T in {fp16, fp32, int32}, shape [*D, D_in], rank >= 1. weight: U in {fp16, fp32, int32}, shape
    [D_out, D_in]; a runtime value or a constant (coremltools declares it const; anekit does not
    require it). bias: U, shape [D_out], optional (default zeros). U may differ from T (iOS17+).
    Output: T, shape [*D, D_out].
    """

    inputs = {
        "x": Input(MM_T),
        "weight": Input(MM_T, rank=2),
        "bias": Input(MM_T, optional=True, rank=1),
    }
    same_dtype = ("weight", "bias")

    def infer(self, a: InferArgs) -> T.Type:
        x, w = a.tensor("x"), a.tensor("weight")
        if x.rank < 1:
            raise a.error("x must have rank 1 or more")
        d_out, d_in = w.shape
        if _known(x.shape[-1], d_in) and x.shape[-1] != d_in:
            raise a.error(
                f"last dimension of x ({x.shape[-1]}) does not match weight's D_in ({d_in}); "
                "weight is [D_out, D_in]"
            )
        if a.has("bias"):
            nb = a.tensor("bias").shape[0]
            if _known(nb, d_out) and nb != d_out:
                raise a.error(f"bias has {nb} values but weight has D_out={d_out}")
        return T.TensorType(x.dtype, (*x.shape[:-1], d_out))

    def reference(self, a: RefArgs) -> np.ndarray:
        out = np.matmul(np.asarray(a["x"]), np.asarray(a["weight"]).T)
        b = a.get("bias")
        return np.asarray(out if b is None else out + np.asarray(b))


# -- einsum ----------------------------------------------------------------------------------------


class _Einsum:
    """A parsed einsum equation bound to operand shapes."""

    __slots__ = ("ell", "ell_dims", "out", "sizes", "terms")

    def __init__(self, equation: str, shapes: Sequence[tuple[T.Dim, ...]]) -> None:
        eq = equation.replace(" ", "")
        if eq.count("->") > 1:
            raise ValueError("the equation has more than one '->'")
        lhs, arrow, rhs = eq.partition("->")
        in_terms = lhs.split(",")
        if len(in_terms) != len(shapes):
            raise ValueError(f"the equation names {len(in_terms)} operand(s) but {len(shapes)} were given")
        self.terms = [self._tokens(t) for t in in_terms]
        self.sizes: dict[str, T.Dim] = {}
        self.ell_dims: list[tuple[T.Dim, ...]] = []
        ell: tuple[T.Dim, ...] = ()
        for i, (toks, shape) in enumerate(zip(self.terms, shapes)):
            letters = [t for t in toks if t != "..."]
            if "..." in toks:
                n_ell = len(shape) - len(letters)
                if n_ell < 0:
                    raise ValueError(
                        f"operand {i} has rank {len(shape)} but its subscripts name {len(letters)} axes"
                    )
            else:
                n_ell = 0
                if len(letters) != len(shape):
                    raise ValueError(
                        f"operand {i} has rank {len(shape)} but its subscripts '{in_terms[i]}' name "
                        f"{len(letters)} axes"
                    )
            dims = list(shape)
            own: dict[str, T.Dim] = {}
            pos = 0
            for t in toks:
                if t == "...":
                    e = tuple(dims[pos : pos + n_ell])
                    self.ell_dims.append(e)
                    b = T.broadcast_shapes(ell, e)
                    if b is None:
                        raise ValueError(f"the '...' dimensions {list(e)} of operand {i} do not broadcast")
                    ell = b
                    pos += n_ell
                    continue
                d = dims[pos]
                pos += 1
                if t in own and _known(own[t], d) and own[t] != d:
                    raise ValueError(f"subscript '{t}' repeats in operand {i} with sizes {own[t]} and {d}")
                own.setdefault(t, d)
                self.sizes[t] = self._unify(t, self.sizes[t], d) if t in self.sizes else d
            if "..." not in toks:
                self.ell_dims.append(())
        self.ell = ell
        has_ell = any("..." in t for t in self.terms)
        if arrow:
            out = self._tokens(rhs)
            for t in out:
                if t != "..." and t not in self.sizes:
                    raise ValueError(f"output subscript '{t}' does not appear in the inputs")
            letters = [t for t in out if t != "..."]
            if len(set(letters)) != len(letters):
                raise ValueError(f"output subscripts '{rhs}' repeat a letter")
            if ell and "..." not in out:
                raise ValueError("the inputs have '...' dimensions, so the output must contain '...'")
        else:
            counts: dict[str, int] = {}
            for toks in self.terms:
                for t in toks:
                    if t != "...":
                        counts[t] = counts.get(t, 0) + 1
            out = (["..."] if has_ell else []) + sorted(t for t, c in counts.items() if c == 1)
        self.out = out

    @staticmethod
    def _tokens(term: str) -> list[str]:
        toks: list[str] = []
        i = 0
        while i < len(term):
            if term.startswith("...", i):
                if "..." in toks:
                    raise ValueError(f"subscripts '{term}' contain '...' more than once")
                toks.append("...")
                i += 3
            elif term[i].isascii() and term[i].isalpha():
                toks.append(term[i])
                i += 1
            else:
                raise ValueError(
                    f"invalid character {term[i]!r} in subscripts '{term}' (use letters and '...')"
                )
        return toks

    @staticmethod
    def _unify(label: str, a: T.Dim, b: T.Dim) -> T.Dim:
        if a == b or b == 1:
            return a
        if a == 1:
            return b
        if isinstance(a, str):
            return b
        if isinstance(b, str):
            return a
        raise ValueError(f"subscript '{label}' has incompatible sizes {a} and {b}")

    def out_shape(self) -> tuple[T.Dim, ...]:
        shape: list[T.Dim] = []
        for t in self.out:
            if t == "...":
                shape.extend(self.ell)
            else:
                shape.append(self.sizes[t])
        return tuple(shape)

    def target_shape(self, i: int) -> tuple[T.Dim, ...]:
        """Operand i's shape with its size-1 dims broadcast to the unified sizes."""
        shape: list[T.Dim] = []
        own = self.ell_dims[i]
        for t in self.terms[i]:
            if t == "...":
                shape.extend(self.ell[len(self.ell) - len(own) :] if own else ())
            else:
                shape.append(self.sizes[t])
        return tuple(shape)

    def numpy_equation(self) -> str:
        lhs = ",".join("".join(t) for t in self.terms)
        return f"{lhs}->{''.join(self.out)}"


@register_op
class einsum(OpDef):
    """einsum(values, equation): Einstein summation over the tensors of ``values``.

    values: tuple of tensors of one dtype T in {fp16, fp32}. equation: const string in numpy notation:
    comma-separated subscripts (ASCII letters, at most one '...' per operand), optionally '->' and the
    output subscripts (implicit output: '...' then the letters used once, sorted). A letter shared by
    operands must have equal sizes or size 1 (size 1 broadcasts); '...' dims broadcast numpy-style.
    Output: T with the output subscripts' sizes.

    coremltools accepts only two operands with the equations "nchw,nwhu->nchu" and "chw,whr->chr"
    (and renamings of them); anekit types and evaluates every well-formed equation.
    """

    inputs = {
        "values": Input(frozenset({"fp16", "fp32"}), variadic=True),
        "equation": Input(STRING, const=True),
    }
    same_dtype = ("values",)

    def infer(self, a: InferArgs) -> T.Type:
        ts = a.types("values")
        check_scalars(a, "equation")
        eq = a.str("equation")
        try:
            parsed = _Einsum(eq, [t.shape for t in ts])
        except ValueError as e:
            raise a.error(f"unsupported einsum equation '{eq}': {e}") from None
        return T.TensorType(ts[0].dtype, parsed.out_shape())

    def reference(self, a: RefArgs) -> np.ndarray:
        vals = a["values"]
        ops = [np.asarray(v) for v in (vals if isinstance(vals, (tuple, list)) else (vals,))]
        p = _Einsum(a.str("equation"), [o.shape for o in ops])
        # The operands' shapes are concrete, so every unified size is an int.
        ops = [np.broadcast_to(o, tuple(int(d) for d in p.target_shape(i))) for i, o in enumerate(ops)]
        return np.asarray(np.einsum(p.numpy_equation(), *ops, optimize=len(ops) > 1))


# -- spatial geometry (shared with the pooling ops) ------------------------------------------------


def int_vector(a: InferArgs, name: str, n: int, fill: int) -> tuple[int, ...]:
    """A const int vector input of exactly n values (``fill`` repeated when omitted)."""
    v = a.value(name)
    if v is None:
        return (fill,) * n
    arr = np.asarray(v)
    if arr.ndim > 1:
        raise a.error(f"{name} must be a 1-D list of ints, got shape {list(arr.shape)}")
    vals = tuple(int(x) for x in arr.ravel())
    if len(vals) != n:
        raise a.error(f"{name} must have {n} values, got {len(vals)} ({list(vals)})")
    return vals


def ref_vector(a: RefArgs, name: str, n: int, fill: int) -> tuple[int, ...]:
    v = a.get(name)
    return (fill,) * n if v is None else tuple(int(x) for x in np.asarray(v).ravel())


def same_pads(d: int, k_eff: int, s: int, lower: bool) -> tuple[int, int]:
    """Before/after padding of "same" (extra on the after side) or "same_lower" (extra before)."""
    out = -(-d // s)
    total = max(0, (out - 1) * s + k_eff - d)
    small = total // 2
    return (total - small, small) if lower else (small, total - small)


def window_count(d: int, k_eff: int, s: int, before: int, after: int, ceil_mode: bool = False) -> int:
    """Number of windows along one dim (<= 0 when the kernel does not fit)."""
    span = d + before + after - k_eff
    if span < 0:
        return 0
    if not ceil_mode:
        return span // s + 1
    n = -(-span // s) + 1
    if n > 1 and (n - 1) * s >= d + before:
        n -= 1  # the last window would start in the trailing padding
    return n


def pad_type_of(a: InferArgs, allowed: Sequence[str] = PAD_TYPES) -> str:
    pt = a.str("pad_type").lower()
    if pt not in allowed:
        raise a.error(f"pad_type must be one of {', '.join(repr(p) for p in allowed)}, got '{pt}'")
    return pt


def custom_pads(a: InferArgs, pad_type: str, nsp: int) -> tuple[int, ...]:
    """The ``pad`` input (2 per spatial dim) when pad_type is custom, else zeros."""
    if pad_type != "custom":
        return (0,) * (2 * nsp)
    pad = int_vector(a, "pad", 2 * nsp, 0)
    if any(p < 0 for p in pad):
        raise a.error(f"pad values must be >= 0, got {list(pad)}")
    return pad


def positive(a: InferArgs, name: str, vals: Sequence[int]) -> None:
    if any(v < 1 for v in vals):
        raise a.error(f"{name} must all be >= 1, got {list(vals)}")


def spatial_out(
    a: InferArgs,
    dims: Sequence[T.Dim],
    k_eff: Sequence[T.Dim],
    strides: Sequence[int],
    pad_type: str,
    pad: Sequence[int],
    ceil_mode: bool = False,
) -> list[T.Dim]:
    """Output spatial sizes of a sliding window (conv or pool); '?' where a symbol makes it unknown."""
    outs: list[T.Dim] = []
    for r, (d, k, s) in enumerate(zip(dims, k_eff, strides)):
        if pad_type in ("same", "same_lower"):
            if isinstance(d, int):
                outs.append(-(-d // s))
            else:
                outs.append(d if s == 1 else "?")
            continue
        b, e = pad[2 * r], pad[2 * r + 1]
        if not (isinstance(d, int) and isinstance(k, int)):
            outs.append(d if (k == 1 and s == 1 and b + e == 0) else "?")
            continue
        n = window_count(d, k, s, b, e, ceil_mode)
        if n <= 0:
            raise a.error(
                f"spatial dim {r}: input size {d} with padding {b}+{e} is smaller than the kernel extent {k}"
            )
        outs.append(n)
    return outs


def resolve_pads(
    pad_type: str, dims: Sequence[int], k_eff: Sequence[int], strides: Sequence[int], pad: object
) -> list[tuple[int, int]]:
    """Concrete (before, after) padding per spatial dim, for the references."""
    if pad_type in ("same", "same_lower"):
        return [same_pads(d, k, s, pad_type == "same_lower") for d, k, s in zip(dims, k_eff, strides)]
    if pad_type == "custom" and pad is not None:
        p = [int(v) for v in np.asarray(pad).ravel()]
        return [(p[2 * i], p[2 * i + 1]) for i in range(len(dims))]
    return [(0, 0)] * len(dims)


def kernel_offsets(kernel: Sequence[int]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(k) for k in kernel))


def window_slices(
    offsets: Sequence[int], dilations: Sequence[int], outs: Sequence[int], strides: Sequence[int]
) -> tuple[slice, ...]:
    """Slices (after the two leading axes) picking, for every output position, the input element under
    kernel offset ``offsets``."""
    lead = (slice(None), slice(None))
    return lead + tuple(
        slice(o * dl, o * dl + (n - 1) * s + 1, s) for o, dl, n, s in zip(offsets, dilations, outs, strides)
    )


# -- conv ------------------------------------------------------------------------------------------


def _bias_check(a: InferArgs, c_out: T.Dim) -> None:
    if a.has("bias"):
        b = a.tensor("bias")
        if b.rank != 1 or (_known(b.shape[0], c_out) and b.shape[0] != c_out):
            raise a.error(
                f"bias must have shape [{c_out}] (one value per output channel), got {list(b.shape)}"
            )


def _add_bias(y: np.ndarray, bias: object) -> np.ndarray:
    if bias is None:
        return y
    b = np.asarray(bias)
    return y + b.reshape((1, b.size) + (1,) * (y.ndim - 2))


_CONV_INPUTS = {
    "x": Input(T.FLOATS, rank=(3, 4, 5)),
    "weight": Input(T.FLOATS, rank=(3, 4, 5)),
    "bias": Input(T.FLOATS, optional=True),
    "strides": Input(INT32, optional=True, const=True),
    "pad_type": Input(STRING, const=True, default="valid"),
    "pad": Input(INT32, optional=True, const=True),
    "dilations": Input(INT32, optional=True, const=True),
    "groups": Input(INT32, const=True, default=1),
}


def _conv_params(
    a: InferArgs, weight_layout: str
) -> tuple[T.TensorType, T.TensorType, int, tuple[int, ...], tuple[int, ...], int, str, tuple[int, ...]]:
    """The checked parameters shared by conv and conv_transpose.

    Returns x, weight, the number of spatial dims, strides, dilations, groups, pad_type and the custom pads.
    """
    x, w = a.tensor("x"), a.tensor("weight")
    nsp = x.rank - 2
    if w.rank != x.rank:
        raise a.error(f"weight must have rank {x.rank} ({weight_layout}) to match x, got {w.rank}")
    check_scalars(a, "pad_type", "groups")
    strides = int_vector(a, "strides", nsp, 1)
    dil = int_vector(a, "dilations", nsp, 1)
    positive(a, "strides", strides)
    positive(a, "dilations", dil)
    groups = a.int("groups")
    if groups < 1:
        raise a.error(f"groups must be >= 1, got {groups}")
    pad_type = pad_type_of(a)
    return x, w, nsp, strides, dil, groups, pad_type, custom_pads(a, pad_type, nsp)


def conv_operands(
    x: np.ndarray, w: np.ndarray, pads: Sequence[tuple[int, int]], outs: Sequence[int], groups: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """(x zero-padded, the weight by group (groups, C_out/groups, C_in/groups, *K), the output positions)."""
    c_in, c_out = x.shape[1], w.shape[0]
    if any(b or e for b, e in pads):
        x = np.pad(x, [(0, 0), (0, 0), *pads])
    return x, w.reshape(groups, c_out // groups, c_in // groups, *w.shape[2:]), int(np.prod(outs))


def conv_nd(
    x: np.ndarray,
    w: np.ndarray,
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[tuple[int, int]],
    outs: Sequence[int],
    groups: int,
) -> np.ndarray:
    """Grouped N-d cross-correlation as one batched matmul per kernel offset."""
    n = x.shape[0]
    x, wg, npos = conv_operands(x, w, pads, outs, groups)
    acc: np.ndarray | None = None
    for off in kernel_offsets(w.shape[2:]):
        xs = x[window_slices(off, dilations, outs, strides)].reshape(n, groups, wg.shape[2], npos)
        part = np.matmul(wg[(slice(None),) * 3 + off], xs)
        acc = part if acc is None else acc + part
    assert acc is not None
    return acc.reshape(n, w.shape[0], *outs)


@register_op
class conv(OpDef):
    """conv(x, weight, bias?, strides?, pad_type="valid", pad?, dilations?, groups=1): N-d convolution.

    x: T in {fp16, fp32}, [N, C_in, *D_in] with 1..3 spatial dims. weight: U in {fp16, fp32} (may
    differ from T, iOS17+), [C_out, C_in/groups, *K]; a runtime value or a constant. bias: U, [C_out],
    optional. strides, dilations: const int32 [S], default all 1. pad_type: const string, "valid"
    (no padding), "same" (out = ceil(in/stride), total padding max(0, (out-1)*stride + dk - in) split
    with the extra element after), "same_lower" (extra element before) or "custom" (use pad).
    pad: const int32 [2*S]: before/after padding per spatial dim, read only when pad_type is custom.
    groups: const int32: C_in and C_out are split into groups convolved independently.
    Output: T, [N, C_out, *D_out] with D_out = floor((D_in + pad_before + pad_after - dk) / stride) + 1,
    dk = (K - 1) * dilation + 1. This is cross-correlation (the kernel is not flipped), zero padding.
    """

    inputs = _CONV_INPUTS
    same_dtype = ("weight", "bias")

    def infer(self, a: InferArgs) -> T.Type:
        x, w, _nsp, strides, dil, groups, pad_type, pad = _conv_params(a, "[C_out, C_in/groups, *K]")
        n, c_in = x.shape[0], x.shape[1]
        c_out, c_in_g = w.shape[0], w.shape[1]
        if isinstance(c_in, int):
            if c_in % groups:
                raise a.error(f"input channels ({c_in}) are not divisible by groups ({groups})")
            if isinstance(c_in_g, int) and c_in // groups != c_in_g:
                raise a.error(
                    f"weight has {c_in_g} input channels per group but x has C_in/groups = {c_in}/{groups}"
                    f" = {c_in // groups}"
                )
        if isinstance(c_out, int) and c_out % groups:
            raise a.error(f"output channels ({c_out}) are not divisible by groups ({groups})")
        _bias_check(a, c_out)
        k_eff = [(k - 1) * d + 1 if isinstance(k, int) else k for k, d in zip(w.shape[2:], dil)]
        outs = spatial_out(a, x.shape[2:], k_eff, strides, pad_type, pad)
        return T.TensorType(x.dtype, (n, c_out, *outs))

    def reference(self, a: RefArgs) -> np.ndarray:
        x, w = np.asarray(a["x"]), np.asarray(a["weight"])
        nsp = x.ndim - 2
        strides = ref_vector(a, "strides", nsp, 1)
        dil = ref_vector(a, "dilations", nsp, 1)
        groups = a.int("groups")
        kernel = w.shape[2:]
        k_eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
        pads = resolve_pads(a.str("pad_type").lower(), x.shape[2:], k_eff, strides, a.get("pad"))
        outs = [window_count(d, k, s, b, e) for d, k, s, (b, e) in zip(x.shape[2:], k_eff, strides, pads)]
        return _add_bias(self.convolve(x, w, strides, dil, pads, outs, groups), a.get("bias"))

    # The convolution itself, its parameters resolved; a subclass may sum its products in another order
    # (the simulator's ``runtime.sim.ordered``).
    convolve = staticmethod(conv_nd)


@register_op
class conv_transpose(OpDef):
    """conv_transpose(x, weight, bias?, pad?, output_padding?, output_shape?, pad_type="valid", strides?,
    dilations?, groups=1): transposed convolution (the adjoint of conv), 1-D/2-D/3-D.

    x: T in {fp16, fp32}, [N, C_in, *D_in]. weight: U in {fp16, fp32}, [C_in, C_out/groups, *K]; a
    runtime value or a constant (iOS17+). bias: U, [C_out], optional. strides, dilations: const int32
    [S], default 1. groups: const int32. Every x[n, ci, i] adds x * weight[ci, co, k] at full position
    i*stride + k*dilation of a buffer of size F = (D_in - 1)*stride + dk, dk = (K - 1)*dilation + 1;
    the output is that buffer cropped by pad_before at the start (zeros past its end).
    Output sizes D_out: output_shape if given (const int32, either the full [N, C_out, *D_out] or only
    the spatial sizes), else by pad_type: "valid": F; "custom": F - pad[2i] - pad[2i+1];
    "same" / "same_lower": D_in * stride; plus output_padding (const int32 [S], default 0, an anekit
    extension not in coremltools' definition; ignored when output_shape is given). pad_before is 0
    for valid, pad[2i] for custom, and for same the padding conv would use on an input of size
    D_in * stride (same: total // 2, same_lower: total - total // 2); output_padding only extends the
    end, as in PyTorch, so it never moves pad_before.
    """

    inputs = {
        "x": Input(T.FLOATS, rank=(3, 4, 5)),
        "weight": Input(T.FLOATS, rank=(3, 4, 5)),
        "bias": Input(T.FLOATS, optional=True),
        "pad": Input(INT32, optional=True, const=True),
        "output_padding": Input(INT32, optional=True, const=True),
        "output_shape": Input(INT32, optional=True, const=True),
        "pad_type": Input(STRING, const=True, default="valid"),
        "strides": Input(INT32, optional=True, const=True),
        "dilations": Input(INT32, optional=True, const=True),
        "groups": Input(INT32, const=True, default=1),
    }
    same_dtype = ("weight", "bias")

    def infer(self, a: InferArgs) -> T.Type:
        x, w, nsp, strides, dil, groups, pad_type, pad = _conv_params(a, "[C_in, C_out/groups, *K]")
        out_pad = int_vector(a, "output_padding", nsp, 0)
        if any(p < 0 for p in out_pad):
            raise a.error(f"output_padding must be >= 0, got {list(out_pad)}")
        n, c_in = x.shape[0], x.shape[1]
        w_in, c_out_g = w.shape[0], w.shape[1]
        if _known(c_in, w_in) and c_in != w_in:
            raise a.error(f"weight's first dim ({w_in}) must equal x's input channels ({c_in})")
        if isinstance(c_in, int) and c_in % groups:
            raise a.error(f"input channels ({c_in}) are not divisible by groups ({groups})")
        c_out: T.Dim = c_out_g * groups if isinstance(c_out_g, int) else (c_out_g if groups == 1 else "?")
        _bias_check(a, c_out)
        if a.has("output_shape"):
            vals = a.ints("output_shape")
            if len(vals) == x.rank:
                if isinstance(n, int) and vals[0] != n:
                    raise a.error(f"output_shape {list(vals)} has batch {vals[0]} but x has batch {n}")
                if isinstance(c_out, int) and vals[1] != c_out:
                    raise a.error(f"output_shape {list(vals)} has {vals[1]} channels but C_out is {c_out}")
                spatial = vals[2:]
            elif len(vals) == nsp:
                spatial = vals
            else:
                raise a.error(
                    f"output_shape must have {x.rank} values ([N, C_out, *D_out]) or {nsp} (spatial), "
                    f"got {list(vals)}"
                )
            positive(a, "output_shape", spatial)
            return T.TensorType(x.dtype, (n, c_out, *spatial))
        outs: list[T.Dim] = []
        for r, (d, k, s, dl, op) in enumerate(zip(x.shape[2:], w.shape[2:], strides, dil, out_pad)):
            if not (isinstance(d, int) and isinstance(k, int)):  # (narrows d, k for the arithmetic)
                simple = (
                    s == 1 and op == 0 and (pad_type.startswith("same") or (k == 1 and pad_type == "valid"))
                )
                outs.append(d if simple else "?")
                continue
            k_eff = (k - 1) * dl + 1
            if pad_type.startswith("same"):
                o = d * s
            else:
                o = (d - 1) * s + k_eff - pad[2 * r] - pad[2 * r + 1]
            o += op
            if o <= 0:
                raise a.error(f"spatial dim {r}: the padding {pad[2 * r]}+{pad[2 * r + 1]} leaves no output")
            outs.append(o)
        return T.TensorType(x.dtype, (n, c_out, *outs))

    def reference(self, a: RefArgs) -> np.ndarray:
        x, w = np.asarray(a["x"]), np.asarray(a["weight"])
        nsp = x.ndim - 2
        strides = ref_vector(a, "strides", nsp, 1)
        dil = ref_vector(a, "dilations", nsp, 1)
        out_pad = ref_vector(a, "output_padding", nsp, 0)
        groups = a.int("groups")
        pad_type = a.str("pad_type").lower()
        pad = ref_vector(a, "pad", 2 * nsp, 0) if pad_type == "custom" else (0,) * (2 * nsp)
        n, c_in = x.shape[:2]
        din = x.shape[2:]
        kernel = w.shape[2:]
        cog = w.shape[1]
        cig, c_out = c_in // groups, cog * groups
        k_eff = [(k - 1) * dl + 1 for k, dl in zip(kernel, dil)]
        full = [(d - 1) * s + k for d, s, k in zip(din, strides, k_eff)]
        given = a.get("output_shape")
        if given is not None:
            g = [int(v) for v in np.asarray(given).ravel()]
            outs = g[2:] if len(g) == x.ndim else g
        elif pad_type.startswith("same"):
            outs = [d * s + op for d, s, op in zip(din, strides, out_pad)]
        else:
            outs = [f - pad[2 * r] - pad[2 * r + 1] + out_pad[r] for r, f in enumerate(full)]
        if pad_type.startswith("same"):
            base = outs if given is not None else [d * s for d, s in zip(din, strides)]
            befores = [
                same_pads(o, k, s, pad_type == "same_lower")[0] for o, k, s in zip(base, k_eff, strides)
            ]
        else:
            befores = [pad[2 * r] for r in range(nsp)]

        dt = np.result_type(x, w)
        buf = np.zeros((n, groups, cog, *full), dtype=dt)
        xs = x.reshape(n, groups, cig, int(np.prod(din)))
        wg = w.reshape(groups, cig, cog, *kernel)
        for off in kernel_offsets(kernel):
            wk = np.swapaxes(wg[(slice(None),) * 3 + off], -1, -2)  # [g, cog, cig]
            part = np.matmul(wk, xs).reshape(n, groups, cog, *din)
            sl = window_slices(off, dil, din, strides)
            at = (slice(None), *sl)
            buf[at] += part
        buf = buf.reshape(n, c_out, *full)

        y = np.zeros((n, c_out, *outs), dtype=dt)
        src: list[slice] = [slice(None), slice(None)]
        dst: list[slice] = [slice(None), slice(None)]
        for f, o, b in zip(full, outs, befores):
            lo, hi = max(b, 0), min(f, b + o)
            if hi <= lo:
                return _add_bias(y, a.get("bias"))
            src.append(slice(lo, hi))
            dst.append(slice(lo - b, hi - b))
        y[tuple(dst)] = buf[tuple(src)]
        return _add_bias(y, a.get("bias"))
