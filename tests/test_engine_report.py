"""A Mac's first-contact report read back as measured evidence (``anekit.engine.report``).

The report under test is written here by hand, as a dict: an M1 under macOS 26.3 on which the matmul of
two activations failed to compile and the baked 1x1 conv ran. The evidence it must give is written out
field by field, from the schema's rules, not from the code under test.
"""

from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path

import pytest

from anekit.engine import report as rep
from anekit.engine.evidence import Evidence
from anekit.errors import AnekitError
from anekit.inputs import InputError

ROOT = Path(__file__).resolve().parents[1]
ERROR = "CompilationFailed: [compile] ANECCompile() FAILED: status 0x4"


def _stage(outcome: str = "ok", error: str | None = None, ms: float | None = 1.25) -> dict:
    return {"outcome": outcome, "error": error, "ms": ms}


NOT_RUN = {"outcome": "not run", "error": None, "ms": None}


def _rung(name: str, constructs: list[str], failed_at: str | None = None) -> dict:
    out: dict = {"name": name, "constructs": constructs}
    reached = True
    for s in ("compile", "load", "run", "compare"):
        if not reached:
            out[s] = dict(NOT_RUN)
        elif s == failed_at:
            out[s] = _stage("failed", ERROR if s == "compile" else f"{s} went wrong", 2.0)
            reached = False
        else:
            out[s] = _stage(ms=None if s == "compare" else 1.25)
    return out


def m1_macos_26() -> dict:
    """An M1 under macOS 26.3: conv.baked ran, matmul.activations failed to compile, the SDPA kernel
    (conv, matmul, softmax) failed too, the softmax ran on its own."""
    return {
        "schema": "anekit-doctor-report",
        "version": 1,
        "anekit": "0.1.0",
        "when": "2026-12-01T10:00:00Z",
        "chip": {"device": "m1", "generation": "m1"},
        "macos": {"version": "26.3", "major": "26"},
        "backend": "ane",
        "rungs": [
            _rung("elementwise", []),
            _rung("conv1x1", ["conv.baked"]),
            _rung("matmul_activations", ["matmul.activations"], failed_at="compile"),
            _rung("softmax_scores", ["softmax.scores"]),
            _rung("sdpa_fwd", ["conv.baked", "matmul.activations", "softmax.scores"], failed_at="compile"),
        ],
        "probes": [
            {
                "name": "mac_ceiling",
                "id": "mac.output-ceiling",
                "inputs": {"x": {"shape": [1, 64, 1, 32], "nonzero": [[0, 0, "6000"], [1, 0, "6000"]]}},
                "read": [[0, 0]],
                "got": ["7c00"],
                "error": None,
                "expected": {"m1": ["7c00"], "m5": ["7800"]},
            },
            {
                "name": "slice_4096",
                "id": "slice.width-offset-gain",
                "inputs": {"x": {"shape": [1, 64, 1, 64], "nonzero": [[0, 35, "6c00"]]}},
                "read": [[0, 3]],
                "got": None,
                "error": "EvalFailed: [run] status 0x1d",
                "expected": {"m1": ["7c00"]},
            },
        ],
        "route": {
            "id": "conv-host-attention",
            "why": "matmul has no run on m1 under macOS 26",
            "evidence": ["maderix/ANE 709b602"],
        },
    }


def _load(tmp_path: Path, doc: dict | str | bytes, name: str = "m1-26.json") -> rep.Report:
    path = tmp_path / name
    data = doc if isinstance(doc, (str, bytes)) else json.dumps(doc)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return rep.load_report(path)


SOURCE = "anekit doctor report m1 macOS 26.3 (m1-26.json)"


def test_the_hand_made_report_loads_and_gives_measured_evidence(tmp_path):
    r = _load(tmp_path, m1_macos_26())
    assert (r.device, r.generation, r.macos, r.macos_major, r.backend) == ("m1", "m1", "26.3", "26", "ane")
    assert r.hardware and r.file == "m1-26.json" and r.source() == SOURCE
    ev = r.evidence()
    assert set(ev) == {"conv.baked", "matmul.activations", "softmax.scores"}  # elementwise tags nothing
    (conv,) = ev["conv.baked"]  # the SDPA failure is not laid on the conv, which ran in conv1x1
    assert conv == Evidence(
        SOURCE,
        "measured",
        "smoke rung 'conv1x1' compiled, loaded and ran as the simulator computes (3.75 ms)",
        ("m1",),
        ("direct",),
        "26",
        False,
    )
    (matmul_alone, matmul_in_sdpa) = ev["matmul.activations"]
    for e, rung in ((matmul_alone, "matmul_activations"), (matmul_in_sdpa, "sdpa_fwd")):
        assert e.refutes and e.status == "measured" and e.is_hardware
        assert (e.chips, e.routes, e.macos, e.source) == (("m1",), ("direct",), "26", SOURCE)
        assert e.observed == f"smoke rung '{rung}' failed at compile: {ERROR}"
    (softmax,) = ev["softmax.scores"]
    assert not softmax.refutes and "'softmax_scores'" in softmax.observed


def test_the_report_round_trips_through_the_writer(tmp_path):
    doc = m1_macos_26()
    r = _load(tmp_path, doc)
    out = tmp_path / "again.json"
    rep.write_report(out, r)
    back = rep.load_report(out)
    assert back == r and back.file == "again.json"
    assert json.loads(out.read_text()) == doc  # the document itself, key for key
    assert rep.dumps(back) == rep.dumps(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.json", "m1-26.json"]  # no temporary


def test_the_probes_give_the_bits_read_per_behaviour(tmp_path):
    r = _load(tmp_path, m1_macos_26())
    found = r.numerics()
    assert list(found) == ["mac.output-ceiling"]  # the probe that read nothing gives no bits
    (probe,) = found["mac.output-ceiling"]
    assert probe.got == ("7c00",) and probe.matches() == ("m1",)
    assert probe.inputs["x"].nonzero == ((0, 0, "6000"), (1, 0, "6000"))


def test_a_simulator_report_gives_no_evidence(tmp_path):
    doc = m1_macos_26()
    doc["backend"] = "sim"
    r = _load(tmp_path, doc)
    assert not r.hardware and r.evidence() == {} and r.numerics() == {}
    doc["chip"] = {"device": None, "generation": None}
    doc["macos"] = {"version": "", "major": ""}
    assert _load(tmp_path, doc).evidence() == {}


def test_a_failure_of_constructs_that_all_ran_elsewhere_refutes_none(tmp_path):
    doc = m1_macos_26()
    doc["rungs"] = [
        _rung("conv1x1", ["conv.baked"]),
        _rung("softmax_scores", ["softmax.scores"]),
        _rung("big", ["conv.baked", "softmax.scores"], failed_at="run"),
    ]
    ev = _load(tmp_path, doc).evidence()
    assert [e.refutes for es in ev.values() for e in es] == [False, False]


def test_a_failure_at_load_run_or_compare_refutes_too(tmp_path):
    doc = m1_macos_26()
    doc["rungs"] = [_rung(f"r_{s}", [c], failed_at=s) for s, c in
                    (("load", "gate.silu"), ("run", "gelu.tanh"), ("compare", "rope.slice-concat"))]  # fmt: skip
    ev = _load(tmp_path, doc).evidence()
    assert {c: [(e.refutes, e.observed) for e in es] for c, es in ev.items()} == {
        "gate.silu": [(True, "smoke rung 'r_load' failed at load: load went wrong")],
        "gelu.tanh": [(True, "smoke rung 'r_run' failed at run: run went wrong")],
        "rope.slice-concat": [(True, "smoke rung 'r_compare' failed at compare: compare went wrong")],
    }


def test_an_unknown_chip_is_kept_without_evidence(tmp_path):
    doc = m1_macos_26()
    doc["chip"] = {"device": None, "generation": None}
    assert _load(tmp_path, doc).evidence() == {}


# -- malformed reports: one anekit error naming the field and what was expected ---------------------------


@pytest.mark.parametrize(
    "edit, field, expected",
    [
        (lambda d: d.update(schema="other"), "schema", "'anekit-doctor-report'"),
        (lambda d: d.update(version=2), "version", "1 (the only version"),
        (lambda d: d.update(version=True), "version", "1 (the only version"),
        (lambda d: d.update(backend="gpu"), "backend", "one of ane, sim"),
        (lambda d: d["chip"].update(device="m7"), "chip.device", "a device anekit.engine.chips knows"),
        (lambda d: d["chip"].update(device="M1 Pro"), "chip.device", "its canonical name 'm1-pro'"),
        (lambda d: d["chip"].update(generation="m2"), "chip.generation", "'m1' (the generation of m1)"),
        (lambda d: d["macos"].update(version="twenty-six"), "macos.version", "a macOS version"),
        (lambda d: d["macos"].update(major="15"), "macos.major", "'26' (the first number"),
        (lambda d: d.update(when="yesterday"), "when", "a UTC time"),
        (lambda d: d.update(rungs={}), "rungs", "an array"),
        (lambda d: d["rungs"][1]["constructs"].append("matmul.magic"), "rungs[1].constructs[1]",
         "a construct id of anekit.engine"),
        (lambda d: d["rungs"][1]["compile"].update(outcome="maybe"), "rungs[1].compile.outcome",
         "one of ok, failed, not run"),
        (lambda d: d["rungs"][2]["load"].update(outcome="ok"), "rungs[2].load.outcome", "'not run'"),
        (lambda d: d["rungs"][2]["compile"].update(error=None), "rungs[2].compile.error",
         "the error line of the failed stage"),
        (lambda d: d["rungs"][1]["run"].update(ms=-1), "rungs[1].run.ms", "null or milliseconds"),
        (lambda d: d["rungs"][1]["run"].update(ms="fast"), "rungs[1].run.ms", "null or milliseconds"),
        (lambda d: d["rungs"][0].pop("compare"), "rungs[0].compare", "a value (the field is required)"),
        (lambda d: d["rungs"][0].update(extra=1), "rungs[0].extra", "no such field"),
        (lambda d: d["probes"][0].update(id="mac.magic"), "probes[0].id", "a behaviour id"),
        (lambda d: d["probes"][0].update(got=["7C00"]), "probes[0].got[0]", "fp16 bits as 4 lower-case hex"),
        (lambda d: d["probes"][0].update(got=["7c00", "7c00"]), "probes[0].got", "1 values"),
        (lambda d: d["probes"][0]["expected"].update(m9=["7c00"]), "probes[0].expected key", "one of m1"),
        (lambda d: d["probes"][0]["inputs"]["x"].update(nonzero=[[64, 0, "6000"]]),
         "probes[0].inputs.x.nonzero[0]", "a channel under 64"),
        (lambda d: d["probes"][1].update(error=None), "probes[1].error", "why nothing was read"),
        (lambda d: d.update(route=3), "route", "'unknown' or an object"),
        (lambda d: d["route"].update(evidence=[""]), "route.evidence[0]", "a non-empty string"),
    ],
)  # fmt: skip
def test_a_malformed_field_is_named(tmp_path, edit, field, expected):
    doc = m1_macos_26()
    edit(doc)
    with pytest.raises(rep.ReportError) as e:
        _load(tmp_path, doc)
    said = str(e.value)
    assert said.startswith(f"[report] {tmp_path / 'm1-26.json'}: field '{field}': expected {expected}"), said


def test_not_an_object_and_not_json_are_named(tmp_path):
    with pytest.raises(rep.ReportError, match="the document: expected an object, got 'an array'"):
        _load(tmp_path, "[]")
    with pytest.raises(AnekitError, match=r"m1-26.json: not JSON"):
        _load(tmp_path, '{"schema": ')
    with pytest.raises(AnekitError, match="not UTF-8"):
        _load(tmp_path, b'{"schema": "\xff"}')


def _leaves(x, path=()):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _leaves(v, (*path, i))
    yield path


def _set(doc, path, value):
    if not path:
        return value
    target = doc
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return doc


def test_every_field_given_a_wrong_type_is_an_anekit_error(tmp_path):
    """Every value of the document (leaf or not) replaced by each JSON type in turn: loaded or refused
    with an anekit error, never another exception."""
    base = m1_macos_26()
    refused = 0
    for path in _leaves(base):
        for wrong in (None, True, 7, 1.5, "x", [], {}, [1, 2], {"a": 1}):
            doc = _set(copy.deepcopy(base), path, wrong)
            try:
                rep.from_json(doc, "[report] fuzz")
            except rep.ReportError as e:
                assert str(e).startswith("[report] fuzz: "), e
                refused += 1
    assert refused > 300


def test_truncated_and_mutated_files_are_anekit_errors(tmp_path):
    text = json.dumps(m1_macos_26(), indent=2).encode("utf-8")
    path = tmp_path / "r.json"
    for cut in range(0, len(text) - 1, 7):  # every 7th truncation
        path.write_bytes(text[:cut])
        with pytest.raises(AnekitError):
            rep.load_report(path)
    rng = random.Random(30)
    loaded = 0
    for _ in range(400):
        data = bytearray(text)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            rep.load_report(path)
            loaded += 1
        except AnekitError:
            pass
    assert loaded < 400  # most mutations are refused; the rest (inside a string, a digit) load


def test_a_huge_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(rep.MAX_BYTES + 1)  # sparse: nothing is written

    def no_open(*a, **k):
        raise AssertionError("the file was opened")

    monkeypatch.setattr("anekit.inputs.os.open", no_open)
    with pytest.raises(InputError, match=f"{rep.MAX_BYTES + 1} bytes, over the {rep.MAX_BYTES}-byte limit"):
        rep.load_report(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="a FIFO"):
        rep.load_report(fifo)


# -- the shipped reports --------------------------------------------------------------------------------------


def test_no_report_is_shipped_yet_and_the_folder_is_package_data():
    shipped = sorted(p.name for p in rep.SHIPPED.iterdir())
    assert shipped == ["README.md"]  # no invented report: only what a user ran and sent goes there
    assert rep.shipped_reports() == () and rep.shipped_evidence() == {}
    pyproject = (ROOT / "pyproject.toml").read_text()  # tomllib is 3.11+: the section read as text
    section = pyproject.split("[tool.setuptools.package-data]\n", 1)[1].split("\n[", 1)[0]
    assert '"anekit.engine" = ["reports/*.json", "reports/README.md"]' in section
    assert rep.SHIPPED == ROOT / "src" / "anekit" / "engine" / "reports"


def test_shipped_evidence_merges_every_report_in_the_folder(tmp_path):
    rep.write_report(tmp_path / "a.json", rep.from_json(m1_macos_26()))
    m4 = m1_macos_26()
    m4["chip"] = {"device": "m4-max", "generation": "m4"}
    m4["rungs"] = [_rung("matmul_activations", ["matmul.activations"])]
    rep.write_report(tmp_path / "b.json", rep.from_json(m4))
    (tmp_path / "notes.txt").write_text("not a report")
    ev = rep.shipped_evidence(tmp_path)
    matmul = ev["matmul.activations"]
    assert [(e.chips, e.refutes) for e in matmul] == [(("m1",), True), (("m1",), True), (("m4",), False)]
    assert matmul[2].source == "anekit doctor report m4-max macOS 26.3 (b.json)"


def test_the_vocabulary_is_the_engine_layers_construct_ids():
    """The ids a report may name are the engine layer's constructs, the version-1 vocabulary among them."""
    from anekit.engine.constructs import CONSTRUCTS

    ids = rep.construct_ids()
    assert ids == tuple(CONSTRUCTS) and set(rep.VOCABULARY) <= set(ids)
    assert len(set(rep.VOCABULARY)) == len(rep.VOCABULARY) == 12
