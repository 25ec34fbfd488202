"""``anekit doctor``: the report on this (Linux) machine, text and JSON, and on a simulated Mac.

The Mac cases run the report over ``tests/fake_objc.py`` (a fake Objective-C runtime with the engine's
classes, some removed on demand) and replace the host facts and the ane module where a branch needs
it, so every line of the report is produced here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types

import numpy as np
import pytest

from anekit import runtime
from anekit.cli import doctor_cmd
from anekit.runtime.sim import SimBackend
from anekit.tools import doctor
from anekit.tools.doctor import Host

KEYS = {
    "trials",
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
}
CLASSES = [
    "_ANEInMemoryModelDescriptor",
    "_ANEInMemoryModel",
    "_ANERequest",
    "_ANEIOSurfaceObject",
    "_ANEClient",
]
MAC = Host("Darwin", "24.1.0", "arm64", "15.1")
LINUX = sys.platform.startswith("linux")


def _doctor(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="anekit")
    doctor_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", *argv])
    return args.run(args)


def _lines(text: str) -> list[tuple[str, str]]:
    """(label, value) of the report's aligned lines (the label ends at the first run of two spaces)."""
    out = []
    for line in text.splitlines():
        label, _, value = line.partition("  ")
        out.append((label.strip(), value.strip()))
    return out


def _line(text: str, label: str) -> str:
    values = [v for k, v in _lines(text) if k == label]
    assert len(values) == 1, f"{label!r} appears {len(values)} times in:\n{text}"
    return values[0]


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("ANEKIT_BACKEND", raising=False)


@pytest.fixture
def fake_ane(monkeypatch):
    """A stand-in for the ane backend module; the test gives it what it needs."""
    module = types.ModuleType(runtime.BACKENDS["ane"][0])
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


@pytest.fixture
def fake_objc(tmp_path):
    from tests.fake_objc import FakeObjC

    return FakeObjC(tmp_path)


# -- this machine -----------------------------------------------------------------------------------


def test_doctor_reports_the_backend_open_uses(no_env, capsys):
    assert _doctor() == 0
    text = capsys.readouterr().out
    best = runtime.available()[0]  # sim here; ane on a Mac whose framework loads
    assert _line(text, "open()").startswith(f"{best} (")
    assert _line(text, "open()").endswith("compile budget 100)")
    assert _line(text, "ANEKIT_BACKEND") == "not set"
    assert _line(text, "backend sim") == "available"
    assert _line(text, "compile budget") == "100 compiles per process (default)"
    assert _line(text, "numpy") == np.__version__
    assert _line(text, "python").startswith(sys.version.split()[0])


@pytest.mark.skipif(not LINUX, reason="what the report says on Linux")
def test_doctor_on_linux_reports_the_simulator(no_env, capsys):
    assert _doctor() == 0
    text = capsys.readouterr().out
    assert _line(text, "os").startswith("Linux ")
    assert _line(text, "macOS") == "no (not macOS)"
    assert _line(text, "framework").endswith("AppleNeuralEngine.framework (not found)")
    assert _line(text, "framework loads") == "no: not tried (needs macOS on Apple silicon)"
    assert _line(text, "classes") == "not available (the framework is not loaded)"
    assert _line(text, "ane module").startswith("imports; not available: ane needs macOS on Apple silicon")
    assert _line(text, "backend ane").startswith("not available: ane needs macOS on Apple silicon")
    assert _line(text, "open()") == "sim (SimBackend, compile budget 100)"


def test_doctor_json_has_every_key(no_env, capsys):
    assert _doctor("--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == KEYS
    assert report["open"]["backend"] == runtime.available()[0]
    assert report["open"]["ok"] is True and report["open"]["error"] is None
    assert report["backends"]["sim"] == {"available": True, "reason": None}
    assert set(report["os"]) == {"system", "release", "machine", "macos", "chip"}
    assert report["compile_budget"] == {"default": runtime.DEFAULT_COMPILE_BUDGET}
    assert report["env"] == {"ANEKIT_BACKEND": None}
    assert set(report["framework"]) == {"path", "exists", "loaded", "status"}
    assert set(CLASSES) <= set(report["classes"])
    assert set(report["ane_module"]) == {"imports", "error", "available", "reason"}
    if LINUX:
        assert report["open"] == {
            "forced_by": None,
            "backend": "sim",
            "ok": True,
            "class": "SimBackend",
            "compile_budget": 100,
            "error": None,
        }
        assert report["os"]["system"] == "Linux" and report["os"]["macos"] is None
        assert report["framework"]["loaded"] is False and report["framework"]["exists"] is False
        assert report["classes"] == dict.fromkeys(CLASSES) and report["selectors"] == {}
        assert report["engine_ready"] is False
        module = report["ane_module"]
        assert (module["imports"], module["available"], module["error"]) == (True, False, None)
        assert (module["reason"] or "").startswith("ane needs macOS on Apple silicon")
        assert report["backends"]["ane"]["available"] is False


def test_the_environment_variable_is_reported_and_honoured(monkeypatch, capsys):
    monkeypatch.setenv("ANEKIT_BACKEND", "sim")
    assert _doctor() == 0
    text = capsys.readouterr().out
    assert _line(text, "ANEKIT_BACKEND") == "sim"
    assert _line(text, "open()") == "sim (SimBackend, compile budget 100, forced by ANEKIT_BACKEND)"


@pytest.mark.skipif("ane" in runtime.available(), reason="the ane backend is available on this machine")
def test_forcing_an_unavailable_backend_fails_with_the_reason(monkeypatch, capsys):
    monkeypatch.setenv("ANEKIT_BACKEND", "ane")
    assert _doctor() == 1
    assert _line(capsys.readouterr().out, "open()").startswith(
        "fails: [runtime] backend 'ane' is not available"
    )
    assert _doctor("--json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["open"]["ok"] is False and report["open"]["backend"] == "ane"
    assert report["open"]["forced_by"] == "ANEKIT_BACKEND"


def test_an_unknown_forced_backend_fails(monkeypatch, capsys):
    monkeypatch.setenv("ANEKIT_BACKEND", "tpu")
    assert _doctor() == 1
    assert "unknown backend 'tpu'" in _line(capsys.readouterr().out, "open()")


def test_the_command_is_wired_into_anekit():
    from anekit.cli.main import build_parser

    args = build_parser().parse_args(["doctor", "--json"])
    assert args.run is doctor_cmd.run and args.json


# -- the ane module as the doctor finds it -------------------------------------------------------------


def test_a_missing_ane_module_is_reported_and_the_rest_still_works(no_env, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, runtime.BACKENDS["ane"][0], None)  # import raises ImportError
    assert _doctor() == 0
    text = capsys.readouterr().out
    assert _line(text, "ane module").startswith("not available: ModuleNotFoundError")
    assert _line(text, "framework loads") == "no: not checked: anekit.runtime.ane does not import"
    assert _line(text, "classes") == "not available (the framework is not loaded)"
    assert _line(text, "backend ane").startswith("not available: ane needs macOS")
    assert _line(text, "open()").startswith("sim (")


def test_an_ane_module_that_explains_itself(no_env, fake_ane, capsys):
    fake_ane.is_available = lambda: False
    fake_ane.unavailable_reason = lambda: "ane: class _ANEClient not found (macOS 15.1)"

    def probe(objc_runtime: object = None) -> None:
        raise RuntimeError("no probe today")

    fake_ane.probe = probe
    assert _doctor() == 0
    text = capsys.readouterr().out
    assert _line(text, "ane module") == "imports; not available: ane: class _ANEClient not found (macOS 15.1)"
    assert _line(text, "backend ane") == "not available: ane: class _ANEClient not found (macOS 15.1)"
    assert _line(text, "framework loads") == "no: probe() raised RuntimeError: no probe today"


def test_an_is_available_that_raises_is_reported(no_env, fake_ane):
    def is_available() -> bool:
        raise RuntimeError("boom")

    fake_ane.is_available = is_available
    info = dataclasses.asdict(doctor.engine().module)
    assert info == {
        "imports": True,
        "error": "is_available() raised RuntimeError: boom",
        "available": None,
        "reason": None,
    }


def test_open_uses_the_engine_where_it_is_available(no_env, fake_ane, capsys):
    class AneBackend(SimBackend):
        name = "ane"

    fake_ane.is_available = lambda: True
    fake_ane.AneBackend = AneBackend
    assert _doctor("--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["open"]["backend"] == "ane" and report["open"]["class"] == "AneBackend"
    assert report["backends"]["ane"] == {"available": True, "reason": None}
    assert report["ane_module"]["available"] is True
    assert report["framework"]["status"] == "not checked: anekit.runtime.ane has no probe()"


# -- a simulated Mac: the framework through the fake Objective-C runtime ---------------------------


def test_a_mac_report_lists_classes_and_selectors(no_env, fake_objc, monkeypatch):
    fake_objc.remove_class("_ANEClient")
    fake_objc.remove_method("_ANEInMemoryModel", "-", "evaluateWithQoS:options:request:error:")
    monkeypatch.setattr(doctor, "host", lambda: MAC)
    report = doctor.diagnose(objc_runtime=fake_objc.runtime()).to_json()
    assert report["os"]["macos"] == "15.1" and report["os"]["machine"] == "arm64"
    assert report["framework"]["loaded"] is True and report["framework"]["status"].startswith("loaded ")
    assert report["classes"]["_ANEInMemoryModel"] is True and report["classes"]["_ANEClient"] is False
    assert report["engine_ready"] is True  # the four required classes are there
    sel = report["selectors"]
    assert sel["-[_ANEInMemoryModel evaluateWithQoS:options:request:error:]"] is False
    assert sel["+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]"] is True
    assert sel["+[_ANEClient sharedConnection]"] is False  # its class is missing
    assert fake_objc.framework_loaded and not fake_objc.errors
    assert not [c for c in fake_objc.calls if c.kind == "msg"]  # the probe sends no message

    text = doctor_cmd.format_report(report)
    assert _line(text, "os") == "Darwin 24.1.0 arm64" and _line(text, "macOS") == "15.1"
    assert _line(text, "framework loads") == "yes"
    classes = [v for k, v in _lines(text) if k == "class"]
    assert "found   _ANEInMemoryModelDescriptor (required)" in classes
    assert "MISSING _ANEClient" in classes
    selectors = [v for k, v in _lines(text) if k == "selector"]
    assert "MISSING -[_ANEInMemoryModel evaluateWithQoS:options:request:error:]" in selectors
    assert "found   -[_ANEInMemoryModel compileWithQoS:options:error:]" in selectors
    assert _line(text, "engine") == "the required classes resolve"


def test_a_mac_without_a_required_class(no_env, fake_objc):
    fake_objc.remove_class("_ANERequest")
    report = doctor.diagnose(objc_runtime=fake_objc.runtime()).to_json()
    assert report["classes"]["_ANERequest"] is False and report["engine_ready"] is False
    text = doctor_cmd.format_report(report)
    assert "MISSING _ANERequest (required)" in [v for k, v in _lines(text) if k == "class"]
    assert _line(text, "engine") == "required classes are MISSING"


def test_a_framework_that_does_not_load(no_env, tmp_path):
    from tests.fake_objc import FakeObjC

    fake = FakeObjC(tmp_path, framework_loads=False)
    report = doctor.diagnose(objc_runtime=fake.runtime()).to_json()
    assert report["framework"]["loaded"] is False
    assert report["framework"]["status"].startswith("did not load: ")
    assert report["classes"] == dict.fromkeys(CLASSES) and report["selectors"] == {}
    text = doctor_cmd.format_report(report)
    assert _line(text, "framework loads").startswith("no: did not load: ")
    assert _line(text, "classes") == "not available (the framework is not loaded)"


def test_host_facts_on_a_mac(monkeypatch):
    monkeypatch.setattr(doctor.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(doctor.platform, "release", lambda: "24.1.0")
    monkeypatch.setattr(doctor.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(doctor.platform, "mac_ver", lambda: ("15.1", ("", "", ""), "arm64"))
    assert doctor.host() == MAC
    monkeypatch.setattr(doctor.platform, "mac_ver", lambda: ("", ("", "", ""), ""))
    assert doctor.host().macos is None
    report = doctor.diagnose().to_json()
    report["os"] = {**report["os"], "system": "Darwin", "macos": None}
    assert _line(doctor_cmd.format_report(report), "macOS") == "unknown"


def test_doctor_reports_the_dialect_trial_and_what_was_remembered(no_env, capsys):
    """The order the macOS backend tries the MIL dialects in, and each remembered outcome."""
    from anekit.runtime.ane import memory

    memory.Memory().remember(
        memory.Outcome(
            "dialect", "m1", "macOS 26.3", "ios16", (memory.Attempt("ios18", "InvalidMILProgram"),), 0.0
        )
    )
    assert _doctor("--json") == 0
    trials = json.loads(capsys.readouterr().out)["trials"]
    assert set(trials["order"]["dialect"]) == {"ios18", "ios16"}
    [outcome] = trials["outcomes"]
    assert outcome["value"] == "ios16" and outcome["chip"] == "m1" and outcome["here"] is False
    assert _doctor() == 0
    out = capsys.readouterr().out
    assert "trial dialect" in out and "dialect on m1 (macOS 26.3): ios16 after ios18 failed" in out
