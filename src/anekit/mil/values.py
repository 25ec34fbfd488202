"""Typed literal values of MIL: inline tensors and scalars, lists, dicts, and BLOBFILE references, and how
MIL text spells each (``format_literal``; ``anekit.mil.types.format_type`` spells their types).

Floating-point values print as C hex floats (``0x1.5p-17``: exact); inside a dict literal they print as
shortest-round-trip decimals (``0.0046742807655237523``), as coremlc does. In the "tensor" scalar style
(programs of version 1.0) scalars are spelled ``tensor<fp16, []>``, BLOBFILE's path and offset included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from anekit.mil import types as T


@dataclass(frozen=True)
class BlobRef:
    """``BLOBFILE(path = string("@model_path/weights/x.bin"), offset = uint64(64))``.

    ``offset`` is the byte offset of the blob's metadata record in the weight file, not of its data.
    """

    path: str
    offset: int


Payload = Union[np.ndarray, BlobRef, tuple]


class Literal:
    """A typed constant as it appears in MIL text: ``tensor<int32, [2]>([1, 1])``, ``fp16(0x1p+0)``.

    The payload is, by type:
      * TensorType: a numpy array of the dtype's storage type and exactly the type's shape, or a BlobRef;
      * ListType: a tuple of element Literals;
      * DictType: a tuple of (key Literal, value Literal) pairs.
    """

    __slots__ = ("type", "value")

    def __init__(self, type_: T.Type, value: Payload) -> None:
        self.type = type_
        self.value = value

    @property
    def is_blob(self) -> bool:
        return isinstance(self.value, BlobRef)

    def _key(self) -> tuple[Any, ...]:
        v = self.value
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                return (self.type, "obj", tuple(v.ravel().tolist()))
            return (self.type, v.dtype.str, v.shape, v.tobytes())
        return (self.type, v)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Literal) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Literal({format_literal(self)})"

    def scalar(self) -> Any:
        """The Python value of a scalar literal (int, float, bool or str)."""
        if not isinstance(self.value, np.ndarray) or self.value.ndim != 0:
            raise ValueError(f"literal of type {self.type} is not a scalar")
        return self.value.item()


def format_float(value: float) -> str:
    """A C99 ``%a`` hex float: ``0x1p+0``, ``-0x1.8p+1``, ``0x0p+0``, ``inf``, ``nan``."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = float(value).hex()  # e.g. '0x1.5000000000000p-17'
    sign = "-" if text.startswith("-") else ""
    mantissa, exponent = text.lstrip("-")[2:].split("p")
    whole, _, frac = mantissa.partition(".")
    frac = frac.rstrip("0")
    body = f"{whole}.{frac}" if frac else whole
    exp = int(exponent)
    if whole == "0" and not frac:
        exp = 0
    return f"{sign}0x{body}p{exp:+d}"


def format_decimal(value: float, dt: T.DType) -> str:
    """Shortest decimal that round-trips at the dtype's precision (``%.17g`` for fp64)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    digits = {64: 17, 32: 9}.get(dt.bits, 5)
    return f"{value:.{digits}g}"


def _quote(s: str) -> str:
    """A MIL string literal's text: double-quoted, with backslash, quote, newline and tab escaped."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


def _element(v: Any, dt: T.DType, in_dict: bool = False) -> str:
    """One element of a tensor payload; ``v`` is a Python scalar (``ndarray.item`` / ``tolist``)."""
    if dt.kind == "string":
        return _quote(str(v))
    if dt.kind == "bool":
        return "true" if v else "false"
    if dt.kind == "float":
        f = float(v)
        return format_decimal(f, dt) if in_dict else format_float(f)
    return str(int(v))


def _payload(lit: Literal, style: str, in_dict: bool = False) -> str:
    """The text inside ``TYPE(...)`` for a literal."""
    t, v = lit.type, lit.value
    if isinstance(v, BlobRef):
        path = f"{T.format_type(T.TensorType(T.string, ()), style)}({_quote(v.path)})"
        offset = f"{T.format_type(T.TensorType(T.uint64, ()), style)}({v.offset})"
        return f"BLOBFILE(path = {path}, offset = {offset})"
    if isinstance(t, T.TensorType):
        assert isinstance(v, np.ndarray)
        if v.ndim == 0:
            return _element(v.item(), t.dtype, in_dict)
        flat = v.ravel().tolist()
        return "[" + ", ".join(_element(x, t.dtype, in_dict) for x in flat) + "]"
    if isinstance(t, T.ListType):
        return "[" + ", ".join(_payload(e, style, in_dict) for e in v) + "]"
    if isinstance(t, T.DictType):
        pairs = (f"{{{_payload(k, style, True)}, {_payload(x, style, True)}}}" for k, x in v)
        return "{" + ", ".join(pairs) + "}"
    raise TypeError(f"cannot print a literal of type {t}")


def format_literal(lit: Literal, style: str = "scalar") -> str:
    """``tensor<int32, [2]>([1, 1])``, ``fp16(0x1p+0)``, ``dict<string, string>({{"a", "b"}})``."""
    return f"{T.format_type(lit.type, style)}({_payload(lit, style)})"


def tensor_literal(dt: str | T.DType, data: Any, shape: tuple[int, ...] | None = None) -> Literal:
    """A tensor (or scalar, for shape ()) literal holding ``data`` converted to the dtype's storage.

    Floats outside a float dtype's range become inf (as the hardware stores them); integers outside an
    integer dtype's range are a ValueError naming the dtype and the value.
    """
    d = T.dtype(dt)
    if d.is_int or d.kind == "bool":
        raw = np.asarray(data)
        if raw.size and raw.dtype.kind in "iuf":
            lo, hi = d.int_range()
            bad = raw[(raw < lo) | (raw > hi) | (raw != np.floor(raw) if raw.dtype.kind == "f" else False)]
            if bad.size:
                raise ValueError(f"value {bad.ravel()[0].item()!r} does not fit {d.name} ({lo}..{hi})")
    if d.name == "bf16":  # one rounding from the value given (no float32 detour)
        from anekit.fp16 import round_f64_to_bf16

        arr = round_f64_to_bf16(np.asarray(data, dtype=np.float64))
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            arr = np.asarray(data, dtype=d.np if d.name != "string" else object)
    if shape is not None:
        arr = arr.reshape(shape)
    return Literal(T.TensorType(d, tuple(int(s) for s in arr.shape)), arr)


def scalar_literal(dt: str | T.DType, value: Any) -> Literal:
    """A scalar literal: ``scalar_literal("fp16", 0.5)`` is ``fp16(0x1p-1)``."""
    return tensor_literal(dt, value, ())


def string_literal(value: str) -> Literal:
    return scalar_literal(T.string, value)


def blob_literal(type_: T.TensorType, path: str, offset: int) -> Literal:
    """A tensor literal whose data lives in a weight file."""
    return Literal(type_, BlobRef(path, int(offset)))


def from_python(value: Any, float_dtype: str = "fp32") -> Literal:
    """A literal from a Python / numpy value: bool, int -> int32, float -> ``float_dtype``, str -> string.

    numpy arrays keep their dtype, except float64 which becomes ``float_dtype`` (MIL programs carry
    fp16/fp32) and int64 which becomes int32.
    """
    if isinstance(value, Literal):
        return value
    if isinstance(value, (bool, np.bool_)):
        return scalar_literal(T.bool_, bool(value))
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.ndarray):
        return scalar_literal(T.int32, int(value))
    if isinstance(value, (float, np.floating)) and not isinstance(value, np.ndarray):
        return scalar_literal(float_dtype, float(value))
    if isinstance(value, str):
        return string_literal(value)
    arr = np.asarray(value)
    if arr.dtype.kind in "US":
        return tensor_literal(T.string, arr.astype(object))
    if arr.dtype == np.float64:
        return tensor_literal(float_dtype, arr)
    if arr.dtype == np.int64:
        return tensor_literal(T.int32, arr)
    return tensor_literal(T.dtype_of_numpy(arr), arr)


def dict_literal(key_type: T.Type, value_type: T.Type, items: dict[Any, Any]) -> Literal:
    """A ``dict<K, V>`` literal from a Python dict of scalar keys and values."""
    pairs = []
    for k, v in items.items():
        assert isinstance(key_type, T.TensorType) and isinstance(value_type, T.TensorType)
        pairs.append((scalar_literal(key_type.dtype, k), scalar_literal(value_type.dtype, v)))
    return Literal(T.DictType(key_type, value_type), tuple(pairs))


def build_info(items: dict[str, str], scalar_style: str = "scalar") -> Literal:
    """The ``buildInfo`` dict of a program header."""
    s = T.scalar(T.string)
    return dict_literal(s, s, items)
