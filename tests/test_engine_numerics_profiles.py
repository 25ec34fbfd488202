"""The numeric profiles as data: every finding has a source, unknown chips take the conservative side
and say so, "any" is the most hazardous union, and the README's table is the generated one."""

from __future__ import annotations

from pathlib import Path

import pytest

from anekit.engine import BEHAVIOURS, CHIPS, profile
from anekit.engine.doc import BEGIN, END, markdown
from anekit.engine.numerics import Behaviour, Finding, UnknownNumerics


def test_every_finding_has_a_source_and_a_status():
    for b in BEHAVIOURS.values():
        assert b.statement and b.findings
        for chip, f in b.findings.items():
            assert chip in CHIPS and f.source.strip() and f.status != "unknown"


def test_a_finding_without_a_source_does_not_go_in():
    with pytest.raises(ValueError, match="without a source"):
        Finding(1, "measured", " ")
    with pytest.raises(ValueError, match="unknown chips"):
        Behaviour("x.y", "s", {"m9": Finding(1, "measured", "src")}, 1)


def test_chips_without_data_take_the_conservative_value_marked_unknown():
    m3 = profile("m3")
    assert m3.findings["mac.subnormal-flush"].status == "unknown" and m3.flushes_mac_subnormals
    assert m3.slice_gain == 16  # no M3 data: the clamp
    assert profile("m5").findings["mac.subnormal-flush"].status == "measured"
    assert not profile("m5").flushes_mac_subnormals


def test_any_is_the_most_hazardous_union():
    anyp = profile("any")
    assert anyp.slice_gain == max(profile(c).slice_gain for c in CHIPS) == 16
    assert anyp.mac_ceiling == min(profile(c).mac_ceiling for c in CHIPS) == 32768
    assert anyp.flushes_mac_subnormals


def test_unknown_names_are_clear_errors():
    with pytest.raises(
        UnknownNumerics, match=r"unknown chip 'M1' \(choose one of: any, m1, m2, m3, m4, m5\)"
    ):
        profile("M1")
    with pytest.raises(UnknownNumerics, match="unknown behaviour"):
        profile("m1")["no.such"]


def test_readme_table_is_the_generated_one():
    readme = Path(__file__).resolve().parents[1] / "README.md"
    text = readme.read_text(encoding="utf-8")
    section = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert section == markdown(), "README's numerics table is stale: paste anekit.engine.doc.markdown()"
