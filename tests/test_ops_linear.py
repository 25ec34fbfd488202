"""matmul, linear, einsum, conv and conv_transpose: references against loop implementations, type rules,
errors."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from anekit.errors import MilTypeError
from anekit.mil import types as T
from anekit.mil.registry import get_op
from tests.op_harness import infer_op, run_op, var

RNG = np.random.default_rng(7)


# -- matmul ------------------------------------------------------------------------------------------


def loop_matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """numpy matmul semantics written out: promote vectors, broadcast batches, sum products."""
    xv, yv = x.ndim == 1, y.ndim == 1
    xm = x[None, :] if xv else x
    ym = y[:, None] if yv else y
    batch = np.broadcast_shapes(xm.shape[:-2], ym.shape[:-2])
    xb = np.broadcast_to(xm, batch + xm.shape[-2:])
    yb = np.broadcast_to(ym, batch + ym.shape[-2:])
    m, k, n = xm.shape[-2], xm.shape[-1], ym.shape[-1]
    out = np.zeros((*batch, m, n))
    for b in np.ndindex(*batch):
        for i in range(m):
            for j in range(n):
                out[(*b, i, j)] = math.fsum(xb[(*b, i, t)] * yb[(*b, t, j)] for t in range(k))
    if xv:
        out = out[..., 0, :]
    if yv:
        out = out[..., 0]
    return out


MATMUL_CASES = [
    ((3, 4), (4, 5), False, False),
    ((2, 3, 4), (4, 5), False, False),
    ((5, 1, 3, 4), (2, 4, 6), False, False),
    ((4,), (2, 4, 5), False, False),
    ((2, 3, 4), (4,), False, False),
    ((4,), (4,), False, False),
    ((4, 3), (5, 4), True, True),
    ((2, 4, 3), (2, 4, 5), True, False),
    ((3, 4), (2, 5, 4), False, True),
    ((4,), (5, 4), False, True),
    ((3, 4), (4,), False, True),
]


@pytest.mark.parametrize(("xs", "ys", "tx", "ty"), MATMUL_CASES)
def test_matmul_reference(xs: tuple, ys: tuple, tx: bool, ty: bool) -> None:
    x, y = RNG.normal(size=xs), RNG.normal(size=ys)
    (out,) = run_op("matmul", x=x, y=y, transpose_x=tx, transpose_y=ty)
    xe = np.swapaxes(x, -1, -2) if tx else x
    ye = np.swapaxes(y, -1, -2) if ty and y.ndim > 1 else y
    np.testing.assert_allclose(out, loop_matmul(xe, ye), rtol=1e-12, atol=1e-12)


def test_matmul_int32() -> None:
    x = RNG.integers(-5, 5, size=(2, 3)).astype(np.int32)
    y = RNG.integers(-5, 5, size=(3, 2)).astype(np.int32)
    (out,) = run_op("matmul", x=x, y=y)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, loop_matmul(x, y).astype(np.int32))


def test_matmul_infer() -> None:
    (t,) = infer_op("matmul", x=var("fp16", ["B", 1, "L", 64]), y=var("fp16", ["B", 12, 64, "S"]))
    assert t == T.tensor("fp16", ["B", 12, "L", "S"])
    (t,) = infer_op("matmul", x=var("fp16", ["B", "L", 64]), y=var("fp16", ["B", "S", 64]), transpose_y=True)
    assert t == T.tensor("fp16", ["B", "L", "S"])
    (t,) = infer_op("matmul", x=var("fp32", [7]), y=var("fp32", [7]))
    assert t == T.tensor("fp32", [])
    # iOS17: mixed dtypes when exactly one side is constant; the output takes the runtime side's dtype
    (t,) = infer_op("matmul", x=var("fp16", [2, 3]), y=np.ones((3, 4), dtype=np.float32))
    assert t == T.tensor("fp16", [2, 4])
    (t,) = infer_op("matmul", x=np.ones((2, 3), dtype=np.float16), y=var("fp32", [3, 4]))
    assert t == T.tensor("fp32", [2, 4])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"x": var("fp16", [2, 3]), "y": var("fp16", [4, 5])}, "inner dimensions"),
        ({"x": var("fp16", [2, 2, 3]), "y": var("fp16", [3, 3, 5])}, "batch dimensions"),
        ({"x": var("fp16", [3]), "y": var("fp16", [3, 2]), "transpose_x": True}, "rank 1"),
        ({"x": var("fp16", [2, 3]), "y": var("fp32", [3, 2])}, "share one dtype"),
        ({"x": var("fp16", []), "y": var("fp16", [3, 2])}, "rank 1 or more"),
        ({"x": var("bool", [2, 3]), "y": var("bool", [3, 2])}, "dtype bool"),
    ],
)
def test_matmul_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(MilTypeError, match=r"\[matmul\].*" + needle):
        infer_op("matmul", **kwargs)


# -- linear ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("xshape", [(5,), (3, 5), (2, 3, 5)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_reference(xshape: tuple, with_bias: bool) -> None:
    x, w, b = RNG.normal(size=xshape), RNG.normal(size=(4, 5)), RNG.normal(size=4)
    kwargs = {"bias": b} if with_bias else {}
    (out,) = run_op("linear", x=x, weight=w, **kwargs)
    want = np.zeros((*xshape[:-1], 4))
    for idx in np.ndindex(*xshape[:-1]):
        for o in range(4):
            want[(*idx, o)] = math.fsum(x[(*idx, i)] * w[o, i] for i in range(5)) + (b[o] if with_bias else 0)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_linear_infer_runtime_weight() -> None:
    (t,) = infer_op("linear", x=var("fp16", ["B", "S", 64]), weight=var("fp16", [128, 64], "w"))
    assert t == T.tensor("fp16", ["B", "S", 128])
    (t,) = infer_op(
        "linear", x=var("fp16", [64]), weight=np.ones((3, 64), np.float32), bias=np.zeros(3, np.float32)
    )
    assert t == T.tensor("fp16", [3])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"x": var("fp16", [2, 5]), "weight": var("fp16", [4, 6])}, "D_in"),
        ({"x": var("fp16", [2, 5]), "weight": var("fp16", [4, 5]), "bias": var("fp16", [3])}, "bias"),
        ({"x": var("fp16", [2, 5]), "weight": var("fp16", [5])}, "rank 1; expected rank 2"),
        ({"x": var("fp16", [5]), "weight": var("fp16", [4, 5]), "bias": var("fp32", [4])}, "share one dtype"),
    ],
)
def test_linear_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(MilTypeError, match=r"\[linear\].*" + needle):
        infer_op("linear", **kwargs)


# -- einsum ------------------------------------------------------------------------------------------


def loop_einsum(equation: str, *ops: np.ndarray) -> np.ndarray:
    """Letters-only einsum by enumerating every label assignment; size-1 operand dims broadcast."""
    lhs, rhs = equation.replace(" ", "").split("->")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    for term, op in zip(terms, ops):
        for ch, d in zip(term, op.shape):
            sizes[ch] = max(sizes.get(ch, 1), d)
    labels = sorted(sizes)
    out = np.zeros([sizes[c] for c in rhs])
    for vals in itertools.product(*(range(sizes[c]) for c in labels)):
        env = dict(zip(labels, vals))
        prod = 1.0
        for term, op in zip(terms, ops):
            prod *= op[tuple(0 if d == 1 else env[c] for c, d in zip(term, op.shape))]
        out[tuple(env[c] for c in rhs)] += prod
    return out


EINSUM_CASES = [
    ("nchw,nwhu->nchu", (2, 3, 4, 5), (2, 5, 4, 3)),
    ("nchw,nwhu->nchu", (1, 3, 1, 5), (2, 5, 4, 3)),  # n and h broadcast
    ("chw,whr->chr", (3, 2, 4), (4, 2, 5)),
    ("chw,whr->chr", (3, 1, 4), (4, 2, 5)),
    ("ij,jk->ik", (3, 4), (4, 2)),
    ("bhqd,bhkd->bhqk", (2, 3, 4, 5), (2, 3, 6, 5)),
    ("ij,ij->", (3, 4), (3, 4)),
    ("i,j->ij", (3,), (4,)),
    ("ij->ji", (3, 4), None),
    ("ii->i", (3, 3), None),
    ("ijk,k->ij", (2, 3, 4), (4,)),
]


@pytest.mark.parametrize(("eq", "xs", "ys"), EINSUM_CASES)
def test_einsum_reference(eq: str, xs: tuple, ys: tuple | None) -> None:
    ops = tuple(RNG.normal(size=s) for s in (xs, ys) if s is not None)
    (out,) = run_op("einsum", values=ops, equation=eq)
    np.testing.assert_allclose(out, loop_einsum(eq, *ops), rtol=1e-12, atol=1e-12)


def test_einsum_implicit_and_ellipsis() -> None:
    a, b = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 2))
    (out,) = run_op("einsum", values=(a, b), equation="ij,jk")
    np.testing.assert_allclose(out, loop_einsum("ij,jk->ik", a, b), rtol=1e-12)
    a, b = RNG.normal(size=(2, 1, 3, 4)), RNG.normal(size=(5, 4, 2))
    (out,) = run_op("einsum", values=(a, b), equation="...ij,...jk->...ik")
    np.testing.assert_allclose(out, loop_matmul(a, b), rtol=1e-12)
    (t,) = infer_op(
        "einsum", values=(var("fp16", [2, 1, 3, 4]), var("fp16", [5, 4, 2])), equation="...ij,...jk"
    )
    assert t == T.tensor("fp16", [2, 5, 3, 2])


def test_einsum_infer_symbolic() -> None:
    (t,) = infer_op(
        "einsum",
        values=(var("fp16", ["B", 8, 1, 64], "q"), var("fp16", ["B", 64, 1, "S"], "k")),
        equation="nchw,nwhu->nchu",
    )
    assert t == T.tensor("fp16", ["B", 8, 1, "S"])


@pytest.mark.parametrize(
    ("values", "eq", "needle"),
    [
        ((var("fp16", [2, 3]), var("fp16", [3, 4])), "ij,jk,kl->il", "operand"),
        ((var("fp16", [2, 3]), var("fp16", [3, 4])), "ijk,jk->ik", "rank 2"),
        ((var("fp16", [2, 3]), var("fp16", [4, 5])), "ij,jk->ik", "incompatible sizes"),
        ((var("fp16", [2, 3]), var("fp16", [3, 4])), "ij,jk->iz", "does not appear"),
        ((var("fp16", [2, 3]), var("fp16", [3, 4])), "ij,j_k->ik", "invalid character"),
        ((var("fp16", [2, 3]), var("fp16", [3, 4])), "ij,jk->ii", "repeat"),
        ((var("fp16", [2, 3]), var("fp16", [3, 4])), "ij->jk->ik", "more than one"),
        ((var("fp16", [2, 2, 3]), var("fp16", [3, 4])), "...ij,jk->ik", "must contain '...'"),
        ((var("fp16", [2, 3]), var("fp32", [3, 4])), "ij,jk->ik", "share one dtype"),
    ],
)
def test_einsum_errors(values: tuple, eq: str, needle: str) -> None:
    with pytest.raises(MilTypeError, match=r"\[einsum\].*" + needle):
        infer_op("einsum", values=values, equation=eq)


# -- conv --------------------------------------------------------------------------------------------


def same_pad(d: int, k: int, s: int, dil: int, lower: bool) -> tuple[int, int]:
    dk = (k - 1) * dil + 1
    out = math.ceil(d / s)
    total = max(0, (out - 1) * s + dk - d)
    return (math.ceil(total / 2), total // 2) if lower else (total // 2, math.ceil(total / 2))


def loop_conv(x, w, b, strides, pads, dil, groups):
    n, _c_in, *dims = x.shape
    c_out, cig, *ks = w.shape
    cog = c_out // groups
    outs = [
        (d + pb + pa - (k - 1) * dl - 1) // s + 1
        for d, k, s, (pb, pa), dl in zip(dims, ks, strides, pads, dil)
    ]
    y = np.zeros([n, c_out, *outs])
    for ni, co, *o in itertools.product(range(n), range(c_out), *(range(v) for v in outs)):
        g = co // cog
        acc = []
        for ci in range(cig):
            for kk in itertools.product(*(range(k) for k in ks)):
                pos = [oi * s + ki * dl - pb for oi, ki, s, dl, (pb, _) in zip(o, kk, strides, dil, pads)]
                if all(0 <= p < d for p, d in zip(pos, dims)):
                    acc.append(x[(ni, g * cig + ci, *pos)] * w[(co, ci, *kk)])
        y[(ni, co, *o)] = math.fsum(acc) + (0.0 if b is None else b[co])
    return y


CONV_CASES = [
    # x shape, weight shape, strides, pad_type, pad, dilations, groups, bias
    ((2, 3, 9), (4, 3, 3), [1], "valid", None, [1], 1, True),
    ((1, 4, 10), (4, 2, 3), [2], "same", None, [1], 2, False),
    ((1, 2, 8), (3, 2, 2), [1], "same_lower", None, [2], 1, True),
    ((1, 3, 6, 7), (4, 3, 3, 2), [1, 1], "valid", None, [1, 1], 1, True),
    ((2, 4, 7, 6), (6, 2, 3, 3), [2, 1], "custom", [1, 0, 2, 1], [1, 2], 2, True),
    ((1, 4, 5, 6), (4, 1, 3, 3), [2, 2], "same", None, [1, 1], 4, False),
    ((1, 2, 5, 5), (2, 2, 2, 4), [1, 3], "same_lower", None, [2, 1], 1, True),
    ((1, 2, 4, 5, 4), (3, 2, 2, 3, 2), [1, 2, 1], "custom", [0, 1, 1, 1, 1, 0], [1, 1, 2], 1, True),
]


@pytest.mark.parametrize(("xs", "ws", "strides", "pad_type", "pad", "dil", "groups", "bias"), CONV_CASES)
def test_conv_reference(xs, ws, strides, pad_type, pad, dil, groups, bias) -> None:
    x, w = RNG.normal(size=xs), RNG.normal(size=ws)
    b = RNG.normal(size=ws[0]) if bias else None
    kwargs = {"strides": strides, "pad_type": pad_type, "dilations": dil, "groups": groups}
    if pad is not None:
        kwargs["pad"] = pad
    if b is not None:
        kwargs["bias"] = b
    (out,) = run_op("conv", x=x, weight=w, **kwargs)
    if pad_type in ("same", "same_lower"):
        pads = [
            same_pad(d, k, s, dl, pad_type == "same_lower")
            for d, k, s, dl in zip(xs[2:], ws[2:], strides, dil)
        ]
    elif pad_type == "custom":
        pads = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(xs) - 2)]
    else:
        pads = [(0, 0)] * (len(xs) - 2)
    want = loop_conv(x, w, b, strides, pads, dil, groups)
    np.testing.assert_allclose(out, want, rtol=1e-11, atol=1e-11)
    if pad_type in ("same", "same_lower"):
        assert out.shape[2:] == tuple(math.ceil(d / s) for d, s in zip(xs[2:], strides))


def test_conv_defaults_and_pad_ignored_unless_custom() -> None:
    x, w = RNG.normal(size=(1, 2, 6)), RNG.normal(size=(3, 2, 3))
    (a,) = run_op("conv", x=x, weight=w)
    (b,) = run_op("conv", x=x, weight=w, pad_type="valid", pad=[2, 2])
    np.testing.assert_allclose(a, loop_conv(x, w, None, [1], [(0, 0)], [1], 1), rtol=1e-12)
    np.testing.assert_allclose(a, b)


def test_conv_1x1_large_is_fast() -> None:
    x = RNG.normal(size=(1, 768, 1, 256)).astype(np.float32)
    w = RNG.normal(size=(768, 768, 1, 1)).astype(np.float32)
    op = get_op("conv")
    op.run({"x": x, "weight": w})
    t0 = time.perf_counter()
    (y,) = op.run({"x": x, "weight": w})
    elapsed = time.perf_counter() - t0
    assert y.shape == (1, 768, 1, 256) and y.dtype == np.float32
    np.testing.assert_allclose(y[0, :, 0, 5], w[:, :, 0, 0] @ x[0, :, 0, 5], rtol=1e-4, atol=1e-3)
    assert elapsed < 0.5, elapsed


def test_conv_infer() -> None:
    # runtime weights, fp16 activations
    (t,) = infer_op("conv", x=var("fp16", [1, 768, 1, 256]), weight=var("fp16", [768, 768, 1, 1], "w"))
    assert t == T.tensor("fp16", [1, 768, 1, 256])
    (t,) = infer_op("conv", x=var("fp16", ["B", 64, 1, "S"]), weight=var("fp16", [32, 64, 1, 1], "w"))
    assert t == T.tensor("fp16", ["B", 32, 1, "S"])
    (t,) = infer_op(
        "conv",
        x=var("fp16", ["B", 8, "H", 32]),
        weight=np.ones((16, 8, 3, 3), np.float32),
        strides=[2, 2],
        pad_type="same",
    )
    assert t == T.tensor("fp16", ["B", 16, "?", 16])
    (t,) = infer_op(
        "conv",
        x=var("fp32", [1, 4, 11]),
        weight=var("fp32", [6, 2, 3], "w"),
        pad_type="custom",
        pad=[2, 1],
        strides=[3],
        dilations=[2],
        groups=2,
    )
    assert t == T.tensor("fp32", [1, 6, 4])  # floor((11 + 3 - 5) / 3) + 1


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"weight": var("fp16", [4, 3, 3, 3], "w")}, "input channels per group"),
        ({"weight": var("fp16", [4, 4, 3, 3], "w"), "groups": 3}, "not divisible by groups"),
        ({"weight": var("fp16", [5, 2, 3, 3], "w"), "groups": 2}, "output channels"),
        ({"weight": var("fp16", [4, 4, 3], "w")}, "rank 4"),
        ({"pad_type": "full"}, "pad_type"),
        ({"pad_type": "custom", "pad": [1, 1]}, "pad must have 4 values"),
        ({"pad_type": "custom", "pad": [1, 1, 1, -1]}, "pad values must be >= 0"),
        ({"strides": [1, 0]}, "strides must all be >= 1"),
        ({"weight": var("fp16", [4, 4, 9, 3], "w")}, "smaller than the kernel"),
        ({"bias": var("fp16", [5], "b")}, "bias"),
        ({"groups": 0}, "groups"),
        ({"x": var("fp16", [1, 4])}, "rank 2"),
    ],
)
def test_conv_errors(kwargs: dict, needle: str) -> None:
    args = {"x": var("fp16", [1, 4, 8, 8]), "weight": var("fp16", [4, 4, 3, 3], "w"), **kwargs}
    with pytest.raises(MilTypeError, match=r"\[conv\].*" + needle):
        infer_op("conv", **args)


# -- conv_transpose ----------------------------------------------------------------------------------


def loop_conv_transpose(x, w, b, strides, befores, outs, dil, groups):
    """Scatter every input element through the kernel, then read the window [before, before + out)."""
    n, c_in, *dims = x.shape
    _, cog, *ks = w.shape
    cig = c_in // groups
    c_out = cog * groups
    full = [(d - 1) * s + (k - 1) * dl + 1 for d, s, k, dl in zip(dims, strides, ks, dil)]
    buf = np.zeros([n, c_out, *full])
    for ni, ci, *i in itertools.product(range(n), range(c_in), *(range(d) for d in dims)):
        g = ci // cig
        for co, kk in itertools.product(range(cog), itertools.product(*(range(k) for k in ks))):
            pos = tuple(ii * s + ki * dl for ii, ki, s, dl in zip(i, kk, strides, dil))
            buf[(ni, g * cog + co, *pos)] += x[(ni, ci, *i)] * w[(ci, co, *kk)]
    y = np.zeros([n, c_out, *outs])
    for idx in itertools.product(*(range(v) for v in outs)):
        src = tuple(o + bf for o, bf in zip(idx, befores))
        if all(0 <= p < f for p, f in zip(src, full)):
            y[(slice(None), slice(None), *idx)] = buf[(slice(None), slice(None), *src)]
    if b is not None:
        y += b.reshape((1, -1) + (1,) * len(dims))
    return y


CONVT_CASES = [
    # x shape, weight shape, strides, pad_type, pad, dilations, groups, output_padding, output_shape
    ((1, 3, 5), (3, 2, 3), [2], "valid", None, [1], 1, None, None),
    ((2, 4, 4), (4, 3, 3), [2], "custom", [1, 1], [1], 2, [1], None),
    ((1, 2, 3, 4), (2, 3, 3, 3), [2, 2], "same", None, [1, 1], 1, None, None),
    ((1, 2, 3, 4), (2, 3, 4, 2), [2, 3], "same_lower", None, [1, 1], 1, None, None),
    ((1, 2, 3, 3), (2, 2, 3, 3), [2, 2], "custom", [1, 1, 0, 2], [1, 2], 1, None, None),
    ((1, 2, 3, 3), (2, 2, 3, 3), [2, 2], "custom", [1, 1, 1, 1], [1, 1], 1, None, [1, 2, 6, 6]),
    ((1, 2, 3, 3), (2, 1, 3, 3), [2, 2], "same", None, [1, 1], 2, None, [7, 6]),
    ((1, 2, 2, 3, 2), (2, 2, 2, 2, 2), [1, 2, 2], "valid", None, [1, 1, 1], 1, None, None),
]


@pytest.mark.parametrize(
    ("xs", "ws", "strides", "pad_type", "pad", "dil", "groups", "opad", "oshape"), CONVT_CASES
)
def test_conv_transpose_reference(xs, ws, strides, pad_type, pad, dil, groups, opad, oshape) -> None:
    x, w = RNG.normal(size=xs), RNG.normal(size=ws)
    b = RNG.normal(size=ws[1] * groups)
    kwargs = {"strides": strides, "pad_type": pad_type, "dilations": dil, "groups": groups, "bias": b}
    nsp = len(xs) - 2
    for key, val in (("pad", pad), ("output_padding", opad), ("output_shape", oshape)):
        if val is not None:
            kwargs[key] = val
    (out,) = run_op("conv_transpose", x=x, weight=w, **kwargs)
    dk = [(k - 1) * dl + 1 for k, dl in zip(ws[2:], dil)]
    opad = opad or [0] * nsp
    pads = [(pad[2 * i], pad[2 * i + 1]) for i in range(nsp)] if pad_type == "custom" else [(0, 0)] * nsp
    if oshape is not None:
        outs = list(oshape[-nsp:])
    elif pad_type.startswith("same"):
        outs = [d * s + p for d, s, p in zip(xs[2:], strides, opad)]
    else:
        outs = [
            (d - 1) * s + k - pb - pa + p for d, s, k, (pb, pa), p in zip(xs[2:], strides, dk, pads, opad)
        ]
    if pad_type.startswith("same"):
        # the padding conv would use on an input of the output's size (before the output padding)
        base = outs if oshape is not None else [d * s for d, s in zip(xs[2:], strides)]
        befores = [
            same_pad(o, k, s, dl, pad_type == "same_lower")[0]
            for o, k, s, dl in zip(base, ws[2:], strides, dil)
        ]
    else:
        befores = [pb for pb, _ in pads]
    want = loop_conv_transpose(x, w, b, strides, befores, outs, dil, groups)
    np.testing.assert_allclose(out, want, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize(
    ("zs", "ws", "strides", "pad", "dil", "groups"),
    [
        ((1, 3, 9), (4, 3, 3), [2], [1, 2], [1], 1),
        ((2, 4, 7, 6), (6, 2, 3, 2), [2, 3], [1, 0, 2, 1], [1, 2], 2),
    ],
)
def test_conv_transpose_is_adjoint_of_conv(zs, ws, strides, pad, dil, groups) -> None:
    """<conv(z, w), x> == <conv_transpose(x, w), z>: conv_transpose is conv's adjoint."""
    z, w = RNG.normal(size=zs), RNG.normal(size=ws)
    geo = {"strides": strides, "pad_type": "custom", "pad": pad, "dilations": dil, "groups": groups}
    (cz,) = run_op("conv", x=z, weight=w, **geo)
    x = RNG.normal(size=cz.shape)
    # conv weight [C_out, C_in/g, K] read as conv_transpose weight [C_in', C_out'/g, K]
    (tx,) = run_op("conv_transpose", x=x, weight=w, output_shape=list(zs), **geo)
    assert tx.shape == z.shape
    np.testing.assert_allclose(np.sum(cz * x), np.sum(tx * z), rtol=1e-10)


def test_conv_transpose_infer() -> None:
    (t,) = infer_op(
        "conv_transpose",
        x=var("fp16", ["B", 8, 16, 16]),
        weight=var("fp16", [8, 4, 4, 4], "w"),
        strides=[2, 2],
        pad_type="same",
    )
    assert t == T.tensor("fp16", ["B", 4, 32, 32])
    (t,) = infer_op(
        "conv_transpose",
        x=var("fp16", [1, 8, "S"]),
        weight=np.ones((8, 2, 3), np.float32),
        pad_type="custom",
        pad=[1, 1],
        groups=4,
    )
    assert t == T.tensor("fp16", [1, 8, "?"])
    (t,) = infer_op(
        "conv_transpose",
        x=var("fp32", [1, 8, 5]),
        weight=var("fp32", [8, 2, 3], "w"),
        strides=[2],
        output_padding=[1],
    )
    assert t == T.tensor("fp32", [1, 2, 12])  # (5-1)*2 + 3 + 1
    (t,) = infer_op(
        "conv_transpose", x=var("fp32", [1, 8, 5]), weight=var("fp32", [8, 2, 3], "w"), output_shape=[1, 2, 9]
    )
    assert t == T.tensor("fp32", [1, 2, 9])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"weight": var("fp16", [3, 2, 3], "w")}, "first dim"),
        ({"groups": 3}, "not divisible"),
        ({"output_shape": [1, 5, 9]}, "channels"),
        ({"output_shape": [1, 2, 9, 9]}, "output_shape must have"),
        ({"pad_type": "custom", "pad": [3, 3], "strides": [1]}, "leaves no output"),
        ({"output_padding": [-1]}, "output_padding"),
        ({"bias": var("fp16", [4], "b")}, "bias"),
        ({"pad_type": "bogus"}, "pad_type"),
    ],
)
def test_conv_transpose_errors(kwargs: dict, needle: str) -> None:
    args = {"x": var("fp16", [1, 4, 2]), "weight": var("fp16", [4, 2, 3], "w"), **kwargs}
    with pytest.raises(MilTypeError, match=r"\[conv_transpose\].*" + needle):
        infer_op("conv_transpose", **args)
