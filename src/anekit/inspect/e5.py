"""The E5 dispatch descriptor: a FlatBuffer read through generic table access and built with its Builder.

The descriptor names the operation chain the runtime submits (reference, "Dispatch descriptor"). It is a
plain FlatBuffer with no file identifier; every integer is little-endian::

    offset            size  contents
    0                 4     u32 uoffset: where the root table starts (relative to byte 0)
    root              4     i32 soffset: the table's vtable is at  root - soffset
    root + 4          ...   the table's inline fields (scalars, uoffsets to strings / vectors / tables,
                            structs), each where the vtable says
    vtable            2     u16 vtable size in bytes (4 + 2 * slots)
    vtable + 2        2     u16 object size: the table's inline bytes, soffset included
    vtable + 4 + 2*i  2     u16 offset of field i inside the table, 0 when the field is absent
    string / vector   4     u32 length (elements), then the elements (a string: UTF-8, then a NUL)

Field i of a table is read through vtable entry ``4 + 2 * i`` (``flatbuffers.table.Table.Offset``); no
generated code is needed. The schema, recovered by the reference from the serializer's symbols::

    table E5Program {             // root
      symbol_names: [string];     // 0  operation, tensor and section names
      build_info: BuildInfo;      // 1  compiler version and source path, key / value pairs
      sections: [Section];        // 2  one per operation: its argument frame and attribute blob
      format_version: int;        // 3  observed == 4
    }
    enum OpType : ubyte { Cast, AneInference, EirInference, CpuInference, BnnsCpuInference,
      MlcCpuInference, MpsGraphInference, E5MinimalCpu, Quant, Dequant, Barrier, JitCall }
    struct TensorDescriptor {     // 152 bytes, 8-aligned (the runtime's two leading pointers are not
      dim: [ulong:4];             //   on the wire)
      stride: [ulong:4];
      width, height, channels, batch_number, sequence_length: ulong;
      stride_width, stride_height, stride_channels, stride_batch_number, stride_sequence_length: ulong;
      storage_type: int;          // an element-type code (ELEMENT_TYPES), then 4 bytes of padding
    }

The reference gives the root table, the OpType membership (its ordinals are inferred: the order listed),
the TensorDescriptor field list and the eleven element-type codes, and names the serializer's other
tables (BuildInfo, AliasSymbol{name, symbol_index, addr_offset}, the per-operation __arg_frame, a nested
FlatBuffer attribute blob) without their layouts. The layouts of those, as this module assumes them::

    table BuildInfo      { entries: [BuildInfoEntry]; }
    table BuildInfoEntry { key: string; value: string; }
    table Section        { name: string; op_type: OpType; arg_frame: ArgFrame; op_attrs: [ubyte]; }
    table ArgFrame       { operands: [Operand]; aliases: [AliasSymbol]; }
    table Operand        { name: string; symbol_index: uint; direction: ubyte; tensor: TensorDescriptor; }
    table AliasSymbol    { name: string; symbol_index: uint; addr_offset: uint; }

``op_attrs`` is the nested attribute FlatBuffer, kept as bytes (``peek_flatbuffer`` lists its root).

Format facts and choices:

* The reference's table 23.2 calls 4, 8, 12, 16 the fields' "voffsets". Those are the fields' offsets
  inside the root *object* (an soffset, then four 4-byte fields: object size 20); the vtable entries
  that hold them sit at 4, 6, 8, 10. Its tag ``0c00 1400 0400 0800`` (vtable size 12, object size 20,
  field 0 at 4, field 1 at 8) agrees with that reading. ``build_e5`` adds fields the way flatc's
  generated builders do (widest first, later fields first among equals), which gives that exact vtable.
* Unknown fields (a table's vtable longer than this schema) are kept as ``RawField``: their inline
  bytes, from their offset to the next field or the table's end. ``build_e5`` writes them back as
  unaligned inline bytes at the same field index, so such a descriptor round-trips as well. Codes that
  are not in OpType or ELEMENT_TYPES are kept as plain ints.
* Every offset is checked before it is followed: anything outside the buffer, a vtable that is not a
  whole number of u16 slots, a field outside its table, a vector longer than the bytes left, or a string
  that is not UTF-8 is a FormatError naming the field path and the byte offset. The schema has no
  recursion, so decoding is bounded by its depth; sub-objects reached through several offsets are
  decoded once.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Any

from flatbuffers import number_types as N
from flatbuffers.builder import Builder
from flatbuffers.table import Table

from anekit.binfmt import Field, Record
from anekit.errors import FormatError

__all__ = [
    "ELEMENT_TYPES",
    "FORMAT",
    "FORMAT_VERSION",
    "SCHEMA",
    "TENSOR_DESCRIPTOR",
    "AliasSymbol",
    "ArgFrame",
    "BuildInfo",
    "BuildInfoEntry",
    "Direction",
    "E5Program",
    "OpType",
    "Operand",
    "RawField",
    "Section",
    "Slot",
    "TableDef",
    "TensorDescriptor",
    "build_e5",
    "decode_e5",
    "detect",
    "element_type_name",
    "op_type_name",
    "peek_flatbuffer",
    "summarize",
]

FORMAT = "e5"
FORMAT_VERSION = 4  # the value observed in real descriptors
VTABLE_HEADER = 4  # u16 vtable size, u16 object size; field i's entry is at 4 + 2 * i
SOFFSET_SIZE = 4
UOFFSET_SIZE = 4
SUMMARY_LIST_LIMIT = 256  # longest list a summary prints in full


class OpType(IntEnum):
    """The twelve operation kinds (one attribute serializer each); ordinals as the reference lists them."""

    Cast = 0
    AneInference = 1
    EirInference = 2
    CpuInference = 3
    BnnsCpuInference = 4
    MlcCpuInference = 5
    MpsGraphInference = 6
    E5MinimalCpu = 7
    Quant = 8
    Dequant = 9
    Barrier = 10
    JitCall = 11


assert len(OpType) == 12

ELEMENT_TYPES: dict[int, str] = {
    0: "int4",
    1: "uint8",
    2: "int8",
    3: "float16",
    4: "float32",
    5: "int16",
    6: "uint16",
    7: "int32",
    8: "uint32",
    9: "int64",
    10: "uint64",
}
"""The closed set of serialization element-type codes an operand's ``storage_type`` holds."""

assert sorted(ELEMENT_TYPES) == list(range(11))


class Direction(IntEnum):
    """Which way an operand flows (assumed encoding of Operand.direction)."""

    input = 0
    output = 1


def op_type_name(code: int) -> str:
    """``"AneInference"`` for 1; ``"unknown(12)"`` for a code outside the enumeration."""
    return OpType(code).name if code in OpType._value2member_map_ else f"unknown({code})"


def element_type_name(code: int) -> str:
    """``"float16"`` for 3; ``"unknown(16)"`` for a code outside the eleven."""
    return ELEMENT_TYPES.get(code, f"unknown({code})")


def _direction_name(code: int) -> str:
    return Direction(code).name if code in Direction._value2member_map_ else f"unknown({code})"


# --------------------------------------------------------------------------------------------------------
# the values
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawField:
    """A field this schema does not know: its index and its inline bytes (to the next field or the end)."""

    index: int
    data: bytes


@dataclass(frozen=True)
class TensorDescriptor:
    """The per-operand layout record (a FlatBuffers struct); ``storage_type`` is an ELEMENT_TYPES code."""

    dim: tuple[int, int, int, int] = (0, 0, 0, 0)
    stride: tuple[int, int, int, int] = (0, 0, 0, 0)
    width: int = 0
    height: int = 0
    channels: int = 0
    batch_number: int = 0
    sequence_length: int = 0
    stride_width: int = 0
    stride_height: int = 0
    stride_channels: int = 0
    stride_batch_number: int = 0
    stride_sequence_length: int = 0
    storage_type: int = 3
    padding: bytes = bytes(4)  # the struct's tail padding, kept as read


_TD_SCALARS = (
    "width",
    "height",
    "channels",
    "batch_number",
    "sequence_length",
    "stride_width",
    "stride_height",
    "stride_channels",
    "stride_batch_number",
    "stride_sequence_length",
)
TENSOR_DESCRIPTOR = Record(
    "TensorDescriptor",
    [
        *(Field(f"dim{i}", "Q", 8 * i) for i in range(4)),
        *(Field(f"stride{i}", "Q", 32 + 8 * i) for i in range(4)),
        *(Field(name, "Q", 64 + 8 * i) for i, name in enumerate(_TD_SCALARS)),
        Field("storage_type", "i", 144),
        Field("padding", "4s", 148),
    ],
    size=152,
)
TENSOR_DESCRIPTOR_ALIGN = 8


def _tensor_from_record(r: dict[str, Any]) -> TensorDescriptor:
    return TensorDescriptor(
        dim=tuple(r[f"dim{i}"] for i in range(4)),
        stride=tuple(r[f"stride{i}"] for i in range(4)),
        **{k: r[k] for k in _TD_SCALARS},
        storage_type=r["storage_type"],
        padding=r["padding"],
    )


def _tensor_to_record(t: TensorDescriptor) -> dict[str, Any]:
    return {
        **{f"dim{i}": v for i, v in enumerate(t.dim)},
        **{f"stride{i}": v for i, v in enumerate(t.stride)},
        **{k: getattr(t, k) for k in _TD_SCALARS},
        "storage_type": t.storage_type,
        "padding": t.padding,
    }


@dataclass(frozen=True)
class BuildInfoEntry:
    """One build-info pair (compiler version, source path, ...)."""

    key: str = ""
    value: str = ""
    unknown: tuple[RawField, ...] = ()


@dataclass(frozen=True)
class BuildInfo:
    """The compiler's build-info key / value pairs."""

    entries: tuple[BuildInfoEntry, ...] = ()
    unknown: tuple[RawField, ...] = ()

    def as_dict(self) -> dict[str, str]:
        return {e.key: e.value for e in self.entries}


@dataclass(frozen=True)
class Operand:
    """One operand binding of an operation: its name, symbol, direction and tensor layout."""

    name: str = ""
    symbol_index: int = 0
    direction: int = Direction.input
    tensor: TensorDescriptor | None = None
    unknown: tuple[RawField, ...] = ()


@dataclass(frozen=True)
class AliasSymbol:
    """A symbol bound at an offset into another: ``name`` at ``addr_offset`` of symbol ``symbol_index``."""

    name: str = ""
    symbol_index: int = 0
    addr_offset: int = 0
    unknown: tuple[RawField, ...] = ()


@dataclass(frozen=True)
class ArgFrame:
    """An operation's argument frame: the operand bindings and per-axis tensor layouts."""

    operands: tuple[Operand, ...] = ()
    aliases: tuple[AliasSymbol, ...] = ()
    unknown: tuple[RawField, ...] = ()


@dataclass(frozen=True)
class Section:
    """One operation of the chain: its name, kind, argument frame and attribute blob (nested FlatBuffer)."""

    name: str = ""
    op_type: int = OpType.Cast
    arg_frame: ArgFrame | None = None
    op_attrs: bytes = b""
    unknown: tuple[RawField, ...] = ()


@dataclass(frozen=True)
class E5Program:
    """The dispatch descriptor's root table."""

    symbol_names: tuple[str, ...] = ()
    build_info: BuildInfo | None = None
    sections: tuple[Section, ...] = ()
    format_version: int = FORMAT_VERSION
    unknown: tuple[RawField, ...] = ()

    @property
    def op_chain(self) -> list[str]:
        """The operation kinds in order: ``["Cast", "AneInference", "Cast"]``."""
        return [op_type_name(s.op_type) for s in self.sections]


# --------------------------------------------------------------------------------------------------------
# the schema, declared once: decode_e5 and build_e5 both walk it
# --------------------------------------------------------------------------------------------------------

# Wire kinds of a slot: a scalar struct code ("B" ubyte, "I" uint, "i" int), "string", "bytes" ([ubyte]),
# "strings" ([string]), "table" / "tables" (one / a vector of the table named by ``target``), "struct"
# (TensorDescriptor inline).
_SCALARS = {"B": N.Uint8Flags, "I": N.Uint32Flags, "i": N.Int32Flags}
_OFFSET_KINDS = ("string", "bytes", "strings", "table", "tables")


@dataclass(frozen=True)
class Slot:
    """One field of a table: its index (vtable entry 4 + 2 * index), name and wire kind."""

    index: int
    name: str
    kind: str
    target: str = ""

    @property
    def inline_size(self) -> int:
        if self.kind in _SCALARS:
            return struct.calcsize("<" + self.kind)
        return TENSOR_DESCRIPTOR.size if self.kind == "struct" else UOFFSET_SIZE


@dataclass(frozen=True)
class TableDef:
    """A table: its name, the dataclass holding it and its slots in index order."""

    name: str
    cls: type[Any]  # a dataclass whose last field is ``unknown`` (the raw fields kept)
    slots: tuple[Slot, ...]

    def __post_init__(self) -> None:
        assert [s.index for s in self.slots] == list(range(len(self.slots))), self.name
        names = [f.name for f in fields(self.cls)]
        assert names == [s.name for s in self.slots] + ["unknown"], self.name


def _table(name: str, cls: type, *slots: tuple[str, str] | tuple[str, str, str]) -> TableDef:
    return TableDef(name, cls, tuple(Slot(i, *s) for i, s in enumerate(slots)))


SCHEMA: dict[str, TableDef] = {
    t.name: t
    for t in (
        _table(
            "E5Program",
            E5Program,
            ("symbol_names", "strings"),
            ("build_info", "table", "BuildInfo"),
            ("sections", "tables", "Section"),
            ("format_version", "i"),
        ),
        _table("BuildInfo", BuildInfo, ("entries", "tables", "BuildInfoEntry")),
        _table("BuildInfoEntry", BuildInfoEntry, ("key", "string"), ("value", "string")),
        _table(
            "Section",
            Section,
            ("name", "string"),
            ("op_type", "B"),
            ("arg_frame", "table", "ArgFrame"),
            ("op_attrs", "bytes"),
        ),
        _table("ArgFrame", ArgFrame, ("operands", "tables", "Operand"), ("aliases", "tables", "AliasSymbol")),
        _table(
            "Operand",
            Operand,
            ("name", "string"),
            ("symbol_index", "I"),
            ("direction", "B"),
            ("tensor", "struct"),
        ),
        _table("AliasSymbol", AliasSymbol, ("name", "string"), ("symbol_index", "I"), ("addr_offset", "I")),
    )
}
ROOT = "E5Program"


def _check_schema() -> None:
    """Every table target exists and the schema has no cycle (so decoding depth is bounded)."""

    def walk(name: str, seen: tuple[str, ...]) -> None:
        assert name not in seen, f"schema cycle through {name}"
        for s in SCHEMA[name].slots:
            if s.kind in ("table", "tables"):
                walk(s.target, (*seen, name))

    walk(ROOT, ())


_check_schema()


# --------------------------------------------------------------------------------------------------------
# decoding
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TableView:
    """A bounds-checked table: the flatbuffers Table, its object size and each slot's in-object offset."""

    tab: Table
    size: int
    slots: tuple[int, ...]
    vtable: int


class _Reader:
    """Follows offsets through one buffer, checking each before ``flatbuffers.table.Table`` reads it."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.buf = data if isinstance(data, bytes) else bytes(data)
        self.n = len(self.buf)
        self.abs = Table(self.buf, 0)  # absolute reads: Get / Indirect / String take buffer positions
        self.memo: dict[tuple[str, str, int], Any] = {}
        self.raw_fields = 0  # unknown fields decoded so far, and their bytes: bounded by the buffer's size
        self.raw_bytes = 0

    def need(self, pos: int, size: int, path: str, what: str) -> None:
        if pos < 0 or size < 0 or pos + size > self.n:
            raise FormatError(
                FORMAT,
                path,
                f"{what} runs outside the buffer",
                offset=pos,
                expected=f"{size} bytes within {self.n}",
                actual=f"{max(0, self.n - pos)} left" if 0 <= pos <= self.n else "outside",
            )

    def u32(self, pos: int, path: str, what: str) -> int:
        self.need(pos, 4, path, what)
        return int(self.abs.Get(N.Uint32Flags, pos))

    def target(self, at: int, path: str) -> int:
        """Where the uoffset stored at ``at`` points (checked to start inside the buffer)."""
        self.need(at, UOFFSET_SIZE, path, "offset")
        to = int(self.abs.Indirect(at))
        if to >= self.n:
            raise FormatError(
                FORMAT,
                path,
                "offset points past the end of the buffer",
                offset=at,
                expected=f"< {self.n}",
                actual=to,
            )
        return to

    def table(self, pos: int, path: str) -> _TableView:
        self.need(pos, SOFFSET_SIZE, path, "table")
        tab = Table(self.buf, pos)
        vt = pos - int(tab.Get(N.SOffsetTFlags, pos))
        size, slots = self.cached(("vtable", "", vt), lambda: self._vtable(tab, vt, path))
        self.need(pos, size, path, "table object")
        return _TableView(tab, size, slots, vt)

    def _vtable(self, tab: Table, vt: int, path: str) -> tuple[int, tuple[int, ...]]:
        """(object size, in-object offset of each slot) of a vtable, checked; tables share vtables."""
        self.need(vt, VTABLE_HEADER, path + ".<vtable>", "vtable header")
        vt_size = int(tab.Get(N.VOffsetTFlags, vt))
        obj_size = int(tab.Get(N.VOffsetTFlags, vt + 2))
        if vt_size < VTABLE_HEADER or vt_size % 2:
            raise FormatError(
                FORMAT,
                path + ".<vtable>",
                "vtable size must be 4 + 2 * slots",
                offset=vt,
                expected="an even size >= 4",
                actual=vt_size,
            )
        self.need(vt, vt_size, path + ".<vtable>", "vtable")
        if obj_size < SOFFSET_SIZE:
            raise FormatError(
                FORMAT,
                path,
                "table object size is smaller than its soffset",
                offset=vt + 2,
                expected=">= 4",
                actual=obj_size,
            )
        slots = tuple(int(tab.Offset(VTABLE_HEADER + 2 * i)) for i in range((vt_size - VTABLE_HEADER) // 2))
        for i, off in enumerate(slots):
            if off and not SOFFSET_SIZE <= off < obj_size:
                raise FormatError(
                    FORMAT,
                    f"{path}.<field {i}>",
                    "field offset lies outside its table",
                    offset=vt + VTABLE_HEADER + 2 * i,
                    expected=f"4..{obj_size - 1}",
                    actual=off,
                )
        return obj_size, slots

    def string_bytes(self, at: int, path: str) -> bytes:
        to = self.target(at, path)
        length = self.u32(to, path, "string length")
        self.need(to + 4, length, path, f"string of {length} bytes")
        return self.abs.String(at)

    def vector(self, at: int, path: str, elem: int) -> tuple[int, int]:
        """(start of the elements, count) of the vector whose uoffset is at ``at``."""
        to = self.target(at, path)
        count = self.u32(to, path, "vector length")
        if count * elem > self.n - to - 4:
            raise FormatError(
                FORMAT,
                path,
                f"vector of {count} elements of {elem} bytes is longer than the buffer",
                offset=to,
                expected=f"<= {(self.n - to - 4) // elem} elements",
                actual=count,
            )
        return to + 4, count

    def cached(self, key: tuple[str, str, int], make: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    # -- typed reads ------------------------------------------------------------------------------------

    def text(self, at: int, path: str) -> str:
        def make() -> str:
            raw = self.string_bytes(at, path)
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise FormatError(
                    FORMAT, path, f"string is not UTF-8 ({e.reason} at byte {e.start})", offset=at
                ) from None

        return self.cached(("string", "", self.target(at, path)), make)

    def blob(self, at: int, path: str) -> bytes:
        return self.cached(("bytes", "", self.target(at, path)), lambda: self.string_bytes(at, path))

    def texts(self, at: int, path: str) -> tuple[str, ...]:
        def make() -> tuple[str, ...]:
            start, count = self.vector(at, path, UOFFSET_SIZE)
            return tuple(self.text(start + 4 * i, f"{path}[{i}]") for i in range(count))

        return self.cached(("strings", "", self.target(at, path)), make)

    def tables(self, at: int, path: str, name: str) -> tuple[Any, ...]:
        def make() -> tuple[Any, ...]:
            start, count = self.vector(at, path, UOFFSET_SIZE)
            out = []
            for i in range(count):
                elem = start + 4 * i
                out.append(self.decode_table(name, self.target(elem, f"{path}[{i}]"), f"{path}[{i}]"))
            return tuple(out)

        return self.cached(("tables", name, self.target(at, path)), make)

    def decode_table(self, name: str, pos: int, path: str) -> Any:
        return self.cached(("table", name, pos), lambda: self._decode_table(SCHEMA[name], pos, path))

    def _decode_table(self, tdef: TableDef, pos: int, path: str) -> Any:
        view = self.table(pos, path)
        values: dict[str, Any] = {}
        for slot in tdef.slots:
            off = view.slots[slot.index] if slot.index < len(view.slots) else 0
            field_path = f"{path}.{slot.name}" if path else slot.name
            if off and off + slot.inline_size > view.size:
                raise FormatError(
                    FORMAT,
                    field_path,
                    f"{slot.inline_size}-byte field overruns its {view.size}-byte table",
                    offset=pos + off,
                    expected=f"offset <= {view.size - slot.inline_size}",
                    actual=off,
                )
            values[slot.name] = self._field(slot, pos + off if off else None, field_path)
        values["unknown"] = self._unknown(view, len(tdef.slots), pos, path)
        return tdef.cls(**values)

    def _field(self, slot: Slot, at: int | None, path: str) -> Any:
        kind = slot.kind
        if kind in _SCALARS:
            return 0 if at is None else int(self.abs.Get(_SCALARS[kind], at))
        if kind == "struct":
            return None if at is None else _tensor_from_record(TENSOR_DESCRIPTOR.parse(self.buf, at))
        if at is None:
            return {"string": "", "bytes": b"", "strings": (), "table": None, "tables": ()}[kind]
        if kind == "string":
            return self.text(at, path)
        if kind == "bytes":
            return self.blob(at, path)
        if kind == "strings":
            return self.texts(at, path)
        if kind == "table":
            return self.decode_table(slot.target, self.target(at, path), path)
        return self.tables(at, path, slot.target)

    def _unknown(self, view: _TableView, known: int, pos: int, path: str) -> tuple[RawField, ...]:
        extents = self.cached(("unknown", str(known), view.vtable), lambda: _raw_extents(view, known))
        self.raw_fields += len(extents)
        self.raw_bytes += sum(end - off for _, off, end in extents)
        if self.raw_fields > self.n + 64 or self.raw_bytes > self.n + 1024:
            raise FormatError(
                FORMAT,
                path or ROOT,
                "unknown fields add up to more than the buffer holds: vtables claim overlapping fields",
                offset=pos,
                expected=f"<= {self.n} bytes of unknown fields",
                actual=self.raw_bytes,
            )
        return tuple(RawField(index, bytes(self.buf[pos + off : pos + end])) for index, off, end in extents)


def _raw_extents(view: _TableView, known: int) -> list[tuple[int, int, int]]:
    """(index, offset, end) of each present slot past the known ones: its bytes run to the next field's
    offset, or to the end of the table."""
    present = sorted({off for off in view.slots if off})
    out = []
    for index in range(known, len(view.slots)):
        off = view.slots[index]
        if off:
            out.append(
                (index, off, present[bisect.bisect_right(present, off)] if off < present[-1] else view.size)
            )
    return out


def decode_e5(data: bytes | bytearray | memoryview) -> E5Program:
    """Decode a dispatch descriptor; FormatError (field path, byte offset) for anything malformed."""
    reader = _Reader(data)
    return reader.decode_table(ROOT, reader.target(0, "<root>"), "")


# --------------------------------------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------------------------------------


def _fits(kind: str, value: Any, path: str) -> None:
    lo, hi = {"B": (0, 0xFF), "I": (0, 0xFFFFFFFF), "i": (-(2**31), 2**31 - 1)}[kind]
    if not isinstance(value, int) or not lo <= value <= hi:
        raise FormatError(
            FORMAT, path, "value does not fit its field", expected=f"an int in {lo}..{hi}", actual=value
        )


def _tensor_bytes(t: Any, path: str) -> bytes:
    if not isinstance(t, TensorDescriptor):
        raise FormatError(FORMAT, path, "expected a TensorDescriptor", actual=type(t).__name__)
    if len(t.dim) != 4 or len(t.stride) != 4 or len(t.padding) != 4:
        raise FormatError(
            FORMAT,
            path,
            "dim and stride hold 4 values, padding 4 bytes",
            actual=(len(t.dim), len(t.stride), len(t.padding)),
        )
    return TENSOR_DESCRIPTOR.build(**_tensor_to_record(t))


def _prepend_inline(b: Builder, raw: bytes, align: int) -> None:
    """Inline bytes in the object being built (a struct, or an unknown field kept raw)."""
    b.Prep(align, len(raw))
    for byte in reversed(raw):
        b.Place(byte, N.Uint8Flags)


def _add_order(tdef: TableDef) -> list[Slot]:
    """flatc's order: widest first, and among equals the later field first."""
    return sorted(reversed(tdef.slots), key=lambda s: -s.inline_size)


class _Writer:
    def __init__(self) -> None:
        self.b = Builder(1024)

    def offsets(self, slot: Slot, value: Any, path: str) -> int | None:
        """Write what a slot points to (before its table starts) and return its offset."""
        b = self.b
        if slot.kind == "string":
            return b.CreateString(value)
        if slot.kind == "bytes":
            return b.CreateByteVector(bytes(value))
        if slot.kind == "table":
            return None if value is None else self.table(SCHEMA[slot.target], value, path)
        if slot.kind == "strings":
            items = [b.CreateString(s) for s in value]
        else:
            items = [self.table(SCHEMA[slot.target], v, f"{path}[{i}]") for i, v in enumerate(value)]
        b.StartVector(UOFFSET_SIZE, len(items), UOFFSET_SIZE)
        for off in reversed(items):
            b.PrependUOffsetTRelative(off)
        return b.EndVector()

    def table(self, tdef: TableDef, obj: Any, path: str) -> int:
        if not isinstance(obj, tdef.cls):
            raise FormatError(
                FORMAT, path or tdef.name, f"expected a {tdef.cls.__name__}", actual=type(obj).__name__
            )
        children: dict[str, int | None] = {}
        for slot in tdef.slots:
            if slot.kind in _OFFSET_KINDS:
                children[slot.name] = self.offsets(
                    slot, getattr(obj, slot.name), f"{path}.{slot.name}".lstrip(".")
                )
        raws = sorted(obj.unknown, key=lambda r: r.index)
        for r in raws:
            if r.index < len(tdef.slots) or not r.data:
                raise FormatError(
                    FORMAT,
                    f"{path}.<field {r.index}>".lstrip("."),
                    "an unknown field needs an index past the known ones and at least one byte",
                    expected=f">= {len(tdef.slots)}",
                    actual=r.index,
                )
        b = self.b
        b.StartObject(max([len(tdef.slots)] + [r.index + 1 for r in raws]))
        for r in reversed(raws):
            _prepend_inline(b, r.data, 1)
            b.Slot(r.index)
        for slot in _add_order(tdef):
            value = getattr(obj, slot.name)
            where = f"{path}.{slot.name}".lstrip(".")
            if slot.kind in _SCALARS:
                _fits(slot.kind, value, where)
                b.PrependSlot(_SCALARS[slot.kind], slot.index, int(value), 0)
            elif slot.kind == "struct":
                if value is not None:
                    _prepend_inline(b, _tensor_bytes(value, where), TENSOR_DESCRIPTOR_ALIGN)
                    b.Slot(slot.index)
            elif children[slot.name] is not None:
                b.PrependUOffsetTRelativeSlot(slot.index, children[slot.name], 0)
        return b.EndObject()


def build_e5(program: E5Program) -> bytes:
    """The FlatBuffer bytes of a descriptor (deterministic; ``decode_e5(build_e5(p)) == p``)."""
    w = _Writer()
    try:
        root = w.table(SCHEMA[ROOT], program, "")
    except (struct.error, TypeError, UnicodeEncodeError) as e:
        raise FormatError(FORMAT, "<build>", f"value cannot be encoded: {e}") from e
    w.b.Finish(root)
    return bytes(w.b.Output())


# --------------------------------------------------------------------------------------------------------
# inspection
# --------------------------------------------------------------------------------------------------------


def peek_flatbuffer(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The root table of any FlatBuffer, schema-free: its object size and the in-object offset of each
    present field. FormatError when the bytes are not a FlatBuffer."""
    reader = _Reader(data)
    view = reader.table(reader.target(0, "<root>"), "<root>")
    return {
        "object_size": view.size,
        "vtable_bytes": 4 + 2 * len(view.slots),
        "fields": {i: off for i, off in enumerate(view.slots) if off},
    }


def detect(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` decodes as a dispatch descriptor with a format version (content only)."""
    if len(data) < 12:
        return False
    root = int.from_bytes(bytes(data[:4]), "little")
    if root % 4 or not 4 <= root <= len(data) - 4:
        return False
    try:
        program = decode_e5(data)
    except FormatError:
        return False
    return 0 < program.format_version < 0x10000 and bool(program.sections or program.symbol_names)


def _limited(items: Sequence[Any], show: Callable[[int, Any], Any] = lambda i, x: x) -> list[Any]:
    """``show`` applied to at most SUMMARY_LIST_LIMIT items (shared sub-objects can make long lists)."""
    out = [show(i, x) for i, x in enumerate(items[:SUMMARY_LIST_LIMIT])]
    if len(items) > SUMMARY_LIST_LIMIT:
        out.append(f"... {len(items) - SUMMARY_LIST_LIMIT} more")
    return out


def _tensor_summary(t: TensorDescriptor) -> dict[str, Any]:
    return {
        "storage_type": element_type_name(t.storage_type),
        "dim": list(t.dim),
        "stride": list(t.stride),
        "size": {k: getattr(t, k) for k in _TD_SCALARS[:5]},
        "strides": {k.removeprefix("stride_"): getattr(t, k) for k in _TD_SCALARS[5:]},
    }


def _attrs_summary(raw: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {"bytes": len(raw)}
    if raw:
        try:
            peek = peek_flatbuffer(raw)
            out["root_fields"] = {str(i): off for i, off in peek["fields"].items()}
        except FormatError as e:
            out["not_a_flatbuffer"] = str(e)
    return out


def _section_summary(i: int, s: Section) -> dict[str, Any]:
    frame = s.arg_frame or ArgFrame()

    def operand(_: int, o: Operand) -> dict[str, Any]:
        tensor = {"tensor": _tensor_summary(o.tensor)} if o.tensor is not None else {}
        return {
            "name": o.name,
            "direction": _direction_name(o.direction),
            "symbol_index": o.symbol_index,
            **tensor,
        }

    def alias(_: int, a: AliasSymbol) -> dict[str, Any]:
        return {"name": a.name, "symbol_index": a.symbol_index, "addr_offset": a.addr_offset}

    return {
        "index": i,
        "name": s.name,
        "op_type": op_type_name(s.op_type),
        "operands": _limited(frame.operands, operand),
        "aliases": _limited(frame.aliases, alias),
        "op_attrs": _attrs_summary(s.op_attrs),
    }


def _unknown_fields(obj: Any, path: str, seen: set[int]) -> Iterator[dict[str, Any]]:
    """Every RawField of a decoded tree with the path of its table; a shared sub-object is visited once."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    for r in obj.unknown:
        yield {"table": path or ROOT, "index": r.index, "bytes": r.data.hex()}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, tuple):
            for i, v in enumerate(value):
                if hasattr(v, "unknown"):
                    yield from _unknown_fields(v, f"{path}.{f.name}[{i}]".lstrip("."), seen)
        elif hasattr(value, "unknown"):
            yield from _unknown_fields(value, f"{path}.{f.name}".lstrip("."), seen)


def summarize(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """A JSON-able description: version, build info, the operation chain and each operation's operands."""
    p = decode_e5(data)
    chain = p.op_chain
    return {
        "kind": "e5",
        "format": "E5 dispatch descriptor (FlatBuffer)",
        "size": len(data),
        "format_version": p.format_version,
        "root_fields": {str(i): off for i, off in peek_flatbuffer(data)["fields"].items()},
        "op_chain": " -> ".join(chain),
        "dispatches": sum(name.endswith("Inference") for name in chain),
        "build_info": p.build_info.as_dict() if p.build_info is not None else {},
        "symbol_names": _limited(p.symbol_names),
        "sections": _limited(p.sections, _section_summary),
        "unknown_fields": _limited(list(_unknown_fields(p, "", set()))),
    }
