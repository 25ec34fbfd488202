"""The generation route of every chip and macOS major, chosen from the constructs' precedents: the table
worked out by hand from the sources, a Mac's report moving a chip (a refused construct keeps a route out,
a run brings it in), the routes' choices as the kernels build them, and one-line errors."""

from __future__ import annotations

import pytest

from anekit.engine.chips import UnknownChip
from anekit.engine.evidence import Evidence
from anekit.engine.generation import FACTS, fact
from anekit.engine.generation_routes import (
    CANDIDATES,
    LEGACY_ID,
    NO_ROUTE,
    ROUTE_IDS,
    NoGenerationRoute,
    UnknownGenerationRoute,
    candidate,
    generation_route,
    markdown_table,
    route_table,
)
from anekit.kernels.route import KernelRoute

FUSED, FUSED_MM = "baked-fused", "baked-fused-rope-matmul"
DYN, CONV = "dynamic-engine-attention", "conv-host-attention"
# Worked out by hand. M1 / M2: no RoPE written in a kernel ran there and matmul failed on the M1 under
# 26.3 (maderix 709b602): the conv route. M3 under 15: only 512-channel convs compiled (no baked route),
# M4's dynamic runs are its nearest; under 26 the slice RoPE was refused on the M3 Ultra and the
# permutation matmul ran (rustane #9); under every macOS nothing holds (convs under 15, the slice RoPE
# under 26). M4 / M5: the stories_mil.h kernels (baked convs, in-kernel RMSNorm, matmul attention) and the
# dynamic pipelines' slice RoPE ran: the fused route. "any": the legacy kernels.
EXPECTED = {
    ("m1", "15"): CONV,
    ("m1", "26"): CONV,
    ("m1", ""): CONV,
    ("m2", "15"): CONV,
    ("m2", "26"): CONV,
    ("m2", ""): CONV,
    ("m3", "15"): DYN,
    ("m3", "26"): FUSED_MM,
    ("m3", ""): NO_ROUTE,
    ("m4", "15"): FUSED,
    ("m4", "26"): FUSED,
    ("m4", ""): FUSED,
    ("m5", "15"): FUSED,
    ("m5", "26"): FUSED,
    ("m5", ""): FUSED,
    ("any", "15"): LEGACY_ID,
    ("any", "26"): LEGACY_ID,
    ("any", ""): LEGACY_ID,
}
KERNEL_ROUTES = {
    FUSED: KernelRoute("baked", "engine", "engine", "slice"),
    FUSED_MM: KernelRoute("baked", "engine", "engine", "matmul"),
    DYN: KernelRoute("dynamic", "engine", "host", "slice"),
    CONV: KernelRoute("baked", "host", "host", "host"),
    LEGACY_ID: KernelRoute("baked", "engine", "engine", "conv"),
}


def _report(construct: str, gen: str, macos: str, refutes: bool) -> dict[str, tuple[Evidence, ...]]:
    e = Evidence("anekit doctor report", "measured", "smoke rung", (gen,), ("direct",), macos, refutes)
    return {construct: (e,)}


@pytest.mark.parametrize("chip,macos", sorted(EXPECTED))
def test_every_chip_and_macos_gets_the_route_worked_out_from_the_sources(chip, macos):
    if EXPECTED[(chip, macos)] == NO_ROUTE:
        with pytest.raises(NoGenerationRoute) as e:
            generation_route(chip, macos)
        assert "\n" not in str(e.value) and "conv.baked refused" in str(e.value)
        return
    r = generation_route(chip, macos)
    assert r.id == EXPECTED[(chip, macos)]
    assert KernelRoute(*r.kernel_route) == KERNEL_ROUTES[r.id]
    assert r.why and "\n" not in r.why


def test_a_refused_construct_keeps_a_route_out_and_a_run_brings_one_in():
    assert generation_route("m4", "26").id == FUSED
    refused = _report("rope.slice-concat", "m4", "26.1", refutes=True)
    moved = generation_route("m4", "26", refused)
    assert moved.id == FUSED_MM  # the slice RoPE refused: the permutation-matmul form is next
    assert "rope.slice-concat refused" in moved.why
    # M1 under 15: nothing but convs; a report that the slice RoPE, rmsnorm and matmul ran there moves it
    ran: dict[str, tuple[Evidence, ...]] = {}
    for cid in candidate(FUSED).constructs:
        ran.update(_report(cid, "m1", "15.2", refutes=False))
    assert generation_route("m1", "15").id == CONV
    assert generation_route("m1", "15", ran).id == FUSED


def test_the_table_has_a_row_per_chip_and_macos_and_prints_as_markdown():
    rows = route_table()
    assert {(r.chip, r.macos): r.route for r in rows} == EXPECTED
    md = markdown_table()
    assert md.count("\n") == len(EXPECTED) + 1 and "| m3 | every | none |" in md


def test_fused_routes_are_the_ones_that_fuse_layers():
    assert [c.fused for c in CANDIDATES] == [True, True, False, False]
    assert generation_route("any").fused and "fused" in generation_route("m4").describe()


def test_bad_input_is_one_line():
    with pytest.raises(UnknownChip):
        generation_route("m9")
    with pytest.raises(UnknownGenerationRoute) as e:
        candidate("fast")
    assert "fast" in str(e.value) and all(i in str(e.value) for i in ROUTE_IDS)


def test_the_generation_facts_rest_on_the_books_rules_and_figures():
    assert fact("decode-width").value == 32  # 64-byte rows of fp16: surface.min-row-bytes
    assert fact("weight-ceiling").value == 2**31
    assert fact("classifier-tile").value == 65536
    assert fact("loaded-programs").value == 120
    for f in FACTS.values():
        assert f.evidence and all(e.source for e in f.evidence), f.id
        assert f.why and "\n" not in f.why
    assert fact("state-ops").rule == "program.state-ops-direct"
    assert fact("fused-dispatch").value > 0


def test_the_candidates_use_the_constructs_the_design_names():
    fused = ("conv.baked", "rmsnorm.plain", "matmul.activations", "softmax.scores")
    assert candidate(FUSED).constructs == (*fused, "rope.slice-concat", "gate.silu")
    assert candidate(FUSED_MM).constructs == (*fused, "rope.permutation-matmul", "gate.silu")
    assert candidate(DYN).constructs == (
        "matmul.dynamic-weights",
        "matmul.activations",
        "softmax.scores",
        "rope.slice-concat",
        "gate.silu",
    )
    assert candidate(CONV).constructs == ("conv.baked", "gate.silu")
    assert candidate(LEGACY_ID).constructs == ()
    # a refused rmsnorm.plain keeps the fused routes out on the M4 (the dynamic route normalises on the host)
    refused = _report("rmsnorm.plain", "m4", "26.1", refutes=True)
    assert generation_route("m4", "26", refused).id == DYN
