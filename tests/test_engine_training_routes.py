"""The training route of every chip and macOS major, chosen from the constructs' precedents: the table
worked out by hand from the sources, the routes' choices as the kernels build them, a Mac's report moving a
chip from one route to another (and back) without a code change, and one-line errors."""

from __future__ import annotations

import pytest

from anekit.engine.chips import UnknownChip
from anekit.engine.constructs import UnknownMacOS, precedent
from anekit.engine.evidence import Evidence
from anekit.engine.training_routes import (
    CANDIDATES,
    NO_ROUTE,
    NoTrainingRoute,
    construct_table,
    markdown_tables,
    route_table,
    training_route,
)
from anekit.kernels.route import ROUTES, KernelRoute

DYN, BAKED, CONV = "dynamic-engine-attention", "baked-engine-attention", "conv-host-attention"
PERM = "dynamic-engine-attention-rope-matmul"
# The routes of the shared vocabulary, as the kernels' four choices.
KERNEL_ROUTES = {
    DYN: KernelRoute("dynamic", "engine", "host", "slice"),
    PERM: KernelRoute("dynamic", "engine", "host", "matmul"),
    BAKED: KernelRoute("baked", "engine", "host", "slice"),
    CONV: KernelRoute("baked", "host", "host", "host"),
}
# Worked out by hand from the sources. M1 / M2: matmul measured failing on the M1 under 26.3 (maderix
# 709b602); under 15 the M1's matmul attention trained (stories_mil.h), but no RoPE written in a kernel
# ever ran on an M1 or M2 and no dynamic-weight kernel either: the conv route everywhere. M3: under 26 the
# slice + concat RoPE was refused on the M3 Ultra and the permutation matmul trained (rustane pull request
# #9); under 15 nothing on the M3 but 512-channel convs (so no conv route: the kernels' convs have the
# model's widths), so it takes M4's runs (the dynamic route); under every macOS the permutation-matmul
# route, the one that ran under 26 and has M4's runs under 15. M4, M5: the dynamic pipelines ran. Any chip:
# the conv route under 26; under 15 the M1 / M2 have no RoPE in a kernel and the M3 no conv: no route.
EXPECTED = {
    ("m1", "15"): CONV,
    ("m1", "26"): CONV,
    ("m1", ""): CONV,
    ("m2", "15"): CONV,
    ("m2", "26"): CONV,
    ("m2", ""): CONV,
    ("m3", "15"): DYN,
    ("m3", "26"): PERM,
    ("m3", ""): PERM,
    ("m4", "15"): DYN,
    ("m4", "26"): DYN,
    ("m4", ""): DYN,
    ("m5", "15"): DYN,
    ("m5", "26"): DYN,
    ("m5", ""): DYN,
    ("any", "15"): NO_ROUTE,
    ("any", "26"): CONV,
    ("any", ""): NO_ROUTE,
}
ROUTED = {k: v for k, v in EXPECTED.items() if v != NO_ROUTE}
NO_PRECEDENT = (
    "rope.swap-conv",
    "rmsnorm.peak-normalised",
    "rmsnorm.scale-repeated",
    "rmsnorm.fused-before-matmuls",
)


def _ran(cid_gen_macos: list[tuple[str, str, str]], refutes: bool = False) -> dict[str, tuple[Evidence, ...]]:
    """What a Mac's report adds: a measured run (or refusal) of each construct on that chip and macOS."""
    out: dict[str, list[Evidence]] = {}
    for cid, gen, macos in cid_gen_macos:
        e = Evidence("anekit doctor report", "measured", "smoke rung", (gen,), ("direct",), macos, refutes)
        out.setdefault(cid, []).append(e)
    return {k: tuple(v) for k, v in out.items()}


@pytest.mark.parametrize("chip,macos", sorted(EXPECTED))
def test_every_chip_and_macos_gets_the_route_worked_out_from_the_sources(chip, macos):
    if EXPECTED[(chip, macos)] == NO_ROUTE:
        with pytest.raises(NoTrainingRoute) as info:
            training_route(chip, macos)
        assert str(info.value).endswith("conv-host-attention: conv.baked refused")
        assert precedent("conv.baked", chip, macos).reason.startswith("refused on m3/15:")
        return
    r = training_route(chip, macos)
    assert r.id == EXPECTED[(chip, macos)]
    assert (r.chip, r.macos) == (chip, macos)
    assert r.why.strip() and "\n" not in r.why and r.evidence


def test_the_route_table_is_every_chip_under_every_major():
    rows = route_table()
    assert {(r.chip, r.macos): r.route for r in rows} == EXPECTED
    assert len(rows) == len(EXPECTED)
    none = [r for r in rows if r.route == NO_ROUTE]
    assert all(r.why.startswith("[engine] no training route on any") for r in none)


def test_the_candidates_are_the_kernels_routes_in_order_of_preference():
    assert [c.id for c in CANDIDATES] == [DYN, PERM, BAKED, CONV]
    for c in CANDIDATES:
        assert KernelRoute(c.weights, c.attention, c.norm, c.rope) == KERNEL_ROUTES[c.id]
    assert KERNEL_ROUTES == ROUTES  # the kernels' table, by the same ids
    assert "matmul.activations" not in CANDIDATES[3].constructs
    assert "matmul.dynamic-weights" not in CANDIDATES[2].constructs
    assert set(CANDIDATES[1].constructs) ^ set(CANDIDATES[0].constructs) == {
        "rope.slice-concat",
        "rope.permutation-matmul",
    }


def test_no_chosen_route_uses_a_construct_without_precedent_there():
    for (chip, macos), _ in ROUTED.items():
        r = training_route(chip, macos)
        assert not set(r.constructs) & set(NO_PRECEDENT)
        for cid in r.constructs:
            assert precedent(cid, chip, macos).answer in ("ran", "nearest"), (chip, macos, cid)


def test_the_evidence_names_the_sources_that_decided():
    assert any("709b602" in s for s in training_route("m1", "26").sources())
    assert any("rustane pull request #9" in s for s in training_route("m3", "26").sources())
    assert "rope.slice-concat refused" in training_route("m3", "26").why
    assert any("rustane pull request #9" in s for s in training_route("m3").sources())
    assert "matmul.activations refused" in training_route("m1", "26").why


def test_device_names_and_versions():
    r = training_route("m4-max", "26.3")
    assert (r.id, r.chip, r.macos) == (DYN, "m4-max", "26")
    assert training_route("M1 Pro", "15.0").id == CONV


def test_a_report_moves_a_chip_to_another_route_and_back():
    """A hand-built report from an M1 on macOS 26: the engine-attention rungs ran -> an engine-attention
    route; the dynamic-weight rung ran too -> the dynamic route; a later report's refusal of matmul ->
    back to the conv route. No code changes, only evidence."""
    attention = [
        ("matmul.activations", "m1", "26"),
        ("softmax.scores", "m1", "26"),
        ("rope.slice-concat", "m1", "26"),
    ]
    assert training_route("m1", "26").id == CONV
    assert training_route("m1", "26", _ran(attention)).id == BAKED
    dynamic = [*attention, ("matmul.dynamic-weights", "m1", "26")]
    assert training_route("m1", "26", _ran(dynamic)).id == DYN
    refused = _ran([("matmul.activations", "m1", "26")], refutes=True)
    both = {k: (*_ran(dynamic).get(k, ()), *refused.get(k, ())) for k in {*_ran(dynamic), *refused}}
    assert training_route("m1", "26", both).id == CONV
    # the report is m1's under 26: the nearest evidence for m1 under 15 and for its family (m2), none for m3
    assert training_route("m1", "15", _ran(dynamic)).id == DYN
    assert training_route("m2", "26", _ran(dynamic)).id == DYN
    assert training_route("m3", "26", _ran(dynamic)).id == PERM
    # a report from the M3 that its RoPE ran there moves the M3 under 26
    assert training_route("m3", "26", _ran([("rope.slice-concat", "m3", "26")])).id == DYN


def test_the_m3_takes_no_conv_route_where_only_512_channel_convs_compiled():
    """A report refusing the dynamic-weight matmul on the M3 under 26 leaves it the conv route there (the
    M3 Ultra trained 768-channel convs under 26.3) but no route under every macOS: under 15 only 512-channel
    convs compiled (conv.channels-512-m3), and the training kernels' convs have the model's widths."""
    refused = _ran([("matmul.dynamic-weights", "m3", "26")], refutes=True)
    assert training_route("m3", "26", refused).id == CONV
    with pytest.raises(NoTrainingRoute) as info:
        training_route("m3", "", refused)
    assert str(info.value).endswith("conv-host-attention: conv.baked refused")
    assert precedent("conv.baked", "m3", "15").answer == "refused"
    assert precedent("conv.baked", "m4", "15").answer == "ran"  # the M3's own limit, not its family's
    assert precedent("conv.baked", "m5", "15").answer == "nearest"


def test_a_measured_refusal_of_every_routes_construct_leaves_no_route():
    refused = _ran([("gate.silu", "m1", "15")], refutes=True)
    with pytest.raises(NoTrainingRoute) as info:
        training_route("m1", "15", refused)
    text = str(info.value)
    assert "\n" not in text and "gate.silu refused" in text and CONV in text


@pytest.mark.parametrize("chip", ["m6", "M7 Max", ""])
def test_an_unknown_chip_is_one_line_naming_the_choices(chip):
    with pytest.raises(UnknownChip) as info:
        training_route(chip)
    assert "\n" not in str(info.value) and "any, m1, m2, m3, m4, m5" in str(info.value)


@pytest.mark.parametrize("macos", ["14", "27", "sequoia"])
def test_an_unknown_macos_is_one_line_naming_the_choices(macos):
    with pytest.raises(UnknownMacOS) as info:
        training_route("m4", macos)
    assert "\n" not in str(info.value) and "15, 26" in str(info.value)


def test_the_markdown_tables_hold_every_route_and_every_construct():
    text = markdown_tables()
    routes, constructs_ = text.split("\n\n")
    rows = [line.split(" | ") for line in routes.splitlines()[2:]]
    assert {(r[0].strip("| "), "" if r[1] == "every" else r[1]): r[2] for r in rows} == EXPECTED
    table = construct_table()
    lines = constructs_.splitlines()
    assert len(lines) == 2 + len(table)
    head = lines[0].split(" | ")
    assert head[1:3] == ["m1/15", "m1/26"] and len(head) == 2 + 10
    for line, row in zip(lines[2:], table):
        cells = line.split(" | ")
        assert cells[0] == f"| {row.construct}"
        assert cells[1:11] == [a for _, _, a in row.precedents]
    assert "no precedent:" in constructs_


# -- what the doctor prints -------------------------------------------------------------------------


def test_the_doctor_names_the_generation_route_of_this_mac_and_why():
    from anekit.tools import doctor

    line = doctor.generation_route_line("Apple M1 Pro", "26.3")
    assert line.startswith("conv-host-attention (") and "matmul.activations refused" in line
    assert doctor.generation_route_line("Apple M4 Max", "15.1").startswith("baked-engine-attention (")
    assert doctor.generation_route_line("Apple M3 Ultra", "26.3.1").startswith(
        "baked-engine-attention-rope-matmul ("
    )
    assert doctor.generation_route_line("Apple M2", "14.6").startswith("conv-host-attention (macOS 14.6 has")
    off = doctor.generation_route_line("x86_64", None)
    assert off.startswith("no chip detected (not a Mac)") and "\n" not in off


def test_the_doctor_names_the_training_route_of_this_mac_and_why():
    from anekit.cli import doctor_cmd
    from anekit.tools import doctor

    line = doctor.route_line("Apple M1 Pro", "26.3")
    assert line.startswith(f"{CONV} (") and "matmul.activations refused" in line
    assert "; evidence: " in line and "709b602" in line and "\n" not in line
    assert doctor.route_line("Apple M4 Max", "15.1").startswith(f"{DYN} (")
    assert doctor.route_line("Apple M3 Ultra", "26.3.1").startswith(f"{PERM} (")
    old = doctor.route_line("Apple M2", "14.6")
    assert old.startswith(f"{CONV} (macOS 14.6 has no evidence")
    # off a Mac: the chip named (under every macOS), or none detected
    assert doctor.route_line(None, None, "m3").startswith(f"{PERM} (")
    assert doctor.route_line(None, None, "m4").startswith(f"{DYN} (")
    off = doctor.route_line("x86_64", None)
    assert off.startswith("no chip detected (not a Mac): the simulator trains with its own kernels; --chip C")
    assert "\n" not in off

    report = doctor.diagnose().to_json()
    report["os"] = {**report["os"], "system": "Darwin", "macos": "26.3", "chip": "Apple M5"}
    shown = [ln for ln in doctor_cmd.format_report(report).splitlines() if ln.startswith("training route")]
    assert len(shown) == 1 and shown[0].split("  ", 1)[1].strip().startswith(f"{DYN} (")


def test_the_doctor_says_none_when_no_route_has_precedent(monkeypatch):
    from anekit.tools import doctor

    def refuse(chip: str, macos: str = "") -> None:
        raise NoTrainingRoute(f"[engine] no training route on {chip} under macOS {macos}: gate.silu refused")

    monkeypatch.setattr(doctor, "training_route", refuse)
    assert (
        doctor.route_line("Apple M1", "15.7")
        == "none ([engine] no training route on m1 under macOS 15: gate.silu refused)"
    )
