"""The doctor and the smoke ladder called from Python (``anekit.tools.doctor``): typed reports, and the
same JSON the command prints."""

from __future__ import annotations

import json

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import preset
from anekit.runtime.sim import SimBackend
from anekit.tools import doctor, smoke

KEYS = [
    "anekit",
    "python",
    "numpy",
    "os",
    "framework",
    "classes",
    "selectors",
    "engine_ready",
    "ane_module",
    "backends",
    "env",
    "compile_budget",
    "open",
    "trials",
]


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("ANEKIT_BACKEND", raising=False)


def test_diagnose_returns_a_typed_report(no_env) -> None:
    report = doctor.diagnose()
    assert isinstance(report, doctor.Report) and isinstance(report.host, doctor.Host)
    assert report.ok and report.opened.backend == runtime.available()[0]
    assert report.opened.compile_budget == runtime.DEFAULT_COMPILE_BUDGET == report.compile_budget
    assert report.backends["sim"] == doctor.BackendStatus(True, None)
    assert report.numpy == np.__version__
    assert set(doctor.CLASSES) <= set(report.engine.classes)
    assert report.env == {"ANEKIT_BACKEND": None}


def test_the_json_form_is_what_the_command_prints(no_env, capsys) -> None:
    from anekit.cli.main import main

    assert main(["doctor", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    doc = doctor.diagnose().to_json()
    assert doc == printed
    assert list(doc) == KEYS  # the document's keys, in the order the command has always printed them
    assert list(doc["open"]) == ["forced_by", "backend", "ok", "class", "compile_budget", "error"]
    assert list(doc["os"]) == ["system", "release", "machine", "macos", "chip"]
    assert list(doc["trials"]) == ["chip", "macos", "order", "memory", "problem", "outcomes"]


def test_an_unopenable_backend_makes_the_report_not_ok(monkeypatch) -> None:
    monkeypatch.setenv("ANEKIT_BACKEND", "tpu")
    report = doctor.diagnose()
    assert not report.ok and report.opened.forced_by == "ANEKIT_BACKEND" and report.opened.backend == "tpu"
    assert "unknown backend 'tpu'" in (report.opened.error or "")
    assert doctor.diagnose(env={}).opened.forced_by is None  # the environment is given, not read


def test_the_smoke_ladder_from_python(no_env) -> None:
    cfg = preset("stories260K")
    seen: list[int] = []
    report = doctor.smoke(SimBackend(), cfg, "ios16", seed=3, on_result=lambda i, r: seen.append(i))
    names = smoke.rung_names()
    assert [r.name for r in report.rungs] == names and seen == list(range(1, len(names) + 1))
    assert report.ok and report.failed == [] and report.dialect == "ios16" and report.seed == 3
    assert report.note == "no Neural Engine here: the ladder ran in the simulator" or report.backend != "sim"
    doc = report.to_json()
    assert doc["summary"] == {"rungs": len(names), "passed": len(names), "failed": []}
    assert doc["numerics"]["assumed"] == "any" and doc["numerics"]["matches"] == ["m1", "m2", "m3"]
    assert json.dumps(doc)  # JSON-ready


def test_the_dialect_is_the_one_asked_else_ios18_off_the_engine() -> None:
    assert doctor.smoke_dialect(SimBackend(), "ios16") == "ios16"
    assert doctor.smoke_dialect(SimBackend()) == "ios18"


# -- the first-contact report from Python -------------------------------------------------------------------


class FakeEngine(SimBackend):
    """The engine as a first Mac might find it: named "ane", refusing every matmul at compile time."""

    name = "ane"

    def _compile(self, prog, fn, weights):
        from anekit.errors import CompilationFailed

        if any(op.op_type == "matmul" for op in fn.ops):
            raise CompilationFailed("[compile] ANECCompile() FAILED: matmul (injected)")
        return super()._compile(prog, fn, weights)


def _mac(brand: str, macos: str) -> doctor.Report:
    """This machine's report, as a Mac with ``brand`` under ``macos`` gives it."""
    from dataclasses import replace

    here = doctor.diagnose(env={})
    return replace(
        here, host=doctor.Host("Darwin", "25.3.0", "arm64", macos), engine=replace(here.engine, chip=brand)
    )


def test_a_mac_run_becomes_measured_evidence(no_env) -> None:
    """The path a first user's report takes: the ladder on the engine, the report, the evidence."""
    from datetime import datetime, timezone

    from anekit.engine import report as first

    found = doctor.smoke(FakeEngine(), preset("stories260K"), "ios18", report=_mac("Apple M1 Pro", "26.3"))
    when = datetime(2026, 12, 1, 10, 0, 0, tzinfo=timezone.utc)
    r = doctor.first_contact(found, when)
    assert (r.device, r.generation, r.macos, r.macos_major, r.backend, r.when) == (
        "m1-pro", "m1", "26.3", "26", "ane", "2026-12-01T10:00:00Z",
    )  # fmt: skip
    assert first.from_json(json.loads(first.dumps(r))) == r  # what the file holds reads back the same
    ev = r.evidence()
    source = "anekit doctor report m1-pro macOS 26.3"
    for construct in ("matmul.activations", "matmul.dynamic-weights", "rmsnorm.fused-before-matmuls"):
        assert ev[construct] and all(e.refutes for e in ev[construct]), construct
        assert all(e.macos == "26" and e.chips == ("m1",) and e.source == source for e in ev[construct])
        assert (
            "failed at compile: CompilationFailed: [compile] ANECCompile() FAILED: matmul"
            in ev[construct][0].observed
        )
    for construct in ("conv.baked", "softmax.scores", "rmsnorm.plain", "rope.slice-concat", "gate.silu"):
        assert ev[construct] and not any(e.refutes for e in ev[construct]), construct
    assert r.numerics()["mac.output-ceiling"][0].got == ("7c00", "77ff")


def test_the_chip_is_named_as_the_engine_layer_names_it() -> None:
    assert doctor.chip_of("ane", "Apple M1 Pro", None) == ("m1-pro", "m1")
    assert doctor.chip_of("ane", "Apple M4", None) == ("m4", "m4")
    assert doctor.chip_of("ane", "Apple M9 Ultra", None) == (None, None)  # unknown: a report without evidence
    assert doctor.chip_of("ane", None, None) == (None, None)
    assert doctor.chip_of("sim", None, "m2") == ("m2", "m2")
    assert doctor.chip_of("sim", None, "any") == (None, None)


def test_the_route_is_the_engine_layers_for_the_chip_and_macos(monkeypatch) -> None:
    from anekit.engine.training_routes import NoTrainingRoute, training_route

    want = training_route("m1", "26")
    got = doctor.chosen_route("m1", "26.3")
    assert got is not None and (got.id, got.why, got.evidence) == (want.id, want.why, want.sources())
    older = doctor.chosen_route("m1", "14.2")  # a major without evidence: the route for every major
    assert older is not None and older.id == training_route("m1", "").id
    assert older.why.startswith("macOS 14.2 has no evidence: the route for every macOS")
    with pytest.raises(NoTrainingRoute):  # no route has a precedent on every chip under every macOS
        training_route("any")
    assert doctor.chosen_route(None, "") is None  # so off a Mac the report names none

    def none(chip, macos=""):
        raise NoTrainingRoute(f"[engine] no training route for {chip}")

    monkeypatch.setattr(doctor, "training_route", none)
    assert doctor.chosen_route("m4", "26") is None  # recorded as "unknown"


class RunsEverything(SimBackend):
    """The engine as a Mac might find it against the record: every rung compiles and runs."""

    name = "ane"


@pytest.mark.parametrize(
    "engine, route", [(FakeEngine, "conv-host-attention"), (RunsEverything, "dynamic-engine-attention")]
)
def test_a_report_moves_the_route_without_a_code_change(no_env, tmp_path, engine, route) -> None:
    """m1 under macOS 26: matmul has a measured refusal (maderix/ANE 709b602), so no engine attention. A
    report of the same Mac written, read back from its file and handed to the engine layer decides it:
    one where matmul failed again keeps the conv route, one where every rung ran gives the dynamic one."""
    from anekit.engine import report as first
    from anekit.engine.training_routes import training_route

    assert training_route("m1", "26").id == "conv-host-attention"
    found = doctor.smoke(engine(), preset("stories260K"), "ios18", report=_mac("Apple M1", "26.3"))
    made = doctor.first_contact(found)
    assert made.route is not None and made.route.id == "conv-host-attention"  # what anekit chose before
    first.write_report(tmp_path / "m1.json", made)
    extra = first.shipped_evidence(tmp_path)
    assert training_route("m1", "26", extra=extra).id == route
