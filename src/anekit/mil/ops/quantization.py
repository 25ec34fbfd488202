"""Dtype conversion and quantization: cast, quantize/dequantize and the constexpr decompression ops."""

from __future__ import annotations

from typing import Any

import numpy as np

from anekit.mil import types as T
from anekit.mil.ops._util import norm_axis
from anekit.mil.registry import Form, InferArgs, Input, OpDef, RefArgs, register_op

# cast: iOS15 allows fp16, fp32, int32, bool; iOS17 adds int8, uint8, int16, uint16 (for x and dtype).
CAST_T = frozenset({"fp16", "fp32", "int8", "uint8", "int16", "uint16", "int32", "bool"})
Q8 = frozenset({"int8", "uint8"})
INT32 = "int32"
STRING = "string"
# Palette index dtypes of the iOS18 LUT ops; their bit width sets the palette size 2**bits.
LUT_INDEX_T = frozenset({"uint1", "uint2", "uint3", "uint4", "uint6", "uint8"})
LUT_T = frozenset({"int8", "uint8", "fp16", "fp32"})
# Blockwise (iOS18) quantized data / offset dtypes.
SHIFT_T = frozenset({"int4", "uint4", "int8", "uint8", "fp16", "fp32"})
SPARSE_T = frozenset({"int4", "uint4", "int8", "uint8", "fp16", "fp32"})
IOS16_PALETTES = (2, 4, 16, 64, 256)

# Where each constexpr op keeps its parameters in each opset, as coremltools writes them: the ops of its
# iOS16 definitions (defs/iOS16/constexpr_ops.py) carry them as attributes in iOS16 and iOS17 programs,
# and so does constexpr_affine_dequantize in later ones (it was never redefined); the iOS18 definitions
# (defs/iOS18/compression.py) take inputs. Source: apple/coremltools backend/mil/load.py
# translate_constexpr (attributes when the definition's opset is iOS17 or older).
_OLD = frozenset({"ios16", "ios17"})
_NEW = frozenset({"ios18"})


def _old_form(*params: str) -> Form:
    return Form("ios16", _OLD, "attributes", params)


def _new_form(*params: str, optional: tuple[str, ...] = ()) -> Form:
    return Form("ios18", _NEW, "inputs", params, optional)


# -- helpers -----------------------------------------------------------------------------------------


def _float_dtype(*arrays: Any) -> np.dtype:
    """The float dtype to compute in: the widest float among the arrays, float64 if none is float."""
    floats = [np.asarray(x).dtype for x in arrays if np.asarray(x).dtype.kind == "f"]
    return np.result_type(*floats) if floats else np.dtype(np.float64)


def _along(p: Any, rank: int, axis: int) -> np.ndarray:
    """A scalar or per-axis vector parameter, shaped to broadcast against a rank-``rank`` tensor."""
    p = np.asarray(p)
    if p.ndim == 0:
        return p
    shape = [1] * rank
    shape[axis % rank] = p.size
    return p.reshape(shape)


def _dims_equal(d0: T.Dim, d1: T.Dim) -> bool:
    return not (isinstance(d0, int) and isinstance(d1, int)) or d0 == d1


def _check_param_vector(a: InferArgs, name: str, data: T.TensorType, axis: int) -> None:
    """A rank-1 quantization parameter must have one entry per slice of ``data`` along ``axis``."""
    t = a.tensor(name)
    if t.rank == 1 and not _dims_equal(t.shape[0], data.shape[axis]):
        raise a.error(
            f"'{name}' has {t.shape[0]} entries; expected {data.shape[axis]} (the size of axis {axis})"
        )


def _check_scale_zp(a: InferArgs, data_name: str) -> None:
    """iOS17 quantize/dequantize rule: scalar scale (and zero_point) without axis, or per-axis vectors."""
    x = a.tensor(data_name)
    sc = a.tensor("scale")
    zp = a.tensor("zero_point") if a.has("zero_point") else None
    if sc.rank == 0:
        if a.has("axis"):
            raise a.error("'axis' must be omitted when 'scale' is a scalar")
        if zp is not None and zp.rank != 0:
            raise a.error("'zero_point' must be a scalar when 'scale' is a scalar")
        return
    if not a.has("axis"):
        raise a.error("'axis' is required when 'scale' is a vector")
    axis = norm_axis(a, a.int("axis"), x.rank)
    _check_param_vector(a, "scale", x, axis)
    if zp is not None:
        if zp.rank != 1:
            raise a.error("'zero_point' must be a vector when 'scale' is a vector")
        _check_param_vector(a, "zero_point", x, axis)


def _dequant(q: Any, scale: Any, zero_point: Any, axis: int) -> np.ndarray:
    q = np.asarray(q)
    ft = _float_dtype(scale, zero_point)
    sc = _along(scale, q.ndim, axis).astype(ft)
    zp = _along(zero_point, q.ndim, axis).astype(ft)
    return (q.astype(ft) - zp) * sc


def _unpack_bits(packed: Any, nbits: int, count: int) -> np.ndarray:
    """``count`` unsigned ``nbits``-bit fields packed LSB-first, one byte after another."""
    bits = np.unpackbits(np.asarray(packed).astype(np.uint8).ravel(), bitorder="little")[: count * nbits]
    fields = bits.reshape(count, nbits).astype(np.int64)
    return (fields << np.arange(nbits, dtype=np.int64)).sum(axis=1)


def _packed_len(nbits: int, count: int) -> int:
    return (nbits * count + 7) // 8


def _ios16_shape(a: InferArgs) -> tuple[int, ...]:
    shape = tuple(int(v) for v in np.asarray(a.const("shape")).ravel())
    if any(d < 0 for d in shape):
        raise a.error(f"shape {list(shape)} has negative entries")
    return shape


def _static_count(shape: tuple[T.Dim, ...]) -> int | None:
    n = 1
    for d in shape:
        if not isinstance(d, int):
            return None
        n *= d
    return n


def _lut_out_shape(
    a: InferArgs, idx_shape: tuple[T.Dim, ...], nbits: int, lut: T.TensorType
) -> tuple[T.Dim, ...]:
    """Type rule of the iOS18 LUT ops: the dense output shape for indices of ``idx_shape``."""
    k = len(idx_shape)
    if k < 1:
        raise a.error("indices must have rank >= 1")
    if lut.rank != k + 2:
        raise a.error(f"'lut' must have rank rank(indices) + 2 = {k + 2}, got rank {lut.rank}")
    for i in range(k):
        di, dl = idx_shape[i], lut.shape[i]
        if isinstance(di, int) and isinstance(dl, int) and (dl < 1 or di % dl):
            raise a.error(f"dim {i} of indices ({di}) is not divisible by dim {i} of lut ({dl})")
    palettes, vsize = lut.shape[-2], lut.shape[-1]
    if isinstance(palettes, int) and palettes != 2**nbits:
        raise a.error(f"lut has {palettes} palette entries; {nbits}-bit indices need {2**nbits}")
    out = list(idx_shape)
    if a.has("vector_axis"):
        va = norm_axis(a, a.int("vector_axis"), k, "vector_axis")
        out[va] = out[va] * vsize if isinstance(out[va], int) and isinstance(vsize, int) else "?"
    elif vsize != 1:
        raise a.error(f"'vector_axis' is required when the lut vector size (last lut dim) is {vsize}, not 1")
    return tuple(out)


def _lut_dense(indices: Any, lut: Any, vector_axis: Any) -> np.ndarray:
    """Decode iOS18 per-block (vector) palettized indices of the dense index shape."""
    idx = np.asarray(indices).astype(np.int64)
    lut = np.asarray(lut)
    k = idx.ndim
    block = [idx.shape[i] // lut.shape[i] for i in range(k)]
    grid = np.indices(idx.shape, sparse=True)
    table = tuple(grid[i] // block[i] for i in range(k))
    at = (*table, idx)
    vals = lut[at]  # idx.shape + (vector_size,)
    vsize = lut.shape[-1]
    if vsize == 1:
        return vals[..., 0]
    va = int(vector_axis) % k
    out_shape = list(idx.shape)
    out_shape[va] *= vsize
    return np.moveaxis(vals, -1, va + 1).reshape(out_shape)


def _shift_scale_check(a: InferArgs, data_shape: tuple[T.Dim, ...], data_dtype: T.DType) -> None:
    sc = a.tensor("scale")
    if len(data_shape) < 1:
        raise a.error("the data must have rank >= 1")
    if sc.rank != len(data_shape):
        raise a.error(f"'scale' must have the rank of the data ({len(data_shape)}), got rank {sc.rank}")
    for i, (dd, ds) in enumerate(zip(data_shape, sc.shape)):
        if isinstance(dd, int) and isinstance(ds, int) and (ds < 1 or dd % ds):
            raise a.error(f"dim {i} of the data ({dd}) is not divisible by dim {i} of scale ({ds})")
    if a.has("offset"):
        off = a.tensor("offset")
        if off.rank != sc.rank or not all(_dims_equal(x, y) for x, y in zip(off.shape, sc.shape)):
            raise a.error(f"'offset' must have the shape of 'scale' {list(sc.shape)}, got {list(off.shape)}")
        if not off.dtype.is_float and off.dtype != data_dtype:
            raise a.error(f"an integer 'offset' must have the data dtype {data_dtype}, got {off.dtype}")


def _shift_scale(data: Any, scale: Any, offset: Any) -> np.ndarray:
    data = np.asarray(data)
    scale = np.asarray(scale)
    ft = _float_dtype(scale, data) if offset is None else _float_dtype(scale, data, offset)
    reps = [d // s for d, s in zip(data.shape, scale.shape)]
    out = data.astype(ft)
    if offset is not None:
        off = np.asarray(offset).astype(ft)
        for ax, r in enumerate(reps):
            off = np.repeat(off, r, axis=ax)
        out = out - off
    sc = scale.astype(ft)
    for ax, r in enumerate(reps):
        sc = np.repeat(sc, r, axis=ax)
    return out * sc


def _scatter_dense(nonzero: Any, mask: np.ndarray) -> np.ndarray:
    nonzero = np.asarray(nonzero)
    out = np.zeros(mask.shape, dtype=nonzero.dtype)
    out[mask != 0] = nonzero.ravel()
    return out


def _check_nonzero_count(a: InferArgs, mask_name: str, data_name: str) -> None:
    """When the uint1 mask's value is known, its count of ones must match the nonzero data length."""
    d = a.tensor(data_name)
    if d.rank != 1:
        raise a.error(f"'{data_name}' must be a 1-D tensor, got rank {d.rank}")
    mask = a.value(mask_name)
    if mask is not None and isinstance(d.shape[0], int):
        ones = int(np.count_nonzero(np.asarray(mask)))
        if ones != d.shape[0]:
            raise a.error(f"'{mask_name}' has {ones} set entries but '{data_name}' has {d.shape[0]} values")


# -- cast / quantize / dequantize --------------------------------------------------------------------


@register_op
class cast(OpDef):
    """cast(x, dtype): convert ``x`` to the element type named by ``dtype``; same shape.

    x: T in {fp16, fp32, int8, uint8, int16, uint16, int32, bool} (iOS15: fp16, fp32, int32, bool;
    iOS17 adds the 8/16-bit integers). dtype: const string, one of the same names; it is the output dtype.
    Semantics: to bool, ``x != 0``; to a float type, the value (the caller rounds to the precision);
    to an integer type, floats truncate toward zero, NaN becomes 0, and every value saturates to the
    target's range (numpy's wrap-around is not used).
    """

    inputs = {"x": Input(CAST_T), "dtype": Input(STRING, rank=0, const=True)}

    def infer(self, a: InferArgs) -> T.Type:
        name = a.str("dtype")
        if name not in CAST_T:
            raise a.error(f"dtype '{name}' is not one of {', '.join(sorted(CAST_T))}")
        return T.TensorType(T.dtype(name), a.tensor("x").shape)

    def reference(self, a: RefArgs) -> np.ndarray:
        target = T.dtype(a.str("dtype"))
        x = np.asarray(a["x"])
        if target.name == "bool":
            return x != 0
        if target.is_float:
            return x.copy() if x.dtype.kind == "f" else x.astype(np.float64)
        lo, hi = target.int_range()
        if x.dtype.kind == "f":
            v = np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0, posinf=hi, neginf=lo)
        else:
            v = x.astype(np.int64)
        return np.clip(v, lo, hi).astype(target.np)


@register_op
class quantize(OpDef):
    """quantize(input, zero_point?, scale, axis?, output_dtype): affine quantization (iOS17).

    ``out = clip(rint(input / scale) + zero_point, lo, hi)`` where rint rounds half to even
    (numpy.rint: 0.5 -> 0, 1.5 -> 2, -2.5 -> -2) and [lo, hi] is the range of output_dtype
    (int8: [-128, 127], uint8: [0, 255]); NaN quantizes to the zero point.
    input: tensor<SrcT>, SrcT in {fp16, fp32}; scale: const SrcT, scalar or vector.
    zero_point: const DstT (optional, default 0), shaped like scale; DstT in {int8, uint8} must equal
    output_dtype. axis: const int32: required when scale is a vector (one entry per slice along axis),
    omitted when it is a scalar. output_dtype: const string "int8" or "uint8".
    Output: tensor<DstT, input.shape>.
    """

    inputs = {
        "input": Input(T.FLOATS),
        "zero_point": Input(Q8, rank=(0, 1), const=True, optional=True),
        "scale": Input(T.FLOATS, rank=(0, 1), const=True),
        "axis": Input(INT32, rank=0, const=True, optional=True),
        "output_dtype": Input(STRING, rank=0, const=True),
    }
    same_dtype = ("input", "scale")

    def infer(self, a: InferArgs) -> T.Type:
        name = a.str("output_dtype")
        if name not in Q8:
            raise a.error(f"output_dtype '{name}' is not int8 or uint8")
        if a.has("zero_point") and a.tensor("zero_point").dtype.name != name:
            raise a.error(f"zero_point dtype {a.tensor('zero_point').dtype} differs from output_dtype {name}")
        _check_scale_zp(a, "input")
        return T.TensorType(T.dtype(name), a.tensor("input").shape)

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["input"])
        dt = T.dtype(a.str("output_dtype"))
        axis = a.get("axis")
        ax = 0 if axis is None else int(np.asarray(axis).item())
        sc = _along(a["scale"], x.ndim, ax)
        zp = _along(a.get("zero_point", 0), x.ndim, ax).astype(_float_dtype(x, sc))
        q = np.rint(x / sc) + zp
        q = np.where(np.isnan(q), zp, q)
        lo, hi = dt.int_range()
        return np.clip(q, lo, hi).astype(dt.np)


@register_op
class dequantize(OpDef):
    """dequantize(input, zero_point?, scale, axis?): ``out = scale * (input - zero_point)`` (iOS17).

    input: tensor<SrcT>, SrcT in {int8, uint8}; zero_point: const SrcT (optional, default 0).
    scale: const DstT in {fp16, fp32}; scalar, or a vector with one entry per slice along ``axis``
    (then axis is required, and zero_point, if given, is a vector too). Output: tensor<DstT, input.shape>.
    """

    inputs = {
        "input": Input(Q8),
        "zero_point": Input(Q8, rank=(0, 1), const=True, optional=True),
        "scale": Input(T.FLOATS, rank=(0, 1), const=True),
        "axis": Input(INT32, rank=0, const=True, optional=True),
    }
    same_dtype = ("input", "zero_point")

    def infer(self, a: InferArgs) -> T.Type:
        _check_scale_zp(a, "input")
        return T.TensorType(a.tensor("scale").dtype, a.tensor("input").shape)

    def reference(self, a: RefArgs) -> np.ndarray:
        axis = a.get("axis")
        ax = 0 if axis is None else int(np.asarray(axis).item())
        return _dequant(a["input"], a["scale"], a.get("zero_point", 0), ax)


# -- constexpr ops (compile-time decompression of constant weights) -----------------------------------


@register_op
class constexpr_affine_dequantize(OpDef):
    """constexpr_affine_dequantize(quantized_data, zero_point, scale, axis) (iOS16).

    ``out = scale * (quantized_data - zero_point)``, with a vector scale / zero_point broadcast along
    ``axis`` (each is independently a scalar or a vector of length ``quantized_data.shape[axis]``).
    quantized_data: const tensor<SrcT>, SrcT in {int8, uint8}; zero_point: const in {int8, uint8, fp32};
    scale: const DstT in {fp16, fp32}; axis: const int32 in [-rank, rank) (required even for scalars).
    All may be BLOBFILE constants: the type follows from the input types alone.
    Output: tensor<DstT, quantized_data.shape>.
    """

    inputs = {
        "quantized_data": Input(Q8, const=True),
        "zero_point": Input({"int8", "uint8", "fp32"}, rank=(0, 1), const=True),
        "scale": Input(T.FLOATS, rank=(0, 1), const=True),
        "axis": Input(INT32, rank=0, const=True),
    }
    forms = (Form("ios16", _OLD | _NEW, "attributes", ("quantized_data", "zero_point", "scale", "axis")),)

    def infer(self, a: InferArgs) -> T.Type:
        q = a.tensor("quantized_data")
        axis = norm_axis(a, a.int("axis"), q.rank)
        _check_param_vector(a, "scale", q, axis)
        _check_param_vector(a, "zero_point", q, axis)
        return T.TensorType(a.tensor("scale").dtype, q.shape)

    def reference(self, a: RefArgs) -> np.ndarray:
        return _dequant(a["quantized_data"], a["scale"], a["zero_point"], a.int("axis"))


@register_op
class constexpr_cast(OpDef):
    """constexpr_cast(source_val, output_dtype) (iOS16): a constant fp16 tensor widened to fp32.

    source_val: const tensor<fp16>; output_dtype: const string, must be "fp32". Output: tensor<fp32>.
    """

    inputs = {"source_val": Input("fp16", const=True), "output_dtype": Input(STRING, rank=0, const=True)}
    forms = (_old_form("source_val", "output_dtype"), _new_form("source_val", "output_dtype"))

    def infer(self, a: InferArgs) -> T.Type:
        if a.str("output_dtype") != "fp32":
            raise a.error(f"output_dtype must be 'fp32', got '{a.str('output_dtype')}'")
        return T.TensorType(T.fp32, a.tensor("source_val").shape)

    def reference(self, a: RefArgs) -> np.ndarray:
        return np.array(a["source_val"], copy=True)


@register_op
class constexpr_blockwise_shift_scale(OpDef):
    """constexpr_blockwise_shift_scale(data, scale, offset?) (iOS18): block-wise dequantization.

    ``out[i...] = scale[b...] * (data[i...] - offset[b...])`` with ``b_k = i_k // block_k`` and
    ``block_k = data.shape[k] / scale.shape[k]`` (every data dim divisible by the scale dim).
    data: const tensor<SrcT>, SrcT in {int4, uint4, int8, uint8, fp16, fp32}, rank >= 1.
    scale: const tensor<DstT, rank(data)>, DstT in {fp16, fp32}.
    offset: const (optional, default 0), the shape of scale; fp16/fp32, or the data's integer dtype.
    All may be BLOBFILE constants: the type follows from the input types alone.
    Output: tensor<DstT, data.shape>.
    """

    inputs = {
        "data": Input(SHIFT_T, const=True),
        "scale": Input(T.FLOATS, const=True),
        "offset": Input(SHIFT_T, const=True, optional=True),
    }
    forms = (_new_form("data", "scale", "offset", optional=("offset",)),)

    def infer(self, a: InferArgs) -> T.Type:
        d = a.tensor("data")
        _shift_scale_check(a, d.shape, d.dtype)
        return T.TensorType(a.tensor("scale").dtype, d.shape)

    def reference(self, a: RefArgs) -> np.ndarray:
        return _shift_scale(a["data"], a["scale"], a.get("offset"))


@register_op
class constexpr_lut_to_dense(OpDef):
    """constexpr_lut_to_dense: palettized weights; iOS16 and iOS18 forms, chosen by the inputs present.

    iOS16 form ``(indices, lut, shape)`` -- used when ``shape`` is given:
      indices: const tensor<uint8, [M]>: n-bit palette indices packed LSB-first, one byte after
      another (an index may straddle two bytes; unused high bits of the last byte are ignored),
      ``M = ceil(n * prod(shape) / 8)``. lut: const tensor<T, [2**n]>, 2**n in {2, 4, 16, 64, 256}.
      shape: const tensor<uint32 (int32 accepted), [K]>: the output shape; its value is needed for
      typing, so it must be an inline constant. ``out.ravel()[p] = lut[index p]``.
    iOS18 form ``(indices, lut, vector_axis?)`` -- used when ``shape`` is absent:
      indices: const tensor<IndicesT, [d_0..d_{K-1}]> of the dense index shape, IndicesT in {uint1,
      uint2, uint3, uint4, uint6, uint8} (sub-byte values held one per uint8 element); its bit width n
      sets the palette size. lut: const tensor<T, [l_0..l_{K-1}, 2**n, V]>; each d_k divisible by l_k,
      block_k = d_k / l_k, and element ``i`` of indices uses table ``lut[i_0 // block_0, ...]``.
      V is the vector size: with V == 1 ``out[i] = table[indices[i], 0]``; with V > 1 the required
      ``vector_axis`` (const int32) receives the V values: ``out[.., i_a*V + v, ..] = table[indices[i], v]``
      (a = vector_axis), so ``out.shape[a] = d_a * V``.
      Typing needs only the input types, so BLOBFILE indices and lut are fine.
    T in {int8, uint8, fp16, fp32}. Output: tensor<T> as described.
    """

    inputs = {
        "indices": Input(LUT_INDEX_T, const=True),
        "lut": Input(LUT_T, const=True),
        "shape": Input({"uint32", INT32}, rank=1, const=True, optional=True),
        "vector_axis": Input(INT32, rank=0, const=True, optional=True),
    }
    forms = (
        _old_form("indices", "lut", "shape"),
        _new_form("indices", "lut", "vector_axis", optional=("vector_axis",)),
    )

    def infer(self, a: InferArgs) -> T.Type:
        idx = a.tensor("indices")
        lut = a.tensor("lut")
        if a.has("shape"):
            if a.has("vector_axis"):
                raise a.error("'vector_axis' (iOS18 form) cannot be combined with 'shape' (iOS16 form)")
            if idx.dtype.name != "uint8" or idx.rank != 1:
                raise a.error(f"iOS16 form: indices must be packed bytes tensor<uint8, [M]>, got {idx}")
            if lut.rank != 1:
                raise a.error(f"iOS16 form: lut must be a vector, got rank {lut.rank}")
            n_pal = lut.shape[0]
            if isinstance(n_pal, int) and n_pal not in IOS16_PALETTES:
                raise a.error(f"iOS16 form: lut size {n_pal} is not one of {list(IOS16_PALETTES)}")
            shape = _ios16_shape(a)
            count = _static_count(shape)
            m = idx.shape[0]
            if isinstance(n_pal, int) and isinstance(m, int) and count is not None:
                nbits = n_pal.bit_length() - 1
                if m != _packed_len(nbits, count):
                    raise a.error(
                        f"iOS16 form: {count} {nbits}-bit indices pack into {_packed_len(nbits, count)} "
                        f"bytes, but indices has {m}"
                    )
            return T.TensorType(lut.dtype, shape)
        return T.TensorType(lut.dtype, _lut_out_shape(a, idx.shape, idx.dtype.bits, lut))

    def reference(self, a: RefArgs) -> np.ndarray:
        lut = np.asarray(a["lut"])
        if a.get("shape") is not None:
            shape = a.ints("shape")
            nbits = lut.size.bit_length() - 1
            count = int(np.prod(shape, dtype=np.int64))
            return lut[_unpack_bits(a["indices"], nbits, count)].reshape(shape)
        return _lut_dense(a["indices"], lut, a.get("vector_axis"))


@register_op
class constexpr_sparse_to_dense(OpDef):
    """constexpr_sparse_to_dense: bit-mask sparse weights; iOS16 and iOS18 forms, chosen by ``shape``.

    Both forms: nonzero_data: const tensor<T, [D]>; the output is zero except where the mask is set,
    and those positions (in row-major order) take nonzero_data in order. D must equal the number of
    set mask bits (checked when the mask value is known).
    iOS16 form ``(nonzero_data, mask, shape)``: mask: const tensor<uint8, [M]>, one bit per output
    element packed LSB-first, ``M = ceil(prod(shape) / 8)``, padding bits zero; shape: const
    tensor<uint32 (int32 accepted), [K]>, an inline constant (its value types the output).
    iOS18 form ``(nonzero_data, mask)``: mask: const tensor<uint1, [dense shape]>; the output has the
    mask's shape (typing needs only the types, so BLOBFILE inputs are fine).
    T in {int4, uint4, int8, uint8, fp16, fp32}. Output: tensor<T>.
    """

    inputs = {
        "nonzero_data": Input(SPARSE_T, const=True),
        "mask": Input({"uint1", "uint8"}, const=True),
        "shape": Input({"uint32", INT32}, rank=1, const=True, optional=True),
    }
    forms = (_old_form("nonzero_data", "mask", "shape"), _new_form("nonzero_data", "mask"))

    def infer(self, a: InferArgs) -> T.Type:
        data = a.tensor("nonzero_data")
        mask = a.tensor("mask")
        if data.rank != 1:
            raise a.error(f"'nonzero_data' must be a 1-D tensor, got rank {data.rank}")
        if not a.has("shape"):
            if mask.dtype.name != "uint1":
                raise a.error(f"iOS18 form (no 'shape'): mask must be uint1 of the dense shape, got {mask}")
            _check_nonzero_count(a, "mask", "nonzero_data")
            return T.TensorType(data.dtype, mask.shape)
        if mask.dtype.name != "uint8" or mask.rank != 1:
            raise a.error(f"iOS16 form: mask must be packed bits tensor<uint8, [M]>, got {mask}")
        shape = _ios16_shape(a)
        count = _static_count(shape)
        m = mask.shape[0]
        if count is not None and isinstance(m, int) and m != _packed_len(1, count):
            raise a.error(f"iOS16 form: {count} mask bits pack into {_packed_len(1, count)} bytes, got {m}")
        bits = a.value("mask")
        if bits is not None and count is not None:
            unpacked = np.unpackbits(np.asarray(bits).astype(np.uint8).ravel(), bitorder="little")
            if unpacked[count:].any():
                raise a.error("iOS16 form: the padding bits of mask must be zero")
            ones = int(unpacked[:count].sum())
            if isinstance(data.shape[0], int) and ones != data.shape[0]:
                raise a.error(f"mask has {ones} set bits but 'nonzero_data' has {data.shape[0]} values")
        return T.TensorType(data.dtype, shape)

    def reference(self, a: RefArgs) -> np.ndarray:
        if a.get("shape") is not None:
            shape = a.ints("shape")
            count = int(np.prod(shape, dtype=np.int64))
            bits = np.unpackbits(np.asarray(a["mask"]).astype(np.uint8).ravel(), bitorder="little")[:count]
            return _scatter_dense(a["nonzero_data"], bits).reshape(shape)
        return _scatter_dense(a["nonzero_data"], np.asarray(a["mask"]))


@register_op
class constexpr_lut_to_sparse(OpDef):
    """constexpr_lut_to_sparse(indices_mask, indices_nonzero_data, lut, vector_axis?) (iOS18).

    Palettization applied to sparse data: the dense index tensor is ``indices_nonzero_data`` scattered
    into the set positions of ``indices_mask`` (as ``constexpr_sparse_to_dense``), decoded with ``lut``
    / ``vector_axis`` exactly as the iOS18 ``constexpr_lut_to_dense``. Two outputs:
      mask: tensor<uint1>: indices_mask, repeated V times along vector_axis when V > 1;
      nonzero_data: tensor<T, [D * V]>: the decoded values at the set positions of that mask (row-major).
    indices_mask: const uint1; indices_nonzero_data: const tensor<IndicesT, [D]>, IndicesT in {uint1,
    uint2, uint3, uint4, uint6, uint8}; lut: const tensor<T, [l.., 2**n, V]>, T in {int8, uint8, fp16, fp32}.
    """

    inputs = {
        "indices_mask": Input("uint1", const=True),
        "indices_nonzero_data": Input(LUT_INDEX_T, const=True),
        "lut": Input(LUT_T, const=True),
        "vector_axis": Input(INT32, rank=0, const=True, optional=True),
    }
    forms = (
        _new_form("indices_mask", "indices_nonzero_data", "lut", "vector_axis", optional=("vector_axis",)),
    )

    def infer(self, a: InferArgs) -> tuple[T.Type, ...]:
        mask = a.tensor("indices_mask")
        data = a.tensor("indices_nonzero_data")
        lut = a.tensor("lut")
        _check_nonzero_count(a, "indices_mask", "indices_nonzero_data")
        out_mask = _lut_out_shape(a, mask.shape, data.dtype.bits, lut)
        v = lut.shape[-1]
        d = data.shape[0]
        n = d * v if isinstance(d, int) and isinstance(v, int) else "?"
        return T.TensorType(T.uint1, out_mask), T.TensorType(lut.dtype, (n,))

    def reference(self, a: RefArgs) -> tuple[np.ndarray, np.ndarray]:
        mask = np.asarray(a["indices_mask"])
        lut = np.asarray(a["lut"])
        va = a.get("vector_axis")
        dense = _lut_dense(_scatter_dense(a["indices_nonzero_data"], mask), lut, va)
        out_mask = mask if lut.shape[-1] == 1 else np.repeat(mask, lut.shape[-1], axis=int(va) % mask.ndim)
        return out_mask.copy(), dense[out_mask != 0]


@register_op
class constexpr_sparse_blockwise_shift_scale(OpDef):
    """constexpr_sparse_blockwise_shift_scale(data_mask, nonzero_data, scale, offset?) (iOS18).

    Block-wise dequantization applied to sparse data: ``nonzero_data`` sits at the set positions of
    ``data_mask`` (row-major) and each value is dequantized with the scale/offset block of its dense
    position, as ``constexpr_blockwise_shift_scale`` on data of shape ``data_mask.shape``. Two outputs:
      mask: tensor<uint1> equal to data_mask; nonzero_data: tensor<DstT, [D]>, the dequantized values.
    data_mask: const uint1; nonzero_data: const tensor<SrcT, [D]>, SrcT in {int4, uint4, int8, uint8,
    fp16, fp32}; scale: const DstT in {fp16, fp32} of rank(data_mask); offset: optional, like scale.
    """

    inputs = {
        "data_mask": Input("uint1", const=True),
        "nonzero_data": Input(SHIFT_T, const=True),
        "scale": Input(T.FLOATS, const=True),
        "offset": Input(SHIFT_T, const=True, optional=True),
    }
    forms = (_new_form("data_mask", "nonzero_data", "scale", "offset", optional=("offset",)),)

    def infer(self, a: InferArgs) -> tuple[T.Type, ...]:
        mask = a.tensor("data_mask")
        data = a.tensor("nonzero_data")
        _check_nonzero_count(a, "data_mask", "nonzero_data")
        _shift_scale_check(a, mask.shape, data.dtype)
        return T.TensorType(T.uint1, mask.shape), T.TensorType(a.tensor("scale").dtype, data.shape)

    def reference(self, a: RefArgs) -> tuple[np.ndarray, np.ndarray]:
        mask = np.asarray(a["data_mask"])
        dense = _shift_scale(_scatter_dense(a["nonzero_data"], mask), a["scale"], a.get("offset"))
        return mask.copy(), dense[mask != 0]
