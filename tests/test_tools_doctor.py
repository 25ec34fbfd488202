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
