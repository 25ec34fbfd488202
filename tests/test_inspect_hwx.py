"""The .hwx container decoder: real M1 files round-trip byte for byte, match their recorded headers, and
mutated files raise only FormatError."""

from __future__ import annotations

import json
import random
import struct
import time
import tracemalloc
from contextlib import suppress
from dataclasses import replace

import pytest

from anekit.errors import FormatError
from anekit.inspect.hwx import (
    ANE_CPUTYPE,
    ANE_MAGIC,
    LC_IDENT,
    LC_LOADFVMLIB,
    LC_SEGMENT_64,
    LC_SYMTAB,
    LC_THREAD,
    MH_MAGIC_64,
    FvmlibCommand,
    Gap,
    HwxFile,
    IdentCommand,
    MachHeader,
    RawCommand,
    Relocation,
    Section,
    SegmentCommand,
    Symbol,
    SymtabCommand,
    ThreadCommand,
    ThreadState,
    decode_hwx,
    detect,
    encode_hwx,
    parse_build_info,
    parse_element_type,
    parse_tensor_stab,
    section_bytes,
    string_table,
    summarize,
)
from tests.conftest import corpus_files, corpus_path
from tests.fuzz_util import watchdog

HWX_FILES = corpus_files("hwx", "*.hwx")

# -- what SOURCES.md records for each corpus file -----------------------------------------------------------
# A segment is ("seg", segname, section names, fileoff, filesize); any other command is (cmd, cmdsize).

PAGEZERO = ("seg", "__PAGEZERO", (), 0x0, 0x0)
FVMLIB_CONST = ("seg", "__FVMLIB", ("__const",), 0x0, 0x0)
FVMLIB_DATA = ("seg", "__FVMLIB", ("__data",), 0x0, 0x0)


def text(filesize: int) -> tuple:
    return ("seg", "__TEXT", ("__text", "__const"), 0x4000, filesize)


def one_input(text_size: int, ident_size: int) -> list[tuple]:
    """The 11-command shape of a single-input, single-output network."""
    return [
        PAGEZERO,
        text(text_size),
        FVMLIB_CONST,
        FVMLIB_DATA,
        (0x6, 32),
        (0x6, 40),
        (0x4, 2152),
        (0x4, 152),
        (0x4, 168),
        (0x8, ident_size),
        (0x2, 24),
    ]


def two_inputs(port_sizes: tuple[int, int]) -> list[tuple]:
    """The 14-command shape of a two-input network (concat, sum)."""
    return [
        PAGEZERO,
        text(0x8000),
        FVMLIB_CONST,
        FVMLIB_CONST,
        FVMLIB_DATA,
        (0x6, 32),
        (0x6, 32),
        (0x6, 40),
        (0x4, 2152),
        (0x4, port_sizes[0]),
        (0x4, port_sizes[1]),
        (0x4, 168),
        (0x8, 384),
        (0x2, 24),
    ]


# file name: (ncmds, sizeofcmds, load commands)
SOURCES = {
    "tinygrad-compiled-model-73536a75.hwx": (11, 3896, one_input(0x4000, 720)),
    "tinygrad-golden-23664c99.hwx": (11, 3560, one_input(0x4000, 384)),
    "tinygrad-golden-ddd67784.hwx": (11, 3560, one_input(0x8000, 384)),
    "tinygrad-golden-e2184c20.hwx": (11, 3552, one_input(0x4000, 376)),
    "tinygrad-golden-f459291c.hwx": (11, 3896, one_input(0x4000, 720)),
    "tinygrad-ops-concat-e03759f0.hwx": (14, 3912, two_inputs((160, 160))),
    "tinygrad-ops-conv-ebc7f830.hwx": (11, 3560, one_input(0x4000, 384)),
    "tinygrad-ops-conv-ff52f832.hwx": (11, 3560, one_input(0x4000, 384)),
    "tinygrad-ops-gemm-73ae6d78.hwx": (11, 3560, one_input(0x4000, 384)),
    "tinygrad-ops-gemm512-aae2e352.hwx": (11, 3560, one_input(0x84000, 384)),
    "tinygrad-ops-relu-f37fecdd.hwx": (11, 3560, one_input(0x8000, 384)),
    "tinygrad-ops-sum-6ca449af.hwx": (14, 3904, two_inputs((152, 160))),
}


def _ids(paths):
    return [p.name for p in paths]


def load(name: str) -> bytes:
    return corpus_path("hwx", name).read_bytes()


def command_shape(c) -> tuple:
    if isinstance(c, SegmentCommand):
        return ("seg", c.segname, tuple(s.sectname for s in c.sections), c.fileoff, c.filesize)
    return (c.cmd, len(c.encode()))


# -- the corpus ----------------------------------------------------------------------------------------------


def test_corpus_is_present():
    if not HWX_FILES:
        pytest.skip("corpus folder hwx not present (the corpus lives in ../shared/corpus)")
    assert sorted(p.name for p in HWX_FILES) == sorted(SOURCES)


@pytest.mark.parametrize("path", HWX_FILES, ids=_ids(HWX_FILES))
def test_corpus_file_round_trips_byte_for_byte(path):
    raw = path.read_bytes()
    hwx = decode_hwx(raw)
    assert encode_hwx(hwx) == raw
    assert decode_hwx(memoryview(raw)) == hwx
    assert decode_hwx(bytearray(raw)) == hwx
    assert decode_hwx(encode_hwx(hwx)) == hwx
    assert hwx.gaps == () and hwx.file_size is None  # nothing outside the structures but zero padding


@pytest.mark.parametrize("path", HWX_FILES, ids=_ids(HWX_FILES))
def test_corpus_header_and_load_commands_match_sources(path):
    ncmds, sizeofcmds, commands = SOURCES[path.name]
    hwx = decode_hwx(path.read_bytes())
    assert hwx.header == MachHeader(ANE_MAGIC, 0x80, 0x4, 0x2, ncmds, sizeofcmds, 0x200000, 0)
    assert [command_shape(c) for c in hwx.commands] == commands
    assert {type(c) for c in hwx.commands} == {
        SegmentCommand,
        FvmlibCommand,
        ThreadCommand,
        IdentCommand,
        SymtabCommand,
    }
    assert path.read_bytes()[:4] == bytes.fromhex("cefaefbe")


@pytest.mark.parametrize("path", HWX_FILES, ids=_ids(HWX_FILES))
def test_corpus_contents(path):
    raw = path.read_bytes()
    hwx = decode_hwx(raw)
    program = section_bytes(hwx, "__TEXT", "__text")
    assert isinstance(program, memoryview)
    assert bytes(program) == raw[0x4000 : 0x4000 + len(program)]
    # one 0x274-byte task descriptor; concat chains a second one at +0x300 (the +0x1c next offset)
    assert len(program) == (0x300 + 0x274 if "concat" in path.name else 0x274)
    assert struct.unpack_from("<I", program, 0x1C)[0] == (0x300 if "concat" in path.name else 0)
    weights = section_bytes(hwx, "__TEXT", "__const")
    assert len(weights) == hwx.find_section("__TEXT", "__const")[1].size
    with pytest.raises(FormatError, match="no file bytes"):
        section_bytes(hwx, "__FVMLIB", "__data")
    with pytest.raises(FormatError, match=r"\[hwx\] section __KERN_0,__kern_0: no such section"):
        section_bytes(hwx, "__KERN_0", "__kern_0")

    info = hwx.build_info
    assert (info.format, info.toolchain, info.toolchain_version, info.target) == (
        "ANEC v1",
        "zin_ane_compiler",
        "v4.2.1",
        "h13",
    )
    assert info.flags["--fl2-cache-mode"] == "resident" and info.flags["--memcache-strategy"] == ""
    assert info.output.endswith(("model.hwx", "model.hwx.tmp"))

    catalog = {e.type_id: e for e in hwx.element_types}
    assert [catalog[i].name for i in range(1, 11)] == [
        "void",
        "int8",
        "uint8",
        "int16",
        "float16",
        "float",
        "raw10",
        "lut",
        "uint4",
        "uint6",
    ]
    assert (catalog[5].kind, catalog[5].size) == ("float", 2)
    assert (catalog[7].kind, catalog[7].lo, catalog[7].hi) == ("integer", -512, 511)
    assert catalog[1].kind == "void" and catalog[8].kind == "opaque"

    # every window is a tensor with a layout, and an __FVMLIB segment of the right direction
    tensors = {t.name: t for t in hwx.tensors}
    windows = hwx.windows
    assert {w.name for w in windows} == set(tensors)
    for w in windows:
        assert w.direction == ("output" if w.name.endswith("@output") else "input")
        t = tensors[w.name]
        assert t.axis_names == "nchw" and t.element_type == "float16" and t.strides[-1] == 2
        assert w.size == t.shape[0] * t.strides[0]  # the window holds the whole tensor
    # each thread port names its tensor; the procedure block names the network
    procedure, *ports = hwx.threads
    assert procedure.string_refs() == [(0, 523, "net")]
    assert {p.strings[1] for p in ports} == set(tensors)
    json.dumps(summarize(raw))


def test_corpus_tensor_layouts_and_weight_tiles():
    hwx = decode_hwx(load("tinygrad-compiled-model-73536a75.hwx"))
    image, probs = hwx.tensors
    assert (image.name, image.shape, image.strides) == ("image", (1, 3, 1, 1), (192, 64, 64, 2))
    assert (probs.name, probs.shape, probs.strides, probs.is_output) == (
        "probs@output",
        (1, 2, 1, 1),
        (128, 64, 64, 2),
        True,
    )
    tiles = hwx.weight_tiles
    assert [(t.lane, t.address, t.offset, t.size, t.section, t.live) for t in tiles] == [
        (0, 0x30000280, 0, 0x40, "__TEXT,__const", True),
        (1, 0x300002C0, 0x40, 0x40, "__TEXT,__const", True),
    ]
    assert tiles[0].kernel == "2DBE6976FEB616E6867A2E3853FC37D0F101C4C51BA4A80C103359643338C0C1"
    # two relocations in __text, section-relative (not extern) to section 2, __TEXT,__const
    relocs = hwx.find_section("__TEXT", "__text")[1].relocations
    assert [(r.address, r.symbolnum, r.extern, r.pcrel, r.length) for r in relocs] == [
        (0x74, 2, False, True, 2),
        (0x78, 2, False, True, 2),
    ]
    assert hwx.sections[relocs[0].symbolnum - 1][1].name == "__TEXT,__const"

    gemm = decode_hwx(load("tinygrad-ops-gemm512-aae2e352.hwx"))
    tiles = gemm.weight_tiles
    assert [t.lane for t in tiles] == list(range(16)) and all(t.size == 0x8000 and t.live for t in tiles)
    assert sum(t.size for t in tiles) == gemm.find_section("__TEXT", "__const")[1].size
    assert gemm.tensors[0].shape == (1, 512, 1, 1)
    relu = decode_hwx(load("tinygrad-ops-relu-f37fecdd.hwx"))
    assert relu.weight_tiles == () and relu.tensors[0].shape == (1, 1, 1, 16)
    concat = decode_hwx(load("tinygrad-ops-concat-e03759f0.hwx"))
    assert [(w.name, w.direction, w.vmaddr) for w in concat.windows] == [
        ("input_1", "input", 0x30008000),
        ("input_0", "input", 0x3000C000),
        ("output@output", "output", 0x30010000),
    ]
    assert len(section_bytes(concat, "__TEXT", "__text")) == 0x574


def test_summary_of_a_corpus_file():
    raw = load("tinygrad-ops-gemm-73ae6d78.hwx")
    s = json.loads(json.dumps(summarize(raw)))
    assert s["kind"] == "hwx" and s["file_size"] == len(raw)
    assert s["header"]["magic"] == "0xbeefface" and s["header"]["filetype_name"] == "MH_EXECUTE"
    assert [c["name"] for c in s["load_commands"]][:5] == ["LC_SEGMENT_64"] * 4 + ["LC_LOADFVMLIB"]
    assert [seg["name"] for seg in s["segments"]] == ["__PAGEZERO", "__TEXT", "__FVMLIB", "__FVMLIB"]
    text_seg = s["segments"][1]
    assert [(x["name"], x["size"], x["align"]) for x in text_seg["sections"]] == [
        ("__text", 0x274, 0x4000),
        ("__const", 0x2000, 0x40),
    ]
    assert len(text_seg["sections"][0]["relocations"]) == 16
    assert s["weights"] == [
        {
            "kernel": "E623D142560CCBA9830BAAEC83E176A38A0B4DF416AD9571A2132640FBFCA250",
            "section": "__TEXT,__const",
            "tiles": 16,
            "live": 16,
            "bytes": 0x2000,
        }
    ]
    assert s["tensors"][0] == {
        "name": "image",
        "axes": "nchw",
        "shape": [1, 64, 1, 1],
        "strides": [4096, 64, 64, 2],
        "element_type": "float16",
    }
    assert s["build_info"]["target"] == "h13" and s["build_info"]["input"] == "./simple/gemm.plist"
    assert len(s["symbols"]) == 30 and s["gaps"] == []


# -- other magics ---------------------------------------------------------------------------------------------


def test_real_macho_magic_variant_decodes():
    raw = load("tinygrad-compiled-model-73536a75.hwx")
    patched = struct.pack("<I", MH_MAGIC_64) + raw[4:]
    assert patched[:4] == bytes.fromhex("cffaedfe")
    hwx = decode_hwx(patched, magic=MH_MAGIC_64)
    assert hwx.header.magic == MH_MAGIC_64
    assert encode_hwx(hwx) == patched
    assert decode_hwx(patched) == hwx  # a known magic without asking
    assert replace(hwx, header=replace(hwx.header, magic=ANE_MAGIC)) == decode_hwx(raw)
    assert detect(patched)
    with pytest.raises(
        FormatError, match=r"\[hwx\] mach_header_64\.magic at byte 0x0: not a hardware container"
    ):
        decode_hwx(patched, magic=ANE_MAGIC)
    with pytest.raises(FormatError, match="0xbeefface"):
        decode_hwx(raw, magic=MH_MAGIC_64)

    odd = struct.pack("<I", 0x12345678) + raw[4:]
    with pytest.raises(FormatError, match="pass magic="):
        decode_hwx(odd)
    assert encode_hwx(decode_hwx(odd, magic=0x12345678)) == odd
    assert not detect(odd)


def test_detect():
    assert detect(bytes.fromhex("cefaefbe") + bytes(28))
    assert detect(bytes.fromhex("cefaefbe"))
    assert detect(struct.pack("<II", MH_MAGIC_64, ANE_CPUTYPE))
    assert not detect(struct.pack("<II", MH_MAGIC_64, 0x0100000C))  # an arm64 Mach-O is not a container
    assert not detect(b"")
    assert not detect(b"bplist00")
    assert not detect(bytes.fromhex("beefface"))  # big-endian byte order


# -- a synthetic container ------------------------------------------------------------------------------------

TD_SIZE = 0x274
TEXT_OFF = 0x1000
BANNER = "ANEC v1\nzin_ane_compiler v9.509.0\n\t-t h13g\n\t--fkernel-rewind=enabled\n\t--flag\n\t-i ./a.mil\n\t-o ./a.hwx\n"
HASH = "AB" * 32


def synthetic(magic: int = ANE_MAGIC) -> HwxFile:
    """A container with every command kind: two windows, __text + __const with relocations, a symbol table
    with catalog, layout and weight-tile symbols, a thread, a banner, an unknown command, a nonzero gap
    and trailing zero padding."""
    program = bytes(range(256)) * 2 + bytes(TD_SIZE - 512)
    weights = b"".join(bytes([lane + 1]) * 0x40 for lane in range(2))
    text_data = program.ljust(0x280, b"\0") + weights
    text_data = text_data.ljust(0x1000, b"\0")
    tile = [f"K{HASH}_ne_{i}" for i in range(3)]
    names = [
        *tile,
        "x",
        "y@output",
        "float16:t5=r1;2;0",
        "int8:t2=r2;0;127",
        "void:t1=1",
        "x:t11=ar1;0;1;12=s256n:ar1;0;4;13=s64c:ar1;0;1;14=s64h:ar1;0;8;15=s2w:5",
        "y@output:t16=ar1;0;1;17=s64n:ar1;0;1;18=s64c:ar1;0;1;19=s64h:ar1;0;8;20=s2w:5",
    ]
    strings, strx = string_table(names)
    symbols = (
        Symbol(tile[0], strx[tile[0]], 0x0F, 2, 2, 0x30000280),
        Symbol(tile[1], strx[tile[1]], 0x0F, 2, 2, 0x300002C0),
        Symbol(tile[2], strx[tile[2]], 0x0F, 2, 0, 0x30000300),  # a sentinel tile at the section end
        Symbol("x", strx["x"], 0x0F, 3, 2, 0x30004000),
        Symbol("y@output", strx["y@output"], 0x0F, 4, 0, 0x30008000),
        *(Symbol(n, strx[n], 0x80, 0, 0, 0) for n in names[5:8]),
        Symbol(names[8], strx[names[8]], 0x20, 0, 11, 0),
        Symbol(names[9], strx[names[9]], 0x20, 0, 16, 0),
    )
    relocs = (Relocation(0x74, 0x05000002), Relocation(0x78, 0x05000002))
    segments = [
        SegmentCommand(LC_SEGMENT_64, "__PAGEZERO", 0, 0x4000, 0, 0, 0, 0, 0x4),
        SegmentCommand(
            LC_SEGMENT_64,
            "__TEXT",
            0x30000000,
            0x4000,
            TEXT_OFF,
            len(text_data),
            5,
            5,
            0,
            (
                Section(
                    "__text", "__TEXT", 0x30000000, TD_SIZE, TEXT_OFF, 14, 0x680, 0x128, relocations=relocs
                ),
                Section("__const", "__TEXT", 0x30000280, 0x80, TEXT_OFF + 0x280, 6, 0, 0x26),
            ),
            text_data,
        ),
        SegmentCommand(
            LC_SEGMENT_64,
            "__FVMLIB",
            0x30004000,
            0x4000,
            0,
            0,
            1,
            1,
            0x6,
            (Section("__const", "__FVMLIB", 0x30004000, 0x200, 0, 14, 0, 0x21),),
        ),
        SegmentCommand(
            LC_SEGMENT_64,
            "__FVMLIB",
            0x30008000,
            0x4000,
            0,
            0,
            2,
            2,
            0x6,
            (Section("__data", "__FVMLIB", 0x30008000, 0x80, 0, 14, 0, 0x23),),
        ),
    ]
    commands = [
        *segments,
        FvmlibCommand(LC_LOADFVMLIB, 20, 0, 0x30004000, b"x".ljust(12, b"\0")),
        FvmlibCommand(LC_LOADFVMLIB, 20, 0, 0x30008000, b"y@output".ljust(12, b"\0")),
        ThreadCommand(LC_THREAD, (ThreadState(1, (0x30000000, 0, 28)),), b"net\0"),
        ThreadCommand(LC_THREAD, (ThreadState(3, (3, 1, 0x24, 0, 0x28)),), b"net\0x\0\0\0"),
        IdentCommand(LC_IDENT, BANNER.encode() + bytes(6)),
        RawCommand(0x1B, bytes(range(16))),  # LC_UUID: not interpreted, kept as is
        SymtabCommand(LC_SYMTAB, 0x400, 0x400 + 16 * len(symbols), symbols, strings),
    ]
    sizeofcmds = sum(len(c.encode()) for c in commands)
    header = MachHeader(magic, ANE_CPUTYPE, 4, 2, len(commands), sizeofcmds, 0x200000, 0)
    return HwxFile(header, tuple(commands), (Gap(0x700, b"note\0here"),), file_size=TEXT_OFF + 0x2000)


def test_synthetic_container_round_trips():
    hwx = synthetic()
    raw = encode_hwx(hwx)
    assert len(raw) == TEXT_OFF + 0x2000 and raw[:4] == bytes.fromhex("cefaefbe")
    assert raw[0x700:0x709] == b"note\0here" and raw[-0x1000:] == bytes(0x1000)
    assert decode_hwx(raw) == hwx
    assert encode_hwx(decode_hwx(raw)) == raw
    assert detect(raw)
    assert struct.unpack_from("<2I", raw, 0x680) == (0x74, 0x05000002)


def test_synthetic_container_interpretation():
    hwx = decode_hwx(encode_hwx(synthetic()))
    assert bytes(section_bytes(hwx, "__TEXT", "__text"))[:256] == bytes(range(256))
    assert bytes(section_bytes(hwx, "__TEXT", "__const")) == bytes([1]) * 0x40 + bytes([2]) * 0x40
    x, y = hwx.tensors
    assert (x.name, x.type_id, x.shape, x.strides, x.element_type_id) == (
        "x",
        11,
        (1, 4, 1, 8),
        (256, 64, 64, 2),
        5,
    )
    assert y.shape == (1, 1, 1, 8) and y.is_output and y.element_type == "float16"
    tiles = hwx.weight_tiles
    assert [(t.lane, t.size, t.live) for t in tiles] == [(0, 0x40, True), (1, 0x40, True), (2, 0, False)]
    assert [(w.name, w.direction, w.size) for w in hwx.windows] == [
        ("x", "input", 0x200),
        ("y@output", "output", 0x80),
    ]
    info = hwx.build_info
    assert (info.toolchain_version, info.target, info.input, info.output) == (
        "v9.509.0",
        "h13g",
        "./a.mil",
        "./a.hwx",
    )
    assert info.options[2] == ("--flag", None) and info.flags == {
        "--fkernel-rewind": "enabled",
        "--flag": None,
    }
    assert hwx.threads[0].string_refs() == [(0, 2, "net")]
    assert hwx.threads[1].string_refs() == [(0, 2, "net"), (0, 4, "x")]
    assert [c.name for c in hwx.commands][-2:] == ["LC_UUID", "LC_SYMTAB"]
    assert isinstance(hwx.commands[-2], RawCommand) and hwx.commands[-2].data == bytes(range(16))
    s = summarize(encode_hwx(hwx))
    assert s["gaps"] == [{"offset": "0x700", "size": 9}] and s["build_info"]["target"] == "h13g"


def test_synthetic_real_macho_shape_with_a_segment_over_the_header():
    """A real Mach-O's __TEXT starts at file offset 0 and so covers the header and load commands."""
    hwx = synthetic(MH_MAGIC_64)
    raw = bytearray(encode_hwx(hwx))
    text_cmd = 32 + len(hwx.commands[0].encode())
    struct.pack_into(
        "<QQ", raw, text_cmd + 40, 0, TEXT_OFF + 0x1000
    )  # fileoff 0, filesize up to the segment end
    decoded = decode_hwx(bytes(raw), magic=MH_MAGIC_64)
    assert decoded.segments[1].fileoff == 0 and decoded.segments[1].data[:4] == bytes.fromhex("cffaedfe")
    assert bytes(section_bytes(decoded, "__TEXT", "__text"))[:256] == bytes(range(256))
    assert decoded.gaps == ()  # the note now lies inside the segment
    assert encode_hwx(decoded) == bytes(raw)


def test_edits_are_encoded():
    hwx = decode_hwx(load("tinygrad-compiled-model-73536a75.hwx"))
    seg = hwx.segments[1]
    sect = seg.sections[1]
    start = sect.offset - seg.fileoff
    data = seg.data[:start] + bytes([0x3C]) * sect.size + seg.data[start + sect.size :]
    edited = replace(hwx, commands=(*hwx.commands[:1], replace(seg, data=data), *hwx.commands[2:]))
    again = decode_hwx(encode_hwx(edited))
    assert bytes(section_bytes(again, "__TEXT", "__const")) == bytes([0x3C]) * sect.size
    too_many = replace(hwx, commands=(*hwx.commands, RawCommand(0x1B, bytes(16))))
    with pytest.raises(FormatError, match="sizeofcmds"):
        encode_hwx(too_many)


# -- the pieces ------------------------------------------------------------------------------------------------


def test_parse_tensor_stab():
    t = parse_tensor_stab("a:t3=ar1;0;2;4=s8n:ar1;0;4;5=s2c:5")
    assert (t.name, t.type_id, t.shape, t.strides, t.axis_names, t.element_type) == (
        "a",
        3,
        (2, 4),
        (8, 2),
        "nc",
        None,
    )
    assert parse_tensor_stab("b:t1=s4w:6").shape == (1,)  # a struct not inside an array: one element
    for bad in [
        "nothing",
        "a:t3=ar1;0;2;",
        "a:t3=ar1;0;2;ar1;0;2;s2w:5",
        "a:t3=s2w:",
        "a:t3=ar1;0;2;4=s8n:ar1;0;4;5",
        "a:t3=5",
    ]:
        with pytest.raises(FormatError, match=r"^\[hwx\] symtab tensor stab"):
            parse_tensor_stab(bad)


def test_parse_element_type():
    assert parse_element_type("float:t6=r1;4;0").size == 4
    assert parse_element_type("uint4:t9=r1;0;15").hi == 15
    assert parse_element_type("e4m3:t16=r1;1;0").kind == "float"
    assert parse_element_type("int4:t23=r1;-8;7").lo == -8
    assert parse_element_type("lut:t8=").kind == "opaque"
    with pytest.raises(FormatError):
        parse_element_type("lut")


def test_parse_build_info_without_banner_lines():
    empty = parse_build_info("")
    assert (empty.format, empty.toolchain, empty.target, empty.options) == (None, None, None, ())
    only = parse_build_info("ANEC v1\ncompiler")
    assert (only.toolchain, only.toolchain_version) == ("compiler", None)


# -- errors ------------------------------------------------------------------------------------------------------


def _patched(raw: bytes, offset: int, fmt: str, *values: int) -> bytes:
    b = bytearray(raw)
    struct.pack_into(fmt, b, offset, *values)
    return bytes(b)


def test_errors_say_where():
    raw = load("tinygrad-compiled-model-73536a75.hwx")
    cases = [
        (raw[:20], r"\[hwx\] mach_header_64 at byte 0x0: file shorter than the 32-byte header"),
        (raw[:3000], r"mach_header_64.sizeofcmds at byte 0x14: load commands run past the end"),
        (_patched(raw, 16, "<I", 12), r"load_commands\[11\] at byte 0xf58: ncmds is 12"),
        (_patched(raw, 36, "<I", 0), r"load_commands\[0\].cmdsize at byte 0x24"),
        (_patched(raw, 0x20 + 64, "<I", 2), r"load_commands\[0\] LC_SEGMENT_64 __PAGEZERO.nsects"),
        (
            _patched(raw, 0x68 + 48, "<Q", 0x10000),
            r"load_commands\[1\] LC_SEGMENT_64 __TEXT.filesize .*run past the end",
        ),
        (
            _patched(raw, 0x68 + 72 + 48, "<I", 0x100),
            r"LC_SEGMENT_64 __TEXT.sections\[0\] __TEXT,__text.offset .*outside",
        ),
        (_patched(raw, 0x68 + 72 + 60, "<I", 100000), r"LC_SEGMENT_64 __TEXT.sections\[0\].nreloc"),
        (_patched(raw, 0xF40 + 12, "<I", 100000), r"load_commands\[10\] LC_SYMTAB.nsyms"),
        (_patched(raw, 0xF40 + 20, "<I", 0x10000), r"LC_SYMTAB.strsize"),
        (
            _patched(raw, 0xF58, "<I", 0x1000),
            r"LC_SYMTAB.symbols\[0\].n_strx at byte 0xf58: points past the end",
        ),
        (_patched(raw, 0x2A0 + 4, "<I", 12), r"load_commands\[5\] LC_LOADFVMLIB.cmdsize"),
    ]
    for data, pattern in cases:
        with pytest.raises(FormatError, match=pattern):
            decode_hwx(data)
    with pytest.raises(TypeError, match="bytes"):
        decode_hwx("not bytes")  # type: ignore[arg-type]


def test_every_truncation_of_the_header_and_commands_is_rejected():
    raw = load("tinygrad-golden-e2184c20.hwx")
    for n in range(0, 0x1200, 7):
        with pytest.raises(FormatError):
            decode_hwx(raw[:n])
    with pytest.raises(FormatError, match="TEXT"):
        decode_hwx(raw[:-1])  # the last segment byte missing


# -- fuzzing -------------------------------------------------------------------------------------------------------


def field_offsets(raw: bytes) -> list[int]:
    """Every 4-byte word of the header, the load commands and the symbol table (all fields are 4-aligned)."""
    hwx = decode_hwx(raw)
    spots = list(range(0, 32 + hwx.header.sizeofcmds, 4))
    table = hwx.symtab
    spots += range(table.symoff, table.symoff + 16 * len(table.symbols), 4)
    return spots


def mutate(raw: bytes, spots: list[int], rng: random.Random) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(4)
        if kind == 0:  # bit flips, mostly in the structures
            for _ in range(rng.randint(1, 8)):
                pos = (
                    rng.choice(spots) + rng.randrange(4)
                    if rng.random() < 0.8
                    else rng.randrange(max(1, len(b)))
                )
                if pos < len(b):
                    b[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncation, often inside the structures
            end = rng.choice(spots) + rng.randrange(8) if rng.random() < 0.5 else rng.randrange(len(b) + 1)
            del b[end:]
        else:  # a word overwritten with a huge, zero, boundary or self-referencing value
            pos = rng.choice(spots)
            value = rng.choice(
                [
                    0,
                    1,
                    8,
                    0x7FFFFFFF,
                    0x80000000,
                    0xFFFFFFFF,
                    len(raw),
                    len(raw) - 1,
                    len(raw) - 16,
                    pos,
                    pos + 4,
                    0x4000,
                    rng.randrange(64),
                    rng.randrange(1 << 32),
                ]
            )
            if pos + 4 <= len(b):
                struct.pack_into("<I", b, pos, value)
    return bytes(b)


def use_everything(data: bytes) -> None:
    """Everything a consumer might do with a file; only FormatError may escape."""
    hwx = decode_hwx(data)
    assert encode_hwx(hwx) == data  # every accepted file re-encodes exactly
    for seg, sect in hwx.sections:
        if sect.has_file_bytes:
            assert len(seg.section_view(sect)) == sect.size
    hwx.tensors, hwx.weight_tiles, hwx.windows, hwx.element_types, hwx.build_info  # noqa: B018
    json.dumps(summarize(data))


@pytest.mark.parametrize("path", HWX_FILES, ids=_ids(HWX_FILES))
def test_mutated_files_raise_only_format_error(path):
    raw = path.read_bytes()
    spots = field_offsets(raw)
    rng = random.Random(f"hwx-fuzz-{path.name}")
    outcomes = {"decoded": 0, "rejected": 0}
    slowest = 0.0
    for case in range(400):
        data = mutate(raw, spots, rng)
        traced = case % 10 == 0
        if traced:
            tracemalloc.start()
        start = time.perf_counter()
        try:
            with watchdog(5):
                use_everything(data)
            outcomes["decoded"] += 1
        except FormatError as e:
            assert str(e).startswith("[hwx] "), e
            outcomes["rejected"] += 1
        except Exception as e:  # pragma: no cover - the failure being tested for
            pytest.fail(f"case {case}: {type(e).__name__}: {e}")
        finally:
            if traced:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                assert peak < 8 * len(raw) + (4 << 20), f"case {case}: peak {peak} bytes"
        slowest = max(slowest, time.perf_counter() - start)
    assert outcomes["decoded"] > 5 and outcomes["rejected"] > 30, outcomes
    assert slowest < 1.0


def test_random_bytes_behind_a_valid_magic():
    rng = random.Random(7)
    for _ in range(300):
        data = bytes.fromhex("cefaefbe") + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
        with watchdog(5), suppress(FormatError):
            use_everything(data)
