"""The rule book judged against hardware: every program a public project ran on a chip compiles in the
strict simulator for that chip and route, and every program measured to fail there is refused.

The corpus is ``tests.engine_corpus`` (each case with its source and what was observed). A rule change
that refuses a known-good program, or lets a known-refused one through, fails here.
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.errors import CompilationFailed
from anekit.mil import parse, verify
from anekit.rules import check_program, errors, rule
from tests.engine_corpus import Case
from tests.engine_corpus.known_good import KNOWN_GOOD
from tests.engine_corpus.known_refused import KNOWN_CONTESTED, KNOWN_REFUSED


def _strict(chip: str, route: str) -> runtime.Backend:
    return runtime.open("sim", chip=chip, route=route, strict=True)


def _inputs(kernel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {s.name: rng.uniform(-1, 1, s.shape).astype(np.float32) for s in kernel.inputs}


@pytest.mark.parametrize("case", KNOWN_GOOD, ids=lambda c: c.name)
def test_a_program_that_ran_on_hardware_compiles_in_the_strict_simulator_on_its_chips(case: Case):
    for chip in case.chips:
        kernel = _strict(chip, case.route).compile(case.mil, weights=case.weights)
    outputs = kernel(**_inputs(kernel, np.random.default_rng(0)))
    assert outputs and all(np.asarray(v).size for v in outputs.values())


@pytest.mark.parametrize("case", KNOWN_REFUSED, ids=lambda c: c.name)
def test_a_program_measured_to_fail_is_refused_on_its_chips(case: Case):
    for chip in case.chips:
        with pytest.raises(CompilationFailed):
            _strict(chip, case.route).compile(case.mil, weights=case.weights)


@pytest.mark.parametrize("case", KNOWN_CONTESTED, ids=lambda c: c.name)
def test_a_program_measured_both_ways_is_a_warning_naming_the_contested_rule(case: Case):
    """Measured to fail on a chip where another hardware-run program says the construct works: the policy
    makes it a warning, so the strict simulator compiles it and lint names the contested rule."""
    program = verify(parse(case.mil))
    for chip in case.chips:
        _strict(chip, case.route).compile(case.mil, weights=case.weights)
        warned = {f.rule.id for f in check_program(program, chip, case.weights, case.route)}
        assert warned & set(case.contested), (case.name, chip, warned)
        for rule_id in warned & set(case.contested):
            assert rule(rule_id).conflicted


def test_the_corpus_covers_every_chip_and_both_compiled_routes():
    for cases in (KNOWN_GOOD, (*KNOWN_REFUSED, *KNOWN_CONTESTED)):
        assert {c for case in cases for c in case.chips} == {"m1", "m2", "m3", "m4", "m5"}
        assert {case.route for case in cases} >= {"direct", "e5rt"}
    names = [c.name for c in (*KNOWN_GOOD, *KNOWN_REFUSED, *KNOWN_CONTESTED)]
    assert len(names) == len(set(names))


def test_no_known_good_program_breaks_an_error_rule_on_its_chips():
    """The same, through ``check_program`` (what ``anekit lint`` reports): no error finding."""
    for case in KNOWN_GOOD:
        program = verify(parse(case.mil))
        for chip in case.chips:
            broken = errors(check_program(program, chip, case.weights, case.route))
            assert not broken, (case.name, chip, [f.short() for f in broken])


def _single_op(case: Case) -> bool:
    fn = verify(parse(case.mil)).main
    return len([op for op in fn.ops if op.op_type != "const"]) == 1


SINGLE_OPS = [c for c in KNOWN_GOOD if _single_op(c)]


def test_there_are_single_op_programs_measured_native_on_every_measured_generation():
    ops = {verify(parse(c.mil)).main.ops[-1].op_type for c in SINGLE_OPS}
    assert len(SINGLE_OPS) >= 30 and len(ops) >= 25
    assert {chip for c in SINGLE_OPS for chip in c.chips} >= {"m1", "m2", "m5"}


@pytest.mark.parametrize("case", SINGLE_OPS, ids=lambda c: c.name)
def test_anekit_lint_is_silent_on_a_single_op_program_measured_native(case: Case, tmp_path, capsys):
    """``anekit lint --chip C --route R`` on an op the sources measured native, at the shape they ran, on
    that chip and route: no error and no warning."""
    from anekit.cli.main import main

    path = tmp_path / f"{case.name}.mil"
    path.write_text(case.mil, encoding="utf-8")
    for name, data in (case.weights or {}).items():
        target = tmp_path / name.removeprefix("@model_path/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    for chip in case.chips:
        assert main(["lint", str(path), "--chip", chip, "--route", case.route]) == 0
        last = capsys.readouterr().out.splitlines()[-1]
        assert last == f"1 program: 0 errors, 0 warnings (chip: {chip}, route: {case.route})", last
