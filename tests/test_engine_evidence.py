"""The engine layer's shared parts: the chip table, the evidence record, the one severity policy (checked
against a table of cases written out by hand), and the trials the macOS backend settles by trying."""

from __future__ import annotations

import pytest

from anekit.engine import chips, evidence, trials
from anekit.engine.evidence import Evidence, severity
from anekit.engine.numerics import BEHAVIOURS
from anekit.engine.numerics import CHIPS as NUMERIC_CHIPS
from anekit.errors import AnekitError
from anekit.rules import CHIPS as RULE_CHIPS

M1, M2, M4 = ("m1",), ("m2",), ("m4",)


def _ev(chips_: tuple[str, ...], status: str = "measured", refutes: bool = False, routes=("direct",)):
    return Evidence("a source", status, "what it saw", chips_, routes, refutes=refutes)


# (evidence, claimed chips, can refuse) -> the severity on each of m1 .. m5 on the direct route, worked out
# by hand from the policy's words.
POLICY_CASES = [
    ("measured on m4, uncontradicted", [_ev(M4)], chips.GENERATIONS, True, ["error"] * 5),
    ("reports only", [_ev(M4, "reported")], chips.GENERATIONS, True, ["warn"] * 5),
    ("a decompiled table only", [_ev(chips.GENERATIONS, "decompile-derived")], chips.GENERATIONS, True, ["warn"] * 5),
    (
        "measured on m4, a hardware run against it on m1",
        [_ev(M4), _ev(M1, refutes=True)],
        chips.GENERATIONS,
        True,
        [None, "warn", "warn", "error", "warn"],
    ),
    (
        "measured both ways on m1",
        [_ev(M1), _ev(M1, refutes=True)],
        chips.GENERATIONS,
        True,
        ["warn", "warn", "warn", "warn", "warn"],
    ),
    ("a report against a measurement elsewhere", [_ev(M4, "reported"), _ev(M1, refutes=True)], chips.GENERATIONS, True,
     [None, "warn", "warn", "warn", "warn"]),
    ("a report contradicted by a report", [_ev(M4), _ev(M1, "reported", refutes=True)], chips.GENERATIONS, True,
     ["error"] * 5),
    ("measured but only slow", [_ev(M4)], chips.GENERATIONS, False, ["warn"] * 5),
    ("gated to m1, m2", [_ev(M1)], ("m1", "m2"), True, ["error", "error", None, None, None]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "items", "claimed", "can_refuse", "want"), POLICY_CASES, ids=[c[0] for c in POLICY_CASES]
)
def test_the_severity_policy(what, items, claimed, can_refuse, want):
    got = [severity(items, c, "direct", claimed, can_refuse) for c in chips.GENERATIONS]
    assert got == want
    assert severity(items, "any", "direct", claimed, can_refuse) == (
        "error" if all(w == "error" for w in want) else None if all(w is None for w in want) else "warn"
    )
    assert severity(items, "m4", "e5rt", claimed, can_refuse) is None  # no evidence covers the route


def test_one_chip_table_for_rules_profiles_and_figures():
    assert RULE_CHIPS == NUMERIC_CHIPS == chips.GENERATIONS == ("m1", "m2", "m3", "m4", "m5")
    assert chips.device("M4 Max").generation == "m4" and chips.device("m3-ultra").dies == 2
    assert chips.device("m5-pro").variant == "pro" and chips.generation("m1-max") == "m1"
    assert {d.generation for d in chips.DEVICES.values()} == set(chips.GENERATIONS)
    with pytest.raises(AnekitError, match=r"^\[engine\] unknown chip 'm9' \(known: m1, m1-pro"):
        chips.device("m9")
    with pytest.raises(AnekitError, match=r"unknown route 'npu'"):
        evidence.check_route("npu")


def test_every_numeric_finding_is_an_evidence_record():
    for b in BEHAVIOURS.values():
        for chip, f in b.findings.items():
            if f.status != "unknown":
                e = f.evidence(chip)
                assert (
                    e.chips == (chip,)
                    and set(e.routes) == set(evidence.ROUTES)
                    and e.status in evidence.STATUSES
                )


def test_evidence_without_a_source_or_with_unknown_chips_does_not_go_in():
    with pytest.raises(ValueError, match="no source"):
        Evidence("", "measured", "it failed")
    with pytest.raises(ValueError, match="chips"):
        Evidence("s", "measured", "it failed", ("m9",))
    with pytest.raises(ValueError, match="status"):
        Evidence("s", "rumoured", "it failed")


def test_the_dialect_trial_puts_the_option_with_most_hardware_runs_first():
    d = trials.DIALECT
    assert d.order("m1", "macOS 26.3") == ("ios16", "ios18")  # the one run under macOS 26 (pull request #6)
    assert d.order("m1", "macOS 15.4") == ("ios18", "ios16")  # M1 Pro / Max trained on macOS 15
    assert d.order("m1", "") == ("ios18", "ios16")  # more runs on the M1 in all
    assert d.order("m4", "macOS 26.1") == ("ios18", "ios16")
    assert trials.macos_major("macOS 15.6.1 (24G90)") == "15" and trials.macos_major("") == ""
    with pytest.raises(AnekitError, match="no trial 'x'"):
        trials.trial("x")
    with pytest.raises(ValueError, match="no hardware run"):
        trials.Trial("t", "q", (trials.Option("a", (_ev(M1),)), trials.Option("b", (_ev(M1, "reported"),))))


def _os(chips_: tuple[str, ...], macos: str, refutes: bool = False) -> Evidence:
    return Evidence("a source", "measured", "what it saw", chips_, ("direct",), macos, refutes=refutes)


# (evidence, macOS asked) -> the severity on m1 .. m5 on the direct route, worked out by hand: under a major
# version, records naming other majors are left out on both sides; records naming none count for all.
MACOS_CASES = [
    ("refused on m1 under 26, asked for 26", [_os(M1, "26.3")], "26", ["error"] * 5),
    ("refused on m1 under 26, asked for 15", [_os(M1, "26.3")], "15", [None] * 5),
    ("refused under 26, ran under 15, no version asked", [_os(M1, "26.3"), _os(M1, "15.0", True)], "",
     ["warn"] * 5),
    ("refused under 26, ran under 15, asked for 26", [_os(M1, "26.3"), _os(M1, "15.0", True)], "26.1",
     ["error"] * 5),
    ("refused under 26, ran under 15, asked for 15", [_os(M1, "26.3"), _os(M1, "15.0", True)], "15",
     [None] * 5),
    ("a record with no version counts under every one", [_ev(M1)], "15", ["error"] * 5),
    ("a run with no version contradicts under 26 too", [_os(M1, "26.3"), _ev(M1, refutes=True)], "26",
     ["warn"] * 5),
    ("a record naming two versions counts under both", [_os(M1, "15.0, 26.3")], "15", ["error"] * 5),
]  # fmt: skip


@pytest.mark.parametrize(("what", "items", "macos", "want"), MACOS_CASES, ids=[c[0] for c in MACOS_CASES])
def test_the_severity_policy_under_a_macos_version(what, items, macos, want):
    assert [severity(items, c, "direct", macos=macos) for c in chips.GENERATIONS] == want


def test_macos_versions_are_numbers_and_records_name_theirs():
    assert evidence.check_macos("26") == "26" and evidence.check_macos("15.3.1") == "15"
    assert evidence.check_macos("") == "" and trials.macos_major is evidence.macos_major
    for bad in ("sequoia", "15.x", "26..1", "v26"):
        with pytest.raises(AnekitError, match=rf"^\[rules\] macOS version '{bad}' is not a version number"):
            evidence.check_macos(bad)
        with pytest.raises(AnekitError, match="is not a version number"):
            severity([_ev(M1)], "m1", "direct", macos=bad)
    assert _os(M1, "15.0, 15.6.1").majors == {"15"} and _ev(M1).majors == frozenset()
    assert _os(M1, "26.3").holds_under("26") and not _os(M1, "26.3").holds_under("15")
    assert _ev(M1).holds_under("15") and _os(M1, "26.3").holds_under("")
    with pytest.raises(ValueError, match="macOS 'Tahoe' is not a list of versions"):
        _os(M1, "Tahoe")
    assert "Under a macOS major version" in evidence.POLICY
