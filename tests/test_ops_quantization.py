"""Tests of cast, quantize/dequantize and the constexpr decompression ops."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from anekit.errors import MilTypeError
from anekit.mil import types as T
from anekit.mil.registry import get_op
from anekit.mil.values import Literal, blob_literal, tensor_literal
from tests.op_harness import infer_op, run_op, var

RNG = np.random.default_rng(99)
WEIGHTS = "@model_path/weights/weight.bin"


def blob(dtype: str, shape: list) -> Literal:
    """A BLOBFILE constant: its type is known, its value is not."""
    return blob_literal(T.tensor(dtype, shape), WEIGHTS, 64)


def run_lit(op: str, **inputs):
    """Like run_op, but inputs may be typed Literals (sub-byte dtypes such as int4 / uint1)."""
    types = infer_op(op, **inputs)
    values = {k: v.value if isinstance(v, Literal) else np.asarray(v) for k, v in inputs.items()}
    outs = get_op(op).run(values, types)
    for o, t in zip(outs, types):
        assert tuple(np.shape(o)) == tuple(t.shape)
    return outs, types


def bad(op: str, match: str = "", **inputs) -> None:
    with pytest.raises(MilTypeError, match=rf"^\[{op}\].*{match}") as info:
        infer_op(op, **inputs)
    assert info.value.op == op


def round_half_even(v: float) -> int:
    return round(v)  # Python's round() rounds halves to even


# -- cast ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "dtype", "expected"),
    [
        ([-2.7, -0.5, 0.5, 2.7, 7.0], "int32", [-2, 0, 0, 2, 7]),
        ([-5.0, 0.9, 300.0, 255.4, float("nan")], "uint8", [0, 0, 255, 255, 0]),
        ([-200.0, 127.9, -128.5, 1e9, -1e9], "int8", [-128, 127, -128, 127, -128]),
        ([0.0, -0.0, 1e-9, -3.0], "bool", [False, False, True, True]),
        ([70000.0, -70000.0, 12.5], "int16", [32767, -32768, 12]),
        ([1.25, -3.5], "fp16", [1.25, -3.5]),
    ],
)
def test_cast_from_float(x, dtype, expected):
    (out,) = run_op("cast", x=np.array(x), dtype=dtype)
    assert out.tolist() == expected
    if dtype not in ("fp16", "fp32"):
        assert out.dtype == T.dtype(dtype).np


def test_cast_from_int_and_bool():
    (f,) = run_op("cast", x=np.array([-3, 0, 1000], dtype=np.int32), dtype="fp32")
    assert f.dtype.kind == "f" and f.tolist() == [-3.0, 0.0, 1000.0]
    (u,) = run_op("cast", x=np.array([-3, 0, 1000], dtype=np.int32), dtype="uint8")
    assert u.tolist() == [0, 0, 255]
    (i,) = run_op("cast", x=np.array([True, False]), dtype="int32")
    assert i.tolist() == [1, 0]
    (b,) = run_op("cast", x=np.array([0, 2, -1], dtype=np.int16), dtype="bool")
    assert b.tolist() == [False, True, True]


def test_cast_types_and_errors():
    (t,) = infer_op("cast", x=var("fp32", [1, "s", 4]), dtype="fp16")
    assert t == T.tensor("fp16", [1, "s", 4])
    (t,) = infer_op("cast", x=var("uint16", []), dtype="bool")
    assert t == T.scalar("bool")
    bad("cast", "dtype 'int64'", x=var("fp32", [2]), dtype="int64")
    bad("cast", "dtype uint32", x=var("uint32", [2]), dtype="fp32")
    bad("cast", "constant", x=var("fp32", [2]), dtype=var("string", []))


# -- quantize / dequantize -----------------------------------------------------------------------------


def test_quantize_scalar_half_even():
    x = np.array([-1.25, -0.75, -0.25, 0.25, 0.75, 1.25, 100.0, -100.0, 0.3])
    (q,) = run_op("quantize", input=x, scale=0.5, zero_point=np.array(3, np.int8), output_dtype="int8")
    expected = [max(-128, min(127, round_half_even(v / 0.5) + 3)) for v in x]
    assert q.dtype == np.int8 and q.tolist() == expected
    assert q.tolist()[:6] == [
        1,
        1,
        3,
        3,
        5,
        5,
    ]  # -2.5 -> -2, -1.5 -> -2, -0.5 -> 0, 0.5 -> 0, 1.5 -> 2, 2.5 -> 2


def test_quantize_per_axis_uint8():
    x = RNG.standard_normal((2, 3, 4)) * 4
    scale = np.array([0.1, 0.05, 0.02])
    zp = np.array([128, 10, 250], dtype=np.uint8)
    (q,) = run_op("quantize", input=x, scale=scale, zero_point=zp, axis=1, output_dtype="uint8")
    assert q.dtype == np.uint8
    for i, c, k in itertools.product(range(2), range(3), range(4)):
        v = round_half_even(x[i, c, k] / scale[c]) + int(zp[c])
        assert q[i, c, k] == max(0, min(255, v))
    (q0,) = run_op("quantize", input=x, scale=scale, axis=-2, output_dtype="int8")
    assert q0[1, 2, 3] == max(-128, min(127, round_half_even(x[1, 2, 3] / scale[2])))


def test_quantize_types_and_errors():
    (t,) = infer_op("quantize", input=var("fp32", ["b", 16]), scale=0.1, output_dtype="uint8")
    assert t == T.tensor("uint8", ["b", 16])
    x = var("fp32", [2, 3])
    bad(
        "quantize",
        "zero_point dtype",
        input=x,
        scale=0.1,
        zero_point=np.array(1, np.uint8),
        output_dtype="int8",
    )
    bad("quantize", "'axis' is required", input=x, scale=np.array([0.1, 0.2, 0.3]), output_dtype="int8")
    bad("quantize", "omitted", input=x, scale=0.1, axis=1, output_dtype="int8")
    bad("quantize", "expected 3", input=x, scale=np.array([0.1, 0.2]), axis=1, output_dtype="int8")
    bad("quantize", "not int8 or uint8", input=x, scale=0.1, output_dtype="int4")
    bad("quantize", "share one dtype", input=var("fp16", [2]), scale=0.1, output_dtype="int8")


def test_dequantize():
    q = RNG.integers(-128, 128, size=(3, 5)).astype(np.int8)
    (out,) = run_op("dequantize", input=q, scale=0.25, zero_point=np.array(-4, np.int8))
    assert all(out[i, j] == 0.25 * (int(q[i, j]) + 4) for i in range(3) for j in range(5))
    scale = np.array([0.5, 2.0, 0.125])
    zp = np.array([1, -2, 0], dtype=np.int8)
    (pa,) = run_op("dequantize", input=q, scale=scale, zero_point=zp, axis=0)
    assert all(pa[i, j] == scale[i] * (int(q[i, j]) - int(zp[i])) for i in range(3) for j in range(5))
    (t,) = infer_op("dequantize", "fp16", input=var("uint8", [4, "s"]), scale=0.5)
    assert t == T.tensor("fp16", [4, "s"])
    bad("dequantize", "expected 5", input=var("int8", [3, 5]), scale=np.array([1.0, 2.0]), axis=1)
    bad(
        "dequantize",
        "must be a vector",
        input=var("int8", [3, 5]),
        scale=np.ones(5),
        zero_point=np.array(0, np.int8),
        axis=1,
    )
    bad("dequantize", "dtype fp32", input=var("fp32", [3]), scale=0.5)


def test_quantize_dequantize_roundtrip():
    x = np.array([-1.0, -0.5, 0.0, 0.5, 1.0])
    (q,) = run_op("quantize", input=x, scale=0.5, output_dtype="int8")
    (y,) = run_op("dequantize", input=q, scale=0.5)
    assert y.tolist() == x.tolist()


# -- constexpr_affine_dequantize / constexpr_cast --------------------------------------------------------


def test_constexpr_affine_dequantize():
    q = RNG.integers(0, 256, size=(4, 3)).astype(np.uint8)
    zp = np.array([128, 0, 255], dtype=np.uint8)
    scale = np.array([0.5, 0.25, 2.0])
    (out,) = run_op("constexpr_affine_dequantize", quantized_data=q, zero_point=zp, scale=scale, axis=1)
    for i, j in itertools.product(range(4), range(3)):
        assert out[i, j] == scale[j] * (int(q[i, j]) - int(zp[j]))
    (s,) = run_op(
        "constexpr_affine_dequantize", quantized_data=q, zero_point=np.float32(1.5), scale=0.5, axis=0
    )
    assert s[2, 1] == 0.5 * (int(q[2, 1]) - 1.5)


def test_constexpr_affine_dequantize_blob_types_and_errors():
    op = "constexpr_affine_dequantize"
    (t,) = infer_op(
        op,
        quantized_data=blob("int8", [64, 32]),
        zero_point=blob("int8", [64]),
        scale=blob("fp16", [64]),
        axis=0,
    )
    assert t == T.tensor("fp16", [64, 32])
    bad(
        op,
        "expected 64",
        quantized_data=blob("int8", [64, 32]),
        zero_point=np.array(0, np.int8),
        scale=blob("fp16", [32]),
        axis=0,
    )
    bad(
        op,
        "out of range",
        quantized_data=blob("int8", [64, 32]),
        zero_point=np.array(0, np.int8),
        scale=0.5,
        axis=2,
    )
    bad(op, "constant", quantized_data=var("int8", [4]), zero_point=np.array(0, np.int8), scale=0.5, axis=0)


def test_constexpr_cast():
    (out,) = run_op("constexpr_cast", source_val=np.array([1.5, -2.0], dtype=np.float16), output_dtype="fp32")
    assert out.tolist() == [1.5, -2.0]
    (t,) = infer_op("constexpr_cast", source_val=blob("fp16", [8, 8]), output_dtype="fp32")
    assert t == T.tensor("fp32", [8, 8])
    bad("constexpr_cast", "must be 'fp32'", source_val=blob("fp16", [8]), output_dtype="fp16")


# -- constexpr_blockwise_shift_scale ---------------------------------------------------------------------


@pytest.mark.parametrize("with_offset", [False, True])
def test_blockwise_shift_scale_int4(with_offset):
    data = RNG.integers(-8, 8, size=(4, 6))
    scale = RNG.uniform(0.1, 1.0, size=(2, 3))
    kw = {}
    offset = np.zeros((2, 3), dtype=np.int64)
    if with_offset:
        offset = RNG.integers(-8, 8, size=(2, 3))
        kw["offset"] = tensor_literal("int4", offset)
    (out,), (t,) = run_lit(
        "constexpr_blockwise_shift_scale", data=tensor_literal("int4", data), scale=scale, **kw
    )
    assert t == T.tensor("fp32", [4, 6])
    for i, j in itertools.product(range(4), range(6)):
        bi, bj = i // 2, j // 2
        assert math.isclose(out[i, j], scale[bi, bj] * (data[i, j] - offset[bi, bj]), rel_tol=1e-6)


def test_blockwise_shift_scale_float_offset_and_types():
    data = RNG.integers(0, 256, size=(3, 8)).astype(np.uint8)
    scale = RNG.uniform(0.1, 1.0, size=(3, 2))
    offset = RNG.uniform(0, 255, size=(3, 2))
    (out,) = run_op("constexpr_blockwise_shift_scale", data=data, scale=scale, offset=offset)
    for i, j in itertools.product(range(3), range(8)):
        assert math.isclose(out[i, j], scale[i, j // 4] * (int(data[i, j]) - offset[i, j // 4]), rel_tol=1e-6)
    op = "constexpr_blockwise_shift_scale"
    (t,) = infer_op(
        op, data=blob("uint4", [128, 64]), scale=blob("fp16", [128, 2]), offset=blob("uint4", [128, 2])
    )
    assert t == T.tensor("fp16", [128, 64])
    bad(op, "rank of the data", data=blob("int8", [128, 64]), scale=blob("fp16", [128]))
    bad(op, "not divisible", data=blob("int8", [128, 64]), scale=blob("fp16", [128, 3]))
    bad(
        op,
        "shape of 'scale'",
        data=blob("int8", [8, 4]),
        scale=blob("fp16", [8, 1]),
        offset=blob("int8", [8, 2]),
    )
    bad(
        op,
        "integer 'offset'",
        data=blob("int4", [8, 4]),
        scale=blob("fp16", [8, 1]),
        offset=blob("int8", [8, 1]),
    )


# -- constexpr_lut_to_dense ------------------------------------------------------------------------------


def pack_lsb_first(values, nbits: int) -> np.ndarray:
    """Pack unsigned nbits-wide values into bytes, least significant bit first, written bit by bit."""
    out = [0] * ((len(values) * nbits + 7) // 8)
    for p, v in enumerate(values):
        for b in range(nbits):
            pos = p * nbits + b
            out[pos // 8] |= ((int(v) >> b) & 1) << (pos % 8)
    return np.array(out, dtype=np.uint8)


def test_lut_ios16_documented_packing():
    # n_bits = 2, shape (5,): byte0 = 0b01_10_11_00 (i3 i2 i1 i0), byte1 = 0bxx_xx_xx_11 (i4)
    indices = np.array([0b01101100, 0b00000011], dtype=np.uint8)
    lut = np.array([10.0, 11.0, 12.0, 13.0])
    (out,) = run_op("constexpr_lut_to_dense", indices=indices, lut=lut, shape=np.array([5], dtype=np.uint32))
    assert out.tolist() == [10.0, 13.0, 12.0, 11.0, 13.0]
    assert pack_lsb_first([0, 3, 2, 1, 3], 2).tolist() == indices.tolist()


@pytest.mark.parametrize("nbits", [1, 2, 4, 6, 8])
def test_lut_ios16_random(nbits):
    shape = (3, 7)
    vals = RNG.integers(0, 2**nbits, size=21)
    lut = RNG.standard_normal(2**nbits)
    (out,) = run_op(
        "constexpr_lut_to_dense",
        indices=pack_lsb_first(vals, nbits),
        lut=lut,
        shape=np.array(shape, np.uint32),
    )
    assert out.shape == shape
    assert [out[i, j] for i in range(3) for j in range(7)] == [lut[v] for v in vals]


def test_lut_ios18_documented_per_group():
    indices = tensor_literal("uint2", [2, 3, 3, 0, 1, 0, 3, 0, 2, 1, 0, 3], (6, 2))
    lut = np.array([1.0, 5.0, 9.0, 13.0, 2.0, 10.0, 18.0, 26.0]).reshape(2, 1, 4, 1)
    (out,), (t,) = run_lit("constexpr_lut_to_dense", indices=indices, lut=lut)
    assert t == T.tensor("fp32", [6, 2])
    assert out.tolist() == [[9, 13], [13, 1], [5, 1], [26, 2], [18, 10], [2, 26]]


@pytest.mark.parametrize("vector_axis", [1, 2, -1])
def test_lut_ios18_documented_vector(vector_axis):
    indices = tensor_literal("uint1", [[[0, 0], [1, 0]], [[1, 1], [0, 0]]])
    a0, a1, a2, b0, b1, b2 = 1.0, 2.0, 3.0, 10.0, 20.0, 30.0
    lut = np.array([a0, a1, a2, b0, b1, b2]).reshape(1, 1, 1, 2, 3)
    (out,), _ = run_lit("constexpr_lut_to_dense", indices=indices, lut=lut, vector_axis=vector_axis)
    if vector_axis == 1:
        expected = [
            [[a0, a0], [a1, a1], [a2, a2], [b0, a0], [b1, a1], [b2, a2]],
            [[b0, b0], [b1, b1], [b2, b2], [a0, a0], [a1, a1], [a2, a2]],
        ]
    else:
        expected = [
            [[a0, a1, a2, a0, a1, a2], [b0, b1, b2, a0, a1, a2]],
            [[b0, b1, b2, b0, b1, b2], [a0, a1, a2, a0, a1, a2]],
        ]
    assert out.tolist() == expected


def test_lut_ios18_blocked_vector_loops():
    idx = RNG.integers(0, 8, size=(4, 6))
    lut = RNG.standard_normal((2, 3, 8, 2))  # 2x3 tables of 8 two-element vectors; blocks of 2x2
    (out,), _ = run_lit(
        "constexpr_lut_to_dense", indices=tensor_literal("uint3", idx), lut=lut, vector_axis=0
    )
    assert out.shape == (8, 6)
    for i, j, v in itertools.product(range(4), range(6), range(2)):
        assert out[i * 2 + v, j] == lut[i // 2, j // 2, idx[i, j], v]


def test_lut_types_with_blobs():
    op = "constexpr_lut_to_dense"
    (t,) = infer_op(op, indices=blob("uint4", [64, 32]), lut=blob("fp16", [4, 1, 16, 1]))
    assert t == T.tensor("fp16", [64, 32])
    (t,) = infer_op(op, indices=blob("uint4", [64, 32]), lut=blob("int8", [1, 1, 16, 4]), vector_axis=0)
    assert t == T.tensor("int8", [256, 32])
    (t,) = infer_op(
        op, indices=blob("uint8", [1024]), lut=blob("fp16", [16]), shape=np.array([64, 32], np.uint32)
    )
    assert t == T.tensor("fp16", [64, 32])


def test_lut_errors():
    op = "constexpr_lut_to_dense"
    shape = np.array([64, 32], np.uint32)
    bad(op, "pack into 1024", indices=blob("uint8", [1000]), lut=blob("fp16", [16]), shape=shape)
    bad(op, "lut size 8", indices=blob("uint8", [768]), lut=blob("fp16", [8]), shape=shape)
    bad(
        op,
        "compile-time constant",
        indices=blob("uint8", [1024]),
        lut=blob("fp16", [16]),
        shape=blob("uint32", [2]),
    )
    bad(
        op,
        "cannot be combined",
        indices=blob("uint8", [1024]),
        lut=blob("fp16", [16]),
        shape=shape,
        vector_axis=0,
    )
    bad(op, "packed bytes", indices=blob("uint4", [64, 32]), lut=blob("fp16", [16]), shape=shape)
    bad(op, "rank rank\\(indices\\) \\+ 2", indices=blob("uint4", [64, 32]), lut=blob("fp16", [16, 1]))
    bad(op, "need 16", indices=blob("uint4", [64, 32]), lut=blob("fp16", [1, 1, 8, 1]))
    bad(op, "not divisible", indices=blob("uint4", [64, 32]), lut=blob("fp16", [3, 1, 16, 1]))
    bad(op, "'vector_axis' is required", indices=blob("uint4", [64, 32]), lut=blob("fp16", [1, 1, 16, 2]))
    bad(op, "out of range", indices=blob("uint4", [64, 32]), lut=blob("fp16", [1, 1, 16, 2]), vector_axis=2)


# -- constexpr_sparse_to_dense ---------------------------------------------------------------------------


def test_sparse_ios16_documented_mask():
    mask = np.array([0b00001100], dtype=np.uint8)  # i2 and i3 set
    (out,) = run_op(
        "constexpr_sparse_to_dense",
        nonzero_data=np.array([7.0, 9.0]),
        mask=mask,
        shape=np.array([5], np.uint32),
    )
    assert out.tolist() == [0.0, 0.0, 7.0, 9.0, 0.0]


def test_sparse_ios16_random():
    bits = RNG.integers(0, 2, size=(3, 5))
    data = RNG.standard_normal(int(bits.sum()))
    (out,) = run_op(
        "constexpr_sparse_to_dense",
        nonzero_data=data,
        mask=pack_lsb_first(bits.ravel(), 1),
        shape=np.array([3, 5], np.uint32),
    )
    k = 0
    for i, j in itertools.product(range(3), range(5)):
        if bits[i, j]:
            assert out[i, j] == data[k]
            k += 1
        else:
            assert out[i, j] == 0


def test_sparse_ios18():
    bits = RNG.integers(0, 2, size=(2, 3, 4))
    data = RNG.integers(-8, 8, size=int(bits.sum()))
    (out,), (t,) = run_lit(
        "constexpr_sparse_to_dense",
        nonzero_data=tensor_literal("int4", data),
        mask=tensor_literal("uint1", bits),
    )
    assert t == T.tensor("int4", [2, 3, 4])
    k = 0
    for idx in itertools.product(range(2), range(3), range(4)):
        assert out[idx] == (data[k] if bits[idx] else 0)
        k += int(bits[idx])


def test_sparse_types_and_errors():
    op = "constexpr_sparse_to_dense"
    (t,) = infer_op(op, nonzero_data=blob("fp16", [100]), mask=blob("uint1", [32, 16]))
    assert t == T.tensor("fp16", [32, 16])
    (t,) = infer_op(
        op, nonzero_data=blob("fp16", [100]), mask=blob("uint8", [64]), shape=np.array([32, 16], np.uint32)
    )
    assert t == T.tensor("fp16", [32, 16])
    bad(op, "set entries", nonzero_data=np.ones(3), mask=tensor_literal("uint1", [[1, 0], [1, 0]]))
    bad(
        op,
        "padding bits",
        nonzero_data=np.ones(2),
        mask=np.array([0b00100001], np.uint8),
        shape=np.array([5], np.uint32),
    )
    bad(
        op,
        "set bits",
        nonzero_data=np.ones(3),
        mask=np.array([0b00000011], np.uint8),
        shape=np.array([5], np.uint32),
    )
    bad(
        op,
        "pack into 64",
        nonzero_data=blob("fp16", [10]),
        mask=blob("uint8", [60]),
        shape=np.array([32, 16], np.uint32),
    )
    bad(op, "must be uint1", nonzero_data=blob("fp16", [10]), mask=blob("uint8", [32, 16]))
    bad(
        op,
        "packed bits",
        nonzero_data=blob("fp16", [10]),
        mask=blob("uint1", [512]),
        shape=np.array([512], np.uint32),
    )


# -- iOS18 sparse + palettized / sparse + quantized ------------------------------------------------------

DOC_MASK = [[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 1], [0, 1, 1, 0, 1, 0], [0, 0, 0, 1, 0, 0]]


def test_lut_to_sparse_documented():
    mask = tensor_literal("uint1", DOC_MASK)
    nz = tensor_literal("uint1", [0, 1, 1, 0, 1, 1, 0, 0, 1])
    (m, vals), (tm, tv) = run_lit(
        "constexpr_lut_to_sparse",
        indices_mask=mask,
        indices_nonzero_data=nz,
        lut=np.array([2.0, 3.0]).reshape(1, 1, 2, 1),
    )
    assert tm == T.tensor("uint1", [4, 6]) and tv == T.tensor("fp32", [9])
    assert m.tolist() == DOC_MASK
    assert vals.tolist() == [2, 3, 3, 2, 3, 3, 2, 2, 3]
    lut = np.array([[2.0, 2.0], [3.0, 3.0]]).reshape(1, 1, 2, 2)
    (m2, v2), (tm2, tv2) = run_lit(
        "constexpr_lut_to_sparse", indices_mask=mask, indices_nonzero_data=nz, lut=lut, vector_axis=0
    )
    assert tm2.shape == (8, 6) and tv2.shape == (18,)
    assert m2.tolist() == [row for row in DOC_MASK for _ in range(2)]
    assert v2.tolist() == [2, 3, 2, 3, 3, 2, 3, 3, 2, 3, 3, 2, 2, 3, 2, 2, 3, 3]
    bad(
        "constexpr_lut_to_sparse",
        "set entries",
        indices_mask=mask,
        indices_nonzero_data=tensor_literal("uint1", [0, 1]),
        lut=np.array([2.0, 3.0]).reshape(1, 1, 2, 1),
    )


def test_sparse_blockwise_shift_scale_documented():
    mask = tensor_literal("uint1", [[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 1, 1], [1, 1, 0, 0]])
    nz = np.array([10, 11, 3, 4, 5, 6, 7, 8, 9], dtype=np.int8)
    scale = np.array([[0.1, 0.2, 0.3, 0.4]])
    offset = np.array([[1, 2, 3, 4]], dtype=np.int8)
    (m, vals), (tm, tv) = run_lit(
        "constexpr_sparse_blockwise_shift_scale", data_mask=mask, nonzero_data=nz, scale=scale, offset=offset
    )
    assert tm == T.tensor("uint1", [4, 4]) and tv == T.tensor("fp32", [9])
    assert m.tolist() == mask.value.tolist()
    assert np.allclose(vals, [0.9, 1.8, 0.2, 0.4, 0.6, 0.9, 1.2, 0.7, 1.4])
    bad(
        "constexpr_sparse_blockwise_shift_scale",
        "not divisible",
        data_mask=mask,
        nonzero_data=nz,
        scale=np.ones((1, 3)),
    )
