"""Task-descriptor chains: the corpus payloads and container programs decode, re-encode byte for byte,
decode their fields with the right masks, dispatch on the generation, and refuse broken chains."""

from __future__ import annotations

import json
import random
import struct
import tracemalloc
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from anekit.errors import FormatError
from anekit.inspect import td
from tests.conftest import corpus_files, corpus_path
from tests.fuzz_util import watchdog

# Per file: (file size, td_count, tsk_size, krn_size). The counts, sizes and kernel sizes are the ones
# the eiln/ane anec tables give (SOURCES.md quotes abs and atan) and the ones the +0x1c chain walk gives.
# One exception: for activation/softmin the tables say tsk_size 0x1774 / krn_size 0x180, which does not
# fit td_count 6 (0x274 + 5 * 0x300 = 0x1174); the bytes put the kernel table at 0x1180 and leave
# 0x1780.. zero, and the one enabled kernel stream reads krn[0:0x80], so the byte-derived sizes are used.
PAYLOADS = {
    "activation-gelu": (0x300, 1, 0x274, 0x80),
    "activation-hardtanh": (0x300, 1, 0x274, 0x80),
    "activation-logsoftmax": (0x1580, 7, 0x1474, 0x100),
    "activation-relu": (0x4280, 1, 0x274, 0x4000),
    "activation-rrelu": (0x300, 1, 0x274, 0x80),
    "activation-selu": (0x300, 1, 0x274, 0x80),
    "activation-softmax": (0xF00, 5, 0xE74, 0x80),
    "activation-softmin": (0x1900, 6, 0x1174, 0x780),
    "binary-ave": (0x4280, 1, 0x274, 0x4000),
    "binary-div": (0x600, 2, 0x574, 0x80),
    "binary-min": (0x4280, 1, 0x274, 0x4000),
    "binary-mul": (0x4280, 1, 0x274, 0x4000),
    "unary-abs": (0x4280, 1, 0x274, 0x4000),
    "unary-atan": (0x980, 3, 0x874, 0x100),
    "unary-cube": (0x4580, 2, 0x574, 0x4000),
    "unary-exp": (0x300, 1, 0x274, 0x80),
    "unary-frac": (0x900, 3, 0x874, 0x80),
    "unary-inv": (0x300, 1, 0x274, 0x80),
    "unary-log10": (0x600, 2, 0x574, 0x80),
    "unary-log2": (0x300, 1, 0x274, 0x80),
    "unary-rsqrt": (0x300, 1, 0x274, 0x80),
    "unary-sigmoid": (0x600, 2, 0x574, 0x80),
    "unary-sqrt": (0x300, 1, 0x274, 0x80),
    "unary-square": (0x4280, 1, 0x274, 0x4000),
}

# Descriptors in each container's __text, and its relocations (each on one kernel coefficient base).
HWX_CHAINS = {
    "compiled-model-73536a75": (1, 2),
    "golden-23664c99": (1, 3),
    "golden-ddd67784": (1, 0),
    "golden-e2184c20": (1, 3),
    "golden-f459291c": (1, 2),
    "ops-concat-e03759f0": (2, 0),
    "ops-conv-ebc7f830": (1, 3),
    "ops-conv-ff52f832": (1, 3),
    "ops-gemm-73ae6d78": (1, 16),
    "ops-gemm512-aae2e352": (1, 16),
    "ops-relu-f37fecdd": (1, 0),
    "ops-sum-6ca449af": (1, 0),
}


def _payload(name: str) -> bytes:
    return corpus_path("ane_td", f"eiln-{name}.bin").read_bytes()


def _put(data: bytes, at: int, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into("<I", out, at, value & 0xFFFFFFFF)
    return bytes(out)


def _word(data: bytes, at: int) -> int:
    return struct.unpack_from("<I", data, at)[0]


# ---------------------------------------------------------------------------------------------------------
# the corpus payloads
# ---------------------------------------------------------------------------------------------------------


def test_every_corpus_payload_has_an_expectation():
    names = {p.name[len("eiln-") : -len(".bin")] for p in corpus_files("ane_td", "*.bin")}
    if not names:
        pytest.skip("corpus ane_td not present (the corpus lives in ../shared/corpus)")
    assert names == set(PAYLOADS)


def test_sources_md_facts_for_abs_and_atan():
    abs_ = td.decode_payload(_payload("unary-abs"))
    assert (len(td.encode(abs_)), abs_.tsk_size, abs_.krn_size, abs_.td_count) == (0x4280, 0x274, 0x4000, 1)
    atan = td.decode_payload(_payload("unary-atan"))
    assert (len(td.encode(atan)), atan.tsk_size, atan.krn_size, atan.td_count) == (0x980, 0x874, 0x100, 3)
    assert atan.td_size == 0x274 and atan.krn_offset == 0x880


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_payload_decodes_into_its_descriptor_count(name):
    data = _payload(name)
    size, count, tsk, krn = PAYLOADS[name]
    payload = td.decode_payload(data)
    assert len(data) == size
    assert (payload.td_count, payload.td_size, payload.tsk_size, payload.krn_size) == (count, 0x274, tsk, krn)
    assert payload.krn_offset == -(-tsk // 64) * 64 and payload.padding == bytes(payload.krn_offset - tsk)
    chain = payload.chain
    assert chain.generation == "h13"
    assert [d.offset for d in chain.descriptors] == [0x300 * i for i in range(count)]
    assert [link.target for link in chain.links] == [0x300 * i for i in range(1, count)] + [None]
    for i, desc in enumerate(chain.descriptors):
        fields = desc.header_fields()
        assert desc.task_index == fields["TID"] == i
        assert fields["EON"] == (i == count - 1)  # end of network on the tail only
        assert fields["NextSize"] == (0x9C if i < count - 1 else 0)
        assert desc.task_flags == (0x02 if count == 1 else 0x03 if i == count - 1 else min(i, 1))
        assert [g.name for g in desc.groups] == [g.name for g in td.H13.groups]


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_payload_reencodes_to_the_same_bytes(name):
    data = _payload(name)
    assert td.encode(td.decode_payload(data)) == data
    assert td.encode(td.decode_payload(memoryview(data))) == data
    chain = td.decode_payload(data).chain
    assert td.encode(chain) == data[: chain.size]


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_kernel_streams_read_inside_the_kernel_bytes(name):
    payload = td.decode_payload(_payload(name))
    for desc in payload.chain.descriptors:
        regs, fields = desc.registers(), desc.fields()
        for i in range(16):
            if fields[f"KernelDMASrc.CoeffDMAConfig[{i}].En"]:
                base, size = regs[f"KernelDMASrc.CoeffBaseAddr[{i}]"], regs[f"KernelDMASrc.CoeffBfrSize[{i}]"]
                assert size > 0 and base + size <= payload.krn_size
                assert desc.header_fields()["KBE0"] == 1
        # The header's write-enable and the destination DMA enable agree on every descriptor.
        assert desc.header_fields()["WBE"] == fields["TileDMADst.DMAConfig.En"]


# ---------------------------------------------------------------------------------------------------------
# fields and masks
# ---------------------------------------------------------------------------------------------------------


def test_dimension_fields_decode_with_their_masks():
    desc = td.decode_payload(_payload("unary-abs")).chain.descriptors[0]
    assert desc.registers()["Common.InDim"] == 0x0A000640
    dims = desc.dimensions()
    assert (dims["Win"], dims["Hin"], dims["Cin"], dims["Cout"]) == (1600, 2560, 1, 1)
    assert (dims["OCGSize"], dims["numGroups"], dims["Kw"], dims["Kh"]) == (0, 1, 1, 1)
    masks = {}
    for short, path in td.H13.dimensions.items():
        group, reg, name = path.split(".")
        spec = next(r for g in td.H13.groups if g.name == group for r in g.registers if r.name == reg)
        masks[short] = next(f for f in spec.fields if f.name == name).mask
    assert {k: masks[k] for k in ("Win", "Hin", "Cin", "Cout", "OCGSize", "numGroups")} == {
        "Win": 0x7FFF,
        "Hin": 0x7FFF,
        "Cin": 0x1FFFF,
        "Cout": 0x1FFFF,
        "OCGSize": 0x7,
        "numGroups": 0x1FFF,
    }


def test_fields_ignore_the_bits_outside_their_mask():
    desc = td.decode_payload(_payload("unary-abs")).chain.descriptors[0]
    common = list(desc.group("Common").words)
    common[0] = 0xFFFFFFFF  # InDim: Win bits 0-14, Hin bits 16-30; bits 15 and 31 belong to neither
    common[3] = common[4] = 0xFFFFFFFF  # Cin, Cout: 17 bits
    common[7] = 0x00001C00  # ConvCfg: only the OCGSize bits 10-12
    common[9] = 0xFFFF3FFF  # GroupConvCfg: NumGroups 0-12, then UnicastEn 14
    groups = tuple(
        g if g.name != "Common" else td.RegisterGroup("Common", g.offset, g.address, tuple(common))
        for g in desc.groups
    )
    dims = td.TdDescriptor(0, 0, desc.header, groups, generation="h13").dimensions()
    assert (dims["Win"], dims["Hin"], dims["Cin"], dims["Cout"]) == (0x7FFF, 0x7FFF, 0x1FFFF, 0x1FFFF)
    assert (dims["OCGSize"], dims["Kw"], dims["Kh"], dims["numGroups"]) == (7, 0, 0, 0x1FFF)


def test_setting_a_field_uses_the_same_table_and_keeps_its_neighbours():
    data = _payload("unary-atan")
    payload = td.decode_payload(data)
    desc = payload.chain.descriptors[1]
    wider = desc.with_field("Common.InDim.Win", 0x7FFF)
    assert wider.dimensions()["Win"] == 0x7FFF and wider.dimensions()["Hin"] == 2560
    assert wider.registers()["Common.InDim"] == 0x0A007FFF
    with pytest.raises(ValueError, match="15 bits"):
        desc.with_field("Common.InDim.Win", 0x8000)
    with pytest.raises(KeyError):
        desc.with_field("Common.InDim.Depth", 1)
    chain = payload.chain
    edited = td.TdChain(
        chain.generation,
        chain.base,
        chain.size,
        (chain.descriptors[0], wider, chain.descriptors[2]),
        chain.links,
        chain.relocations,
        chain.filler,
    )
    out = td.encode(edited)
    assert out[:0x428] + out[0x42C:] == data[:0x428] + data[0x42C : chain.size]
    assert _word(out, 0x300 + 0x128) == 0x0A007FFF


def test_the_references_opcode_words_are_conv_config_words():
    conv_cfg = next(r for r in td.H13.groups[1].registers if r.name == "ConvCfg")

    def decode(word):
        return {f.name: f.get(word) for f in conv_cfg.fields}

    assert decode(0x5042A063) == {
        "Kw": 3,
        "Kh": 3,
        "OCGSize": 0,
        "Sx": 1,
        "Sy": 1,
        "Px": 1,
        "Py": 1,
        "Ox": 1,
        "Oy": 1,
    }
    assert decode(0x5000B021)["OCGSize"] == 4 and decode(0x5000A021)["Kw"] == 1


def test_strides_are_signed_26_bit_fields_at_bit_6():
    stride = td.BitField("Stride", 6, 26, signed=True)
    assert stride.get(0xC80) * 64 == 3200
    assert stride.get(0xFFFFFFC0) == -1 and stride.put(0, -1) == 0xFFFFFFC0
    assert stride.get(0x3F) == 0


def test_layout_table_is_consistent():
    assert td.H13.size == 0x274 and td.HEADER.size == td.HEADER_SIZE == 0x28
    offsets = dict((g.name, off + 4) for off, g in td.H13.group_offsets())
    assert offsets == {
        "KernelDMASrc": 0x2C,
        "Common": 0x128,
        "TileDMASrc": 0x16C,
        "L2": 0x1E0,
        "PE": 0x22C,
        "NE": 0x240,
        "TileDMADst": 0x258,
    }
    assert [g.header_word for g in td.H13.groups][:2] == [0xF401F800, 0x3C000000]
    for group in td.H13.groups:
        assert len({r.index for r in group.registers}) == len(group.registers)
        assert all(0 <= r.index < group.count for r in group.registers)
    registers = {g.register_name(r.index) for g in td.H13.groups for r in g.registers}
    assert all(slot.register in registers for slot in td.H13.slots)
    assert td.H13.locate(0x74) == "KernelDMASrc.CoeffBaseAddr[0]"
    assert td.H13.locate(0x1C) == "header.next_pointer" and td.H13.locate(0x124) == "Common.header"


# ---------------------------------------------------------------------------------------------------------
# generation dispatch
# ---------------------------------------------------------------------------------------------------------


def test_layout_is_chosen_by_name_cpusubtype_or_group_headers():
    data = _payload("unary-atan")
    assert td.layout_for("h13") is td.layout_for("H13") is td.layout_for(4) is td.H13
    assert td.layout_for(7) is None and td.layout_for("h99") is None
    for generation in ("h13", 4, None):
        assert td.decode_chain(data, generation=generation).generation == "h13"


@pytest.mark.parametrize("generation", ["h99", 0x7, 123])
def test_an_unknown_generation_falls_back_to_raw_words(generation):
    data = _payload("unary-atan")
    chain = td.decode_chain(data, end=0x874, generation=generation)
    assert chain.generation is None and len(chain) == 3
    for desc in chain.descriptors:
        assert desc.groups == () and desc.fields() == {} and desc.dimensions() == {}
        assert desc.registers() == {} and desc.header_fields() == {}
        assert desc.raw[:4] == struct.pack("<I", 0xF401F800)
    assert [d.size for d in chain.descriptors] == [0x300, 0x300, 0x274]
    assert td.encode(chain) == data[:0x874]
    assert td.chain_summary(chain)["generation"].startswith("unknown")
    json.dumps(td.chain_summary(chain))


def test_bytes_that_do_not_follow_a_layout_are_raw_when_sniffed_and_refused_when_claimed():
    data = _put(_payload("unary-atan"), 0x124, 0x3C000004)  # Common's group header, other address
    sniffed = td.decode_chain(data, end=0x874)
    assert sniffed.generation is None and td.encode(sniffed) == data[:0x874]
    with pytest.raises(FormatError, match=r"descriptor\[0\]\.Common\.header") as err:
        td.decode_chain(data, generation="h13")
    assert err.value.offset == 0x124 and err.value.expected == "0x3c000000"
    later = _put(_payload("unary-atan"), 0x600 + 0x168, 0)  # only the third descriptor breaks
    with pytest.raises(FormatError, match=r"descriptor\[2\]\.TileDMASrc\.header"):
        td.decode_chain(later)
    with pytest.raises(FormatError, match="no known task-descriptor layout"):
        td.decode_payload(data, generation=None)


# ---------------------------------------------------------------------------------------------------------
# broken chains
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "at, value, message, raw_too",
    [
        (0x31C, 0x300, "loop: link back to descriptor", True),  # descriptor 1 points at itself
        (0x61C, 0x300, "loop: link back to descriptor", True),  # the tail points back to descriptor 1
        (0x1C, 0x100, "link overlaps descriptor", False),  # into the middle of descriptor 0
        (0x31C, 0x500, "link overlaps descriptor", False),  # would overlap descriptor 1
        (0x1C, 0x302, "not word-aligned", True),
        (0x1C, 0xFFFFFFFC, "past the end", True),
        (0x31C, 0x980, "past the end", True),
        (0x61C, 0x800, "past the end", False),  # fits the file but not a 0x274-byte descriptor
    ],
)
def test_bad_links_raise_format_error(at, value, message, raw_too):
    data = _put(_payload("unary-atan"), at, value)
    with pytest.raises(FormatError, match=message) as err:
        td.decode_payload(data)
    assert err.value.offset == at and err.value.field.endswith("next_pointer")
    assert "[ane_td]" in str(err.value)
    if raw_too:  # raw descriptors have no known size, so only overlaps of their headers are visible
        with pytest.raises(FormatError, match=message):
            td.decode_chain(data, generation="h99")


def test_a_loop_between_raw_descriptors_is_refused():
    data = _put(_payload("unary-atan"), 0x61C, 0)
    data = _put(data, 0x31C, 0x0)  # ends after two descriptors
    assert len(td.decode_chain(data, generation="h99")) == 2
    with pytest.raises(FormatError, match="loop"):
        td.decode_chain(_put(data, 0x31C, 0x300), generation="h99")


def test_truncated_payloads_raise_format_error():
    data = _payload("unary-atan")
    for end in range(0, 0x874, 4):
        with pytest.raises(FormatError):
            td.decode_payload(data[:end])
        with pytest.raises(FormatError):
            td.decode_chain(data, end=end, generation="h13")
    assert td.decode_payload(data[:0x874]).krn_size == 0  # chain complete, no kernel bytes
    with pytest.raises(FormatError, match="outside the data"):
        td.decode_chain(data, base=0x100, end=0x80)


def test_next_size_must_announce_the_next_descriptor():
    data = _put(_payload("unary-atan"), 0x4, 0x009001E0)
    with pytest.raises(FormatError, match="NextSize") as err:
        td.decode_payload(data)
    assert (err.value.expected, err.value.actual) == (0x9C, 0x90)


# ---------------------------------------------------------------------------------------------------------
# relocations and containers
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Reloc:
    address: int
    symbolnum: int = 2
    length: int = 2
    extern: bool = False
    scattered: bool = False


def test_relocations_land_on_their_registers():
    data = _payload("unary-atan")
    chain = td.decode_chain(data, end=0x874, relocations=[_Reloc(0x74), _Reloc(0x300 + 0x78), _Reloc(0x25C)])
    placed = [(r.descriptor, r.register, r.slot, r.value) for r in chain.relocations]
    assert placed == [
        (0, "KernelDMASrc.CoeffBaseAddr[0]", "kernel coefficient stream 0", 0x80),
        (1, "KernelDMASrc.CoeffBaseAddr[1]", "kernel coefficient stream 1", 0),
        (0, "TileDMADst.BaseAddr", "output tile write base", 0),
    ]
    kept = td.decode_chain(data, end=0x874, relocations=[_Reloc(0x80000010, scattered=True)])
    assert kept.relocations[0].descriptor is None
    for address in (0x290, 0x872, 0x874, 0x10000):  # padding, straddling the end, past the end
        with pytest.raises(FormatError, match=r"relocation\[0\]"):
            td.decode_chain(data, end=0x874, relocations=[_Reloc(address)])


def _hwx_module():
    try:
        from anekit.inspect import hwx
    except ImportError:
        pytest.skip("anekit.inspect.hwx is not there yet: the container chains are tested once it is")
    return hwx


def _text(hwx, data: bytes):
    container = hwx.decode_hwx(data)
    _, sect = container.find_section("__TEXT", "__text")
    return container, sect, hwx.section_bytes(container, "__TEXT", "__text")


@pytest.mark.parametrize("name", sorted(HWX_CHAINS))
def test_container_text_sections_decode_as_chains(name):
    hwx = _hwx_module()
    data = corpus_path("hwx", f"tinygrad-{name}.hwx").read_bytes()
    container, sect, text = _text(hwx, data)
    count, nreloc = HWX_CHAINS[name]
    chain = td.decode_chain(text, generation=container.header.cpusubtype, relocations=sect.relocations)
    assert chain.generation == "h13" and len(chain) == count and len(chain.relocations) == nreloc
    assert td.encode(chain) == bytes(text)
    weights = [s.name for _, s in container.sections].index("__TEXT,__const") + 1
    stride = chain.relocations[1].value if nreloc > 1 else 0  # 0x40, 0x200 or 0x8000 per channel
    for i, reloc in enumerate(chain.relocations):
        assert reloc.section == weights and not reloc.extern  # against the weight section
        assert reloc.register == f"KernelDMASrc.CoeffBaseAddr[{i}]"
        assert reloc.slot == f"kernel coefficient stream {i}"
        assert reloc.value == i * stride
    enabled = sum(chain.descriptors[0].fields()[f"KernelDMASrc.CoeffDMAConfig[{i}].En"] for i in range(16))
    assert enabled == nreloc
    whole = td.decode_chain(data, base=sect.offset, end=sect.offset + sect.size)
    assert whole.descriptors == chain.descriptors
    json.dumps(td.chain_summary(chain))


def test_container_dimensions_match_their_sources():
    hwx = _hwx_module()
    dims = {}
    for name in ("ops-gemm-73ae6d78", "ops-gemm512-aae2e352", "ops-relu-f37fecdd"):
        container, _, text = _text(hwx, corpus_path("hwx", f"tinygrad-{name}.hwx").read_bytes())
        dims[name] = td.decode_chain(text, generation=container.header.cpusubtype).descriptors[0].dimensions()
    assert (dims["ops-gemm-73ae6d78"]["Cin"], dims["ops-gemm-73ae6d78"]["Cout"]) == (64, 64)
    assert (dims["ops-gemm512-aae2e352"]["Cin"], dims["ops-gemm512-aae2e352"]["OCGSize"]) == (512, 5)
    assert (dims["ops-relu-f37fecdd"]["Win"], dims["ops-relu-f37fecdd"]["Hin"]) == (16, 1)


# ---------------------------------------------------------------------------------------------------------
# the inspect interface
# ---------------------------------------------------------------------------------------------------------


def test_detect_and_summarize():
    data = _payload("unary-atan")
    assert td.detect(data) and td.detect(memoryview(data))
    assert not td.detect(b"") and not td.detect(bytes(0x400)) and not td.detect(data[:0x20])
    for path in corpus_files("hwx", "*.hwx"):
        assert not td.detect(path.read_bytes())
    summary = td.summarize(data)
    json.dumps(summary)
    assert (summary["kind"], summary["td_count"], summary["krn_size"]) == ("ane_td", 3, 0x100)
    first = summary["descriptors"][0]
    assert first["dimensions"]["Win"] == 1600 and first["kernel_streams"] == [
        {"channel": 0, "base": 0x80, "size": 0x80}
    ]
    assert first["tile_dma"]["src1"]["strides"][0] == 3200
    with pytest.raises(FormatError):
        td.summarize(bytes(0x400))


# ---------------------------------------------------------------------------------------------------------
# fuzzing
# ---------------------------------------------------------------------------------------------------------


def _mutate(data: bytes, rng: random.Random, anchors: list[int]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(5)
        if kind == 0 and out:  # bit flips
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(len(out))
                out[i] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncation
            del out[rng.randrange(len(out) + 1) :]
        elif len(out) >= 4:  # a u32 at a header / group-header / random word
            at = rng.choice(anchors) if kind < 4 else rng.randrange(0, len(out) - 3, 4)
            if at + 4 > len(out):
                continue
            value = rng.choice(
                [
                    0,
                    1,
                    0xFFFFFFFF,
                    0x7FFFFFFF,
                    0x80000000,
                    at,
                    at - 0x1C,
                    len(out),
                    rng.getrandbits(32),
                    *anchors,
                ]
            )
            struct.pack_into("<I", out, at, value & 0xFFFFFFFF)
    return bytes(out)


def _anchors(n: int) -> list[int]:
    inner = [0x0, 0x4, 0x1C, 0x20, 0x28, 0x124, 0x168, 0x1DC, 0x228, 0x23C, 0x254, 0x300]
    return [d * 0x300 + k for d in range(n) for k in inner]


def _fuzz(data: bytes, decode, seed: str, rounds: int) -> dict[str, int]:
    rng = random.Random(seed)
    anchors = _anchors(max(1, len(data) // 0x300))
    outcomes = {"decoded": 0, "rejected": 0}
    for _ in range(rounds):
        mutated = _mutate(data, rng, anchors)
        with watchdog(5):
            try:
                value = decode(mutated)
            except FormatError:
                outcomes["rejected"] += 1
                continue
        outcomes["decoded"] += 1
        assert td.encode(value) == mutated[: len(td.encode(value))]
    return outcomes


@pytest.mark.parametrize("path", corpus_files("ane_td", "*.bin"), ids=lambda p: p.stem)
def test_mutated_payloads_raise_only_format_errors(path: Path):
    data = path.read_bytes()
    tracemalloc.start()
    try:
        payloads = _fuzz(data, td.decode_payload, f"payload-{path.name}", 150)
        sniffed = _fuzz(data, lambda b: td.decode_chain(b, end=min(len(b), 0x1800)), f"chain-{path.name}", 60)
        raw = _fuzz(data, lambda b: td.decode_chain(b, generation="h99"), f"raw-{path.name}", 40)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * len(data) + (4 << 20), f"peak allocation {peak} bytes for a {len(data)}-byte input"
    assert payloads["rejected"] > 0 and payloads["decoded"] > 0
    assert sniffed["decoded"] + sniffed["rejected"] == 60 and raw["decoded"] > 0


@pytest.mark.parametrize("path", corpus_files("hwx", "*.hwx"), ids=lambda p: p.stem)
def test_mutated_container_programs_raise_only_format_errors(path: Path):
    hwx = _hwx_module()
    container, sect, text = _text(hwx, path.read_bytes())
    relocs = sect.relocations

    def decode(b: bytes):
        return td.decode_chain(b, generation=container.header.cpusubtype, relocations=relocs)

    outcomes = _fuzz(bytes(text), decode, f"hwx-{path.name}", 120)
    assert outcomes["rejected"] > 0 and outcomes["decoded"] > 0


def test_random_bytes_are_refused_cleanly():
    rng = random.Random(6)
    samples = [b"", b"\0" * 3, bytes(0x274), b"\xff" * 0x274]
    samples += [rng.randbytes(rng.randrange(0, 0x900)) for _ in range(200)]
    for sample in samples:
        with watchdog(5):
            for decode in (
                td.decode_payload,
                lambda b: td.decode_chain(b, generation="h99"),
                td.decode_chain,
            ):
                with suppress(FormatError):
                    decode(sample)
            assert td.detect(sample) in (True, False)
