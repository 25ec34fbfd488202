"""The numeric rungs of ``doctor --smoke`` tell the chip profiles apart and name where a machine departs
from the profile anekit assumed (here the "machine" is the simulator set to one chip's profile, or to the
ideal machine, standing in for hardware that disagrees with the record)."""

from __future__ import annotations

import json

import pytest

from anekit.runtime.sim import SimBackend
from anekit.tools import smoke_numerics


@pytest.mark.parametrize(
    "chip, matched",
    [("m1", ["m1", "m2", "m3"]), ("m2", ["m1", "m2", "m3"]), ("m4", ["m4"]), ("m5", ["m5"]),
     ("any", ["m1", "m2", "m3"])],
)  # fmt: skip
def test_each_profile_is_recognised(chip, matched):
    found = smoke_numerics.run(SimBackend(chip=chip, strict=False), "ios18")
    assert [r.name for r in found] == ["mac_ceiling", "nan_coercion", "subnormal_mac", "slice_4096"]
    assert smoke_numerics.profiles_matched(found) == matched
    assert smoke_numerics.differences(found, chip) == []


def test_a_machine_unlike_its_profile_is_named():
    """An M5-like machine assumed to be an M1: the subnormal flush and the slice gain differ."""
    found = smoke_numerics.run(SimBackend(chip="m5", strict=False), "ios18")
    differs = smoke_numerics.differences(found, "m1")
    assert [d.split(":")[0] for d in differs] == ["mac.subnormal-flush", "slice.width-offset-gain"]
    assert "got [1.19209e-07], the m1 profile says [0]" in differs[0]


def test_an_ieee_machine_matches_no_profile():
    found = smoke_numerics.run(SimBackend(numerics="ieee", strict=False), "ios18")
    assert smoke_numerics.profiles_matched(found) == []
    lines = [smoke_numerics.format_result(r) for r in found]
    assert "NO profile predicts it" in lines[0] and "got [32768, 32752]" in lines[0]
    assert json.dumps([r.to_json() for r in found])  # JSON-ready (inf and nan as strings)
