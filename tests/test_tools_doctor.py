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


def test_the_route_is_unknown_without_the_routes_module(monkeypatch) -> None:
    import importlib
    import sys
    import types

    real = importlib.import_module

    def without(name, *a):
        if name == doctor.ROUTES_MODULE:
            raise ImportError(name)
        return real(name, *a)

    monkeypatch.setattr(doctor.importlib, "import_module", without)
    assert doctor.chosen_route("m1", "26") is None
    monkeypatch.undo()

    asked = []

    def training_route(chip, macos=""):
        asked.append((chip, macos))
        if chip == "m7":
            from anekit.errors import AnekitError

            raise AnekitError("[engine] unknown chip 'm7'")
        ev = types.SimpleNamespace(source="maderix/ANE 709b602")
        return types.SimpleNamespace(id="conv-host-attention", why="no matmul run", evidence=(ev,))

    module = types.ModuleType(doctor.ROUTES_MODULE)
    module.training_route = training_route
    monkeypatch.setitem(sys.modules, doctor.ROUTES_MODULE, module)
    from anekit.engine.report import Route

    assert doctor.chosen_route("m1", "26") == Route(
        "conv-host-attention", "no matmul run", ("maderix/ANE 709b602",)
    )
    assert doctor.chosen_route(None, "") is not None and asked[-1] == ("any", "")
    assert doctor.chosen_route("m7", "") is None
