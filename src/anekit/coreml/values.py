"""MIL types and literal values <-> their protobuf form (MIL.proto ``ValueType`` and ``Value``).

Inline tensors use the ``TensorValue`` field coremltools writes and reads for each dtype
(coremltools ``converters/mil/backend/mil/helper.py`` ``_tensor_field_by_type`` and
``IMMEDIATE_VALUE_TYPES_IN_BYTES``), so its loader and the CoreML framework read what anekit writes::

    dtype                                       TensorValue field
    fp16, int4, int8, uint1..uint6, uint8,      bytes (little-endian; sub-byte values packed LSB first,
      uint32, bf16                                as in MILBlob)
    int16, uint16, int32                        ints
    int64, uint64                               longInts
    fp32 / fp64 / bool / string                 floats / doubles / bools / strings (UTF-8)

A tensor whose data lives in a weight file is a ``BlobFileValue``: ``fileName`` (``@model_path/...``)
and ``offset`` (of the blob's metadata record). Symbolic dimensions are written as unknown dimensions
and read back as ``?`` (the protobuf keeps no symbol names).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from anekit.blob import _pack_bits, _sign_extend4, _unpack_bits
from anekit.coreml._proto import proto
from anekit.errors import CoreMLFormatError
from anekit.fp16 import bf16_bits_to_f32, f32_to_bf16_bits
from anekit.mil import types as T
from anekit.mil.values import BlobRef, Literal, tensor_literal

# anekit dtype -> MIL.proto DataType name (FLOAT8E4M3FN / FLOAT8E5M2 have no anekit dtype).
PROTO_DTYPE_NAMES: dict[str, str] = {
    "bool": "BOOL", "string": "STRING", "fp16": "FLOAT16", "fp32": "FLOAT32", "fp64": "FLOAT64",
    "bf16": "BFLOAT16", "int4": "INT4", "int8": "INT8", "int16": "INT16", "int32": "INT32",
    "int64": "INT64", "uint1": "UINT1", "uint2": "UINT2", "uint3": "UINT3", "uint4": "UINT4",
    "uint6": "UINT6", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
}  # fmt: skip
BYTES_DTYPES = frozenset(
    {"fp16", "bf16", "int4", "int8", "uint1", "uint2", "uint3", "uint4", "uint6", "uint8", "uint32"}
)
INTS_DTYPES = frozenset({"int16", "uint16", "int32"})
LONG_DTYPES = frozenset({"int64", "uint64"})
_LE = {"int8": "<i1", "uint8": "<u1", "uint32": "<u4", "int16": "<i2", "uint16": "<u2", "int32": "<i4"}

BlobReader = Callable[[str, int, T.TensorType, str], Literal]
"""(fileName, offset, declared type, field path) -> the BLOBFILE literal, checked against the file."""


def proto_dtype(dt: T.DType) -> int:
    return proto().MIL.DataType.Value(PROTO_DTYPE_NAMES[dt.name])


def _dtype_from_proto(code: int, field: str) -> T.DType:
    mil = proto().MIL
    try:
        name = mil.DataType.Name(code)
    except ValueError:
        name = str(code)
    for ours, theirs in PROTO_DTYPE_NAMES.items():
        if theirs == name:
            return T.dtype(ours)
    raise CoreMLFormatError(field, f"data type {name} has no anekit MIL dtype", actual=name)


# -- types ------------------------------------------------------------------------------------------


def type_to_proto(t: T.Type, where: str) -> Any:
    """The ``ValueType`` of a MIL type; CoreMLFormatError for types a package cannot hold."""
    mil = proto().MIL
    vt = mil.ValueType()
    if isinstance(t, T.TensorType):
        tt = vt.tensorType
        tt.dataType = proto_dtype(t.dtype)
        tt.rank = len(t.shape)
        for d in t.shape:
            dim = tt.dimensions.add()
            if isinstance(d, int):
                dim.constant.size = d
            else:
                dim.unknown.variadic = False
    elif isinstance(t, T.ListType):
        vt.listType.type.CopyFrom(type_to_proto(t.elem, where))
        if t.length is None:
            vt.listType.length.unknown.variadic = False
        else:
            vt.listType.length.constant.size = t.length
    elif isinstance(t, T.DictType):
        vt.dictionaryType.keyType.CopyFrom(type_to_proto(t.key, where))
        vt.dictionaryType.valueType.CopyFrom(type_to_proto(t.value, where))
    elif isinstance(t, T.TupleType):
        for e in t.elems:
            vt.tupleType.types.add().CopyFrom(type_to_proto(e, where))
    elif isinstance(t, T.StateType):
        vt.stateType.wrappedType.CopyFrom(type_to_proto(t.wrapped, where))
    else:
        raise CoreMLFormatError(where, f"type {t} cannot be written in a CoreML package")
    return vt


def _dim(d: Any, field: str) -> int | str:
    kind = d.WhichOneof("dimension")
    if kind == "constant":
        return int(d.constant.size)
    if kind == "unknown" and not d.unknown.variadic:
        return "?"
    raise CoreMLFormatError(field, "variadic or missing dimension (anekit needs a fixed rank)")


def type_from_proto(vt: Any, field: str) -> T.Type:
    """The MIL type of a ``ValueType``."""
    kind = vt.WhichOneof("type")
    if kind == "tensorType":
        tt = vt.tensorType
        dt = _dtype_from_proto(tt.dataType, f"{field}.tensorType.dataType")
        if tt.rank != len(tt.dimensions):
            raise CoreMLFormatError(
                f"{field}.tensorType.rank", "rank differs from the number of dimensions",
                expected=len(tt.dimensions), actual=tt.rank,
            )  # fmt: skip
        shape = tuple(_dim(d, f"{field}.tensorType.dimensions[{i}]") for i, d in enumerate(tt.dimensions))
        return T.TensorType(dt, shape)
    if kind == "listType":
        elem = type_from_proto(vt.listType.type, f"{field}.listType.type")
        length = _dim(vt.listType.length, f"{field}.listType.length")
        return T.ListType(elem, length if isinstance(length, int) else None)
    if kind == "dictionaryType":
        dt_ = vt.dictionaryType
        return T.DictType(
            type_from_proto(dt_.keyType, f"{field}.dictionaryType.keyType"),
            type_from_proto(dt_.valueType, f"{field}.dictionaryType.valueType"),
        )
    if kind == "tupleType":
        return T.TupleType(
            tuple(type_from_proto(e, f"{field}.tupleType[{i}]") for i, e in enumerate(vt.tupleType.types))
        )
    if kind == "stateType":
        return T.StateType(type_from_proto(vt.stateType.wrappedType, f"{field}.stateType"))
    raise CoreMLFormatError(field, "value type is not set")


# -- values -----------------------------------------------------------------------------------------


def pack_sub_byte(values: np.ndarray, bits: int) -> bytes:
    """Sub-byte values packed LSB first into ceil(n * bits / 8) bytes (the MILBlob packing)."""
    flat = (np.asarray(values).reshape(-1).astype(np.int16) & ((1 << bits) - 1)).astype(np.uint8)
    n = flat.size
    padded = np.zeros(-(-n // 8) * 8, dtype=np.uint8)
    padded[:n] = flat
    return _pack_bits(padded, bits).tobytes()[: -(-n * bits // 8)] if n else b""


def tensor_bytes(lit: Literal) -> bytes:
    """The stored bytes of an inline tensor of a ``bytes`` dtype (also what goes in a weight file)."""
    assert isinstance(lit.type, T.TensorType) and isinstance(lit.value, np.ndarray)
    dt, arr = lit.type.dtype, lit.value
    if dt.name == "fp16":
        return arr.astype("<f2").tobytes()
    if dt.name == "bf16":
        return f32_to_bf16_bits(arr.astype(np.float32)).astype("<u2").tobytes()
    if dt.bits < 8:
        return pack_sub_byte(arr, dt.bits)
    return arr.astype(_LE[dt.name]).tobytes()


def literal_to_value(lit: Literal, where: str) -> Any:
    """The protobuf ``Value`` of a literal (a BLOBFILE literal keeps its file name and offset)."""
    mil = proto().MIL
    v = mil.Value()
    v.type.CopyFrom(type_to_proto(lit.type, where))
    payload = lit.value
    if isinstance(payload, BlobRef):
        v.blobFileValue.fileName = payload.path
        v.blobFileValue.offset = payload.offset
        return v
    t = lit.type
    if isinstance(t, T.ListType):
        for i, e in enumerate(payload):
            v.immediateValue.list.values.add().CopyFrom(literal_to_value(e, f"{where}[{i}]"))
        return v
    if isinstance(t, T.DictType):
        for k, val in payload:
            pair = v.immediateValue.dictionary.values.add()
            pair.key.CopyFrom(literal_to_value(k, f"{where}.key"))
            pair.value.CopyFrom(literal_to_value(val, f"{where}.value"))
        return v
    if not isinstance(t, T.TensorType) or not isinstance(payload, np.ndarray):
        raise CoreMLFormatError(where, f"literal of type {t} cannot be written in a CoreML package")
    tv = v.immediateValue.tensor
    name = t.dtype.name
    flat = payload.reshape(-1)
    if name in BYTES_DTYPES:
        tv.bytes.values = tensor_bytes(lit)
    elif name in INTS_DTYPES:
        tv.ints.SetInParent()
        tv.ints.values.extend(flat.astype(np.int64).tolist())
    elif name in LONG_DTYPES:
        tv.longInts.SetInParent()
        tv.longInts.values.extend(flat.astype(np.uint64).view(np.int64).tolist())
    elif name == "fp32":
        tv.floats.SetInParent()
        tv.floats.values.extend(flat.astype(np.float32).tolist())
    elif name == "fp64":
        tv.doubles.SetInParent()
        tv.doubles.values.extend(flat.astype(np.float64).tolist())
    elif name == "bool":
        tv.bools.SetInParent()
        tv.bools.values.extend(bool(x) for x in flat.tolist())
    elif name == "string":
        tv.strings.SetInParent()
        tv.strings.values.extend(str(x) for x in flat.tolist())
    else:  # pragma: no cover - every MIL dtype is listed above
        raise CoreMLFormatError(where, f"no protobuf encoding for {name}")
    return v


def _from_bytes(raw: bytes, dt: T.DType, n: int, field: str) -> np.ndarray:
    if dt.bits < 8:
        need = -(-n * dt.bits // 8)
        if len(raw) != need:
            raise CoreMLFormatError(
                f"{field}.bytes", f"{n} {dt.name} values take {need} bytes", expected=need, actual=len(raw)
            )
        vals = _unpack_bits(np.frombuffer(raw, dtype=np.uint8), dt.bits, n)
        return _sign_extend4(vals) if dt.name == "int4" else vals
    np_dt = {"fp16": "<f2", "bf16": "<u2"}.get(dt.name) or _LE.get(dt.name)
    if np_dt is None:
        raise CoreMLFormatError(f"{field}.bytes", f"{dt.name} values are not stored as bytes")
    size = np.dtype(np_dt).itemsize
    if len(raw) != n * size:
        raise CoreMLFormatError(
            f"{field}.bytes",
            f"{n} {dt.name} values take {n * size} bytes",
            expected=n * size,
            actual=len(raw),
        )
    arr = np.frombuffer(raw, dtype=np_dt)
    return bf16_bits_to_f32(arr) if dt.name == "bf16" else arr


def _tensor_from_proto(tv: Any, t: T.TensorType, field: str) -> Literal:
    if not t.is_static:
        raise CoreMLFormatError(field, f"a constant needs a static shape, got {list(t.shape)}")
    n = 1
    for d in t.shape:
        n *= int(d)
    dt = t.dtype
    which = tv.WhichOneof("value")
    if which is None:
        data: Any = np.zeros(0)
    elif which == "bytes":
        data = _from_bytes(tv.bytes.values, dt, n, field)
    else:
        data = list(getattr(tv, which).values)
        allowed = {
            "floats": dt.is_float, "doubles": dt.is_float, "ints": dt.is_int or dt.kind == "bool",
            "longInts": dt.is_int, "bools": dt.kind == "bool", "strings": dt.kind == "string",
        }[which]  # fmt: skip
        if not allowed:
            raise CoreMLFormatError(f"{field}.{which}", f"a {dt.name} tensor cannot be stored in '{which}'")
        if which == "longInts" and dt.name == "uint64":
            data = np.asarray(data, dtype=np.int64).view(np.uint64)
    count = len(data)
    if count != n:
        raise CoreMLFormatError(
            f"{field}.{which or 'value'}",
            f"holds {count} values; the type {t} needs {n}",
            expected=n,
            actual=count,
        )
    try:
        return tensor_literal(dt, np.asarray(data), tuple(int(d) for d in t.shape))
    except ValueError as e:
        raise CoreMLFormatError(field, str(e)) from None


def value_to_literal(v: Any, field: str, blob: BlobReader | None = None) -> Literal:
    """The literal of a protobuf ``Value``; BLOBFILE values go through ``blob`` (refused when None)."""
    t = type_from_proto(v.type, f"{field}.type")
    which = v.WhichOneof("value")
    if which == "blobFileValue":
        if blob is None or not isinstance(t, T.TensorType) or not t.is_static:
            raise CoreMLFormatError(
                f"{field}.blobFileValue", f"a weight-file value is not allowed here ({t})"
            )
        return blob(v.blobFileValue.fileName, int(v.blobFileValue.offset), t, f"{field}.blobFileValue")
    if which != "immediateValue":
        raise CoreMLFormatError(field, "value has neither an immediate value nor a weight-file value")
    iv = v.immediateValue
    kind = iv.WhichOneof("value")
    if isinstance(t, T.TensorType) and kind == "tensor":
        return _tensor_from_proto(iv.tensor, t, f"{field}.immediateValue.tensor")
    if isinstance(t, T.ListType) and kind == "list":
        items = tuple(value_to_literal(e, f"{field}.list[{i}]", blob) for i, e in enumerate(iv.list.values))
        return Literal(t, items)
    if isinstance(t, T.DictType) and kind == "dictionary":
        pairs = tuple(
            (
                value_to_literal(p.key, f"{field}.dictionary[{i}].key"),
                value_to_literal(p.value, f"{field}.dictionary[{i}].value"),
            )
            for i, p in enumerate(iv.dictionary.values)
        )
        return Literal(t, pairs)
    raise CoreMLFormatError(f"{field}.immediateValue", f"a {kind or 'missing'} value for a value of type {t}")
