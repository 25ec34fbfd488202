"""The simulator's chip binding (runtime.sim.chip): a chip name resolved once to the numerics it computes
with, each value the one the chip's profile records, and no other module of the simulator reading a
profile itself."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from anekit.engine import CHIPS, profile
from anekit.errors import AnekitError
from anekit.runtime import sim
from anekit.runtime.sim import SimBackend
from anekit.runtime.sim.chip import bind, check_chip
from tests.numerics_probe import probe

# field of ChipNumerics -> the behaviour of the profile it must hold (anekit.engine.numerics)
FIELDS = {
    "mac_ceiling": "mac.output-ceiling",
    "flush": "mac.subnormal-flush",
    "mac_ties": "mac.tie-rounding",
    "tile_rounding": "mac.first-stage",
    "reduce_ties": "reduce.tie-rounding",
    "slice_gain": "slice.width-offset-gain",
    "partials": "mac.interior-partials",
    "sqrt_subnormals": "table.subnormal-input",
    "signed_zero": "recip.signed-zero",
    "round_away": "round.half-away",
    "tables": "activation.tables",
}


@pytest.mark.parametrize("chip", ["any", *CHIPS])
def test_every_value_is_the_one_the_chips_profile_records(chip):
    bound, recorded = bind(chip), profile(chip)
    assert bound.chip == chip and bound.profile == recorded
    for field, behaviour in FIELDS.items():
        assert getattr(bound, field) == recorded[behaviour], field
    lo, hi = recorded["activation.tables"]["sigmoid"].domain
    assert bound.sigmoid_knots == (float(np.float16(lo)), float(np.float16(hi)))


def test_a_chip_is_resolved_once():
    assert bind("m1") is bind("m1") and bind("m1") is not bind("m5")


def test_an_unknown_chip_is_refused_naming_the_choices():
    for call in (lambda: check_chip("m9"), lambda: bind("m9"), lambda: SimBackend(chip="m9")):
        with pytest.raises(AnekitError, match=r"m9.*any, m1"):
            call()


def test_the_backend_computes_with_the_bound_chip():
    """A subnormal product in a matmul: +0 on M1 (the MAC flushes), kept on M5 (DESIGN.md, "Numerics")."""
    tiny = np.float32(2.0**-20)  # an fp16 subnormal

    def body(f, x):
        return f.matmul(x=x, y=np.ones((4, 1), np.float32))

    x = np.full((1, 4), tiny, np.float32)
    assert probe(body, chip="m1", x=x).item() == 0.0
    assert probe(body, chip="m5", x=x).item() == 4 * tiny
    assert SimBackend(chip="m5").chip_numerics is bind("m5")
    assert SimBackend(chip="m5", numerics="ieee").chip_numerics is None


def test_only_the_binding_reads_a_profile():
    """No module of the simulator but runtime.sim.chip imports a profile, the tables or the chip check from
    anekit.engine.numerics: everything else asks the binding."""
    binding_names = {"profile", "Profile", "TABLES", "check_chip", "BEHAVIOURS", "behaviour"}
    sources = ("anekit.engine.numerics", "anekit.engine")
    folder = Path(sim.__file__).parent
    for path in sorted(folder.glob("*.py")):
        if path.name == "chip.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in sources:
                taken = {a.name for a in node.names} & binding_names
                assert not taken, f"{path.name} imports {sorted(taken)} from {node.module}"
            if isinstance(node, ast.ImportFrom) and node.module == "anekit.rules":
                assert "check_chip" not in {a.name for a in node.names}, path.name
