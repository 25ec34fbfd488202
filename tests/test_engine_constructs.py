"""The constructs of the training kernels and the precedent policy: every construct of the shared vocabulary
is there with its sources, the answers on each chip and macOS are the ones worked out by hand from the
sources (maderix/ANE 709b602, community_results.json, pull request #28; rustane pull request #9 and issue
#11; Orion), and each step of the policy (macOS majors, refusal before run, the report's tier, the
families, the weakest over majors and chips) is pinned by a case of its own."""

from __future__ import annotations

import pytest

from anekit.engine import book, constructs
from anekit.engine.chips import UnknownChip
from anekit.engine.constructs import (
    CONSTRUCTS,
    UnknownConstruct,
    UnknownMacOS,
    evidence_majors,
    macos_major,
    precedent,
)
from anekit.engine.evidence import Evidence

# The shared vocabulary of the engine constructs (the ids the kernels and the reports use).
VOCABULARY = (
    "conv.baked",
    "matmul.activations",
    "matmul.dynamic-weights",
    "softmax.scores",
    "rmsnorm.fused-before-matmuls",
    "rmsnorm.plain",
    "rmsnorm.peak-normalised",
    "rmsnorm.scale-repeated",
    "rope.swap-conv",
    "rope.slice-concat",
    "rope.permutation-matmul",
    "gate.silu",
    "gelu.tanh",
)
# No program with these ran on the in-memory route (rmsnorm.fused-before-matmuls: only a report of its
# BNNS fallback; gelu.tanh: only through e5rt).
NO_PRECEDENT = (
    "rmsnorm.fused-before-matmuls",
    "rmsnorm.peak-normalised",
    "rmsnorm.scale-repeated",
    "rope.swap-conv",
    "gelu.tanh",
)

# (construct, chip, macOS major) -> precedent, worked out from the sources:
# - M1 Pro / Max trained stories_mil.h (1x1 convs, RMSNorm, matmul attention, softmax, SiLU gate) on 15;
#   on 26.3 the M1 Pro ran the conv kernels (FFN included) and matmul failed (maderix 709b602);
# - M2: nothing measured on the in-memory route (rustane issue #11 is an unattributed report): it takes M1's;
# - M3 Ultra 26.3: both maderix pipelines (pull request #28; the dynamic one without RoPE); 26.3.1: rustane
#   trained with dynamic matmuls and RoPE as a permutation matmul after its slice + concat RoPE was refused
#   (pull request #9); M3 Pro and M3 Ultra 15.7.4: 512-channel convs only, every other width refused (the
#   training kernels' convs have the model's widths: conv.baked refused there); nothing else under 15, so
#   the M3 takes M4's runs there, and its own 26 run of the permutation matmul;
# - M4: maderix's pipelines (cb474e1 dynamic, c3c5094 RoPE), rustane, Orion (15): no macOS stated but Orion's;
# - M5: the static pipeline on 26.3, pull request #35's dynamic matmul on 26.3, rustane's forward on an M5 Max.
HAND = {
    "conv.baked": {
        "m1": ("ran", "ran"),
        "m2": ("nearest", "nearest"),
        "m3": ("refused", "ran"),
        "m4": ("ran", "ran"),
        "m5": ("nearest", "ran"),
    },
    "matmul.activations": {
        "m1": ("ran", "refused"),
        "m2": ("nearest", "refused"),
        "m3": ("nearest", "ran"),
        "m4": ("ran", "ran"),
        "m5": ("ran", "ran"),
    },
    "matmul.dynamic-weights": {
        "m1": ("none", "refused"),
        "m2": ("none", "refused"),
        "m3": ("nearest", "ran"),
        "m4": ("ran", "ran"),
        "m5": ("ran", "ran"),
    },
    "softmax.scores": {
        "m1": ("ran", "nearest"),
        "m2": ("nearest", "none"),
        "m3": ("nearest", "ran"),
        "m4": ("ran", "ran"),
        "m5": ("ran", "ran"),
    },
    "rope.slice-concat": {
        "m1": ("none", "none"),
        "m2": ("none", "none"),
        "m3": ("nearest", "refused"),
        "m4": ("ran", "ran"),
        "m5": ("ran", "ran"),
    },
    "rope.permutation-matmul": {
        "m1": ("none", "none"),
        "m2": ("none", "none"),
        "m3": ("nearest", "ran"),
        "m4": ("none", "nearest"),
        "m5": ("none", "nearest"),
    },
    "gate.silu": {
        "m1": ("ran", "ran"),
        "m2": ("nearest", "nearest"),
        "m3": ("nearest", "ran"),
        "m4": ("ran", "ran"),
        "m5": ("nearest", "ran"),
    },
}


def _run(gen: str, macos: str = "", refutes: bool = False, status: str = "measured", routes=("direct",)):
    return Evidence("a Mac's report", status, "smoke rung", (gen,), routes, macos, refutes)


def test_every_id_of_the_vocabulary_is_a_construct():
    assert set(VOCABULARY) <= set(CONSTRUCTS)
    for cid, c in CONSTRUCTS.items():
        assert c.id == cid and c.what.strip() and c.used_by.strip()


def test_every_construct_has_a_supporting_source_or_says_it_has_no_precedent():
    for cid, c in CONSTRUCTS.items():
        supporting = [e for e in c.evidence if not e.refutes]
        assert supporting or c.note.strip(), cid
        assert c.has_precedent == (cid not in NO_PRECEDENT), cid
        if cid in NO_PRECEDENT:
            assert c.note.strip(), cid
            assert all(
                precedent(cid, g, m).answer == "none"
                for g in ["m1", "m2", "m3", "m4", "m5"]
                for m in ("15", "26")
            )


@pytest.mark.parametrize("cid", sorted(HAND))
def test_precedent_on_every_chip_and_macos_is_the_one_worked_out_from_the_sources(cid):
    for gen, (on15, on26) in HAND[cid].items():
        assert precedent(cid, gen, "15").answer == on15, (cid, gen, "15")
        assert precedent(cid, gen, "26").answer == on26, (cid, gen, "26")


def test_the_answers_carry_the_evidence_that_decided_them():
    m1 = precedent("matmul.activations", "m1", "26")
    assert any("709b602" in e.source and e.refutes and e.macos == "26.3" for e in m1.evidence)
    m3 = precedent("rope.slice-concat", "m3", "26")
    assert [e.macos for e in m3.evidence] == ["26.3.1"]
    assert "rustane pull request #9" in m3.evidence[0].source
    m2 = precedent("conv.baked", "m2", "26")
    assert m2.answer == "nearest" and all(e.chips == ("m1",) for e in m2.evidence)
    fused = precedent("rmsnorm.fused-before-matmuls", "m4", "15")
    assert fused.answer == "none" and any(
        "BNNS" in e.observed and e.status == "reported" for e in fused.evidence
    )


def test_reused_book_evidence_is_the_books_own_observation():
    """One fact lives once: a construct's record of an observation the rule book holds keeps the book's
    source, observation, chips and macOS (only the polarity and, for e5rt, the route are its own)."""
    in_book = {(e.source, e.observed): e for r in book.RULES.values() for e in r.evidence}
    shared = 0
    for c in CONSTRUCTS.values():
        for e in c.evidence:
            b = in_book.get((e.source, e.observed))
            if b is not None:
                shared += 1
                assert (b.status, b.chips, b.macos) == (e.status, e.chips, e.macos)
    assert shared >= 5


def test_the_macos_of_a_version_is_its_major():
    assert macos_major("26.3.1") == "26"
    assert macos_major("15") == "15"
    assert macos_major("") == ""
    assert evidence_majors("15.0, 15.6.1") == frozenset({"15"})
    assert evidence_majors("26.3") == frozenset({"26"})
    assert evidence_majors("") == frozenset()


@pytest.mark.parametrize("bad", ["14", "27.1", "tahoe", "26.3.1.2"])
def test_an_unknown_macos_is_one_line_naming_the_choices(bad):
    with pytest.raises(UnknownMacOS) as info:
        macos_major(bad)
    text = str(info.value)
    assert "\n" not in text and f"'{bad}'" in text and "15, 26" in text


def test_unknown_construct_and_chip_are_one_line_errors():
    with pytest.raises(UnknownConstruct) as info:
        precedent("rope.magic", "m1")
    assert "\n" not in str(info.value) and "rope.slice-concat" in str(info.value)
    with pytest.raises(UnknownChip) as chip:
        precedent("conv.baked", "m6")
    assert "\n" not in str(chip.value) and "any, m1" in str(chip.value)
    with pytest.raises(UnknownConstruct):
        precedent("conv.baked", "m1", extra={"conv.bakd": ()})


def test_device_names_take_their_generation_and_versions_their_major():
    assert precedent("matmul.activations", "m1-pro", "26.3").answer == "refused"
    assert precedent("matmul.activations", "M1 Max", "15.6.1").answer == "ran"


def test_a_stated_macos_holds_for_its_major_only_an_unstated_one_for_every_major():
    stated = {"rope.slice-concat": (_run("m1", "15"),)}
    assert precedent("rope.slice-concat", "m1", "15", stated).answer == "ran"
    assert precedent("rope.slice-concat", "m1", "26", stated).answer == "nearest"  # its own run, other major
    unstated = {"rope.slice-concat": (_run("m1"),)}
    assert precedent("rope.slice-concat", "m1", "26", unstated).answer == "ran"


def test_a_reports_measured_run_decides_over_the_record_and_a_refusal_over_a_run():
    ran = {"matmul.activations": (_run("m1", "26"),)}
    assert precedent("matmul.activations", "m1", "26", ran).answer == "ran"  # the record says refused
    both = {"matmul.activations": (_run("m1", "26"), _run("m1", "26", refutes=True))}
    assert precedent("matmul.activations", "m1", "26", both).answer == "refused"
    refused = {"conv.baked": (_run("m1", "15", refutes=True),)}
    assert precedent("conv.baked", "m1", "15", refused).answer == "refused"  # the record says ran


def test_reports_and_e5rt_runs_decide_nothing():
    reported = {"matmul.activations": (_run("m1", "15", refutes=True, status="reported"),)}
    assert precedent("matmul.activations", "m1", "15", reported).answer == "ran"
    e5rt = {"rope.slice-concat": (_run("m1", "26", routes=("e5rt",)),)}
    assert precedent("rope.slice-concat", "m1", "26", e5rt).answer == "none"


def test_a_generation_without_its_own_measurement_takes_its_familys():
    on_m2 = {"rope.slice-concat": (_run("m2", "26"),)}
    assert precedent("rope.slice-concat", "m1", "26", on_m2).answer == "nearest"
    assert precedent("rope.slice-concat", "m2", "26", on_m2).answer == "ran"
    refused_m2 = {"conv.baked": (_run("m2", "26", refutes=True),)}
    assert precedent("conv.baked", "m1", "26", refused_m2).answer == "ran"  # m1 has its own run
    refused_m1 = {"gate.silu": (_run("m1", "26", refutes=True),)}
    assert precedent("gate.silu", "m2", "26", refused_m1).answer == "refused"  # m2 takes m1's failure
    # the other family is no precedent: rope.slice-concat ran on m4 and m5, never on m1 / m2
    assert constructs.family("m1") == ("m2",) and constructs.family("m4") == ("m3", "m5")
    assert precedent("rope.slice-concat", "m1", "15").answer == "none"


def test_every_major_and_every_chip_take_the_weakest_answer():
    assert precedent("matmul.activations", "m1").answer == "refused"  # ran under 15, refused under 26
    assert precedent("conv.baked", "m3").answer == "refused"  # ran under 26, only 512 channels under 15
    assert precedent("conv.baked", "m3", "26").answer == "ran"
    assert precedent("conv.baked", "any", "26").answer == "nearest"  # m2 has no run of its own
    assert precedent("conv.baked", "any").answer == "refused"
    assert precedent("rope.slice-concat", "any", "15").answer == "none"
    assert precedent("matmul.activations", "any").answer == "refused"
