"""The E5 dispatch descriptor: schema facts, byte layout, round trips, unknown fields, bad input, fuzzing."""

from __future__ import annotations

import random
import struct
import time
import tracemalloc
from contextlib import suppress

import flatbuffers
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anekit.errors import FormatError
from anekit.inspect import e5
from anekit.inspect.e5 import (
    ELEMENT_TYPES,
    TENSOR_DESCRIPTOR,
    AliasSymbol,
    ArgFrame,
    BuildInfo,
    BuildInfoEntry,
    Direction,
    E5Program,
    Operand,
    OpType,
    RawField,
    Section,
    TensorDescriptor,
    build_e5,
    decode_e5,
    detect,
    element_type_name,
    op_type_name,
    peek_flatbuffer,
    summarize,
)
from tests.conftest import corpus_files
from tests.fuzz_util import watchdog

# -- a canonical descriptor: one fused inference bracketed by two casts --------------------------------------


def fp16_tensor(channels: int = 64, width: int = 16) -> TensorDescriptor:
    row = 2 * width
    return TensorDescriptor(
        dim=(1, channels, 1, width),
        stride=(channels * row, row, row, 2),
        width=width,
        height=1,
        channels=channels,
        batch_number=1,
        sequence_length=1,
        stride_width=2,
        stride_height=row,
        stride_channels=row,
        stride_batch_number=channels * row,
        stride_sequence_length=channels * row,
        storage_type=3,
    )


def canonical() -> E5Program:
    """Op0_Cast -> Op1_AneInference -> Op2_Cast, each with an argument frame and a nested attribute blob."""
    names = ("Op0_Cast", "Op1_AneInference", "Op2_Cast", "x", "x_ane", "y_ane", "y")

    def op(i: int, kind: OpType, src: int, dst: int) -> Section:
        frame = ArgFrame(
            operands=(
                Operand(names[src], src, Direction.input, fp16_tensor()),
                Operand(names[dst], dst, Direction.output, fp16_tensor()),
            ),
            aliases=(AliasSymbol(f"{names[dst]}_view", dst, 0x80),) if kind == OpType.AneInference else (),
        )
        attrs = build_e5(E5Program(symbol_names=(f"attrs{i}",), format_version=i + 1))
        return Section(names[i], kind, frame, attrs)

    return E5Program(
        symbol_names=names,
        build_info=BuildInfo(
            (BuildInfoEntry("compiler", "zin_ane_compiler v9.509.0"), BuildInfoEntry("source", "model.mil"))
        ),
        sections=(op(0, OpType.Cast, 3, 4), op(1, OpType.AneInference, 4, 5), op(2, OpType.Cast, 5, 6)),
        format_version=4,
    )


def u32(b: bytes, at: int) -> int:
    return struct.unpack_from("<I", b, at)[0]


def u16(b: bytes, at: int) -> int:
    return struct.unpack_from("<H", b, at)[0]


def root_vtable(b: bytes) -> tuple[int, int]:
    """(root table position, its vtable position), read by hand."""
    root = u32(b, 0)
    return root, root - struct.unpack_from("<i", b, root)[0]


# -- schema facts --------------------------------------------------------------------------------------------


def test_the_enumerations_are_the_references():
    assert [m.name for m in OpType] == [
        "Cast",
        "AneInference",
        "EirInference",
        "CpuInference",
        "BnnsCpuInference",
        "MlcCpuInference",
        "MpsGraphInference",
        "E5MinimalCpu",
        "Quant",
        "Dequant",
        "Barrier",
        "JitCall",
    ]
    assert [int(m) for m in OpType] == list(range(12))
    assert ELEMENT_TYPES == {
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
    assert op_type_name(1) == "AneInference" and op_type_name(12) == "unknown(12)"
    assert element_type_name(3) == "float16" and element_type_name(16) == "unknown(16)"


def test_tensor_descriptor_struct_layout():
    """18 u64 (dim[4], stride[4], five sizes, five strides), the i32 storage type, 4 bytes of padding."""
    assert TENSOR_DESCRIPTOR.size == 152
    names = [f.name for f in TENSOR_DESCRIPTOR.fields]
    assert names[:8] == ["dim0", "dim1", "dim2", "dim3", "stride0", "stride1", "stride2", "stride3"]
    assert names[8:18] == [
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
    ]
    assert (
        TENSOR_DESCRIPTOR.offset_of("storage_type") == 144 and TENSOR_DESCRIPTOR.offset_of("padding") == 148
    )


# -- the bytes the builder writes ----------------------------------------------------------------------------


def test_root_vtable_is_the_references_tag():
    """Table 23.1's tag for the real descriptor: vtable size 12, object size 20, fields at 4, 8, 12, 16."""
    b = build_e5(canonical())
    root, vt = root_vtable(b)
    assert b[vt : vt + 12].hex() == "0c001400040008000c001000"
    assert struct.unpack_from("<i", b, root + 16)[0] == 4  # format_version, inline
    assert peek_flatbuffer(b) == {"object_size": 20, "vtable_bytes": 12, "fields": {0: 4, 1: 8, 2: 12, 3: 16}}


def test_symbol_names_read_back_by_hand():
    b = build_e5(canonical())
    root, _ = root_vtable(b)
    at = root + 4  # field 0's uoffset
    vec = at + u32(b, at)
    names = []
    for i in range(u32(b, vec)):
        elem = vec + 4 + 4 * i
        s = elem + u32(b, elem)
        names.append(b[s + 4 : s + 4 + u32(b, s)].decode())
        assert b[s + 4 + u32(b, s)] == 0  # NUL-terminated
    assert tuple(names) == canonical().symbol_names


def test_tensor_descriptor_bytes_by_hand():
    t = fp16_tensor(channels=8, width=4)
    b = build_e5(
        E5Program(symbol_names=("t",), sections=(Section("s", 0, ArgFrame((Operand("t", 0, 0, t),))),))
    )
    record = struct.pack("<18Qi4x", *t.dim, *t.stride, 4, 1, 8, 1, 1, 2, 8, 8, 64, 64, 3)
    at = b.find(record)
    assert at > 0 and at % 8 == 0  # the struct is inline and 8-aligned


# -- round trips ---------------------------------------------------------------------------------------------


def test_canonical_round_trip_and_summary():
    p = canonical()
    b = build_e5(p)
    assert decode_e5(b) == p
    assert build_e5(decode_e5(b)) == b
    assert decode_e5(memoryview(b)) == p and decode_e5(bytearray(b)) == p
    assert detect(b)
    s = summarize(b)
    assert s["kind"] == "e5" and s["format_version"] == 4
    assert s["op_chain"] == "Cast -> AneInference -> Cast" and s["dispatches"] == 1
    assert s["build_info"]["compiler"] == "zin_ane_compiler v9.509.0"
    op1 = s["sections"][1]
    assert op1["name"] == "Op1_AneInference" and op1["op_type"] == "AneInference"
    assert [o["direction"] for o in op1["operands"]] == ["input", "output"]
    assert op1["operands"][0]["tensor"]["storage_type"] == "float16"
    assert op1["operands"][0]["tensor"]["dim"] == [1, 64, 1, 16]
    assert op1["aliases"] == [{"name": "y_ane_view", "symbol_index": 5, "addr_offset": 0x80}]
    assert op1["op_attrs"]["root_fields"] == {"0": 4, "2": 8, "3": 12}
    assert s["unknown_fields"] == []


names_st = st.text(max_size=10)
u8 = st.integers(0, 255)
u32_st = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)


def raws(first: int) -> st.SearchStrategy[tuple[RawField, ...]]:
    """Unknown fields past a table's known slots, in index order (as the decoder returns them)."""
    pairs = st.lists(
        st.tuples(st.integers(first, first + 5), st.binary(min_size=1, max_size=9)),
        max_size=2,
        unique_by=lambda t: t[0],
    )
    return pairs.map(lambda ps: tuple(RawField(i, d) for i, d in sorted(ps)))


tensors = st.builds(
    TensorDescriptor,
    dim=st.tuples(u64, u64, u64, u64),
    stride=st.tuples(u64, u64, u64, u64),
    **{name: u64 for name in e5._TD_SCALARS},
    storage_type=i32,
    padding=st.binary(min_size=4, max_size=4),
)
operands = st.builds(
    Operand, name=names_st, symbol_index=u32_st, direction=u8, tensor=st.none() | tensors, unknown=raws(4)
)
aliases = st.builds(AliasSymbol, name=names_st, symbol_index=u32_st, addr_offset=u32_st, unknown=raws(3))
frames = st.builds(
    ArgFrame,
    operands=st.lists(operands, max_size=3).map(tuple),
    aliases=st.lists(aliases, max_size=2).map(tuple),
    unknown=raws(2),
)
sections = st.builds(
    Section,
    name=names_st,
    op_type=u8,
    arg_frame=st.none() | frames,
    op_attrs=st.binary(max_size=40),
    unknown=raws(4),
)
entries = st.builds(BuildInfoEntry, key=names_st, value=names_st, unknown=raws(2))
programs = st.builds(
    E5Program,
    symbol_names=st.lists(names_st, max_size=5).map(tuple),
    build_info=st.none()
    | st.builds(BuildInfo, entries=st.lists(entries, max_size=3).map(tuple), unknown=raws(1)),
    sections=st.lists(sections, max_size=4).map(tuple),
    format_version=i32,
    unknown=raws(4),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_random_descriptors_round_trip(p):
    b = build_e5(p)
    assert decode_e5(b) == p
    assert build_e5(decode_e5(b)) == b
    summarize(b)  # never raises on what the builder writes


# -- reading what another writer wrote ------------------------------------------------------------------------


def _string_vector(b: flatbuffers.Builder, items: list[int]) -> int:
    b.StartVector(4, len(items), 4)
    for off in reversed(items):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def test_a_buffer_written_field_by_field_in_schema_order_with_shared_strings():
    """Another writer's choices (declaration order, shared strings, a forced default) decode the same."""
    b = flatbuffers.Builder(0)
    x = b.CreateSharedString("x")
    names = _string_vector(b, [x, b.CreateSharedString("x"), b.CreateString("Op0_Cast")])
    b.StartObject(4)  # Section: name, op_type (forced default 0), no frame, op_attrs absent
    b.PrependUOffsetTRelativeSlot(0, x, 0)
    b.ForceDefaults(True)
    b.PrependUint8Slot(1, 0, 0)
    b.ForceDefaults(False)
    section = b.EndObject()
    secs = _string_vector(b, [section, section])  # the same table twice
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(0, names, 0)
    b.PrependUOffsetTRelativeSlot(2, secs, 0)
    b.PrependInt32Slot(3, 4, 0)
    b.Finish(b.EndObject())
    p = decode_e5(bytes(b.Output()))
    assert p == E5Program(symbol_names=("x", "x", "Op0_Cast"), sections=(Section("x"), Section("x")))


def test_an_older_schema_with_a_shorter_vtable_reads_with_defaults():
    b = flatbuffers.Builder(0)
    names = _string_vector(b, [b.CreateString("only")])
    b.StartObject(1)
    b.PrependUOffsetTRelativeSlot(0, names, 0)
    b.Finish(b.EndObject())
    assert decode_e5(bytes(b.Output())) == E5Program(symbol_names=("only",), format_version=0)


def test_unknown_fields_are_kept_raw_and_survive_a_rebuild():
    """A newer writer's root with a u64 at slot 4 and a string at slot 6: known fields still decode."""
    b = flatbuffers.Builder(0)
    extra = b.CreateString("future")
    names = _string_vector(b, [b.CreateString("a")])
    b.StartObject(7)
    b.PrependUint64Slot(4, 0x1122334455667788, 0)
    b.PrependUOffsetTRelativeSlot(6, extra, 0)
    b.PrependInt32Slot(3, 4, 0)
    b.PrependUOffsetTRelativeSlot(0, names, 0)
    b.Finish(b.EndObject())
    data = bytes(b.Output())
    p = decode_e5(data)
    assert p.symbol_names == ("a",) and p.format_version == 4
    assert [r.index for r in p.unknown] == [4, 6]
    assert p.unknown[0].data[:8] == struct.pack("<Q", 0x1122334455667788)
    assert len(p.unknown[1].data) == 4  # a uoffset, kept as its inline bytes
    s = summarize(data)
    assert [(u["table"], u["index"]) for u in s["unknown_fields"]] == [("E5Program", 4), ("E5Program", 6)]
    assert decode_e5(build_e5(p)) == p  # written back at the same slots


def test_unknown_codes_are_kept_as_ints():
    p = E5Program(
        sections=(Section("s", 200, ArgFrame((Operand("t", 0, 7, TensorDescriptor(storage_type=99)),))),)
    )
    q = decode_e5(build_e5(p))
    assert q == p and q.op_chain == ["unknown(200)"]
    op = summarize(build_e5(p))["sections"][0]["operands"][0]
    assert op["direction"] == "unknown(7)" and op["tensor"]["storage_type"] == "unknown(99)"


# -- what the builder refuses ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "program, field",
    [
        (E5Program(sections=(Section(op_type=256),)), "sections[0].op_type"),
        (E5Program(format_version=2**31), "format_version"),
        (E5Program(sections=(Section(arg_frame=ArgFrame((Operand(symbol_index=-1),))),)), "symbol_index"),
        (
            E5Program(
                sections=(Section(arg_frame=ArgFrame((Operand(tensor=TensorDescriptor(dim=(1, 2))),))),)
            ),
            "tensor",
        ),
        (E5Program(unknown=(RawField(2, b"x"),)), "<field 2>"),
        (E5Program(unknown=(RawField(9, b""),)), "<field 9>"),
        (E5Program(sections=("not a section",)), "sections[0]"),
        (E5Program(symbol_names=(3,)), "<build>"),
    ],
)
def test_builder_rejects_values_that_do_not_fit(program, field):
    with pytest.raises(FormatError, match=r"^\[e5\] .*" + field.replace("[", r"\[").replace("]", r"\]")):
        build_e5(program)


# -- malformed input -----------------------------------------------------------------------------------------


def patched(b: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(b)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def test_malformed_buffers_name_the_field_and_offset():
    b = build_e5(canonical())
    root, vt = root_vtable(b)
    cases = [
        (b[:3], r"<root>.*offset runs outside the buffer"),
        (patched(b, 0, "<I", len(b) + 8), r"<root>.*points past the end"),
        (patched(b, root, "<i", -(len(b))), r"<vtable>.*outside the buffer"),
        (patched(b, vt, "<H", 7), r"vtable size must be 4 \+ 2 \* slots"),
        (patched(b, vt + 2, "<H", 2), r"smaller than its soffset"),
        (patched(b, vt + 2, "<H", 0xFFFF), r"table object runs outside the buffer"),
        (patched(b, vt + 4, "<H", 40), r"<field 0>.*outside its table"),
        (patched(b, vt + 10, "<H", 18), r"format_version.*overruns its 20-byte table"),
    ]
    names_vec = root + 4 + u32(b, root + 4)
    cases.append((patched(b, names_vec, "<I", 0x40000000), r"symbol_names.*vector of 1073741824 elements"))
    first = names_vec + 4 + u32(b, names_vec + 4)
    cases.append((patched(b, first, "<I", 0xFFFFFFF0), r"symbol_names\[0\].*string of 4294967280 bytes"))
    bad_utf8 = bytearray(b)
    bad_utf8[first + 4] = 0xFF
    cases.append((bytes(bad_utf8), r"symbol_names\[0\].*not UTF-8"))
    for data, pattern in cases:
        with pytest.raises(FormatError, match=r"^\[e5\] .*" + pattern):
            decode_e5(data)
        assert not detect(data)


def test_every_truncation_raises_format_error_or_loses_only_the_tail_padding():
    b = build_e5(canonical())
    decoded = []
    for n in range(len(b)):
        try:
            assert decode_e5(b[:n]) == canonical()
            decoded.append(n)
        except FormatError:
            pass
    assert decoded == [len(b) - 4, len(b) - 3, len(b) - 2, len(b) - 1]  # the last string's NUL and padding


def test_shared_sub_objects_are_decoded_once():
    """10,000 section offsets to one table holding 10,000 operand offsets to one operand: fast, bounded."""
    n = 10_000
    b = flatbuffers.Builder(0)
    name = b.CreateString("o")
    b.StartObject(4)
    b.PrependUint32Slot(1, 1, 0)
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    operand = b.EndObject()
    frame_vec = _string_vector(b, [operand] * n)
    b.StartObject(2)
    b.PrependUOffsetTRelativeSlot(0, frame_vec, 0)
    frame = b.EndObject()
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(2, frame, 0)
    section = b.EndObject()
    secs = _string_vector(b, [section] * n)
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(2, secs, 0)
    b.PrependInt32Slot(3, 4, 0)
    b.Finish(b.EndObject())
    data = bytes(b.Output())
    start = time.perf_counter()
    p = decode_e5(data)
    s = summarize(data)
    assert time.perf_counter() - start < 2
    assert len(p.sections) == n and p.sections[0] is p.sections[-1]
    assert len(p.sections[0].arg_frame.operands) == n and p.sections[0].arg_frame.operands[0] == Operand(
        "o", 1
    )
    assert len(s["sections"]) == e5.SUMMARY_LIST_LIMIT + 1 and s["sections"][-1].endswith("more")


def test_a_large_vtable_shared_by_many_tables_is_bounded():
    """4,000 sections sharing one 2,000-slot vtable whose unknown slots all claim the same 4 bytes: the
    unknown fields would add up to far more than the buffer, which is rejected quickly."""
    n_slots, n_tables = 2_000, 4_000
    out = bytearray(4)  # u32 root offset, patched below
    root_vt = len(out)
    out += struct.pack("<5H", 10, 8, 0, 0, 4)  # E5Program: sections at offset 4 of an 8-byte object
    out += bytes(-len(out) % 4)
    root = len(out)
    out += struct.pack("<iI", root - root_vt, 0)  # soffset, sections uoffset (patched below)
    shared_vt = len(out)
    out += struct.pack("<HH", 4 + 2 * n_slots, 8) + bytes(8) + struct.pack("<H", 4) * (n_slots - 4)
    out += bytes(-len(out) % 4)
    vec = len(out)
    tables = [vec + 4 + 4 * n_tables + 8 * i for i in range(n_tables)]
    out += struct.pack("<I", n_tables) + b"".join(
        struct.pack("<I", t - (vec + 4 + 4 * i)) for i, t in enumerate(tables)
    )
    for t in tables:
        out += struct.pack("<iI", t - shared_vt, 0)
    struct.pack_into("<I", out, 0, root)
    struct.pack_into("<I", out, root + 4, vec - (root + 4))
    start = time.perf_counter()
    with pytest.raises(
        FormatError,
        match=r"sections\[\d+\] at byte 0x[0-9a-f]+: unknown fields add up to more than the buffer holds",
    ):
        decode_e5(bytes(out))
    assert time.perf_counter() - start < 1
    few = bytearray(out)
    struct.pack_into("<I", few, vec, 3)  # three such tables fit the budget and decode, unknown fields kept
    p = decode_e5(bytes(few))
    assert len(p.sections) == 3 and len(p.sections[0].unknown) == n_slots - 4
    assert p.sections[0].unknown[0] == RawField(4, bytes(4))


# -- detection -----------------------------------------------------------------------------------------------


def test_detect_needs_a_decodable_root_with_content():
    assert detect(build_e5(canonical()))
    assert not detect(build_e5(E5Program()))  # no names, no sections: nothing to call a descriptor
    assert not detect(build_e5(E5Program(symbol_names=("a",), format_version=0)))
    assert not detect(b"") and not detect(bytes(64)) and not detect(b"\xff" * 64)


OTHER_KINDS = [
    p
    for folder in ("hwx", "ane_td", "mil", "llama2c", "ane_weights", "plist", "mlmodel")
    for p in corpus_files(folder, "*")
]


@pytest.mark.parametrize("path", OTHER_KINDS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_detect_rejects_every_other_corpus_file(path):
    assert not detect(path.read_bytes())


# -- fuzzing -------------------------------------------------------------------------------------------------


def seeds() -> list[bytes]:
    rich = E5Program(
        symbol_names=("a", "b"),
        build_info=BuildInfo((BuildInfoEntry("k", "v"),), unknown=(RawField(1, b"\x01\x02"),)),
        sections=(
            Section(
                "s0",
                1,
                ArgFrame((Operand("t", 1, 1, fp16_tensor()),), (AliasSymbol("al", 0, 4),)),
                b"\x08\x00",
            ),
        ),
        unknown=(RawField(5, b"\xff" * 8),),
    )
    return [build_e5(canonical()), build_e5(rich)]


def mutate(raw: bytes, rng: random.Random) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(5)
        if kind == 0:  # bit flips
            for _ in range(rng.randint(1, 8)):
                if b:
                    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncation
            del b[rng.randrange(len(b) + 1) :]
        elif kind in (2, 3) and len(b) >= 4:  # a u32 (offset, soffset, length) overwritten
            at = rng.randrange(0, len(b) - 3) & ~3
            special = [0, 1, 4, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFC, len(b), len(b) - 4]
            value = rng.choice([*special, at, -at % 2**32, rng.randrange(2**32)])  # at, -at: self-references
            struct.pack_into("<I", b, at, value)
        elif len(b) >= 2:  # a u16 (vtable size, object size, field offset) overwritten
            at = rng.randrange(0, len(b) - 1) & ~1
            struct.pack_into("<H", b, at, rng.choice([0, 1, 3, 4, 5, 0xFFFF, 0x8000, rng.randrange(64)]))
    return bytes(b)


@pytest.mark.parametrize("which", [0, 1], ids=["canonical", "rich"])
def test_mutated_descriptors_decode_or_raise_format_error(which):
    raw = seeds()[which]
    rng = random.Random(f"e5-fuzz-{which}")
    outcomes = {"decoded": 0, "rejected": 0}
    slowest = 0.0
    tracemalloc.start()
    try:
        for case in range(1500):
            data = mutate(raw, rng)
            if case == 300:
                tracemalloc.stop()  # the memory check covers the first cases; the rest run at full speed
            start = time.perf_counter()
            with watchdog(5):
                try:
                    decode_e5(data)
                    summarize(data)
                    detect(data)
                    outcomes["decoded"] += 1
                except FormatError as e:
                    assert str(e).startswith("[e5] "), e
                    outcomes["rejected"] += 1
                except Exception as e:  # pragma: no cover - the failure being tested for
                    pytest.fail(f"case {case}: {type(e).__name__}: {e} on {data.hex()}")
            slowest = max(slowest, time.perf_counter() - start)
            if case < 300:
                _, peak = tracemalloc.get_traced_memory()
                assert peak < 4 << 20, f"case {case}: {peak} bytes for a {len(data)}-byte input"
                tracemalloc.reset_peak()
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    assert outcomes["decoded"] > 50 and outcomes["rejected"] > 300, outcomes
    assert slowest < 1.0


def test_random_bytes_never_escape_format_error():
    rng = random.Random(5)
    for _ in range(2000):
        n = rng.randrange(0, 200)
        data = bytes(rng.randrange(256) for _ in range(n))
        if n >= 4 and rng.random() < 0.7:  # a plausible root offset makes the decoder go further
            data = struct.pack("<I", rng.randrange(4, max(5, n), 4)) + data[4:]
        with watchdog(5), suppress(FormatError):
            decode_e5(data)
        assert detect(data) in (True, False)


def test_peek_flatbuffer_rejects_what_is_not_one():
    with pytest.raises(FormatError, match=r"^\[e5\] <root>"):
        peek_flatbuffer(b"\x00\x01")
