"""Pooling and normalization ops: references against explicit loops, type rules, errors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from anekit.errors import MilTypeError
from anekit.mil import types as T
from tests.op_harness import infer_op, run_op, var

RNG = np.random.default_rng(99)


# -- pooling -----------------------------------------------------------------------------------------


def pool_geometry(dims, ks, strides, pad_type, pad, ceil_mode):
    pads, outs = [], []
    for i, (d, k, s) in enumerate(zip(dims, ks, strides)):
        if pad_type in ("same", "same_lower"):
            o = math.ceil(d / s)
            total = max(0, (o - 1) * s + k - d)
            lo, hi = total // 2, total - total // 2
            pads.append((hi, lo) if pad_type == "same_lower" else (lo, hi))
            outs.append(o)
            continue
        b, e = (pad[2 * i], pad[2 * i + 1]) if pad_type == "custom" else (0, 0)
        if ceil_mode:
            o = math.ceil((d + b + e - k) / s) + 1
            if (o - 1) * s >= d + b:
                o -= 1
        else:
            o = (d + b + e - k) // s + 1
        pads.append((b, e))
        outs.append(o)
    return pads, outs


def loop_pool(x, kind, ks, strides, pad_type, pad=None, ceil_mode=False, exclude=False):
    n, c, *dims = x.shape
    pads, outs = pool_geometry(dims, ks, strides, pad_type, pad, ceil_mode)
    y = np.zeros([n, c, *outs])
    for ni, ci, *o in itertools.product(range(n), range(c), *(range(v) for v in outs)):
        vals, count = [], 0
        for kk in itertools.product(*(range(k) for k in ks)):
            pos = [oi * s + ki - b for oi, ki, s, (b, _) in zip(o, kk, strides, pads)]
            if all(0 <= p < d for p, d in zip(pos, dims)):
                vals.append(x[(ni, ci, *pos)])
                count += 1
            elif all(-b <= p < d + e for p, d, (b, e) in zip(pos, dims, pads)) and not exclude:
                count += 1  # a padded zero inside the declared padding
        if kind == "max":
            v = max(vals)
        elif kind == "avg":
            v = math.fsum(vals) / count
        else:
            v = math.sqrt(math.fsum(t * t for t in vals))
        y[(ni, ci, *o)] = v
    return y


POOL_CASES = [
    # x shape, kernel, strides, pad_type, pad, ceil_mode
    ((1, 2, 4, 6), [2, 2], [2, 2], "valid", None, False),
    ((2, 2, 5, 6), [3, 3], [2, 2], "custom", [1, 1, 0, 1], False),
    ((1, 3, 5, 7), [3, 3], [2, 2], "same", None, False),
    ((1, 2, 7), [4], [1], "same_lower", None, False),
    ((1, 2, 9), [3], [2], "same", None, False),
    ((1, 2, 5, 5), [2, 2], [2, 2], "valid", None, True),
    ((1, 2, 6, 6), [3, 3], [2, 2], "custom", [1, 1, 1, 1], True),
    ((1, 1, 7), [2], [3], "custom", [1, 1], True),
    ((1, 2, 3, 4, 5), [2, 2, 2], [1, 2, 1], "valid", None, False),
    ((1, 1, 4, 5, 3), [2, 3, 2], [2, 2, 2], "custom", [1, 0, 1, 1, 0, 1], False),
]


POOL_KINDS = [
    ("max_pool", "max", False),
    ("avg_pool", "avg", False),
    ("avg_pool", "avg", True),
    ("l2_pool", "l2", False),
]
POOL_PARAMS = [
    (*case, *kind)
    for case in POOL_CASES
    for kind in POOL_KINDS
    if not (kind[0] == "l2_pool" and len(case[0]) == 5)  # l2_pool takes 1 or 2 spatial dims
]


@pytest.mark.parametrize(
    ("xs", "ks", "strides", "pad_type", "pad", "ceil_mode", "op", "kind", "exclude"), POOL_PARAMS
)
def test_pool_reference(xs, ks, strides, pad_type, pad, ceil_mode, op, kind, exclude) -> None:
    x = RNG.normal(size=xs)
    kwargs = {"kernel_sizes": ks, "strides": strides, "pad_type": pad_type, "ceil_mode": ceil_mode}
    if pad is not None:
        kwargs["pad"] = pad
    if op == "avg_pool":
        kwargs["exclude_padding_from_average"] = exclude
    (out,) = run_op(op, x=x, **kwargs)
    want = loop_pool(x, kind, ks, strides, pad_type, pad, ceil_mode, exclude)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_pool_ceil_mode_counts_only_declared_padding() -> None:
    x = np.arange(5.0).reshape(1, 1, 5)
    (out,) = run_op("avg_pool", x=x, kernel_sizes=[2], strides=[2], pad_type="valid", ceil_mode=True)
    assert out.tolist() == [[[0.5, 2.5, 4.0]]]
    (out,) = run_op("max_pool", x=-x, kernel_sizes=[2], strides=[2], pad_type="custom", pad=[1, 1])
    assert out.tolist() == [[[0.0, -1.0, -3.0]]]  # the padding never wins a max


def test_pool_infer() -> None:
    for op in ("max_pool", "avg_pool", "l2_pool"):
        (t,) = infer_op(
            op, x=var("fp16", ["B", 8, "H", 16]), kernel_sizes=[2, 2], strides=[2, 2], pad_type="valid"
        )
        assert t == T.tensor("fp16", ["B", 8, "?", 8]), op
        (t,) = infer_op(op, x=var("fp16", ["B", 8, "H", 16]), kernel_sizes=[3, 3], pad_type="same")
        assert t == T.tensor("fp16", ["B", 8, "H", 16]), op
    (t,) = infer_op(
        "max_pool",
        x=var("fp32", [1, 4, 6, 6]),
        kernel_sizes=[3, 3],
        strides=[2, 2],
        pad_type="custom",
        pad=[1, 1, 1, 1],
        ceil_mode=True,
    )
    assert t == T.tensor("fp32", [1, 4, 4, 4])  # torch gives 4 (floor gives 3)
    (t,) = infer_op("avg_pool", x=var("fp32", [1, 4, 2, 3, 4]), kernel_sizes=[1, 1, 1], pad_type="valid")
    assert t == T.tensor("fp32", [1, 4, 2, 3, 4])


@pytest.mark.parametrize(
    ("op", "kwargs", "needle"),
    [
        ("max_pool", {"kernel_sizes": [2]}, "kernel_sizes must have 2 values"),
        ("max_pool", {"kernel_sizes": [2, 0]}, "kernel_sizes must all be >= 1"),
        ("avg_pool", {"pad_type": "full"}, "pad_type"),
        ("avg_pool", {"pad_type": "same", "ceil_mode": True}, "ceil_mode"),
        ("max_pool", {"kernel_sizes": [9, 2]}, "smaller than the kernel"),
        ("l2_pool", {"x": var("fp16", [1, 2, 4, 4, 4]), "kernel_sizes": [2, 2, 2]}, "rank 5"),
        ("max_pool", {"pad_type": None}, "missing required input 'pad_type'"),
        ("avg_pool", {"strides": var("int32", [2])}, "constant"),
        ("max_pool", {"x": var("int32", [1, 2, 8, 8])}, "dtype int32"),
        ("avg_pool", {"pad_type": "custom", "pad": [1, 1, 1]}, "pad must have 4 values"),
    ],
)
def test_pool_errors(op: str, kwargs: dict, needle: str) -> None:
    args = {"x": var("fp16", [1, 2, 8, 8]), "kernel_sizes": [2, 2], "pad_type": "valid", **kwargs}
    args = {k: v for k, v in args.items() if v is not None}
    with pytest.raises(MilTypeError, match=rf"\[{op}\].*" + needle):
        infer_op(op, **args)


# -- normalization -----------------------------------------------------------------------------------


def _stats(vals: list[float]) -> tuple[float, float]:
    m = math.fsum(vals) / len(vals)
    return m, math.fsum((v - m) ** 2 for v in vals) / len(vals)


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 3, 2, 5), (2, 2, 2, 3, 2)])
@pytest.mark.parametrize("affine", [False, True])
def test_batch_norm_reference(shape: tuple, affine: bool) -> None:
    x = RNG.normal(size=shape)
    c = shape[1]
    mean, var_ = RNG.normal(size=c), RNG.uniform(0.5, 2.0, size=c)
    gamma, beta = RNG.normal(size=c), RNG.normal(size=c)
    kwargs = {"gamma": gamma, "beta": beta} if affine else {}
    (out,) = run_op("batch_norm", x=x, mean=mean, variance=var_, epsilon=1e-3, **kwargs)
    want = np.zeros(shape)
    for idx in np.ndindex(*shape):
        ch = idx[1]
        v = (x[idx] - mean[ch]) / math.sqrt(var_[ch] + 1e-3)
        want[idx] = v * gamma[ch] + beta[ch] if affine else v
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5)])
@pytest.mark.parametrize("affine", [False, True])
def test_instance_norm_reference(shape: tuple, affine: bool) -> None:
    x = RNG.normal(size=shape)
    gamma, beta = RNG.normal(size=shape[1]), RNG.normal(size=shape[1])
    kwargs = {"gamma": gamma, "beta": beta} if affine else {}
    (out,) = run_op("instance_norm", x=x, **kwargs)
    want = np.zeros(shape)
    for n, ch in np.ndindex(*shape[:2]):
        m, v = _stats([float(t) for t in x[n, ch].ravel()])
        y = (x[n, ch] - m) / math.sqrt(v + 1e-5)
        want[n, ch] = y * gamma[ch] + beta[ch] if affine else y
    np.testing.assert_allclose(out, want, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize(
    ("shape", "axes"), [((2, 3, 4), [-1]), ((2, 3, 4), [1, 2]), ((2, 3, 4), [2, 0]), ((3, 5), None)]
)
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_reference(shape: tuple, axes: list[int] | None, affine: bool) -> None:
    x = RNG.normal(size=shape)
    red = list(range(len(shape))) if axes is None else sorted(a % len(shape) for a in axes)
    norm_shape = [shape[i] for i in red]
    gamma, beta = RNG.normal(size=norm_shape), RNG.normal(size=norm_shape)
    kwargs = {} if axes is None else {"axes": axes}
    if affine:
        kwargs.update(gamma=gamma, beta=beta)
    (out,) = run_op("layer_norm", x=x, epsilon=1e-4, **kwargs)
    kept = [i for i in range(len(shape)) if i not in red]
    want = np.zeros(shape)
    for kidx in itertools.product(*(range(shape[i]) for i in kept)):
        full_idx = []
        for ridx in itertools.product(*(range(shape[i]) for i in red)):
            env = dict(zip(kept, kidx)) | dict(zip(red, ridx))
            full_idx.append((tuple(env[i] for i in range(len(shape))), ridx))
        m, v = _stats([float(x[i]) for i, _ in full_idx])
        for i, ridx in full_idx:
            y = (x[i] - m) / math.sqrt(v + 1e-4)
            want[i] = y * gamma[ridx] + beta[ridx] if affine else y
    np.testing.assert_allclose(out, want, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 2, 3, 2)])
def test_l2_norm_reference(shape: tuple) -> None:
    x = RNG.normal(size=shape)
    (out,) = run_op("l2_norm", x=x, epsilon=1e-3)
    want = np.zeros(shape)
    for lead in np.ndindex(*shape[:-3]):
        block = x[lead]
        norm = math.sqrt(math.fsum(float(t) ** 2 for t in block.ravel()) + 1e-3)
        want[lead] = block / norm
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def loop_lrn(x: np.ndarray, size: int, alpha: float, beta: float, k: float) -> np.ndarray:
    want = np.zeros(x.shape)
    c = x.shape[1]
    for n, ch, h, w in np.ndindex(*x.shape):
        lo, hi = max(0, ch - size // 2), min(c - 1, ch + (size - 1) // 2)
        s = math.fsum(x[n, j, h, w] ** 2 for j in range(lo, hi + 1))
        want[n, ch, h, w] = x[n, ch, h, w] / (k + alpha / size * s) ** beta
    return want


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_local_response_norm_reference(size: int) -> None:
    x = RNG.normal(size=(2, 6, 3, 2))
    (out,) = run_op("local_response_norm", x=x, size=size, alpha=0.5, beta=0.6, k=2.0)
    np.testing.assert_allclose(out, loop_lrn(x, size, 0.5, 0.6, 2.0), rtol=1e-12, atol=1e-12)
    (out,) = run_op("local_response_norm", x=x, size=size)  # defaults alpha=1e-4, beta=0.75, k=1
    np.testing.assert_allclose(out, loop_lrn(x, size, 1e-4, 0.75, 1.0), rtol=1e-12, atol=1e-12)


def test_norm_infer() -> None:
    x = var("fp16", ["B", 64, 1, "S"])
    c = var("fp32", [64], "c")
    assert infer_op("batch_norm", x=x, mean=c, variance=c, gamma=c, beta=c)[0] == x.type
    assert infer_op("instance_norm", x=x, gamma=c, beta=c, epsilon=1e-3)[0] == x.type
    assert infer_op("layer_norm", x=var("fp16", ["B", "S", 64]), axes=[-1], gamma=c, beta=c)[0] == T.tensor(
        "fp16", ["B", "S", 64]
    )
    assert infer_op("layer_norm", x=var("fp16", [2, "S"]), gamma=var("fp16", [2, 7], "g"))[0] == T.tensor(
        "fp16", [2, "S"]
    )
    assert infer_op("l2_norm", x=x)[0] == x.type
    assert infer_op("local_response_norm", x=x, size=5)[0] == x.type


@pytest.mark.parametrize(
    ("op", "kwargs", "needle"),
    [
        (
            "batch_norm",
            {"x": var("fp16", [1, 4, 8]), "mean": var("fp16", [3], "m"), "variance": var("fp16", [4], "v")},
            "mean must have shape",
        ),
        (
            "batch_norm",
            {"x": var("fp16", [1, 4]), "mean": var("fp16", [4], "m"), "variance": var("fp16", [4], "v")},
            "rank 2",
        ),
        (
            "batch_norm",
            {"x": var("fp16", [1, 4, 2]), "mean": var("fp16", [4], "m"), "variance": var("fp32", [4], "v")},
            "share one dtype",
        ),
        (
            "instance_norm",
            {"x": var("fp16", [1, 4, 8]), "beta": var("fp16", [4, 1], "b")},
            "beta must have shape",
        ),
        (
            "instance_norm",
            {"x": var("fp16", [1, 4, 8]), "epsilon": np.array([1e-5, 1e-5])},
            "epsilon must be a scalar",
        ),
        ("layer_norm", {"x": var("fp16", [2, 3, 4]), "axes": [3]}, "out of range"),
        (
            "layer_norm",
            {"x": var("fp16", [2, 3, 4]), "axes": [-1], "gamma": var("fp16", [3], "g")},
            "gamma must have shape",
        ),
        ("layer_norm", {"x": var("int32", [2, 3])}, "dtype int32"),
        ("l2_norm", {"x": var("fp16", [4, 8])}, "rank 3 or more"),
        ("local_response_norm", {"x": var("fp16", [1, 4, 8]), "size": 0}, "size must be >= 1"),
        ("local_response_norm", {"x": var("fp16", [1, 4, 8])}, "missing required input 'size'"),
    ],
)
def test_norm_errors(op: str, kwargs: dict, needle: str) -> None:
    with pytest.raises(MilTypeError, match=rf"\[{op}\].*" + needle):
        infer_op(op, **kwargs)
