"""Tests of the tensor shape and data-movement ops: numpy references, type rules and errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from anekit.errors import MilTypeError
from anekit.mil import types as T
from tests.op_harness import infer_op, run_op, var

RNG = np.random.default_rng(1234)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def shape_of(op: str, **inputs) -> tuple:
    (t,) = infer_op(op, **inputs)
    return t.shape


def bad(op: str, match: str = "", **inputs) -> None:
    with pytest.raises(MilTypeError, match=rf"^\[{op}\].*{match}") as info:
        infer_op(op, **inputs)
    assert info.value.op == op


# -- reshape -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("xshape", "target", "expected"),
    [
        ((2, 3, 4), [4, -1], (4, 6)),
        ((2, 3, 4), [24], (24,)),
        ((1, 64, 1, 16), [1, 4, 16, 16], (1, 4, 16, 16)),
        ((2, 50), [1, 0, -1, 0], (1, 1, 2, 50)),  # iOS17: zeros align from the right
        ((4, 3, 2), [0, 0, -1], (4, 3, 2)),  # K == rank: iOS15 and iOS17 agree
        ((6,), [0, 1, -1], (1, 1, 6)),
    ],
)
def test_reshape_reference(xshape, target, expected):
    x = rand(*xshape)
    (out,) = run_op("reshape", x=x, shape=np.array(target))
    assert out.shape == expected
    flat_in = [x[i] for i in itertools.product(*map(range, xshape))]
    flat_out = [out[i] for i in itertools.product(*map(range, expected))]
    assert flat_in == flat_out


def test_reshape_types():
    assert shape_of("reshape", x=var("fp16", [1, "s", 64]), shape=np.array([1, 0, -1])) == (1, "s", 64)
    assert shape_of("reshape", x=var("fp16", ["s", 4]), shape=np.array([2, 2, -1])) == (2, 2, "s")
    assert shape_of("reshape", x=var("fp16", ["s", 4]), shape=np.array([-1])) == ("?",)
    assert shape_of("reshape", x=var("fp16", [2, 3]), shape=var("int32", [3])) == ("?", "?", "?")
    (t,) = infer_op("reshape", x=var("int8", [4, 4]), shape=np.array([16], dtype=np.int16))
    assert t == T.tensor("int8", [16])


@pytest.mark.parametrize(
    ("target", "match"),
    [([-1, -1], "more than one -1"), ([5, 5], "element counts"), ([5, -1], "divide"), ([-2, 12], "negative")],
)
def test_reshape_errors(target, match):
    bad("reshape", match, x=var("fp32", [2, 3, 4]), shape=np.array(target))


def test_reshape_error_unknown_rank():
    bad("reshape", "unknown length", x=var("fp32", [2, 3]), shape=var("int32", ["k"]))


# -- transpose / expand_dims / squeeze / flatten2d ----------------------------------------------------


@pytest.mark.parametrize("perm", [[0, 1, 3, 2], [3, 2, 1, 0], [1, 0, 2, 3], [0, -1, 1, -2]])
def test_transpose_reference(perm):
    x = rand(2, 3, 4, 5)
    (out,) = run_op("transpose", x=x, perm=perm)
    p = [v % 4 for v in perm]
    assert out.shape == tuple(x.shape[k] for k in p)
    for o in itertools.product(*map(range, out.shape)):
        src = [0] * 4
        for k in range(4):
            src[p[k]] = o[k]
        assert out[o] == x[tuple(src)]


def test_transpose_attention_heads():
    heads, hd, seq = 2, 3, 4
    x = rand(1, heads * hd, 1, seq)
    (r,) = run_op("reshape", x=x, shape=[1, heads, hd, seq])
    (out,) = run_op("transpose", x=r, perm=[0, 1, 3, 2])
    for h, d, s in itertools.product(range(heads), range(hd), range(seq)):
        assert out[0, h, s, d] == x[0, h * hd + d, 0, s]
    assert shape_of("transpose", x=var("fp16", [1, "h", 64, "s"]), perm=[0, 1, 3, 2]) == (1, "h", "s", 64)


@pytest.mark.parametrize(
    ("perm", "match"), [([0, 1], "entries"), ([0, 0, 1], "repeat"), ([0, 1, 3], "out of range")]
)
def test_transpose_errors(perm, match):
    bad("transpose", match, x=var("fp16", [2, 3, 4]), perm=perm)


def test_transpose_perm_must_be_const():
    bad("transpose", "constant", x=var("fp16", [2, 3]), perm=var("int32", [2]))


def test_expand_dims():
    x = rand(2, 3)
    (out,) = run_op("expand_dims", x=x, axes=[0, -1])
    assert out.shape == (1, 2, 3, 1)
    for i, j in itertools.product(range(2), range(3)):
        assert out[0, i, j, 0] == x[i, j]
    (s,) = run_op("expand_dims", x=np.float64(2.5), axes=[0])
    assert s.shape == (1,) and s[0] == 2.5
    assert shape_of("expand_dims", x=var("fp16", ["s", 8]), axes=[1]) == ("s", 1, 8)
    bad("expand_dims", "out of range", x=var("fp16", [2, 3]), axes=[3])
    bad("expand_dims", "repeat", x=var("fp16", [2, 3]), axes=[0, -4])


def test_squeeze():
    x = rand(1, 3, 1, 2)
    for axes in ([0, 2], [-2, 0], None):
        kw = {} if axes is None else {"axes": axes}
        (out,) = run_op("squeeze", x=x, **kw)
        assert out.shape == (3, 2)
        assert all(out[i, j] == x[0, i, 0, j] for i in range(3) for j in range(2))
    (s,) = run_op("squeeze", x=np.ones((1, 1)) * 4.0)
    assert s.shape == () and s == 4.0
    assert shape_of("squeeze", x=var("fp16", ["s", 1, 4])) == ("s", 4)
    assert shape_of("squeeze", x=var("fp16", ["s", 1, 4]), axes=[0]) == (1, 4)
    bad("squeeze", "size 3", x=var("fp16", [1, 3]), axes=[1])
    bad("squeeze", "out of range", x=var("fp16", [1, 3]), axes=[2])


@pytest.mark.parametrize(
    ("xshape", "axis", "expected"),
    [
        ((3,), -1, (1, 3)),
        ((3,), 1, (3, 1)),
        ((4, 3), -1, (4, 3)),
        ((2, 3, 2), -1, (6, 2)),
        ((5, 5, 2), 1, (5, 10)),
    ],
)
def test_flatten2d(xshape, axis, expected):
    x = rand(*xshape)
    (out,) = run_op("flatten2d", x=x, axis=axis)
    assert out.shape == expected
    assert list(out.ravel()) == [x[i] for i in itertools.product(*map(range, xshape))]


def test_flatten2d_types_and_errors():
    assert shape_of("flatten2d", x=var("fp32", ["s", 3, 4])) == ("s", 12)
    assert shape_of("flatten2d", x=var("fp32", [2, "s", 4]), axis=2) == ("?", 4)
    bad("flatten2d", "out of range", x=var("fp32", [2, 3]), axis=3)


# -- concat / split / stack --------------------------------------------------------------------------


def test_concat_reference():
    a, b, c = rand(2, 1, 3), rand(2, 4, 3), rand(2, 2, 3)
    (out,) = run_op("concat", values=(a, b, c), axis=1)
    expected = np.zeros((2, 7, 3))
    expected[:, 0:1], expected[:, 1:5], expected[:, 5:7] = a, b, c
    assert out.shape == (2, 7, 3) and np.array_equal(out, expected)


def test_concat_interleave_documented_example():
    in1 = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float64)
    in2 = np.array([[7, 8], [9, 10], [11, 12]], dtype=np.float64)
    (plain,) = run_op("concat", values=(in1, in2), axis=0)
    (inter,) = run_op("concat", values=(in1, in2), axis=0, interleave=True)
    assert plain.tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]
    assert inter.tolist() == [[1, 2], [7, 8], [3, 4], [9, 10], [5, 6], [11, 12]]


@pytest.mark.parametrize("interleave", [False, True])
def test_concat_ane_channel_pack(interleave):
    chans, seq = 4, 5
    vals = tuple(rand(1, chans, 1, seq) for _ in range(6))
    (out,) = run_op("concat", values=vals, axis=1, interleave=interleave)
    assert out.shape == (1, 6 * chans, 1, seq)
    for k, v in enumerate(vals):
        for c in range(chans):
            dst = c * 6 + k if interleave else k * chans + c
            assert np.array_equal(out[0, dst], v[0, c])


def test_concat_types():
    (t,) = infer_op("concat", values=(var("fp16", [1, 4, 1, "s"]), var("fp16", [1, 8, 1, "s"])), axis=1)
    assert t == T.tensor("fp16", [1, 12, 1, "s"])
    assert shape_of("concat", values=(var("fp16", ["a", 2]), var("fp16", [3, 2])), axis=0) == ("?", 2)
    assert shape_of("concat", values=(var("fp16", ["a", 2]), var("fp16", ["a", 2])), axis=1) == ("a", 4)
    assert shape_of("concat", values=(var("fp16", [2, 3]),) * 3, axis=-1, interleave=True) == (2, 9)


def test_concat_errors():
    bad("concat", "must match", values=(var("fp16", [2, 3]), var("fp16", [3, 3])), axis=1)
    bad("concat", "same shape", values=(var("fp16", [2, 3]), var("fp16", [2, 4])), axis=1, interleave=True)
    bad("concat", "one rank", values=(var("fp16", [2, 3]), var("fp16", [2, 3, 1])), axis=0)
    bad("concat", "out of range", values=(var("fp16", [2, 3]), var("fp16", [2, 3])), axis=2)
    bad("concat", "share one dtype", values=(var("fp16", [2, 3]), var("fp32", [2, 3])), axis=0)


@pytest.mark.parametrize(
    ("kw", "bounds"), [({"num_splits": 3}, [0, 2, 4, 6]), ({"split_sizes": [1, 3, 2]}, [0, 1, 4, 6])]
)
def test_split_reference(kw, bounds):
    x = rand(2, 6, 3)
    outs = run_op("split", x=x, axis=-2, **kw)
    assert len(outs) == 3
    for k, o in enumerate(outs):
        lo, hi = bounds[k], bounds[k + 1]
        assert o.shape == (2, hi - lo, 3)
        for i, j, c in itertools.product(range(2), range(hi - lo), range(3)):
            assert o[i, j, c] == x[i, lo + j, c]


def test_split_types_and_errors():
    ts = infer_op("split", x=var("fp16", ["s", 6]), axis=1, num_splits=2)
    assert [t.shape for t in ts] == [("s", 3), ("s", 3)]
    ts = infer_op("split", x=var("fp16", ["s", 6]), axis=0, num_splits=2)
    assert [t.shape for t in ts] == [("?", 6), ("?", 6)]
    bad("split", "does not divide", x=var("fp16", [2, 7]), axis=1, num_splits=2)
    bad("split", "sum to", x=var("fp16", [2, 7]), axis=1, split_sizes=[3, 3])
    bad("split", "num_splits 3", x=var("fp16", [2, 6]), axis=1, split_sizes=[3, 3], num_splits=3)
    bad("split", "one of", x=var("fp16", [2, 6]), axis=1)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_stack(axis):
    vals = tuple(rand(2, 3) for _ in range(4))
    (out,) = run_op("stack", values=vals, axis=axis)
    ax = axis % 3
    assert out.shape[ax] == 4 and out.ndim == 3
    for k, v in enumerate(vals):
        for i, j in itertools.product(range(2), range(3)):
            idx = [i, j]
            idx.insert(ax, k)
            assert out[tuple(idx)] == v[i, j]


def test_stack_types_and_errors():
    assert shape_of("stack", values=(var("fp16", ["s", 3]), var("fp16", [2, 3])), axis=0) == (2, 2, 3)
    bad("stack", "one shape", values=(var("fp16", [2, 3]), var("fp16", [3, 3])), axis=0)
    bad("stack", "out of range", values=(var("fp16", [2, 3]), var("fp16", [2, 3])), axis=3)


# -- slicing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("begin", "size", "ranges"),
    [
        ([0, 8, 0, 0], [1, 8, 1, 5], [(0, 1), (8, 16), (0, 1), (0, 5)]),
        ([0, 16, 0, 2], [-1, -1, -1, -1], [(0, 1), (16, 24), (0, 1), (2, 5)]),
        ([0, -8, 0, -3], [1, 4, 1, -1], [(0, 1), (16, 20), (0, 1), (2, 5)]),
    ],
)
def test_slice_by_size_reference(begin, size, ranges):
    x = rand(1, 24, 1, 5)
    (out,) = run_op("slice_by_size", x=x, begin=begin, size=size)
    assert out.shape == tuple(hi - lo for lo, hi in ranges)
    for o in itertools.product(*map(range, out.shape)):
        assert out[o] == x[tuple(lo + k for k, (lo, _) in zip(o, ranges))]


def test_slice_by_size_types():
    x = var("fp16", [1, 24, 1, "s"])
    assert shape_of("slice_by_size", x=x, begin=[0, 8, 0, 0], size=[1, 8, 1, -1]) == (1, 8, 1, "s")
    assert shape_of("slice_by_size", x=x, begin=[0, 8, 0, 2], size=[1, 8, 1, -1]) == (1, 8, 1, "?")
    assert shape_of("slice_by_size", x=x, begin=var("int32", [4]), size=[1, 8, 1, 3]) == (1, 8, 1, 3)
    assert shape_of("slice_by_size", x=x, begin=var("int32", [4]), size=[1, -1, 1, 3]) == (1, "?", 1, 3)
    assert shape_of("slice_by_size", x=x, begin=[0, 0, 0, 0], size=var("int32", [4])) == ("?",) * 4


def test_slice_by_size_errors():
    x = var("fp16", [1, 24, 1, 5])
    bad("slice_by_size", "exceeds", x=x, begin=[0, 20, 0, 0], size=[1, 8, 1, 5])
    bad("slice_by_size", "out of range", x=x, begin=[0, 30, 0, 0], size=[1, -1, 1, 5])
    bad("slice_by_size", "expected one per dimension", x=x, begin=[0, 0, 0], size=[1, 1, 1])
    bad("slice_by_size", "invalid", x=x, begin=[0, 0, 0, 0], size=[1, -2, 1, 1])


def _pick(x: np.ndarray, rows, cols):
    """x restricted to explicit row/column index lists (an int drops that dim)."""
    rr = [rows] if isinstance(rows, int) else rows
    cc = [cols] if isinstance(cols, int) else cols
    out = np.array([[x[r, c] for c in cc] for r in rr])
    if isinstance(cols, int):
        out = out[:, 0]
    if isinstance(rows, int):
        out = out[0]
    return out


@pytest.mark.parametrize(
    ("kw", "rows", "cols"),
    [
        ({"begin": [1, 0], "end": [3, 6], "stride": [1, 2]}, [1, 2], [0, 2, 4]),
        ({"begin": [3, 5], "end": [0, 0], "stride": [-1, -2]}, [3, 2, 1], [5, 3, 1]),
        (
            {"begin": [9, 2], "end": [2, 9], "begin_mask": [True, False], "end_mask": [False, True]},
            [0, 1],
            [2, 3, 4, 5],
        ),
        ({"begin": [0, 4], "end": [4, 5], "squeeze_mask": [False, True]}, [0, 1, 2, 3], 4),
        ({"begin": [-3, -4], "end": [-1, -1]}, [1, 2], [2, 3, 4]),
        ({"begin": [2, 1], "end": [0, 0], "squeeze_mask": [True, True]}, 2, 1),
        (
            {
                "begin": [0, 0],
                "end": [0, 0],
                "begin_mask": [True, True],
                "end_mask": [True, True],
                "stride": [-1, 3],
            },
            [3, 2, 1, 0],
            [0, 3],
        ),
        ({"begin": [1, 0], "end": [100, 6]}, [1, 2, 3], [0, 1, 2, 3, 4, 5]),
    ],
)
def test_slice_by_index_reference(kw, rows, cols):
    x = rand(4, 6)
    (out,) = run_op("slice_by_index", x=x, **kw)
    expected = _pick(x, rows, cols)
    assert out.shape == expected.shape and np.array_equal(out, expected)


def test_slice_by_index_types():
    x = var("fp16", [1, "h", 4, "s"])
    full = {"begin_mask": [True] * 4, "end_mask": [True] * 4}
    assert shape_of("slice_by_index", x=x, begin=[0] * 4, end=[0] * 4, **full) == (1, "h", 4, "s")
    assert shape_of("slice_by_index", x=x, begin=[0, 0, 1, 0], end=[1, 1, 3, 1]) == (1, "?", 2, "?")
    assert shape_of(
        "slice_by_index",
        x=x,
        begin=var("int32", [4]),
        end=[1, 2, 3, 4],
        squeeze_mask=[True, False, False, False],
    ) == ("?", "?", "?")
    (t,) = infer_op(
        "slice_by_index", x=var("int8", [3, 3]), begin=[1, 2], end=[2, 3], squeeze_mask=[True, True]
    )
    assert t == T.scalar("int8")


def test_slice_by_index_errors():
    x = var("fp16", [4, 6])
    bad("slice_by_index", "zero", x=x, begin=[0, 0], end=[4, 6], stride=[1, 0])
    bad("slice_by_index", "out of range", x=x, begin=[4, 0], end=[5, 6], squeeze_mask=[True, False])
    bad("slice_by_index", "entries", x=x, begin=[0, 0], end=[4, 6], end_mask=[True])
    bad("slice_by_index", "constant", x=x, begin=[0, 0], end=[4, 6], stride=var("int32", [2]))


def test_crop():
    x = rand(2, 3, 6, 7)
    (out,) = run_op("crop", x=x, crop_height=[1, 2], crop_width=[3, 0])
    assert out.shape == (2, 3, 3, 4)
    for n, c, h, w in itertools.product(range(2), range(3), range(3), range(4)):
        assert out[n, c, h, w] == x[n, c, h + 1, w + 3]
    assert shape_of("crop", x=var("fp16", ["b", 3, 6, 7]), crop_height=[1, 1], crop_width=[0, 0]) == (
        "b",
        3,
        4,
        7,
    )
    bad("crop", "rank >= 3", x=var("fp16", [6, 7]), crop_height=[1, 1], crop_width=[0, 0])
    bad("crop", "removes all", x=var("fp16", [1, 6, 7]), crop_height=[3, 3], crop_width=[0, 0])
    bad("crop", "2 entries", x=var("fp16", [1, 6, 7]), crop_height=[1], crop_width=[0, 0])


# -- tile / reverse / pad -------------------------------------------------------------------------------


def test_tile():
    x = rand(2, 3)
    (out,) = run_op("tile", x=x, reps=[3, 2])
    assert out.shape == (6, 6)
    for i, j in itertools.product(range(6), range(6)):
        assert out[i, j] == x[i % 2, j % 3]
    assert shape_of("tile", x=var("fp16", ["s", 3]), reps=[1, 4]) == ("s", 12)
    assert shape_of("tile", x=var("fp16", ["s", 3]), reps=[2, 4]) == ("?", 12)
    assert shape_of("tile", x=var("fp16", [2, 3]), reps=var("int32", [2])) == ("?", "?")
    bad("tile", ">= 1", x=var("fp16", [2, 3]), reps=[0, 1])
    bad("tile", "expected one per dimension", x=var("fp16", [2, 3]), reps=[1, 1, 1])


@pytest.mark.parametrize("axes", [[0], [-1], [0, 2], None])
def test_reverse(axes):
    x = rand(2, 3, 4)
    kw = {} if axes is None else {"axes": axes}
    (out,) = run_op("reverse", x=x, **kw)
    flip = {0, 1, 2} if axes is None else {a % 3 for a in axes}
    for idx in itertools.product(range(2), range(3), range(4)):
        src = tuple((n - 1 - i) if d in flip else i for d, (i, n) in enumerate(zip(idx, x.shape)))
        assert out[idx] == x[src]


def test_reverse_types_and_errors():
    (t,) = infer_op("reverse", x=var("int16", ["s", 3]), axes=[0])
    assert t == T.tensor("int16", ["s", 3])
    bad("reverse", "repeat", x=var("fp16", [2, 3]), axes=[1, -1])
    bad("reverse", "out of range", x=var("fp16", [2, 3]), axes=[2])


def _pad1d(row, before, after, mode, value=0.0):
    """One-dimensional padding written out element by element."""
    n = len(row)
    out = []
    for k in range(-before, n + after):
        if 0 <= k < n:
            out.append(row[k])
        elif mode == "constant":
            out.append(value)
        elif mode == "replicate":
            out.append(row[0] if k < 0 else row[n - 1])
        else:  # reflect about the edge element, edge not repeated
            out.append(row[-k] if k < 0 else row[2 * (n - 1) - k])
    return out


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("constant", [0, 0, 1, 2, 3, 0, 0]),
        ("reflect", [3, 2, 1, 2, 3, 2, 1]),
        ("replicate", [1, 1, 1, 2, 3, 3, 3]),
    ],
)
def test_pad_1d(mode, expected):
    (out,) = run_op("pad", x=np.array([1.0, 2.0, 3.0]), pad=[2, 2], mode=mode)
    assert out.tolist() == expected


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate"])
def test_pad_2d(mode):
    x = rand(2, 4, 5)
    pads = [1, 2, 3, 1]
    (out,) = run_op("pad", x=x, pad=pads, mode=mode, constant_val=-7.0)
    assert out.shape == (2, 7, 9)
    for n in range(2):
        rows = [_pad1d(list(x[n, r]), 3, 1, mode, -7.0) for r in range(4)]
        cols = [_pad1d([rows[r][c] for r in range(4)], 1, 2, mode, -7.0) for c in range(9)]
        expected = np.array(cols).T
        assert np.array_equal(out[n], expected)


def test_pad_types_and_errors():
    (t,) = infer_op(
        "pad", "fp16", x=var("fp16", [1, 3, "h", 8]), pad=[1, 1], mode="reflect", constant_val=0.0
    )
    assert t == T.tensor("fp16", [1, 3, "h", 10])
    assert shape_of("pad", x=var("fp32", [1, "h", 8]), pad=[0, 0, 2, 1, 0, 0]) == (1, "?", 8)
    assert shape_of("pad", x=var("fp32", [2, 3]), pad=var("int32", [4])) == ("?", "?")
    bad("pad", "mode 'wrap'", x=var("fp32", [2, 3]), pad=[1, 1], mode="wrap")
    bad("pad", "exceeds", x=var("fp32", [2, 3]), pad=[3, 0], mode="reflect")
    bad("pad", "exceeds", x=var("fp32", [2, 3]), pad=[4, 0], mode="replicate")
    bad("pad", "even", x=var("fp32", [2, 3]), pad=[1, 1, 1])
    bad("pad", "negative", x=var("fp32", [2, 3]), pad=[1, -1])
    bad("pad", "2 \\* rank", x=var("fp32", [2, 3]), pad=var("int32", [2]))
    bad("pad", "share one dtype", x=var("fp16", [2, 3]), pad=[1, 1], constant_val=1.0)


# -- gather ---------------------------------------------------------------------------------------------


def test_gather_reference():
    x = rand(3, 4, 5)
    idx = np.array([[0, 3], [-1, 2]], dtype=np.int32)
    (out,) = run_op("gather", x=x, indices=idx, axis=1)
    assert out.shape == (3, 2, 2, 5)
    for i, a, b, k in itertools.product(range(3), range(2), range(2), range(5)):
        assert out[i, a, b, k] == x[i, idx[a, b] % 4, k]
    (s,) = run_op("gather", x=x, indices=np.int32(2), axis=0)
    assert np.array_equal(s, x[2])


def test_gather_batch_dims():
    x = rand(2, 4, 3)
    idx = np.array([[0, 1, 3, 3, 2], [2, 2, 0, 1, 3]], dtype=np.int32)
    (out,) = run_op("gather", x=x, indices=idx, axis=1, batch_dims=1)
    assert out.shape == (2, 5, 3)
    for b, j, k in itertools.product(range(2), range(5), range(3)):
        assert out[b, j, k] == x[b, idx[b, j], k]


def test_gather_types_and_errors():
    (t,) = infer_op("gather", x=var("fp16", ["v", 64]), indices=var("int32", [1, "s"]))
    assert t == T.tensor("fp16", [1, "s", 64])
    (t,) = infer_op("gather", x=var("fp16", [2, 8, 3]), indices=var("uint16", [2, 5]), axis=1, batch_dims=1)
    assert t.shape == (2, 5, 3)
    bad("gather", "out of range", x=var("fp16", [2, 3]), indices=var("int32", [4]), axis=2)
    bad("gather", "batch_dims", x=var("fp16", [2, 3]), indices=var("int32", [2, 4]), axis=0, batch_dims=1)
    bad("gather", "batch dim 0", x=var("fp16", [2, 3]), indices=var("int32", [3, 4]), axis=1, batch_dims=1)
    bad(
        "gather",
        "validate_indices",
        x=var("fp16", [2, 3]),
        indices=np.array([0, 3]),
        axis=1,
        validate_indices=True,
    )
    bad("gather", "dtype fp32", x=var("fp16", [2, 3]), indices=var("fp32", [2]))


def test_gather_along_axis():
    x = rand(3, 4)
    idx = np.array([[0, 2, 1, 0], [2, 2, 0, 1]], dtype=np.int32)
    (out,) = run_op("gather_along_axis", x=x, indices=idx, axis=0)
    assert out.shape == (2, 4)
    for i, j in itertools.product(range(2), range(4)):
        assert out[i, j] == x[idx[i, j], j]
    idx1 = np.array([[3, -1], [0, 1], [2, 2]], dtype=np.int32)
    (out1,) = run_op("gather_along_axis", x=x, indices=idx1, axis=-1)
    for i, j in itertools.product(range(3), range(2)):
        assert out1[i, j] == x[i, idx1[i, j] % 4]
    (t,) = infer_op("gather_along_axis", x=var("fp16", ["b", 10]), indices=var("int32", ["b", 3]), axis=1)
    assert t == T.tensor("fp16", ["b", 3])
    bad("gather_along_axis", "rank", x=var("fp16", [3, 4]), indices=var("int32", [3]))
    bad("gather_along_axis", "dim 1 differs", x=var("fp16", [3, 4]), indices=var("int32", [2, 3]), axis=0)


# -- depth/space shuffles, upsampling -------------------------------------------------------------------

# The Core ML specification's ReorganizeData example: C=8, H=1, W=2 holding 1..16.
SPEC_X = np.arange(1, 17, dtype=np.float64).reshape(1, 8, 1, 2)


def test_depth_to_space_spec_example():
    (out,) = run_op("depth_to_space", x=SPEC_X, block_size=2)
    assert out[0].tolist() == [[[1, 5, 2, 6], [9, 13, 10, 14]], [[3, 7, 4, 8], [11, 15, 12, 16]]]


def test_pixel_shuffle_spec_example():
    (out,) = run_op("pixel_shuffle", x=SPEC_X, upscale_factor=2)
    assert out[0].tolist() == [[[1, 3, 2, 4], [5, 7, 6, 8]], [[9, 11, 10, 12], [13, 15, 14, 16]]]


@pytest.mark.parametrize("b", [1, 2, 3])
def test_depth_space_formulas(b):
    n, c, h, w = 2, 2, 3, 2
    x = rand(n, c * b * b, h, w)
    (d2s,) = run_op("depth_to_space", x=x, block_size=b)
    (ps,) = run_op("pixel_shuffle", x=x, upscale_factor=b)
    for i0, c0, hh, ww in itertools.product(range(n), range(c), range(h * b), range(w * b)):
        i, j = hh % b, ww % b
        assert d2s[i0, c0, hh, ww] == x[i0, (i * b + j) * c + c0, hh // b, ww // b]
        assert ps[i0, c0, hh, ww] == x[i0, c0 * b * b + i * b + j, hh // b, ww // b]
    y = rand(n, c, h * b, w * b)
    (s2d,) = run_op("space_to_depth", x=y, block_size=b)
    (pu,) = run_op("pixel_unshuffle", x=y, downscale_factor=np.array(b, np.uint32))
    for i0, c0, hh, ww, i, j in itertools.product(range(n), range(c), range(h), range(w), range(b), range(b)):
        assert s2d[i0, (i * b + j) * c + c0, hh, ww] == y[i0, c0, hh * b + i, ww * b + j]
        assert pu[i0, c0 * b * b + i * b + j, hh, ww] == y[i0, c0, hh * b + i, ww * b + j]
    (back,) = run_op("depth_to_space", x=s2d, block_size=b)
    assert np.array_equal(back, y)


def test_depth_space_types_and_errors():
    assert shape_of("depth_to_space", x=var("fp16", ["n", 8, 3, 4]), block_size=2) == ("n", 2, 6, 8)
    assert shape_of("space_to_depth", x=var("fp16", ["n", 2, 4, 6]), block_size=2) == ("n", 8, 2, 3)
    assert shape_of("pixel_shuffle", x=var("fp16", [1, 9, "h", 2]), upscale_factor=3) == (1, 1, "?", 6)
    assert shape_of(
        "pixel_unshuffle", x=var("fp32", [1, 1, 4, 4]), downscale_factor=np.array(2, np.uint32)
    ) == (1, 4, 2, 2)
    bad("depth_to_space", "divisible by 4", x=var("fp16", [1, 6, 3, 4]), block_size=2)
    bad("space_to_depth", "height dim", x=var("fp16", [1, 2, 3, 4]), block_size=2)
    bad("pixel_shuffle", "rank 4", x=var("fp16", [9, 2, 2]), upscale_factor=3)
    bad("pixel_unshuffle", "width dim", x=var("fp16", [1, 1, 4, 5]), downscale_factor=np.array(2, np.uint32))
    bad("depth_to_space", "positive", x=var("fp16", [1, 4, 3, 4]), block_size=0)
    bad("depth_to_space", "dtype int32", x=var("int32", [1, 4, 3, 4]), block_size=2)


@pytest.mark.parametrize(("sh", "sw"), [(2, 3), (1, 1), (2.0, 1.0)])
def test_upsample_nearest_integer(sh, sw):
    x = rand(2, 3, 4)
    (out,) = run_op("upsample_nearest_neighbor", x=x, scale_factor_height=sh, scale_factor_width=sw)
    sh, sw = int(sh), int(sw)
    assert out.shape == (2, 3 * sh, 4 * sw)
    for c, i, j in itertools.product(range(2), range(3 * sh), range(4 * sw)):
        assert out[c, i, j] == x[c, i // sh, j // sw]


def test_upsample_nearest_fractional():
    x = rand(1, 4, 3)
    (out,) = run_op("upsample_nearest_neighbor", x=x, scale_factor_height=1.5, scale_factor_width=2.5)
    rows = [0, 0, 1, 2, 2, 3]  # floor(i / 1.5)
    cols = [0, 0, 0, 1, 1, 2, 2]  # floor(j / 2.5), 7 = floor(3 * 2.5)
    assert out.shape == (1, 6, 7)
    assert np.array_equal(out[0], np.array([[x[0, r, c] for c in cols] for r in rows]))


def test_upsample_nearest_types_and_errors():
    op = "upsample_nearest_neighbor"
    assert shape_of(op, x=var("fp16", [1, 3, "h", 5]), scale_factor_width=2) == (1, 3, "h", 10)
    assert shape_of(op, x=var("fp16", [1, 3, "h", 5]), scale_factor_height=2) == (1, 3, "?", 5)
    bad(op, "rank >= 3", x=var("fp16", [3, 5]), scale_factor_height=2)
    bad(op, "> 0", x=var("fp16", [1, 3, 5]), scale_factor_height=0)


# -- fill / shape / identity ---------------------------------------------------------------------------


def test_fill():
    (out,) = run_op("fill", shape=[2, 3], value=1.5)
    assert out.shape == (2, 3) and all(v == 1.5 for v in out.ravel())
    (z,) = run_op("fill", shape=[4])
    assert z.tolist() == [0.0] * 4
    (t,) = infer_op("fill", shape=[2, 3], value=np.int32(7))
    assert t == T.tensor("int32", [2, 3])
    (t,) = infer_op("fill", shape=[2])
    assert t == T.tensor("fp32", [2])
    assert shape_of("fill", shape=var("int32", [3]), value=True) == ("?", "?", "?")
    bad("fill", "negative", shape=[2, -1])
    bad("fill", "constant", shape=[2], value=var("fp32", []))


def test_shape_and_identity():
    x = rand(2, 3, 4)
    (s,) = run_op("shape", x=x)
    assert s.dtype == np.int32 and s.tolist() == [2, 3, 4]
    (s0,) = run_op("shape", x=np.float64(1.0))
    assert s0.shape == (0,)
    (t,) = infer_op("shape", x=var("fp16", [1, "s", 8]))
    assert t == T.tensor("int32", [3])
    (i,) = run_op("identity", x=x)
    assert np.array_equal(i, x) and i is not x
    (t,) = infer_op("identity", x=var("bool", ["s"]))
    assert t == T.tensor("bool", ["s"])
    bad("shape", "unexpected input", x=var("fp16", [2]), y=var("fp16", [2]))
    bad("identity", "missing required input 'x'")


def test_integer_and_bool_data_movement():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    (out,) = run_op("transpose", x=x, perm=[1, 0])
    assert out.dtype == np.int32 and all(out[j, i] == x[i, j] for i in range(3) for j in range(4))
    m = np.array([[True, False], [False, True]])
    (t,) = infer_op("concat", values=(m, m), axis=0)
    assert t == T.tensor("bool", [4, 2])
    (u,) = infer_op("reshape", x=var("uint16", [2, 3]), shape=[6])
    assert u.dtype.name == "uint16"
