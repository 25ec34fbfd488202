"""The ANE hardware container (.hwx): a Mach-O-shaped file decoded to frozen dataclasses, re-encoded exactly.

Layout of the M1 (H13) containers the ANE compiler writes; all integers little-endian::

    offset    size         record
    0x0000    32           mach_header_64   u32 magic 0xbeefface (bytes CE FA EF BE) | u32 cputype 0x80
                                            | u32 cpusubtype 4 | u32 filetype 2 (execute) | u32 ncmds
                                            | u32 sizeofcmds | u32 flags 0x200000 | u32 reserved
    0x0020    sizeofcmds   load commands    u32 cmd | u32 cmdsize | body, one after another:
                 0x19 LC_SEGMENT_64   segment_command_64 (72 bytes) then nsects x section_64 (80 bytes)
                 0x06 LC_LOADFVMLIB   u32 name offset (20) | u32 minor_version | u32 header_addr
                                      | window name, NUL-padded to cmdsize
                 0x04 LC_THREAD       {u32 flavor | u32 count | count x u32 state}+ then NUL-separated
                                      names that state words point at (offsets from the command start)
                 0x08 LC_IDENT        the compiler banner: "ANEC v1", toolchain, then one line per flag
                 0x02 LC_SYMTAB       u32 symoff | u32 nsyms | u32 stroff | u32 strsize
              ...          nlist_64 symbols (16 bytes each) at symoff, the string table at stroff,
                           relocation_info records (8 bytes each) at each section's reloff
              ...          zero padding up to the first segment with file bytes
    0x4000    filesize     __TEXT segment: __text (the task-descriptor program: 0x274-byte descriptors,
                           a second one 0x300 bytes after the first, linked by the word at +0x1c)
                           then __const (the weight tiles), each section padded to its alignment

Segments without file bytes (fileoff = filesize = 0) are virtual: __PAGEZERO (the guard page at 0)
and the __FVMLIB windows, one per input (__const, read) or output (__data, write) tensor, whose
vmaddr the LC_LOADFVMLIB commands bind to the tensor names.

The symbol table names three things. Section symbols (n_type 0x0f) are the weight tiles
``K<sha256 of the weight>_ne_<lane>`` in __TEXT,__const and the window tensors. Stabs-style local
symbols (n_type 0x80) hold the element-type catalog, ``float16:t5=r1;2;0``: a range type whose
``r<base>;<size>;0`` form is a float of that many bytes and ``r<base>;<lo>;<hi>`` an integer range.
Global stabs (n_type 0x20, n_desc = the type id) give each tensor's memory layout as nested arrays of
structs, ``image:t11=ar1;0;1;12=s192n:ar1;0;3;13=s64c:...:ar1;0;1;15=s2w:5``: ``ar1;0;<count>;``
repeats the struct that follows ``count`` times (the bound is a count, not a stabs inclusive upper
bound), ``s<size><axis>:`` is one element along ``axis`` of ``size`` bytes (the axis's byte
stride), and the final number is the element type id.

Decoding keeps everything needed to give the same bytes back: unknown load commands stay raw, every
command keeps the bytes after its known fields, and file bytes that no structure covers are kept as
``Gap`` records when they are not all zero (zero padding is implied by the offsets). ``encode_hwx``
writes the gaps, then every structure at its recorded file offset, then the header and the load
commands. The magic is a parameter: ``decode_hwx(data)`` accepts the engine magic and the real
64-bit Mach-O magic 0xfeedfacf (a file patched for otool), ``decode_hwx(data, magic=X)`` any other.
"""

from __future__ import annotations

import bisect
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from anekit.binfmt import Field, Record
from anekit.errors import FormatError

__all__ = [
    "ANE_CPUTYPE",
    "ANE_MAGIC",
    "COMMAND_NAMES",
    "COMMAND_TYPES",
    "FMT",
    "KNOWN_MAGICS",
    "LC_IDENT",
    "LC_LOADFVMLIB",
    "LC_SEGMENT_64",
    "LC_SYMTAB",
    "LC_THREAD",
    "MACH_HEADER_64",
    "MH_MAGIC_64",
    "NLIST_64",
    "RELOCATION_INFO",
    "SECTION_64",
    "SEGMENT_COMMAND_64",
    "BuildInfo",
    "CommandSpan",
    "ElementType",
    "FvmlibCommand",
    "Gap",
    "HwxFile",
    "IdentCommand",
    "LoadCommand",
    "MachHeader",
    "RawCommand",
    "Relocation",
    "Section",
    "SegmentCommand",
    "Symbol",
    "SymtabCommand",
    "TensorAxis",
    "TensorLayout",
    "ThreadCommand",
    "ThreadState",
    "WeightTile",
    "Window",
    "decode_hwx",
    "detect",
    "encode_hwx",
    "parse_build_info",
    "parse_element_type",
    "parse_tensor_stab",
    "register_command",
    "section_bytes",
    "string_table",
    "summarize",
]

FMT = "hwx"
"""Format name that starts every error message of this module."""

ANE_MAGIC = 0xBEEFFACE
"""The engine's container magic, file bytes CE FA EF BE."""
MH_MAGIC_64 = 0xFEEDFACF
"""The 64-bit Mach-O magic; a container with its magic patched to this parses with otool / rabin2."""
KNOWN_MAGICS = (ANE_MAGIC, MH_MAGIC_64)
"""Magics ``decode_hwx`` accepts when it is given no explicit magic."""
ANE_CPUTYPE = 0x80
"""The engine pseudo-architecture in ``cputype``."""

LC_SYMTAB = 0x2
LC_THREAD = 0x4
LC_UNIXTHREAD = 0x5
LC_LOADFVMLIB = 0x6
LC_IDFVMLIB = 0x7
LC_IDENT = 0x8
LC_SEGMENT_64 = 0x19

COMMAND_NAMES: dict[int, str] = {
    0x1: "LC_SEGMENT",
    LC_SYMTAB: "LC_SYMTAB",
    0x3: "LC_SYMSEG",
    LC_THREAD: "LC_THREAD",
    LC_UNIXTHREAD: "LC_UNIXTHREAD",
    LC_LOADFVMLIB: "LC_LOADFVMLIB",
    LC_IDFVMLIB: "LC_IDFVMLIB",
    LC_IDENT: "LC_IDENT",
    0x9: "LC_FVMFILE",
    0xB: "LC_DYSYMTAB",
    0xC: "LC_LOAD_DYLIB",
    0xE: "LC_LOAD_DYLINKER",
    LC_SEGMENT_64: "LC_SEGMENT_64",
    0x1B: "LC_UUID",
    0x1D: "LC_CODE_SIGNATURE",
    0x32: "LC_BUILD_VERSION",
}
"""Mach-O load-command names by tag, for summaries (the tags this module decodes and common others)."""

FILETYPE_NAMES = {0x1: "MH_OBJECT", 0x2: "MH_EXECUTE", 0x6: "MH_DYLIB", 0xB: "MH_KEXT_BUNDLE"}
ZEROFILL_SECTION_TYPES = frozenset({0x1, 0xC, 0x12})
"""Section types (flags & 0xff) without file bytes: S_ZEROFILL, S_GB_ZEROFILL, S_THREAD_LOCAL_ZEROFILL."""
VM_PROT_WRITE = 0x2
N_STAB = 0xE0
N_TYPE = 0x0E
N_SECT = 0x0E
N_GSYM = 0x20
N_LSYM = 0x80

# --------------------------------------------------------------------------------------------------------
# record tables
# --------------------------------------------------------------------------------------------------------

MACH_HEADER_64 = Record(
    "mach_header_64",
    (
        Field("magic", "I", 0),
        Field("cputype", "I", 4),
        Field("cpusubtype", "I", 8),
        Field("filetype", "I", 12),
        Field("ncmds", "I", 16),
        Field("sizeofcmds", "I", 20),
        Field("flags", "I", 24),
        Field("reserved", "I", 28),
    ),
    size=32,
)
LOAD_COMMAND = Record("load_command", (Field("cmd", "I", 0), Field("cmdsize", "I", 4)), size=8)
SEGMENT_COMMAND_64 = Record(
    "segment_command_64",
    (
        Field("cmd", "I", 0),
        Field("cmdsize", "I", 4),
        Field("segname", "16s", 8),
        Field("vmaddr", "Q", 24),
        Field("vmsize", "Q", 32),
        Field("fileoff", "Q", 40),
        Field("filesize", "Q", 48),
        Field("maxprot", "I", 56),
        Field("initprot", "I", 60),
        Field("nsects", "I", 64),
        Field("flags", "I", 68),
    ),
    size=72,
)
SECTION_64 = Record(
    "section_64",
    (
        Field("sectname", "16s", 0),
        Field("segname", "16s", 16),
        Field("addr", "Q", 32),
        Field("size", "Q", 40),
        Field("offset", "I", 48),
        Field("align", "I", 52),
        Field("reloff", "I", 56),
        Field("nreloc", "I", 60),
        Field("flags", "I", 64),
        Field("reserved1", "I", 68),
        Field("reserved2", "I", 72),
        Field("reserved3", "I", 76),
    ),
    size=80,
)
RELOCATION_INFO = Record("relocation_info", (Field("r_address", "I", 0), Field("r_info", "I", 4)), size=8)
SYMTAB_COMMAND = Record(
    "symtab_command",
    (
        Field("cmd", "I", 0),
        Field("cmdsize", "I", 4),
        Field("symoff", "I", 8),
        Field("nsyms", "I", 12),
        Field("stroff", "I", 16),
        Field("strsize", "I", 20),
    ),
    size=24,
)
NLIST_64 = Record(
    "nlist_64",
    (
        Field("n_strx", "I", 0),
        Field("n_type", "B", 4),
        Field("n_sect", "B", 5),
        Field("n_desc", "H", 6),
        Field("n_value", "Q", 8),
    ),
    size=16,
)
FVMLIB_COMMAND = Record(
    "fvmlib_command",
    (
        Field("cmd", "I", 0),
        Field("cmdsize", "I", 4),
        Field("name_offset", "I", 8),
        Field("minor_version", "I", 12),
        Field("header_addr", "I", 16),
    ),
    size=20,
)
THREAD_STATE = Record("thread_state", (Field("flavor", "I", 0), Field("count", "I", 4)), size=8)

HEADER_SIZE = MACH_HEADER_64.size
assert HEADER_SIZE == 32 and SEGMENT_COMMAND_64.size == 72 and SECTION_64.size == 80
assert NLIST_64.size == 16 and RELOCATION_INFO.size == 8 and SYMTAB_COMMAND.size == 24


def _name16(raw: bytes) -> str:
    """A 16-byte name field as text; latin-1 and only trailing NULs stripped, so it re-encodes exactly."""
    return raw.rstrip(b"\0").decode("latin-1")


def _name16_bytes(name: str, what: str) -> bytes:
    raw = name.encode("latin-1", errors="strict")
    if len(raw) > 16:
        raise FormatError(FMT, what, "name longer than 16 bytes", expected="<= 16", actual=len(raw))
    return raw.ljust(16, b"\0")


def _cstring(buf: bytes, start: int, end: int) -> str:
    """The NUL-terminated string at ``buf[start:end]`` (to ``end`` if no NUL), decoded for display."""
    stop = buf.find(b"\0", start, end)
    return buf[start : end if stop < 0 else stop].decode("utf-8", errors="backslashreplace")


def _u32s(values: Iterable[int]) -> bytes:
    values = tuple(values)
    return struct.pack(f"<{len(values)}I", *values)


# --------------------------------------------------------------------------------------------------------
# header, load commands
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MachHeader:
    """The 32-byte mach_header_64. ``encode_hwx`` writes ``ncmds`` as the number of commands it encodes."""

    magic: int
    cputype: int
    cpusubtype: int
    filetype: int
    ncmds: int
    sizeofcmds: int
    flags: int
    reserved: int = 0


@dataclass(frozen=True)
class CommandSpan:
    """A load command being decoded: the whole file, the command's offset, size and index, and its name
    (the start of every error's field path)."""

    buf: bytes
    offset: int
    size: int
    index: int
    name: str

    def field(self, path: str) -> str:
        return f"load_commands[{self.index}] {self.name}.{path}"

    def body(self) -> bytes:
        return self.buf[self.offset : self.offset + self.size]

    def need(self, path: str, fixed: int) -> None:
        if self.size < fixed:
            raise FormatError(
                FMT,
                self.field(path),
                f"cmdsize too small for the {fixed}-byte command",
                offset=self.offset + 4,
                expected=f">= {fixed}",
                actual=self.size,
            )

    def span(self, path: str, start: int, length: int, at: int) -> None:
        """Check that file bytes ``[start, start + length)`` exist (``at``: where the reference sits)."""
        if length and (start + length > len(self.buf)):
            raise FormatError(
                FMT,
                self.field(path),
                f"{length} bytes at file offset {start:#x} run past the end of the {len(self.buf)}-byte file",
                offset=at,
                expected=f"<= {len(self.buf)}",
                actual=start + length,
            )


class LoadCommand:
    """A load command. Subclasses are frozen dataclasses registered per tag with ``register_command``.

    ``decode`` builds one from the file bytes, ``encode`` gives the command's own bytes back (exactly
    ``cmdsize`` of them) and ``file_regions`` the (file offset, bytes) pieces outside the command area
    that it owns (segment contents, symbol and string tables, relocations).
    """

    cmd: int

    @property
    def name(self) -> str:
        return COMMAND_NAMES.get(self.cmd, f"cmd {self.cmd:#x}")

    @classmethod
    def decode(cls, cmd: int, where: CommandSpan) -> LoadCommand:
        raise NotImplementedError

    def encode(self) -> bytes:
        raise NotImplementedError

    def file_regions(self) -> list[tuple[int, bytes]]:
        return []


COMMAND_TYPES: dict[int, type[LoadCommand]] = {}
"""Decoder class per load-command tag; a tag not here decodes as ``RawCommand``."""


def register_command(*tags: int) -> Callable[[type[LoadCommand]], type[LoadCommand]]:
    """Class decorator: decode load commands with these tags with the decorated class."""

    def add(cls: type[LoadCommand]) -> type[LoadCommand]:
        for tag in tags:
            assert tag not in COMMAND_TYPES, f"load command {tag:#x} registered twice"
            COMMAND_TYPES[tag] = cls
        return cls

    return add


@dataclass(frozen=True)
class RawCommand(LoadCommand):
    """A load command this module does not interpret: its tag and the bytes after cmd / cmdsize."""

    cmd: int
    data: bytes = b""

    @classmethod
    def decode(cls, cmd: int, where: CommandSpan) -> RawCommand:
        return cls(cmd, where.body()[8:])

    def encode(self) -> bytes:
        return LOAD_COMMAND.build(cmd=self.cmd, cmdsize=8 + len(self.data)) + self.data


# -- LC_SEGMENT_64 -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Relocation:
    """One relocation_info record: the patched address in the section and the packed r_info word."""

    address: int
    info: int

    @property
    def scattered(self) -> bool:
        return bool(self.address & 0x80000000)

    @property
    def symbolnum(self) -> int:
        """Symbol index when ``extern``, else the 1-based section number the address is relative to."""
        return self.info & 0xFFFFFF

    @property
    def pcrel(self) -> bool:
        return bool(self.info >> 24 & 1)

    @property
    def length(self) -> int:
        """log2 of the patched width in bytes (2: a 4-byte word)."""
        return self.info >> 25 & 3

    @property
    def extern(self) -> bool:
        return bool(self.info >> 27 & 1)

    @property
    def type(self) -> int:
        return self.info >> 28


@dataclass(frozen=True)
class Section:
    """A section_64 record and the relocations its ``reloff`` / ``nreloc`` point at."""

    sectname: str
    segname: str
    addr: int
    size: int
    offset: int
    align: int
    reloff: int = 0
    flags: int = 0
    reserved1: int = 0
    reserved2: int = 0
    reserved3: int = 0
    relocations: tuple[Relocation, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.segname},{self.sectname}"

    @property
    def type(self) -> int:
        """The section type, the low byte of ``flags``."""
        return self.flags & 0xFF

    @property
    def has_file_bytes(self) -> bool:
        """False for window sections (offset 0) and zero-fill sections."""
        return self.offset != 0 and self.size != 0 and self.type not in ZEROFILL_SECTION_TYPES

    def encode(self) -> bytes:
        return SECTION_64.build(
            sectname=_name16_bytes(self.sectname, "section.sectname"),
            segname=_name16_bytes(self.segname, "section.segname"),
            addr=self.addr,
            size=self.size,
            offset=self.offset,
            align=self.align,
            reloff=self.reloff,
            nreloc=len(self.relocations),
            flags=self.flags,
            reserved1=self.reserved1,
            reserved2=self.reserved2,
            reserved3=self.reserved3,
        )


@register_command(LC_SEGMENT_64)
@dataclass(frozen=True)
class SegmentCommand(LoadCommand):
    """LC_SEGMENT_64: a segment, its sections and its file bytes (``data``, ``filesize`` of them)."""

    cmd: int
    segname: str
    vmaddr: int
    vmsize: int
    fileoff: int
    filesize: int
    maxprot: int
    initprot: int
    flags: int = 0
    sections: tuple[Section, ...] = ()
    data: bytes = field(default=b"", repr=False)
    extra: bytes = b""  # command bytes after the last section_64 (none in a well-formed file)

    @classmethod
    def decode(cls, cmd: int, where: CommandSpan) -> SegmentCommand:
        where.need("cmdsize", SEGMENT_COMMAND_64.size)
        buf, base = where.buf, where.offset
        h = SEGMENT_COMMAND_64.parse(buf, base)
        segname = _name16(h["segname"])
        where = replace(where, name=f"{where.name} {segname}")
        nsects = h["nsects"]
        if SEGMENT_COMMAND_64.size + SECTION_64.size * nsects > where.size:
            raise FormatError(
                FMT,
                where.field("nsects"),
                f"{nsects} sections of {SECTION_64.size} bytes do not fit in the {where.size}-byte command",
                offset=base + SEGMENT_COMMAND_64.offset_of("nsects"),
                expected=f"<= {(where.size - SEGMENT_COMMAND_64.size) // SECTION_64.size}",
                actual=nsects,
            )
        fileoff, filesize = h["fileoff"], h["filesize"]
        where.span("filesize", fileoff, filesize, base + SEGMENT_COMMAND_64.offset_of("filesize"))
        sections = []
        for k in range(nsects):
            at = base + SEGMENT_COMMAND_64.size + SECTION_64.size * k
            s = SECTION_64.parse(buf, at)
            nreloc, reloff = s["nreloc"], s["reloff"]
            where.span(
                f"sections[{k}].nreloc",
                reloff,
                RELOCATION_INFO.size * nreloc,
                at + SECTION_64.offset_of("nreloc"),
            )
            relocs = tuple(
                Relocation(*RELOCATION_INFO.struct.unpack_from(buf, reloff + RELOCATION_INFO.size * r))
                for r in range(nreloc)
            )
            sect = Section(
                _name16(s["sectname"]),
                _name16(s["segname"]),
                s["addr"],
                s["size"],
                s["offset"],
                s["align"],
                reloff,
                s["flags"],
                s["reserved1"],
                s["reserved2"],
                s["reserved3"],
                relocs,
            )
            if sect.has_file_bytes and not (
                fileoff <= sect.offset and sect.offset + sect.size <= fileoff + filesize
            ):
                raise FormatError(
                    FMT,
                    where.field(f"sections[{k}] {sect.name}.offset"),
                    f"section bytes [{sect.offset:#x}, {sect.offset + sect.size:#x}) lie outside the "
                    f"segment's file range [{fileoff:#x}, {fileoff + filesize:#x})",
                    offset=at + SECTION_64.offset_of("offset"),
                )
            sections.append(sect)
        end = SEGMENT_COMMAND_64.size + SECTION_64.size * nsects
        return cls(
            cmd,
            segname,
            h["vmaddr"],
            h["vmsize"],
            fileoff,
            filesize,
            h["maxprot"],
            h["initprot"],
            h["flags"],
            tuple(sections),
            buf[fileoff : fileoff + filesize] if filesize else b"",
            where.body()[end:],
        )

    def encode(self) -> bytes:
        body = b"".join(s.encode() for s in self.sections) + self.extra
        return (
            SEGMENT_COMMAND_64.build(
                cmd=self.cmd,
                cmdsize=SEGMENT_COMMAND_64.size + len(body),
                segname=_name16_bytes(self.segname, "segment.segname"),
                vmaddr=self.vmaddr,
                vmsize=self.vmsize,
                fileoff=self.fileoff,
                filesize=self.filesize,
                maxprot=self.maxprot,
                initprot=self.initprot,
                nsects=len(self.sections),
                flags=self.flags,
            )
            + body
        )

    def file_regions(self) -> list[tuple[int, bytes]]:
        regions = [(self.fileoff, self.data)] if self.data else []
        for s in self.sections:
            if s.relocations:
                regions.append((s.reloff, b"".join(_u32s((r.address, r.info)) for r in s.relocations)))
        return regions

    def section(self, sectname: str) -> Section | None:
        return next((s for s in self.sections if s.sectname == sectname), None)

    def section_view(self, sect: Section) -> memoryview:
        """The file bytes of one of this segment's sections, as a view into ``data``."""
        if not sect.has_file_bytes:
            raise FormatError(
                FMT, f"section {sect.name}", "has no file bytes (a virtual window or zero-fill section)"
            )
        start = sect.offset - self.fileoff
        if start < 0 or start + sect.size > len(self.data):
            raise FormatError(
                FMT,
                f"section {sect.name}.offset",
                f"lies outside segment {self.segname}'s {len(self.data)} file bytes",
                actual=sect.offset,
            )
        return memoryview(self.data)[start : start + sect.size]


# -- LC_THREAD ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThreadState:
    """One flavor block of a thread command: the flavor and its ``count`` 32-bit state words."""

    flavor: int
    state: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.state)


@register_command(LC_THREAD, LC_UNIXTHREAD)
@dataclass(frozen=True)
class ThreadCommand(LoadCommand):
    """LC_THREAD: flavor blocks, then ``tail``, the bytes after them (the engine's NUL-separated names).

    Blocks are read while one fits with a nonzero count; whatever follows is the tail. The engine's
    procedure block (flavor 1) names the program and its port blocks (flavor 3) name the tensors
    through state words holding an offset, from the command start, of a string in the tail.
    """

    cmd: int
    states: tuple[ThreadState, ...] = ()
    tail: bytes = b""

    @classmethod
    def decode(cls, cmd: int, where: CommandSpan) -> ThreadCommand:
        body = where.body()
        pos, states = 8, []
        while pos + THREAD_STATE.size <= len(body):
            flavor, count = THREAD_STATE.struct.unpack_from(body, pos)
            if count == 0 or pos + THREAD_STATE.size + 4 * count > len(body):
                break
            states.append(ThreadState(flavor, struct.unpack_from(f"<{count}I", body, pos + 8)))
            pos += THREAD_STATE.size + 4 * count
        return cls(cmd, tuple(states), body[pos:])

    def encode(self) -> bytes:
        body = b"".join(
            THREAD_STATE.build(flavor=s.flavor, count=s.count) + _u32s(s.state) for s in self.states
        )
        body += self.tail
        return LOAD_COMMAND.build(cmd=self.cmd, cmdsize=8 + len(body)) + body

    @property
    def tail_offset(self) -> int:
        """Offset of the tail from the start of the command."""
        return 8 + sum(THREAD_STATE.size + 4 * s.count for s in self.states)

    @property
    def strings(self) -> tuple[str, ...]:
        """The non-empty NUL-separated strings of the tail."""
        return tuple(p.decode("utf-8", errors="backslashreplace") for p in self.tail.split(b"\0") if p)

    def string_at(self, offset: int) -> str | None:
        """The string starting at ``offset`` (from the command start) if one starts there, else None."""
        rel = offset - self.tail_offset
        if not 0 <= rel < len(self.tail) or self.tail[rel] == 0 or (rel and self.tail[rel - 1] != 0):
            return None
        return _cstring(self.tail, rel, len(self.tail))

    def string_refs(self) -> list[tuple[int, int, str]]:
        """(block index, word index, string) for every state word that points at a string of the tail."""
        refs = []
        for b, s in enumerate(self.states):
            for w, value in enumerate(s.state):
                text = self.string_at(value)
                if text is not None:
                    refs.append((b, w, text))
        return refs


# -- LC_SYMTAB ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Symbol:
    """One nlist_64 entry and its name from the string table."""

    name: str
    strx: int
    type: int
    sect: int
    desc: int
    value: int

    @property
    def is_stab(self) -> bool:
        return bool(self.type & N_STAB)

    @property
    def in_section(self) -> bool:
        return not self.is_stab and self.type & N_TYPE == N_SECT

    def encode(self) -> bytes:
        return NLIST_64.build(
            n_strx=self.strx, n_type=self.type, n_sect=self.sect, n_desc=self.desc, n_value=self.value
        )


@register_command(LC_SYMTAB)
@dataclass(frozen=True)
class SymtabCommand(LoadCommand):
    """LC_SYMTAB: the symbols (nlist_64 at ``symoff``) and the raw string table (at ``stroff``)."""

    cmd: int
    symoff: int
    stroff: int
    symbols: tuple[Symbol, ...] = ()
    strings: bytes = field(default=b"", repr=False)
    extra: bytes = b""

    @classmethod
    def decode(cls, cmd: int, where: CommandSpan) -> SymtabCommand:
        where.need("cmdsize", SYMTAB_COMMAND.size)
        buf, base = where.buf, where.offset
        h = SYMTAB_COMMAND.parse(buf, base)
        symoff, nsyms, stroff, strsize = h["symoff"], h["nsyms"], h["stroff"], h["strsize"]
        where.span("nsyms", symoff, NLIST_64.size * nsyms, base + SYMTAB_COMMAND.offset_of("nsyms"))
        where.span("strsize", stroff, strsize, base + SYMTAB_COMMAND.offset_of("strsize"))
        strings = buf[stroff : stroff + strsize] if strsize else b""
        symbols = []
        for k in range(nsyms):
            at = symoff + NLIST_64.size * k
            strx, ntype, sect, desc, value = NLIST_64.struct.unpack_from(buf, at)
            if strx >= strsize and not (strx == 0 and strsize == 0):
                raise FormatError(
                    FMT,
                    where.field(f"symbols[{k}].n_strx"),
                    "points past the end of the string table",
                    offset=at,
                    expected=f"< {strsize}",
                    actual=strx,
                )
            symbols.append(Symbol(_cstring(strings, strx, strsize), strx, ntype, sect, desc, value))
        return cls(cmd, symoff, stroff, tuple(symbols), strings, where.body()[SYMTAB_COMMAND.size :])

    def encode(self) -> bytes:
        return (
            SYMTAB_COMMAND.build(
                cmd=self.cmd,
                cmdsize=SYMTAB_COMMAND.size + len(self.extra),
                symoff=self.symoff,
                nsyms=len(self.symbols),
                stroff=self.stroff,
                strsize=len(self.strings),
            )
            + self.extra
        )

    def file_regions(self) -> list[tuple[int, bytes]]:
        regions = []
        if self.symbols:
            regions.append((self.symoff, b"".join(s.encode() for s in self.symbols)))
        if self.strings:
            regions.append((self.stroff, self.strings))
        return regions


def string_table(names: Iterable[str]) -> tuple[bytes, dict[str, int]]:
    """A Mach-O string table (a leading NUL, then each name NUL-terminated) and each name's index."""
    table, index = bytearray(b"\0"), {}
    for name in names:
        if name not in index:
            index[name] = len(table)
            table += name.encode("utf-8") + b"\0"
    return bytes(table), index


# -- LC_LOADFVMLIB -----------------------------------------------------------------------------------------


@register_command(LC_LOADFVMLIB, LC_IDFVMLIB)
@dataclass(frozen=True)
class FvmlibCommand(LoadCommand):
    """LC_LOADFVMLIB: binds a window name to the vmaddr (``header_addr``) of an __FVMLIB window.

    ``tail`` is everything after the 20-byte fixed part: the NUL-padded name ``name_offset`` points at.
    """

    cmd: int
    name_offset: int
    minor_version: int
    header_addr: int
    tail: bytes = b""

    @classmethod
    def decode(cls, cmd: int, where: CommandSpan) -> FvmlibCommand:
        where.need("cmdsize", FVMLIB_COMMAND.size)
        h = FVMLIB_COMMAND.parse(where.buf, where.offset)
        tail = where.body()[FVMLIB_COMMAND.size :]
        return cls(cmd, h["name_offset"], h["minor_version"], h["header_addr"], tail)

    def encode(self) -> bytes:
        return (
            FVMLIB_COMMAND.build(
                cmd=self.cmd,
                cmdsize=FVMLIB_COMMAND.size + len(self.tail),
                name_offset=self.name_offset,
                minor_version=self.minor_version,
                header_addr=self.header_addr,
            )
            + self.tail
        )

    @property
    def window_name(self) -> str:
        """The string ``name_offset`` points at ("" when it points outside the command)."""
        rel = self.name_offset - FVMLIB_COMMAND.size
        return _cstring(self.tail, rel, len(self.tail)) if 0 <= rel < len(self.tail) else ""


# -- LC_IDENT ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildInfo:
    """The compiler banner of LC_IDENT, split into its parts.

    ``options`` keeps every flag line in order as (flag, value) pairs (value None for a bare flag);
    ``target``, ``input`` and ``output`` are the values of ``-t``, ``-i`` and ``-o``.
    """

    text: str
    format: str | None
    toolchain: str | None
    toolchain_version: str | None
    options: tuple[tuple[str, str | None], ...]

    def option(self, flag: str) -> str | None:
        return next((v for k, v in self.options if k == flag), None)

    @property
    def target(self) -> str | None:
        return self.option("-t")

    @property
    def input(self) -> str | None:
        return self.option("-i")

    @property
    def output(self) -> str | None:
        return self.option("-o")

    @property
    def flags(self) -> dict[str, str | None]:
        """The ``--name=value`` options by name (the last one wins)."""
        return {k: v for k, v in self.options if k.startswith("--")}


def parse_build_info(text: str) -> BuildInfo:
    """Split a banner: a format line ("ANEC v1"), a toolchain line ("zin_ane_compiler v4.2.1"), then one
    indented option per line (``-t h13``, ``--fl2-cache-mode=resident``, ``-i path``)."""
    head: list[str] = []
    options: list[tuple[str, str | None]] = []
    for line in text.splitlines():
        item = line.strip()
        if not item:
            continue
        if line[:1].isspace() or item.startswith("-"):
            if item.startswith("--"):
                key, eq, value = item.partition("=")
                options.append((key, value if eq else None))
            else:
                key, _, value = item.partition(" ")
                options.append((key, value.strip() or None))
        else:
            head.append(item)
    fmt = head[0] if head else None
    toolchain = version = None
    if len(head) > 1:
        name, _, ver = head[1].rpartition(" ")
        toolchain, version = (name, ver) if name else (head[1], None)
    return BuildInfo(text, fmt, toolchain, version, tuple(options))


@register_command(LC_IDENT)
@dataclass(frozen=True)
class IdentCommand(LoadCommand):
    """LC_IDENT: NUL-terminated strings padded with NULs; the engine writes one, the compiler banner."""

    cmd: int
    data: bytes = b""

    @classmethod
    def decode(cls, cmd: int, where: CommandSpan) -> IdentCommand:
        return cls(cmd, where.body()[8:])

    def encode(self) -> bytes:
        return LOAD_COMMAND.build(cmd=self.cmd, cmdsize=8 + len(self.data)) + self.data

    @property
    def strings(self) -> tuple[str, ...]:
        return tuple(p.decode("utf-8", errors="backslashreplace") for p in self.data.split(b"\0") if p)

    @property
    def build_info(self) -> BuildInfo:
        return parse_build_info(self.strings[0] if self.strings else "")


# --------------------------------------------------------------------------------------------------------
# symbol-table interpretation: element types, tensor layouts, weight tiles
# --------------------------------------------------------------------------------------------------------

_TYPEDEF = re.compile(r"(?s)(?P<name>.*?):t(?P<id>\d+)=(?P<definition>.*)")
_RANGE = re.compile(r"r(?P<base>\d+);(?P<lo>-?\d+);(?P<hi>-?\d+);?")
_ARRAY = re.compile(r"ar(?P<index>\d+);(?P<lo>-?\d+);(?P<hi>-?\d+);")
_TYPE_ID = re.compile(r"(?P<id>\d+)=")
_MEMBER = re.compile(r"s(?P<size>\d+)(?P<axis>[A-Za-z_]+):")
_ELEMENT = re.compile(r"(?P<id>\d+)")
_WEIGHT_TILE = re.compile(r"K(?P<kernel>[0-9A-Fa-f]+)_ne_(?P<lane>\d+)")


@dataclass(frozen=True)
class ElementType:
    """One entry of the element-type catalog, ``name:t<id>=<definition>``.

    ``kind`` is "void" (the type refers to itself), "float" (``r<base>;<bytes>;0``: ``size`` bytes),
    "integer" (``r<base>;<lo>;<hi>``: the range lo..hi) or "opaque" (an empty or other definition).
    """

    name: str
    type_id: int
    definition: str
    kind: str
    lo: int | None = None
    hi: int | None = None
    size: int | None = None


def parse_element_type(text: str) -> ElementType:
    """Parse one catalog stab; FormatError if it is not ``name:t<id>=<definition>``."""
    m = _TYPEDEF.fullmatch(text)
    if m is None:
        raise FormatError(FMT, "symtab element type", "not a 'name:t<id>=<definition>' stab", actual=text)
    name, type_id, definition = m["name"], int(m["id"]), m["definition"]
    if definition == str(type_id):
        return ElementType(name, type_id, definition, "void")
    r = _RANGE.fullmatch(definition)
    if r is None:
        return ElementType(name, type_id, definition, "opaque")
    lo, hi = int(r["lo"]), int(r["hi"])
    if hi == 0 and lo > 0:
        return ElementType(name, type_id, definition, "float", size=lo)
    return ElementType(name, type_id, definition, "integer", lo=lo, hi=hi)


@dataclass(frozen=True)
class TensorAxis:
    """One axis of a tensor layout: its letter, element count and byte stride."""

    name: str
    count: int
    stride: int


@dataclass(frozen=True)
class TensorLayout:
    """A tensor's memory layout from its stab: axes outermost first (n, c, h, w) and the element type."""

    name: str
    type_id: int
    axes: tuple[TensorAxis, ...]
    element_type_id: int
    element_type: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.count for a in self.axes)

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(a.stride for a in self.axes)

    @property
    def axis_names(self) -> str:
        return "".join(a.name for a in self.axes)

    @property
    def is_output(self) -> bool:
        return self.name.endswith("@output")


def parse_tensor_stab(text: str, catalog: dict[int, ElementType] | None = None) -> TensorLayout:
    """Parse ``name:t<id>=ar1;0;<n>;<id>=s<stride>n:ar1;0;<c>;...=s<stride>w:<element type id>``.

    Each ``ar<index>;<lo>;<hi>;`` gives the count (hi - lo) of the ``s<size><axis>:`` struct that
    follows; ``size`` is that axis's byte stride. FormatError (naming the character) otherwise.
    """
    m = _TYPEDEF.fullmatch(text)
    if m is None:
        raise FormatError(FMT, "symtab tensor stab", "not a 'name:t<id>=<definition>' stab", actual=text)
    s, pos = text, m.start("definition")
    axes: list[TensorAxis] = []
    count: int | None = None
    while True:
        if a := _ARRAY.match(s, pos):
            if count is not None:
                raise FormatError(
                    FMT, "symtab tensor stab", f"array of an array at character {pos}", actual=s
                )
            count, pos = int(a["hi"]) - int(a["lo"]), a.end()
            if t := _TYPE_ID.match(s, pos):
                pos = t.end()
        elif member := _MEMBER.match(s, pos):
            axes.append(TensorAxis(member["axis"], 1 if count is None else count, int(member["size"])))
            count, pos = None, member.end()
            if t := _TYPE_ID.match(s, pos):
                pos = t.end()
        elif (e := _ELEMENT.fullmatch(s, pos)) and count is None and axes:
            elem = int(e["id"])
            known = (catalog or {}).get(elem)
            return TensorLayout(m["name"], int(m["id"]), tuple(axes), elem, known.name if known else None)
        else:
            raise FormatError(
                FMT,
                "symtab tensor stab",
                f"unexpected text at character {pos}: {s[pos : pos + 16]!r}",
                actual=s,
            )


@dataclass(frozen=True)
class WeightTile:
    """A weight tile symbol ``K<hash>_ne_<lane>``: where it sits and how many bytes run to the next one.

    ``live`` is False for sentinel tiles of unused lanes (n_desc 0, placed at the section end).
    """

    name: str
    kernel: str
    lane: int
    address: int
    section: str | None
    offset: int | None
    size: int
    live: bool


@dataclass(frozen=True)
class Window:
    """An LC_LOADFVMLIB binding: a tensor name, its window's vmaddr, size and direction."""

    name: str
    vmaddr: int
    section: str | None
    size: int | None
    direction: str  # "input" (read-only window), "output" (writable window), "unknown" (no window there)


# --------------------------------------------------------------------------------------------------------
# the container
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gap:
    """File bytes no structure covers that are not all zero (zero bytes around them are implied)."""

    offset: int
    data: bytes


@dataclass(frozen=True)
class HwxFile:
    """A decoded container: header, load commands, nonzero uncovered bytes, and the file size.

    ``file_size`` is None when the file ends right after its last structure, else its length (the
    trailing bytes are zeros).
    """

    header: MachHeader
    commands: tuple[LoadCommand, ...]
    gaps: tuple[Gap, ...] = ()
    file_size: int | None = None

    # -- structure -------------------------------------------------------------------------------------

    @property
    def segments(self) -> tuple[SegmentCommand, ...]:
        return tuple(c for c in self.commands if isinstance(c, SegmentCommand))

    @property
    def sections(self) -> tuple[tuple[SegmentCommand, Section], ...]:
        """Every section with its segment, in file order; symbol ``n_sect`` k names entry k - 1."""
        return tuple((seg, s) for seg in self.segments for s in seg.sections)

    def segment(self, segname: str) -> SegmentCommand | None:
        return next((s for s in self.segments if s.segname == segname), None)

    def find_section(self, segname: str, sectname: str) -> tuple[SegmentCommand, Section] | None:
        """The first section named ``segname,sectname`` (by the section's own names) and its segment."""
        return next(
            ((g, s) for g, s in self.sections if s.segname == segname and s.sectname == sectname), None
        )

    @property
    def symtab(self) -> SymtabCommand | None:
        return next((c for c in self.commands if isinstance(c, SymtabCommand)), None)

    @property
    def symbols(self) -> tuple[Symbol, ...]:
        table = self.symtab
        return table.symbols if table else ()

    @property
    def threads(self) -> tuple[ThreadCommand, ...]:
        return tuple(c for c in self.commands if isinstance(c, ThreadCommand))

    @property
    def build_info(self) -> BuildInfo | None:
        ident = next((c for c in self.commands if isinstance(c, IdentCommand)), None)
        return ident.build_info if ident else None

    # -- interpretation --------------------------------------------------------------------------------

    @property
    def element_types(self) -> tuple[ElementType, ...]:
        """The element-type catalog (local stabs that parse as ``name:t<id>=...``)."""
        out = []
        for sym in self.symbols:
            if sym.type == N_LSYM:
                try:
                    out.append(parse_element_type(sym.name))
                except FormatError:
                    continue
        return tuple(out)

    @property
    def tensors(self) -> tuple[TensorLayout, ...]:
        """The tensor layouts of the global stabs; stabs outside the known grammar are left out (their
        raw text stays in ``symbols``)."""
        catalog = {e.type_id: e for e in self.element_types}
        out = []
        for sym in self.symbols:
            if sym.type == N_GSYM:
                try:
                    out.append(parse_tensor_stab(sym.name, catalog))
                except FormatError:
                    continue
        return tuple(out)

    @property
    def weight_tiles(self) -> tuple[WeightTile, ...]:
        """The ``K<hash>_ne_<lane>`` section symbols, each sized up to the next tile or the section end."""
        sections = self.sections
        found = [
            (sym, m) for sym in self.symbols if (m := _WEIGHT_TILE.fullmatch(sym.name)) and sym.in_section
        ]
        starts: dict[int, list[int]] = {}
        for sym, _ in found:
            starts.setdefault(sym.sect, []).append(sym.value)
        for values in starts.values():
            values.sort()
        tiles = []
        for sym, m in found:
            sect = sections[sym.sect - 1][1] if 0 < sym.sect <= len(sections) else None
            size, offset = 0, None
            if sect is not None:
                values = starts[sym.sect]
                k = bisect.bisect_right(values, sym.value)
                end = min(values[k], sect.addr + sect.size) if k < len(values) else sect.addr + sect.size
                size, offset = max(0, end - sym.value), sym.value - sect.addr
            tiles.append(
                WeightTile(
                    sym.name,
                    m["kernel"],
                    int(m["lane"]),
                    sym.value,
                    sect.name if sect else None,
                    offset,
                    size,
                    sym.desc != 0,
                )
            )
        return tuple(tiles)

    @property
    def windows(self) -> tuple[Window, ...]:
        """The LC_LOADFVMLIB bindings, each matched to the segment whose vmaddr it names."""
        out = []
        for c in self.commands:
            if isinstance(c, FvmlibCommand) and c.cmd == LC_LOADFVMLIB:
                seg = next((s for s in self.segments if s.vmaddr == c.header_addr), None)
                sect = seg.sections[0] if seg and seg.sections else None
                direction = "unknown"
                if seg is not None:
                    direction = "output" if seg.initprot & VM_PROT_WRITE else "input"
                out.append(
                    Window(
                        c.window_name,
                        c.header_addr,
                        sect.name if sect else None,
                        sect.size if sect else None,
                        direction,
                    )
                )
        return tuple(out)


def _check_buffer(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"[{FMT}] decode_hwx takes bytes, bytearray or memoryview, not {type(data).__name__}")


def decode_hwx(data: bytes | bytearray | memoryview, magic: int | None = None) -> HwxFile:
    """Decode a container. ``magic``: the required magic (None: any of ``KNOWN_MAGICS``).

    Raises FormatError naming the field and byte offset for anything that does not fit.
    """
    buf = _check_buffer(data)
    try:
        return _decode(buf, magic)
    except FormatError:
        raise
    except (struct.error, ValueError, IndexError, OverflowError) as e:  # a bounds check this module missed
        raise FormatError(FMT, "file", f"malformed container: {type(e).__name__}: {e}") from e


def _decode(buf: bytes, magic: int | None) -> HwxFile:
    if len(buf) < HEADER_SIZE:
        raise FormatError(
            FMT,
            "mach_header_64",
            "file shorter than the 32-byte header",
            offset=0,
            expected=f">= {HEADER_SIZE}",
            actual=len(buf),
        )
    h = MACH_HEADER_64.parse(buf)
    allowed = KNOWN_MAGICS if magic is None else (magic,)
    if h["magic"] not in allowed:
        raise FormatError(
            FMT,
            "mach_header_64.magic",
            "not a hardware container" + ("" if magic is not None else " (pass magic= for a patched file)"),
            offset=0,
            expected=" or ".join(f"{m:#010x}" for m in allowed),
            actual=f"{h['magic']:#010x}",
        )
    header = MachHeader(**h)
    end_of_cmds = HEADER_SIZE + header.sizeofcmds
    if end_of_cmds > len(buf):
        raise FormatError(
            FMT,
            "mach_header_64.sizeofcmds",
            "load commands run past the end of the file",
            offset=MACH_HEADER_64.offset_of("sizeofcmds"),
            expected=f"<= {len(buf) - HEADER_SIZE}",
            actual=header.sizeofcmds,
        )
    commands: list[LoadCommand] = []
    pos = HEADER_SIZE
    for i in range(header.ncmds):
        if pos + LOAD_COMMAND.size > end_of_cmds:
            raise FormatError(
                FMT,
                f"load_commands[{i}]",
                f"ncmds is {header.ncmds} but only {i} commands fit in sizeofcmds",
                offset=pos,
                expected=f"<= {end_of_cmds}",
                actual=pos + LOAD_COMMAND.size,
            )
        cmd, cmdsize = LOAD_COMMAND.struct.unpack_from(buf, pos)
        if cmdsize < LOAD_COMMAND.size or pos + cmdsize > end_of_cmds:
            raise FormatError(
                FMT,
                f"load_commands[{i}].cmdsize",
                "smaller than 8 bytes or past the end of the load commands (sizeofcmds)",
                offset=pos + 4,
                expected=f"8..{end_of_cmds - pos}",
                actual=cmdsize,
            )
        cls = COMMAND_TYPES.get(cmd, RawCommand)
        name = COMMAND_NAMES.get(cmd, f"cmd {cmd:#x}")
        commands.append(cls.decode(cmd, CommandSpan(buf, pos, cmdsize, i, name)))
        pos += cmdsize

    covered = [(0, pos)] + [(o, o + len(b)) for c in commands for o, b in c.file_regions()]
    gaps = _gaps(buf, covered)
    natural_end = max([e for _, e in covered] + [g.offset + len(g.data) for g in gaps])
    return HwxFile(header, tuple(commands), gaps, len(buf) if len(buf) > natural_end else None)


def _gaps(buf: bytes, covered: list[tuple[int, int]]) -> tuple[Gap, ...]:
    """The stretches of ``buf`` outside ``covered`` that hold a nonzero byte, trimmed to the nonzero part."""
    gaps, at = [], 0
    for start, end in [*sorted(covered), (len(buf), len(buf))]:
        if start > at:
            chunk = buf[at:start]
            lead = len(chunk) - len(chunk.lstrip(b"\0"))
            if lead < len(chunk):
                body = chunk[lead:].rstrip(b"\0")
                gaps.append(Gap(at + lead, body))
        at = max(at, end)
    return tuple(gaps)


def encode_hwx(hwx: HwxFile) -> bytes:
    """The container's bytes: ``encode_hwx(decode_hwx(b)) == b`` for every file ``decode_hwx`` accepts."""
    cmds = b"".join(c.encode() for c in hwx.commands)
    h = hwx.header
    if len(cmds) > h.sizeofcmds:
        raise FormatError(
            FMT,
            "mach_header_64.sizeofcmds",
            "smaller than the encoded load commands",
            expected=f">= {len(cmds)}",
            actual=h.sizeofcmds,
        )
    regions = [r for c in hwx.commands for r in c.file_regions()]
    end = max(
        [HEADER_SIZE + h.sizeofcmds, hwx.file_size or 0]
        + [o + len(b) for o, b in regions]
        + [g.offset + len(g.data) for g in hwx.gaps]
    )
    out = bytearray(end)
    for g in hwx.gaps:
        out[g.offset : g.offset + len(g.data)] = g.data
    for offset, raw in regions:
        out[offset : offset + len(raw)] = raw
    out[:HEADER_SIZE] = MACH_HEADER_64.build(
        magic=h.magic,
        cputype=h.cputype,
        cpusubtype=h.cpusubtype,
        filetype=h.filetype,
        ncmds=len(hwx.commands),
        sizeofcmds=h.sizeofcmds,
        flags=h.flags,
        reserved=h.reserved,
    )
    out[HEADER_SIZE : HEADER_SIZE + len(cmds)] = cmds
    return bytes(out)


def section_bytes(hwx: HwxFile, segname: str, sectname: str) -> memoryview:
    """The file bytes of section ``segname,sectname`` (the first one of that name), as a read-only view.

    ``section_bytes(hwx, "__TEXT", "__text")`` is the task-descriptor program.
    """
    found = hwx.find_section(segname, sectname)
    if found is None:
        have = ", ".join(s.name for _, s in hwx.sections) or "none"
        raise FormatError(FMT, f"section {segname},{sectname}", f"no such section (sections: {have})")
    seg, sect = found
    return seg.section_view(sect)


# --------------------------------------------------------------------------------------------------------
# the shared inspect interface
# --------------------------------------------------------------------------------------------------------

_ANE_MAGIC_BYTES = struct.pack("<I", ANE_MAGIC)
_MH_MAGIC_64_BYTES = struct.pack("<I", MH_MAGIC_64)


def detect(data: bytes) -> bool:
    """True for the engine magic, or a 64-bit Mach-O magic on the engine cputype (a patched container)."""
    head = bytes(data[:8])
    if head[:4] == _ANE_MAGIC_BYTES:
        return True
    return head[:4] == _MH_MAGIC_64_BYTES and len(head) == 8 and head[4:8] == struct.pack("<I", ANE_CPUTYPE)


def _hex(value: int) -> str:
    return f"{value:#x}"


def _command_summary(c: LoadCommand) -> dict[str, Any]:
    raw = c.encode()
    entry: dict[str, Any] = {"cmd": _hex(c.cmd), "name": c.name, "cmdsize": len(raw)}
    if isinstance(c, SegmentCommand):
        entry["segment"] = c.segname
    elif isinstance(c, FvmlibCommand):
        entry["window"] = c.window_name
        entry["header_addr"] = _hex(c.header_addr)
    elif isinstance(c, ThreadCommand):
        entry["flavors"] = [{"flavor": s.flavor, "count": s.count} for s in c.states]
        entry["strings"] = list(c.strings)
        entry["string_refs"] = [{"block": b, "word": w, "string": t} for b, w, t in c.string_refs()]
    elif isinstance(c, SymtabCommand):
        entry.update(
            symoff=_hex(c.symoff), nsyms=len(c.symbols), stroff=_hex(c.stroff), strsize=len(c.strings)
        )
    return entry


def summarize(data: bytes) -> dict[str, Any]:
    """A JSON-able description: header, load commands, segments and sections, symbols, tensor layouts,
    weight tiles, windows and build info. Addresses, offsets, flags and magics are hex strings; sizes
    and counts are integers."""
    hwx = decode_hwx(data)
    h = hwx.header
    info = hwx.build_info
    tiles = hwx.weight_tiles
    weights: dict[str, dict[str, Any]] = {}
    for t in tiles:
        w = weights.setdefault(
            t.kernel, {"kernel": t.kernel, "section": t.section, "tiles": 0, "live": 0, "bytes": 0}
        )
        w["tiles"] += 1
        w["live"] += int(t.live)
        w["bytes"] += t.size
    return {
        "kind": "hwx",
        "file_size": len(data),
        "header": {
            "magic": _hex(h.magic),
            "cputype": _hex(h.cputype),
            "cpusubtype": _hex(h.cpusubtype),
            "filetype": _hex(h.filetype),
            "filetype_name": FILETYPE_NAMES.get(h.filetype),
            "ncmds": h.ncmds,
            "sizeofcmds": h.sizeofcmds,
            "flags": _hex(h.flags),
        },
        "load_commands": [_command_summary(c) for c in hwx.commands],
        "segments": [
            {
                "name": seg.segname,
                "vmaddr": _hex(seg.vmaddr),
                "vmsize": seg.vmsize,
                "fileoff": _hex(seg.fileoff),
                "filesize": seg.filesize,
                "maxprot": seg.maxprot,
                "initprot": seg.initprot,
                "flags": _hex(seg.flags),
                "sections": [
                    {
                        "name": s.sectname,
                        "addr": _hex(s.addr),
                        "size": s.size,
                        "offset": _hex(s.offset),
                        "align": 1 << min(s.align, 63),
                        "flags": _hex(s.flags),
                        "relocations": [
                            {"address": _hex(r.address), "symbolnum": r.symbolnum, "extern": r.extern}
                            for r in s.relocations
                        ],
                    }
                    for s in seg.sections
                ],
            }
            for seg in hwx.segments
        ],
        "symbols": [
            {
                "name": s.name,
                "type": _hex(s.type),
                "sect": s.sect,
                "desc": _hex(s.desc),
                "value": _hex(s.value),
            }
            for s in hwx.symbols
        ],
        "element_types": [
            {"id": e.type_id, "name": e.name, "kind": e.kind, "lo": e.lo, "hi": e.hi, "size": e.size}
            for e in hwx.element_types
        ],
        "tensors": [
            {
                "name": t.name,
                "axes": t.axis_names,
                "shape": list(t.shape),
                "strides": list(t.strides),
                "element_type": t.element_type or t.element_type_id,
            }
            for t in hwx.tensors
        ],
        "windows": [
            {
                "name": w.name,
                "vmaddr": _hex(w.vmaddr),
                "section": w.section,
                "size": w.size,
                "direction": w.direction,
            }
            for w in hwx.windows
        ],
        "weights": list(weights.values()),
        "weight_tiles": [
            {"name": t.name, "lane": t.lane, "address": _hex(t.address), "size": t.size, "live": t.live}
            for t in tiles
        ],
        "build_info": None
        if info is None
        else {
            "format": info.format,
            "toolchain": info.toolchain,
            "toolchain_version": info.toolchain_version,
            "target": info.target,
            "input": info.input,
            "output": info.output,
            "flags": info.flags,
        },
        "gaps": [{"offset": _hex(g.offset), "size": len(g.data)} for g in hwx.gaps],
    }
