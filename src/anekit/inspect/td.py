"""The register program: Neural Engine task-descriptor chains, their relocations and register groups.

A task descriptor (TD) is one engine pass: a ten-word header followed by register writes. Descriptors
are chained by the next-offset word at +0x1c (a byte offset from the start of the chain; 0 ends it).
The chain is the ``__text`` section of a ``.hwx`` container, or the front of a bare payload
(``ane_td`` files: descriptors, then kernel bytes). All words are little-endian u32::

    +0x00  task              TID (bits 0-15) | NID (16-23) | LNID (24) | EON (25)
    +0x04  cycles            ExeCycles (0-15) | NextSize (16-31) = next descriptor's words - 1
    +0x08  log_events        +0x0c exceptions   +0x10 debug_log_events   +0x14 debug_exceptions
    +0x18  flags             SrcLoc (28), DstLoc (29): clear when the source / result stays in L2
    +0x1c  next_pointer      offset of the next descriptor from the chain start, 0 at the tail
    +0x20  buffer_bases      RBase0 | RBE0 | RBase1 | RBE1 | WBase | WBE | TBase | TBE | ENE
    +0x24  kernel_bases      KBase0..3 with their enables (buffer indices the loader binds)
    +0x28  register groups   each: u32 (words - 1) << 26 | register address, then the words

The H13 (M1, container cpusubtype 4) descriptor is 0x274 bytes with the same seven groups in every
descriptor, not a sparse stream::

    payload   group         address  words  registers
    +0x02c    KernelDMASrc  0x1f800  62     16 coefficient DMA channels (config, base, size), 4 more
    +0x128    Common        0x00000  16     InDim, ChCfg, Cin, Cout, OutDim, ConvCfg, GroupConvCfg, ...
    +0x16c    TileDMASrc    0x13800  28     source config, two sources' base + strides, formats
    +0x1e0    L2            0x04800  18     on-chip source / result configuration
    +0x22c    PE            0x08800   4     planar-engine constants
    +0x240    NE            0x0c800   5     KernelCfg, MACCfg, ..., PostScale
    +0x258    TileDMADst    0x17800   7     config, base, row / plane / depth / group strides, format

Chained descriptors sit 0x300 apart (0x274 rounded up to 0x100). A bare payload puts the kernel
bytes at the next multiple of 64 after the last descriptor. The layout changes between silicon
generations and no field in a descriptor names its generation: the layout is chosen from the
container's cpusubtype, a generation name, or by matching the seven group headers, and a chain no
known layout matches is kept as raw words. In the ``.hwx`` files the kernel coefficient bases
(``CoeffBaseAddr[i]``) are Mach-O relocations against the weight section (``__TEXT,__const`` in the
M1 files); the tile DMA bases are offsets into the buffers the header's RBase / WBase indices name.

Format facts, where they differ from the program-container reference (chapter 23):

* The M1 bytes do not follow its table 23.4 (bases +0x2c/+0xfc/+0x150/..., 34/19/69/30/14/11/21
  registers, register bases 0x5500/none/0x4d00/...): the groups are the ones above.
* Its dimension offsets (Win @0x0f4, Hin @0x0f6, Cin @0x100, Cout @0x104) sit 0x34 below where the
  M1 bytes hold them (+0x128, +0x12a, +0x134, +0x138); the widths (15-bit spatial, 17-bit channel)
  fit. OCGSize is bits 10-12 of ConvCfg (+0x144) and numGroups bits 0-12 of GroupConvCfg (+0x14c).
* Its "opcode words" (0x5042a063 convolution, 0x5000a021, 0x5000b021) are ConvCfg values (kernel
  3x3 padded 1, 1x1, 1x1 with OCGSize 4); "register 0x5021 set to 0x2041" is ConvCfg followed by the
  next Common word; "31 20 00 01 / 31 20 30 01" are the source and destination DMA format words.
* Table 23.11: +0x04 is ExeCycles and the next descriptor's size, +0x08 the log-event mask,
  +0x10 the debug log-event mask, +0x18 a flag word; the flags byte at +0x03 is 0x02 for a lone
  descriptor and 0x00 / 0x01 / 0x03 for first / middle / last of a chain. Three chained M1
  descriptors sit at 0x000 / 0x300 / 0x600, not 0x000 / 0x300 / 0x500; records are not 44 bytes.
* The v10 relocation registers of table 23.5 (0x1344 ...) do not occur in M1 descriptors; the
  H13 slots are the base-address registers listed in ``H13.slots``.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Union

from anekit.binfmt import Field, Record
from anekit.errors import FormatError

__all__ = [
    "FORMAT",
    "GENERATIONS",
    "GROUP_HEADER",
    "H13",
    "HEADER",
    "HEADER_SIZE",
    "KERNEL_ALIGN",
    "NEXT_OFFSET",
    "BitField",
    "GroupSpec",
    "RegisterGroup",
    "RegisterSpec",
    "RelocationLike",
    "SlotSpec",
    "TdChain",
    "TdDescriptor",
    "TdLayout",
    "TdLink",
    "TdPayload",
    "TdRelocation",
    "chain_summary",
    "decode_chain",
    "decode_payload",
    "detect",
    "encode",
    "encode_chain",
    "encode_payload",
    "layout_for",
    "summarize",
]

FORMAT = "ane_td"
"""Format name used in error messages."""
WORD = 4
HEADER_SIZE = 0x28
"""Bytes of the descriptor header (ten words) before the register groups."""
NEXT_OFFSET = 0x1C
"""Byte offset, inside a descriptor, of the next-descriptor link."""
KERNEL_ALIGN = 64
"""In a bare payload the kernel bytes start at the next multiple of this after the last descriptor."""
MACHO_MAGICS = (0xFEEDFACE, 0xFEEDFACF, 0xBEEFFACE)
"""Container magics: a file starting with one of them is a container, not a bare payload."""


# --------------------------------------------------------------------------------------------------------
# record tables: bytes and bits
# --------------------------------------------------------------------------------------------------------


HEADER = Record(
    "td_header",
    (
        Field("task", "I", 0x00),
        Field("cycles", "I", 0x04),
        Field("log_events", "I", 0x08),
        Field("exceptions", "I", 0x0C),
        Field("debug_log_events", "I", 0x10),
        Field("debug_exceptions", "I", 0x14),
        Field("flags", "I", 0x18),
        Field("next_pointer", "I", 0x1C),
        Field("buffer_bases", "I", 0x20),
        Field("kernel_bases", "I", 0x24),
    ),
    size=HEADER_SIZE,
)
HEADER_WORDS = tuple(f.name for f in HEADER.fields)
assert HEADER.offset_of("next_pointer") == NEXT_OFFSET


@dataclass(frozen=True)
class BitField:
    """A bit field of one 32-bit word: its name, lowest bit and width; parses and builds the word."""

    name: str
    shift: int
    width: int
    signed: bool = False

    def __post_init__(self) -> None:
        assert self.shift >= 0 and self.width > 0 and self.shift + self.width <= 32, self

    @property
    def mask(self) -> int:
        """The field's mask before shifting (0x7fff for a 15-bit field)."""
        return (1 << self.width) - 1

    def get(self, word: int) -> int:
        """The field's value in ``word`` (two's complement when signed)."""
        value = (word >> self.shift) & self.mask
        if self.signed and value >> (self.width - 1):
            value -= 1 << self.width
        return value

    def put(self, word: int, value: int) -> int:
        """``word`` with this field set to ``value``; a value that does not fit is a ValueError."""
        low, high = (-(1 << (self.width - 1)), (1 << (self.width - 1)) - 1) if self.signed else (0, self.mask)
        if not low <= value <= high:
            raise ValueError(f"[{FORMAT}] {self.name}: {value} does not fit in {self.width} bits")
        return (word & ~(self.mask << self.shift)) | ((value & self.mask) << self.shift)


def _bits(word: int, fields: Sequence[BitField]) -> dict[str, int]:
    return {f.name: f.get(word) for f in fields}


def _build_bits(fields: Sequence[BitField], **values: int) -> int:
    word = 0
    by_name = {f.name: f for f in fields}
    for name, value in values.items():
        word = by_name[name].put(word, value)
    return word


GROUP_HEADER = (BitField("address", 0, 26), BitField("last", 26, 6))
"""Register-group header word: register address of the first word, and the word count minus one."""
assert sum(f.width for f in GROUP_HEADER) == 32


# --------------------------------------------------------------------------------------------------------
# layouts: one table per generation
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisterSpec:
    """A named register inside a group: its word index and its bit fields."""

    name: str
    index: int
    fields: tuple[BitField, ...] = ()


@dataclass(frozen=True)
class GroupSpec:
    """One register group of a layout: name, register address, word count and named registers."""

    name: str
    address: int
    count: int
    registers: tuple[RegisterSpec, ...] = ()
    role: str = ""

    @property
    def header_word(self) -> int:
        """The group header word this layout expects."""
        return _build_bits(GROUP_HEADER, address=self.address, last=self.count - 1)

    @property
    def size(self) -> int:
        """Bytes of the group: header word plus its register words."""
        return WORD * (1 + self.count)

    def register_name(self, index: int) -> str:
        """The register's name, or ``Group[index]`` when the layout does not name it."""
        for reg in self.registers:
            if reg.index == index:
                return f"{self.name}.{reg.name}"
        return f"{self.name}[{index}]"


@dataclass(frozen=True)
class SlotSpec:
    """A buffer base the loader resolves: the register that holds it and what it addresses."""

    name: str
    register: str
    binding: str = ""


@dataclass(frozen=True)
class TdLayout:
    """A generation's descriptor layout: header bit fields, register groups, relocation slots."""

    name: str
    cpusubtypes: tuple[int, ...]
    header_fields: Mapping[str, tuple[BitField, ...]]
    groups: tuple[GroupSpec, ...]
    slots: tuple[SlotSpec, ...]
    dimensions: Mapping[str, str]

    @property
    def size(self) -> int:
        """Bytes of one descriptor."""
        return HEADER_SIZE + sum(g.size for g in self.groups)

    def group_offsets(self) -> Iterator[tuple[int, GroupSpec]]:
        """(offset of the group header inside a descriptor, group) in stream order."""
        at = HEADER_SIZE
        for group in self.groups:
            yield at, group
            at += group.size

    def locate(self, offset: int) -> str | None:
        """The register at byte ``offset`` of a descriptor (``header.<word>`` inside the header)."""
        if 0 <= offset < HEADER_SIZE:
            return f"header.{HEADER_WORDS[offset // WORD]}"
        for at, group in self.group_offsets():
            if at <= offset < at + group.size:
                index = (offset - at) // WORD - 1
                return f"{group.name}.header" if index < 0 else group.register_name(index)
        return None

    def signature_matches(self, data: Any, at: int) -> bool:
        """Whether the descriptor at ``at`` carries exactly this layout's group headers."""
        if at + self.size > len(data):
            return False
        return all(
            struct.unpack_from("<I", data, at + off)[0] == g.header_word for off, g in self.group_offsets()
        )


def _dma_config() -> tuple[BitField, ...]:
    return (BitField("En", 0, 1), BitField("CacheHint", 6, 4))


def _stride() -> tuple[BitField, ...]:
    return (BitField("Stride", 6, 26, signed=True),)


def _indexed(name: str, first: int, n: int, fields: tuple[BitField, ...] = ()) -> list[RegisterSpec]:
    return [RegisterSpec(f"{name}[{i}]", first + i, fields) for i in range(n)]


def _kernel_bases() -> tuple[BitField, ...]:
    return tuple(
        f for i in range(4) for f in (BitField(f"KBase{i}", 6 * i, 5), BitField(f"KBE{i}", 6 * i + 5, 1))
    )


# Register names follow the compiler's own debug names where the corpus bytes pin a register down
# (values that match the known shapes, enables that agree with the header); a word no evidence names
# stays ``Group[i]``. The four Aux channels of KernelDMASrc (configured but unused in the corpus) are
# taken as the reference's bias / post-scale / palette-lookup / activation-lookup streams, in its order.
H13 = TdLayout(
    name="h13",
    cpusubtypes=(4,),
    header_fields={
        "task": (
            BitField("TID", 0, 16),
            BitField("NID", 16, 8),
            BitField("LNID", 24, 1),
            BitField("EON", 25, 1),
        ),
        "cycles": (BitField("ExeCycles", 0, 16), BitField("NextSize", 16, 16)),
        "flags": (BitField("SrcLoc", 28, 1), BitField("DstLoc", 29, 1)),
        "buffer_bases": (
            BitField("RBase0", 0, 5),
            BitField("RBE0", 5, 1),
            BitField("RBase1", 6, 5),
            BitField("RBE1", 11, 1),
            BitField("WBase", 12, 5),
            BitField("WBE", 17, 1),
            BitField("TBase", 18, 5),
            BitField("TBE", 23, 1),
            BitField("ENE", 24, 3),
        ),
        "kernel_bases": _kernel_bases(),
    },
    groups=(
        GroupSpec(
            "KernelDMASrc",
            0x1F800,
            62,
            (
                *_indexed("CoeffDMAConfig", 2, 16, _dma_config()),
                *_indexed("CoeffBaseAddr", 18, 16),
                *_indexed("CoeffBfrSize", 34, 16),
                *_indexed("AuxDMAConfig", 50, 4, _dma_config()),
                *_indexed("AuxBaseAddr", 54, 4),
                *_indexed("AuxBfrSize", 58, 4),
            ),
            role="kernel (weight) DMA: 16 coefficient channels plus 4 auxiliary streams",
        ),
        GroupSpec(
            "Common",
            0x00000,
            16,
            (
                RegisterSpec("InDim", 0, (BitField("Win", 0, 15), BitField("Hin", 16, 15))),
                RegisterSpec("ChCfg", 2, (BitField("InFmt", 0, 2), BitField("OutFmt", 4, 2))),
                RegisterSpec("Cin", 3, (BitField("Cin", 0, 17),)),
                RegisterSpec("Cout", 4, (BitField("Cout", 0, 17),)),
                RegisterSpec("OutDim", 5, (BitField("Wout", 0, 15), BitField("Hout", 16, 15))),
                RegisterSpec(
                    "ConvCfg",
                    7,
                    (
                        BitField("Kw", 0, 5),
                        BitField("Kh", 5, 5),
                        BitField("OCGSize", 10, 3),
                        BitField("Sx", 13, 2),
                        BitField("Sy", 15, 2),
                        BitField("Px", 17, 5),
                        BitField("Py", 22, 5),
                        BitField("Ox", 28, 2),
                        BitField("Oy", 30, 2),
                    ),
                ),
                RegisterSpec(
                    "GroupConvCfg",
                    9,
                    (
                        BitField("NumGroups", 0, 13),
                        BitField("UnicastEn", 14, 1),
                        BitField("ElemMultMode", 15, 1),
                        BitField("UnicastCin", 16, 16),
                    ),
                ),
                RegisterSpec("TileCfg", 10, (BitField("TileHeight", 0, 15),)),
            ),
            role="dimensions, formats, convolution and group configuration",
        ),
        GroupSpec(
            "TileDMASrc",
            0x13800,
            28,
            (
                RegisterSpec("DMAConfig", 0, _dma_config()),
                RegisterSpec("Src1BaseAddr", 2),
                RegisterSpec("Src1RowStride", 3, _stride()),
                RegisterSpec("Src1PlaneStride", 4, _stride()),
                RegisterSpec("Src1DepthStride", 5, _stride()),
                RegisterSpec("Src1GroupStride", 6, _stride()),
                RegisterSpec("Src2BaseAddr", 7),
                RegisterSpec("Src2RowStride", 8, _stride()),
                RegisterSpec("Src2PlaneStride", 9, _stride()),
                RegisterSpec("Src2DepthStride", 10, _stride()),
                RegisterSpec("Src2GroupStride", 11, _stride()),
                RegisterSpec("Src1Fmt", 14),
                RegisterSpec("Src2Fmt", 15),
            ),
            role="tile DMA sources: the input tile and the second operand",
        ),
        GroupSpec("L2", 0x04800, 18, role="L2 source and result configuration"),
        GroupSpec("PE", 0x08800, 4, role="planar-engine constants"),
        GroupSpec(
            "NE",
            0x0C800,
            5,
            (
                RegisterSpec("KernelCfg", 0),
                RegisterSpec("MACCfg", 1),
                RegisterSpec("PostScale", 4, (BitField("PostScale", 0, 16),)),
            ),
            role="neural-engine kernel format and op mode",
        ),
        GroupSpec(
            "TileDMADst",
            0x17800,
            7,
            (
                RegisterSpec("DMAConfig", 0, _dma_config()),
                RegisterSpec("BaseAddr", 1),
                RegisterSpec("RowStride", 2, _stride()),
                RegisterSpec("PlaneStride", 3, _stride()),
                RegisterSpec("DepthStride", 4, _stride()),
                RegisterSpec("GroupStride", 5, _stride()),
                RegisterSpec("Fmt", 6),
            ),
            role="tile DMA destination: the output tile",
        ),
    ),
    slots=(
        SlotSpec("input tile read base", "TileDMASrc.Src1BaseAddr", "header RBase0"),
        SlotSpec("second-operand read base", "TileDMASrc.Src2BaseAddr", "header RBase1"),
        SlotSpec("output tile write base", "TileDMADst.BaseAddr", "header WBase"),
        *(
            SlotSpec(f"kernel coefficient stream {i}", f"KernelDMASrc.CoeffBaseAddr[{i}]", "weights")
            for i in range(16)
        ),
        SlotSpec("kernel bias stream", "KernelDMASrc.AuxBaseAddr[0]", "weights"),
        SlotSpec("kernel post-scale stream", "KernelDMASrc.AuxBaseAddr[1]", "weights"),
        SlotSpec("kernel palette-lookup stream", "KernelDMASrc.AuxBaseAddr[2]", "weights"),
        SlotSpec("kernel activation-lookup stream", "KernelDMASrc.AuxBaseAddr[3]", "weights"),
    ),
    dimensions={
        "Win": "Common.InDim.Win",
        "Hin": "Common.InDim.Hin",
        "Cin": "Common.Cin.Cin",
        "Cout": "Common.Cout.Cout",
        "Wout": "Common.OutDim.Wout",
        "Hout": "Common.OutDim.Hout",
        "OCGSize": "Common.ConvCfg.OCGSize",
        "numGroups": "Common.GroupConvCfg.NumGroups",
        "Kw": "Common.ConvCfg.Kw",
        "Kh": "Common.ConvCfg.Kh",
        "TileHeight": "Common.TileCfg.TileHeight",
    },
)
assert H13.size == 0x274, hex(H13.size)
assert [off for off, _ in H13.group_offsets()] == [0x28, 0x124, 0x168, 0x1DC, 0x228, 0x23C, 0x254]

GENERATIONS: dict[str, TdLayout] = {H13.name: H13}
"""Known descriptor layouts by generation name; a chain of any other generation decodes to raw words."""


def layout_for(generation: str | int | None) -> TdLayout | None:
    """The layout of a generation name ("h13") or container cpusubtype (4); None when unknown."""
    if isinstance(generation, str):
        return GENERATIONS.get(generation.lower())
    if isinstance(generation, int):
        return next((lay for lay in GENERATIONS.values() if generation in lay.cpusubtypes), None)
    return None


# --------------------------------------------------------------------------------------------------------
# decoded values
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisterGroup:
    """One decoded register group: where its header sits in the descriptor, its address and words."""

    name: str
    offset: int
    address: int
    words: tuple[int, ...]

    def register_address(self, index: int) -> int:
        """Register address of word ``index`` (consecutive words go to consecutive registers)."""
        return self.address + WORD * index


@dataclass(frozen=True)
class TdDescriptor:
    """One task descriptor: its place in the chain, header words, and register groups or raw words.

    ``groups`` is filled for a known generation; otherwise ``raw`` holds the bytes after the header.
    """

    index: int
    offset: int
    header: tuple[int, ...]
    groups: tuple[RegisterGroup, ...] = ()
    raw: bytes = b""
    generation: str | None = None

    @property
    def layout(self) -> TdLayout | None:
        return layout_for(self.generation)

    @property
    def size(self) -> int:
        return HEADER_SIZE + sum(WORD * (1 + len(g.words)) for g in self.groups) + len(self.raw)

    @property
    def next_offset(self) -> int:
        return self.header[HEADER_WORDS.index("next_pointer")]

    @property
    def task_index(self) -> int:
        """The 16-bit index in the first header word (table 23.11 "index")."""
        return self.header[0] & 0xFFFF

    @property
    def task_flags(self) -> int:
        """The flags byte (+0x03): 0x02 alone, 0x00 / 0x01 / 0x03 first / middle / last of a chain."""
        return self.header[0] >> 24

    def header_words(self) -> dict[str, int]:
        return dict(zip(HEADER_WORDS, self.header))

    def header_fields(self) -> dict[str, int]:
        """Named header bit fields of this generation (empty for an unknown one)."""
        layout = self.layout
        out: dict[str, int] = {}
        if layout is not None:
            for word_name, fields in layout.header_fields.items():
                out.update(_bits(self.header[HEADER_WORDS.index(word_name)], fields))
        return out

    def group(self, name: str) -> RegisterGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def registers(self) -> dict[str, int]:
        """Every register word by name (``Group.Register`` or ``Group[i]`` when unnamed)."""
        layout = self.layout
        if layout is None:
            return {}
        out = {}
        for g, spec in zip(self.groups, layout.groups):
            for i, word in enumerate(g.words):
                out[spec.register_name(i)] = word
        return out

    def fields(self) -> dict[str, int]:
        """Every named bit field by path (``Common.InDim.Win``), decoded with its mask."""
        layout = self.layout
        if layout is None:
            return {}
        out = {}
        for g, spec in zip(self.groups, layout.groups):
            for reg in spec.registers:
                for f in reg.fields:
                    out[f"{spec.name}.{reg.name}.{f.name}"] = f.get(g.words[reg.index])
        return out

    def dimensions(self) -> dict[str, int]:
        """Win, Hin, Cin, Cout, Wout, Hout, OCGSize, numGroups, ... (empty for an unknown generation)."""
        layout = self.layout
        if layout is None:
            return {}
        fields = self.fields()
        return {short: fields[path] for short, path in layout.dimensions.items()}

    def with_field(self, path: str, value: int) -> TdDescriptor:
        """A copy with one named bit field (``Common.InDim.Win``) set, through the same field table."""
        layout = self.layout
        if layout is None:
            raise KeyError(path)
        group_name, reg_name, field_name = [*path.split("."), "", "", ""][:3]
        for gi, spec in enumerate(layout.groups):
            reg = next((r for r in spec.registers if r.name == reg_name), None)
            bit = next((f for f in reg.fields if f.name == field_name), None) if reg else None
            if spec.name != group_name or reg is None or bit is None:
                continue
            words = list(self.groups[gi].words)
            words[reg.index] = bit.put(words[reg.index], value)
            groups = list(self.groups)
            groups[gi] = replace(self.groups[gi], words=tuple(words))
            return replace(self, groups=tuple(groups))
        raise KeyError(path)


@dataclass(frozen=True)
class TdLink:
    """One +0x1c link: descriptor ``source`` (at ``offset``) points at ``target`` (None at the tail)."""

    source: int
    offset: int
    target: int | None


class RelocationLike(Protocol):
    """What the chain needs of a container relocation record (``anekit.inspect.hwx.Relocation``): the
    section-relative address of the patched word, its width (log2 bytes) and its target."""

    @property
    def address(self) -> int: ...

    @property
    def scattered(self) -> bool: ...

    @property
    def length(self) -> int: ...

    @property
    def symbolnum(self) -> int: ...

    @property
    def extern(self) -> bool: ...


@dataclass(frozen=True)
class TdRelocation:
    """A relocation placed in the chain: the patched descriptor, register and slot, the target section
    ordinal (or symbol index when ``extern``), and the value the slot holds now (the offset into the
    target section). A scattered relocation is kept unplaced."""

    address: int
    section: int
    extern: bool
    descriptor: int | None
    register: str | None
    slot: str | None
    value: int | None
    relocation: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class TdChain:
    """A decoded descriptor chain: descriptors in link order, links, placed relocations, and the bytes
    of the region no descriptor covers (so re-encoding gives the same bytes)."""

    generation: str | None
    base: int
    size: int
    descriptors: tuple[TdDescriptor, ...]
    links: tuple[TdLink, ...]
    relocations: tuple[TdRelocation, ...] = ()
    filler: tuple[tuple[int, bytes], ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return len(self.descriptors)


@dataclass(frozen=True)
class TdPayload:
    """A bare task-descriptor payload: the chain, the padding to the kernel, the kernel bytes."""

    chain: TdChain
    padding: bytes
    kernel: bytes = field(repr=False)

    @property
    def td_count(self) -> int:
        return len(self.chain)

    @property
    def td_size(self) -> int:
        return self.chain.descriptors[0].size

    @property
    def tsk_size(self) -> int:
        return self.chain.size

    @property
    def krn_offset(self) -> int:
        return self.chain.size + len(self.padding)

    @property
    def krn_size(self) -> int:
        return len(self.kernel)


# --------------------------------------------------------------------------------------------------------
# decoding
# --------------------------------------------------------------------------------------------------------

Buffer = Union[bytes, bytearray, memoryview]


def _u32(view: memoryview, at: int) -> int:
    return struct.unpack_from("<I", view, at)[0]


def _view(data: Buffer) -> memoryview:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"[{FORMAT}] expected bytes or memoryview, got {type(data).__name__}")
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _choose_layout(view: memoryview, base: int, generation: str | int | None) -> tuple[TdLayout | None, bool]:
    """The layout to decode with, and whether it was asked for (then the bytes must follow it)."""
    if generation is not None:
        return layout_for(generation), True
    for layout in GENERATIONS.values():
        if layout.signature_matches(view, base):
            return layout, False
    return None, False


def _walk(view: memoryview, base: int, limit: int, layout: TdLayout | None) -> list[int]:
    """Descriptor offsets in link order; refuses loops, overlaps, misaligned and out-of-range links."""
    extent = layout.size if layout is not None else HEADER_SIZE
    region = limit - base
    if extent > region:
        raise FormatError(
            FORMAT,
            "descriptor[0]",
            "first descriptor runs past the end of the chain region",
            offset=base,
            expected=f"{extent:#x} bytes",
            actual=f"{region:#x} bytes",
        )
    offsets = [0]
    ordered = [0]
    while True:
        at = offsets[-1]
        where = f"descriptor[{len(offsets) - 1}].next_pointer"
        link_at = base + at + NEXT_OFFSET
        nxt = _u32(view, link_at)
        if nxt == 0:
            return offsets
        if nxt % WORD:
            raise FormatError(FORMAT, where, "link is not word-aligned", offset=link_at, actual=f"{nxt:#x}")
        if nxt + extent > region:
            raise FormatError(
                FORMAT,
                where,
                "link points past the end of the chain region",
                offset=link_at,
                expected=f"at most {region - extent:#x}",
                actual=f"{nxt:#x}",
            )
        k = bisect.bisect_left(ordered, nxt)
        for j in (k - 1, k):
            if 0 <= j < len(ordered) and abs(ordered[j] - nxt) < extent:
                other = offsets.index(ordered[j])
                what = "loop: link back to" if ordered[j] == nxt else "link overlaps"
                raise FormatError(
                    FORMAT,
                    where,
                    f"{what} descriptor[{other}] at {ordered[j]:#x}",
                    offset=link_at,
                    actual=f"{nxt:#x}",
                )
        offsets.append(nxt)
        ordered.insert(k, nxt)


def _decode_descriptor(
    view: memoryview, base: int, at: int, index: int, end: int, layout: TdLayout | None, required: bool
) -> TdDescriptor:
    start = base + at
    hdr = HEADER.parse(view, start)
    header = tuple(hdr[name] for name in HEADER_WORDS)
    if layout is None:
        return TdDescriptor(index, at, header, raw=bytes(view[start + HEADER_SIZE : base + end]))
    groups = []
    for off, spec in layout.group_offsets():
        word = _u32(view, start + off)
        if word != spec.header_word:
            raise FormatError(
                FORMAT,
                f"descriptor[{index}].{spec.name}.header",
                f"not a {layout.name} register group"
                + ("" if required else " (the first descriptor matched this layout)"),
                offset=start + off,
                expected=f"{spec.header_word:#010x}",
                actual=f"{word:#010x}",
            )
        words = struct.unpack_from(f"<{spec.count}I", view, start + off + WORD)
        groups.append(RegisterGroup(spec.name, off, spec.address, tuple(words)))
    desc = TdDescriptor(index, at, header, tuple(groups), generation=layout.name)
    next_size = desc.header_fields().get("NextSize")
    if desc.next_offset and next_size is not None and next_size != layout.size // WORD - 1:
        raise FormatError(
            FORMAT,
            f"descriptor[{index}].cycles.NextSize",
            "size announced for the next descriptor does not match the layout",
            offset=start + HEADER.offset_of("cycles"),
            expected=layout.size // WORD - 1,
            actual=next_size,
        )
    return desc


def _place(
    descriptors: Sequence[TdDescriptor],
    layout: TdLayout | None,
    view: memoryview,
    base: int,
    relocations: Sequence[RelocationLike],
) -> tuple[TdRelocation, ...]:
    """Put each relocation on the descriptor and register whose word it patches."""
    starts = sorted((d.offset, d.index) for d in descriptors)
    keys = [s for s, _ in starts]
    slots = {s.register: s.name for s in layout.slots} if layout is not None else {}
    out = []
    for i, reloc in enumerate(relocations):
        address, width = int(reloc.address), 1 << int(reloc.length)
        section, extern = int(reloc.symbolnum), bool(reloc.extern)
        if reloc.scattered:
            out.append(TdRelocation(address, section, extern, None, None, None, None, reloc))
            continue
        k = bisect.bisect_right(keys, address) - 1
        desc = descriptors[starts[k][1]] if k >= 0 else None
        if desc is None or address + width > desc.offset + desc.size:
            raise FormatError(
                FORMAT,
                f"relocation[{i}].address",
                "relocation does not patch a word inside a task descriptor",
                offset=base + address if address < len(view) else None,
                actual=f"{address:#x} (+{width} bytes)",
            )
        register = layout.locate(address - desc.offset) if layout is not None else None
        value = int.from_bytes(view[base + address : base + address + width], "little")
        slot = slots.get(register) if register is not None else None
        out.append(TdRelocation(address, section, extern, desc.index, register, slot, value, reloc))
    return tuple(out)


def decode_chain(
    data: Buffer,
    base: int = 0,
    *,
    end: int | None = None,
    generation: str | int | None = None,
    relocations: Sequence[RelocationLike] = (),
) -> TdChain:
    """Decode the descriptor chain starting at ``data[base]`` (links are offsets from ``base``).

    ``end`` bounds the chain region (default: the end of ``data``; pass the section end for a
    container). ``generation`` is a generation name ("h13"), a container cpusubtype (4) or None to
    recognise the layout by its group headers; an unknown generation gives raw words. ``relocations``
    (the container's records for this section, addresses relative to ``base``) are placed on the
    registers they patch.
    """
    view = _view(data)
    limit = len(view) if end is None else end
    if not 0 <= base <= limit <= len(view):
        raise FormatError(
            FORMAT,
            "chain",
            "chain region outside the data",
            offset=base,
            actual=f"end {limit:#x} of {len(view):#x}",
        )
    layout, required = _choose_layout(view, base, generation)
    offsets = _walk(view, base, limit, layout)
    ordered = sorted(offsets)
    ends = {}
    for i, at in enumerate(ordered):
        if layout is not None:
            ends[at] = at + layout.size
        else:
            ends[at] = ordered[i + 1] if i + 1 < len(ordered) else limit - base
    descriptors = tuple(
        _decode_descriptor(view, base, at, i, ends[at], layout, required) for i, at in enumerate(offsets)
    )
    size = (limit - base) if end is not None or layout is None else max(ends.values())
    filler = []
    cursor = 0
    for at in ordered:
        if at > cursor:
            filler.append((cursor, bytes(view[base + cursor : base + at])))
        cursor = ends[at]
    if cursor < size:
        filler.append((cursor, bytes(view[base + cursor : base + size])))
    links = tuple(
        TdLink(i, d.offset, d.next_offset if d.next_offset else None) for i, d in enumerate(descriptors)
    )
    placed = _place(descriptors, layout, view, base, relocations)
    return TdChain(
        layout.name if layout is not None else None, base, size, descriptors, links, placed, tuple(filler)
    )


def decode_payload(data: Buffer, *, generation: str | int | None = "h13") -> TdPayload:
    """A bare payload: the descriptor chain from byte 0, then padding to a 64-byte boundary, then the
    kernel bytes. The descriptor count is the length of the +0x1c chain; the layout must be known."""
    view = _view(data)
    chain = decode_chain(view, 0, generation=generation)
    if chain.generation is None:
        raise FormatError(
            FORMAT,
            "descriptor[0]",
            "no known task-descriptor layout matches, so the kernel bytes cannot be located",
            offset=HEADER_SIZE,
            expected=f"group headers of {sorted(GENERATIONS)}",
            actual=f"{_u32(view, HEADER_SIZE):#010x}" if len(view) >= HEADER_SIZE + WORD else "truncated",
        )
    krn = min(len(view), -(-chain.size // KERNEL_ALIGN) * KERNEL_ALIGN)
    return TdPayload(chain, bytes(view[chain.size : krn]), bytes(view[krn:]))


# --------------------------------------------------------------------------------------------------------
# encoding
# --------------------------------------------------------------------------------------------------------


def _encode_descriptor(desc: TdDescriptor) -> bytes:
    parts = [HEADER.build(**dict(zip(HEADER_WORDS, desc.header)))]
    for g in desc.groups:
        parts.append(struct.pack("<I", _build_bits(GROUP_HEADER, address=g.address, last=len(g.words) - 1)))
        parts.append(struct.pack(f"<{len(g.words)}I", *g.words))
    parts.append(desc.raw)
    return b"".join(parts)


def encode_chain(chain: TdChain) -> bytes:
    """The chain region's bytes: every descriptor at its offset, the uncovered bytes as they were."""
    out = bytearray(chain.size)
    for at, chunk in chain.filler:
        out[at : at + len(chunk)] = chunk
    for desc in chain.descriptors:
        blob = _encode_descriptor(desc)
        out[desc.offset : desc.offset + len(blob)] = blob
    return bytes(out)


def encode_payload(payload: TdPayload) -> bytes:
    """Descriptors, padding and kernel bytes: the payload's file bytes."""
    return encode_chain(payload.chain) + payload.padding + payload.kernel


def encode(value: TdChain | TdPayload) -> bytes:
    """Re-encode a decoded chain or payload; ``encode(decode_payload(b)) == b``."""
    if isinstance(value, TdPayload):
        return encode_payload(value)
    if isinstance(value, TdChain):
        return encode_chain(value)
    raise TypeError(f"[{FORMAT}] cannot encode {type(value).__name__}")


# --------------------------------------------------------------------------------------------------------
# inspect interface
# --------------------------------------------------------------------------------------------------------


def detect(data: bytes) -> bool:
    """Cheap sniff for a bare payload: a known layout's group headers at the start, no container magic."""
    view = _view(data)
    if len(view) < HEADER_SIZE + WORD or _u32(view, 0) in MACHO_MAGICS:
        return False
    return any(layout.signature_matches(view, 0) for layout in GENERATIONS.values())


def _descriptor_summary(desc: TdDescriptor, relocs: Sequence[TdRelocation]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": desc.index,
        "offset": desc.offset,
        "size": desc.size,
        "task_index": desc.task_index,
        "task_flags": desc.task_flags,
        "next": desc.next_offset or None,
        "header": {name: f"{word:#010x}" for name, word in desc.header_words().items()},
    }
    layout = desc.layout
    if layout is None:
        out["raw_words"] = len(desc.raw) // WORD
        return out
    regs = desc.registers()
    fields = desc.fields()
    out["header_fields"] = desc.header_fields()
    out["dimensions"] = desc.dimensions()
    out["conv"] = {k: fields[f"Common.ConvCfg.{k}"] for k in ("Kw", "Kh", "Sx", "Sy", "Px", "Py", "Ox", "Oy")}
    out["kernel_streams"] = [
        {
            "channel": i,
            "base": regs[f"KernelDMASrc.CoeffBaseAddr[{i}]"],
            "size": regs[f"KernelDMASrc.CoeffBfrSize[{i}]"],
        }
        for i in range(16)
        if fields[f"KernelDMASrc.CoeffDMAConfig[{i}].En"]
    ]
    out["tile_dma"] = {
        "source_enabled": fields["TileDMASrc.DMAConfig.En"],
        "src1": {
            "base": regs["TileDMASrc.Src1BaseAddr"],
            "strides": [
                fields[f"TileDMASrc.Src1{s}Stride.Stride"] * 64 for s in ("Row", "Plane", "Depth", "Group")
            ],
        },
        "src2": {
            "base": regs["TileDMASrc.Src2BaseAddr"],
            "strides": [
                fields[f"TileDMASrc.Src2{s}Stride.Stride"] * 64 for s in ("Row", "Plane", "Depth", "Group")
            ],
        },
        "dst": {
            "enabled": fields["TileDMADst.DMAConfig.En"],
            "base": regs["TileDMADst.BaseAddr"],
            "strides": [
                fields[f"TileDMADst.{s}Stride.Stride"] * 64 for s in ("Row", "Plane", "Depth", "Group")
            ],
        },
    }
    mine = [r for r in relocs if r.descriptor == desc.index]
    relocated = {r.register for r in mine}
    out["slots"] = [
        {"slot": s.name, "register": s.register, "binding": s.binding, "value": regs[s.register]}
        for s in layout.slots
        if s.binding.startswith("header") or regs[s.register] or s.register in relocated
    ]
    out["relocations"] = [
        {"register": r.register, "slot": r.slot, "value": r.value, "section": r.section} for r in mine
    ]
    return out


def chain_summary(chain: TdChain) -> dict[str, Any]:
    """A JSON-able summary of a chain (also used for a container's ``__text``)."""
    return {
        "generation": chain.generation or "unknown (raw words)",
        "td_count": len(chain),
        "size": chain.size,
        "links": [[link.offset, link.target] for link in chain.links],
        "relocations": len(chain.relocations),
        "descriptors": [_descriptor_summary(d, chain.relocations) for d in chain.descriptors],
    }


def summarize(data: bytes) -> dict[str, Any]:
    """A JSON-able summary of a bare task-descriptor payload."""
    payload = decode_payload(data, generation=None)
    return {
        "kind": "ane_td",
        "description": "bare task-descriptor payload: descriptor chain, then kernel bytes",
        "td_count": payload.td_count,
        "td_size": payload.td_size,
        "tsk_size": payload.tsk_size,
        "krn_offset": payload.krn_offset,
        "krn_size": payload.krn_size,
        **{k: v for k, v in chain_summary(payload.chain).items() if k not in ("td_count", "size")},
    }
