"""MIL types: element dtypes, tensors (rank 0 = scalar), lists, dicts, tuples, tensor buffers, states.

A scalar is a rank-0 tensor: ``fp16`` and ``tensor<fp16, []>`` are the same type, spelled one way or
the other depending on the program version (see ``anekit.mil.printer``). Dimensions are ints, or
strings for symbolic sizes (``is0``) and ``?`` for an unknown size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

import numpy as np


@dataclass(frozen=True)
class DType:
    """An element type: its MIL spelling, kind, width in bits and numpy storage dtype."""

    name: str
    kind: str  # "float", "int", "uint", "bool" or "string"
    bits: int
    storage: str  # numpy dtype name used to hold values of this type

    def __str__(self) -> str:
        return self.name

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def np(self) -> np.dtype:
        """The numpy dtype that stores values of this type (sub-byte ints widen to int8/uint8)."""
        return np.dtype(self.storage)

    def int_range(self) -> tuple[int, int]:
        """The inclusive value range of an integer dtype."""
        if self.kind == "int":
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        if self.kind == "uint":
            return 0, (1 << self.bits) - 1
        if self.kind == "bool":
            return 0, 1
        raise ValueError(f"{self.name} is not an integer type")


_DTYPE_TABLE = (
    # name, kind, bits, storage
    ("fp16", "float", 16, "float16"),
    ("bf16", "float", 16, "float32"),  # numpy has no bfloat16: values held as float32 rounded to bf16
    ("fp32", "float", 32, "float32"),
    ("fp64", "float", 64, "float64"),
    ("int4", "int", 4, "int8"),
    ("int8", "int", 8, "int8"),
    ("int16", "int", 16, "int16"),
    ("int32", "int", 32, "int32"),
    ("int64", "int", 64, "int64"),
    ("uint1", "uint", 1, "uint8"),
    ("uint2", "uint", 2, "uint8"),
    ("uint3", "uint", 3, "uint8"),
    ("uint4", "uint", 4, "uint8"),
    ("uint6", "uint", 6, "uint8"),
    ("uint8", "uint", 8, "uint8"),
    ("uint16", "uint", 16, "uint16"),
    ("uint32", "uint", 32, "uint32"),
    ("uint64", "uint", 64, "uint64"),
    ("bool", "bool", 8, "bool"),
    ("string", "string", 0, "object"),
)

DTYPES: dict[str, DType] = {row[0]: DType(*row) for row in _DTYPE_TABLE}

fp16, bf16, fp32, fp64 = (DTYPES[n] for n in ("fp16", "bf16", "fp32", "fp64"))
int4, int8, int16, int32, int64 = (DTYPES[n] for n in ("int4", "int8", "int16", "int32", "int64"))
uint1, uint2, uint3, uint4, uint6 = (DTYPES[n] for n in ("uint1", "uint2", "uint3", "uint4", "uint6"))
uint8, uint16, uint32, uint64 = (DTYPES[n] for n in ("uint8", "uint16", "uint32", "uint64"))
bool_, string = DTYPES["bool"], DTYPES["string"]

# Dtype families used by op specs.
FLOATS = frozenset({"fp16", "fp32"})
FLOATS_ALL = frozenset({"fp16", "bf16", "fp32", "fp64"})
INTS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
SUBBYTE = frozenset({"int4", "uint1", "uint2", "uint3", "uint4", "uint6"})
NUMERIC = FLOATS | INTS
ANY_DTYPE = frozenset(DTYPES)

Dim = Union[int, str]


def dtype(name: str | DType) -> DType:
    """Look up a dtype by MIL name; raises KeyError-free ValueError for unknown names."""
    if isinstance(name, DType):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown MIL dtype '{name}' (known: {', '.join(DTYPES)})") from None


def dtype_of_numpy(arr: np.ndarray | np.dtype) -> DType:
    """The MIL dtype matching a numpy array's dtype (float64 -> fp64, bool -> bool, str -> string)."""
    dt = arr.dtype if isinstance(arr, np.ndarray) else np.dtype(arr)
    if dt.kind in "USO":
        return string
    names = {"float16": "fp16", "float32": "fp32", "float64": "fp64", "bool": "bool"}
    name = names.get(dt.name, dt.name)
    return dtype(name)


class Type:
    """Base of all MIL types (value objects: compare by value, hashable)."""

    __slots__ = ()


@dataclass(frozen=True)
class TensorType(Type):
    """``tensor<dtype, [d0, d1, ...]>``; shape () is a scalar. Dims are int, symbol name, or '?'."""

    dtype: DType
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_scalar(self) -> bool:
        return not self.shape

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int | None:
        if not self.is_static:
            return None
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    def __str__(self) -> str:
        return format_type(self)


@dataclass(frozen=True)
class ListType(Type):
    """``list<elem, length>``: a homogeneous list (length None when unknown)."""

    elem: Type
    length: int | None

    def __str__(self) -> str:
        return format_type(self)


@dataclass(frozen=True)
class DictType(Type):
    """``dict<key, value>``: used for buildInfo and op attributes."""

    key: Type
    value: Type

    def __str__(self) -> str:
        return format_type(self)


@dataclass(frozen=True)
class TupleType(Type):
    """A tuple of types: the type of a tuple argument such as ``values = (a, b, c)``."""

    elems: tuple[Type, ...]

    def __str__(self) -> str:
        return format_type(self)


@dataclass(frozen=True)
class TensorBufferType(Type):
    """``tensor_buffer<dtype, shape=[...], strides=[...], interleave_factors=[...]>`` (strided memory)."""

    dtype: DType
    shape: tuple[Dim, ...]
    strides: tuple[int, ...]
    interleave_factors: tuple[int, ...]

    def __str__(self) -> str:
        return format_type(self)


@dataclass(frozen=True)
class StateType(Type):
    """``state<tensor<...>>``: a mutable state of a stateful (iOS18) function."""

    wrapped: Type

    def __str__(self) -> str:
        return format_type(self)


@dataclass(frozen=True)
class OpaqueType(Type):
    """A type the parser could read but anekit does not model; kept as its text, flagged by verify."""

    text: str

    def __str__(self) -> str:
        return self.text


def tensor(dt: str | DType, shape: Sequence[Dim]) -> TensorType:
    """Build a tensor type: ``tensor("fp16", [1, 64, 1, 16])``."""
    return TensorType(dtype(dt), tuple(shape))


def scalar(dt: str | DType) -> TensorType:
    """Build a scalar (rank-0 tensor) type."""
    return TensorType(dtype(dt), ())


def _fmt_dim(d: Dim) -> str:
    return str(d)


def format_type(t: Type, scalar_style: str = "scalar") -> str:
    """MIL spelling of a type. ``scalar_style`` "tensor" spells scalars ``tensor<fp16, []>`` (program 1.0)."""
    if isinstance(t, TensorType):
        if not t.shape and scalar_style == "scalar":
            return t.dtype.name
        return f"tensor<{t.dtype.name}, [{', '.join(map(_fmt_dim, t.shape))}]>"
    if isinstance(t, ListType):
        length = "?" if t.length is None else str(t.length)
        return f"list<{format_type(t.elem, scalar_style)}, {length}>"
    if isinstance(t, DictType):
        return f"dict<{format_type(t.key, scalar_style)}, {format_type(t.value, scalar_style)}>"
    if isinstance(t, TupleType):
        return "(" + ", ".join(format_type(e, scalar_style) for e in t.elems) + ")"
    if isinstance(t, TensorBufferType):
        return (
            f"tensor_buffer<{t.dtype.name}, shape=[{', '.join(map(_fmt_dim, t.shape))}], "
            f"strides=[{', '.join(map(str, t.strides))}], "
            f"interleave_factors=[{', '.join(map(str, t.interleave_factors))}]>"
        )
    if isinstance(t, StateType):
        return f"state<{format_type(t.wrapped, scalar_style)}>"
    if isinstance(t, OpaqueType):
        return t.text
    raise TypeError(f"not a MIL type: {t!r}")


def broadcast_shapes(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    """Numpy-style broadcast of two shapes with symbolic dims; None when they do not broadcast."""
    out: list[Dim] = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else 1
        db = b[len(b) - 1 - i] if i < len(b) else 1
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        elif isinstance(da, str) or isinstance(db, str):
            out.append(da if isinstance(db, str) else db)
        else:
            return None
    return tuple(reversed(out))
