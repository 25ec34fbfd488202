"""scaled_dot_product_attention: reference against a per-row loop, type rules, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anekit.errors import MilTypeError
from anekit.mil import types as T
from tests.op_harness import infer_op, run_op, var

RNG = np.random.default_rng(2024)


def loop_sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    *batch, n_l, e = q.shape
    n_s, ev = k.shape[-2], v.shape[-1]
    full_mask = None if mask is None else np.broadcast_to(mask, (*batch, n_l, n_s))
    out = np.zeros((*batch, n_l, ev))
    for b in np.ndindex(*batch):
        for i in range(n_l):
            scores = []
            for j in range(n_s):
                sc = math.fsum(q[(*b, i, t)] * k[(*b, j, t)] for t in range(e)) / math.sqrt(e)
                if full_mask is not None:
                    m = full_mask[(*b, i, j)]
                    if full_mask.dtype == np.bool_:
                        sc = sc if m else -math.inf
                    else:
                        sc += float(m)
                scores.append(sc)
            top = max(scores)
            ex = [math.exp(sc - top) if sc != -math.inf else 0.0 for sc in scores]
            total = math.fsum(ex)
            for c in range(ev):
                out[(*b, i, c)] = math.fsum(ex[j] / total * v[(*b, j, c)] for j in range(n_s))
    return out


SHAPES = [
    # batch dims, L, S, E, EV
    ((2,), 3, 4, 5, 2),
    ((2, 3), 4, 5, 3, 6),
    ((1, 2, 2), 2, 3, 4, 3),
]


@pytest.mark.parametrize(("batch", "n_l", "n_s", "e", "ev"), SHAPES)
def test_sdpa_reference_no_mask(batch: tuple, n_l: int, n_s: int, e: int, ev: int) -> None:
    q = RNG.normal(size=(*batch, n_l, e))
    k = RNG.normal(size=(*batch, n_s, e))
    v = RNG.normal(size=(*batch, n_s, ev))
    (out,) = run_op("scaled_dot_product_attention", query=q, key=k, value=v)
    np.testing.assert_allclose(out, loop_sdpa(q, k, v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mask_shape", ["full", "ls", "s", "b11s"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_reference_masks(mask_shape: str, kind: str) -> None:
    batch, n_l, n_s, e = (2, 3), 4, 5, 6
    q = RNG.normal(size=(*batch, n_l, e))
    k = RNG.normal(size=(*batch, n_s, e))
    v = RNG.normal(size=(*batch, n_s, 3))
    shape = {"full": (*batch, n_l, n_s), "ls": (n_l, n_s), "s": (n_s,), "b11s": (2, 1, 1, n_s)}[mask_shape]
    if kind == "bool":
        mask = RNG.random(shape) < 0.7
        mask[..., 0] = True  # keep every row non-empty
    else:
        mask = RNG.normal(size=shape) * 3.0
    (out,) = run_op("scaled_dot_product_attention", query=q, key=k, value=v, attn_mask=mask)
    np.testing.assert_allclose(out, loop_sdpa(q, k, v, mask), rtol=1e-12, atol=1e-12)


def test_sdpa_causal_bool_mask_matches_additive() -> None:
    q, k, v = (RNG.normal(size=(1, 2, 4, 8)) for _ in range(3))
    causal = np.tril(np.ones((4, 4), dtype=bool))
    additive = np.where(causal, 0.0, -1e9)
    (a,) = run_op("scaled_dot_product_attention", query=q, key=k, value=v, attn_mask=causal)
    (b,) = run_op("scaled_dot_product_attention", query=q, key=k, value=v, attn_mask=additive)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a[..., 0, :], v[..., 0, :], rtol=1e-12)  # the first query sees only key 0


def test_sdpa_infer() -> None:
    (t,) = infer_op(
        "scaled_dot_product_attention",
        query=var("fp16", ["B", 12, "L", 64], "q"),
        key=var("fp16", ["B", 12, "S", 64], "k"),
        value=var("fp16", ["B", 12, "S", 32], "v"),
        attn_mask=var("bool", ["L", "S"], "m"),
    )
    assert t == T.tensor("fp16", ["B", 12, "L", 32])
    (t,) = infer_op(
        "scaled_dot_product_attention",
        query=var("fp32", [2, 7, 16], "q"),
        key=var("fp32", [2, 9, 16], "k"),
        value=var("fp32", [2, 9, 16], "v"),
        attn_mask=var("fp16", [1, 7, 9], "m"),
    )
    assert t == T.tensor("fp32", [2, 7, 16])


@pytest.mark.parametrize(
    ("shapes", "needle"),
    [
        (([2, 3, 4], [2, 5, 4], [2, 5, 4, 1]), "share one rank"),
        (([3, 4], [5, 4], [5, 4]), "rank >= 3"),
        (([2, 3, 4], [2, 5, 6], [2, 5, 4]), "embedding size"),
        (([2, 3, 4], [2, 5, 4], [2, 6, 4]), "sequence length"),
        (([2, 3, 4], [3, 5, 4], [3, 5, 4]), "batch dims"),
        (([2, 3, 4], [2, 5, 4], [2, 5, 4], [3, 6]), "attn_mask shape"),
        (([2, 3, 4], [2, 5, 4], [2, 5, 4], [4, 3, 5]), "attn_mask shape"),
        (([2, 3, 4], [2, 5, 4], [2, 5, 4], [1, 2, 3, 5]), "attn_mask must have rank"),
    ],
)
def test_sdpa_errors(shapes: tuple, needle: str) -> None:
    names = ("query", "key", "value", "attn_mask")
    args = {n: var("fp16", s, n) for n, s in zip(names, shapes)}
    with pytest.raises(MilTypeError, match=r"\[scaled_dot_product_attention\].*" + needle):
        infer_op("scaled_dot_product_attention", **args)


@pytest.mark.parametrize(
    ("dtypes", "needle"),
    [
        (("fp16", "fp32", "fp16", None), "share one dtype"),
        (("fp16", "fp16", "fp16", "int32"), "attn_mask' has dtype int32"),
        (("int32", "int32", "int32", None), "dtype int32"),
    ],
)
def test_sdpa_dtype_errors(dtypes: tuple, needle: str) -> None:
    names = ("query", "key", "value", "attn_mask")
    shapes = ([1, 2, 4], [1, 3, 4], [1, 3, 4], [2, 3])
    args = {n: var(d, s, n) for n, d, s in zip(names, dtypes, shapes) if d is not None}
    with pytest.raises(MilTypeError, match=r"\[scaled_dot_product_attention\].*" + needle):
        infer_op("scaled_dot_product_attention", **args)
