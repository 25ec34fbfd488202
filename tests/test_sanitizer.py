"""The sanitizer: each hazard found, with its op, count and largest offending value, in a program built to
trigger it; nothing reported for a program inside the envelope; the report's text and JSON forms; and
the sanitizer never changes a result."""

from __future__ import annotations

import json

import numpy as np
import pytest

from anekit import runtime
from anekit.errors import AnekitError
from tests.numerics_probe import fp16, probe, row

pytestmark = pytest.mark.usefixtures("fp16_path")  # every case with the compiled loops and without


def _hazards(backend) -> dict[str, dict]:
    return {h: v for rec in backend.sanitizer.records() for h, v in rec["hazards"].items()}


CASES = [
    ("mac-ceiling", "m1", lambda f, x: f.linear(x=x, weight=fp16(np.ones((1, 2)))), row(16384, 16384), 32768),
    (
        "mac-partial",
        "m1",
        lambda f, x: f.matmul(x=x, y=fp16(np.ones((10, 1)))),
        row(20000, 20000, 0, 0, -20000, -20000, 0, 0, 1, 1),
        2,
    ),
    ("nan-coerced", "any", lambda f, x: f.relu(x=x), row(np.nan, 1), np.inf),
    ("indeterminate", "any", lambda f, x: f.sub(x=x, y=x), row(np.inf, 1), 0),
    (
        "subnormal-flush",
        "m1",
        lambda f, x: f.matmul(x=x, y=fp16(np.ones((2, 1)))),
        row(2.0**-24, 2.0**-24),
        0,
    ),
    (
        "slice-saturated",
        "m2",
        lambda f, x: f.slice_by_size(x=x, begin=[0, 1], size=[1, 3]),
        row(0, 5000, -6000, 1),
        6000,
    ),
    ("table-domain", "any", lambda f, x: f.sigmoid(x=x), row(-20, 0, 30), 30),
    ("table-collapse", "any", lambda f, x: f.softplus(x=x), row(12, 1), 12),
    ("signed-zero", "m1", lambda f, x: f.real_div(x=1.0, y=x), row(-0.0, 2), 0),
    ("round-shift", "m5", lambda f, x: f.round(x=x), row(1024, 3.2), 1024),
]


@pytest.mark.parametrize("hazard, chip, body, x, largest", CASES, ids=[c[0] for c in CASES])
def test_each_hazard_is_found(hazard, chip, body, x, largest):
    _, backend = probe(body, chip, sanitize=True, x=x)
    found = _hazards(backend)
    assert hazard in found, found
    assert found[hazard]["count"] >= 1
    assert found[hazard]["largest"] == pytest.approx(largest, rel=0.01) or largest == 0


def test_nothing_reported_inside_the_envelope():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64))
    w = np.sign(w) * (0.01 + 0.1 * np.abs(w))  # no weight near an fp16 subnormal
    body = lambda f, x: f.relu(x=f.matmul(x=x, y=fp16(w)))  # noqa: E731
    _, backend = probe(body, "m1", sanitize=True, x=rng.standard_normal((8, 64)).astype(np.float32))
    assert backend.sanitizer.records() == [] and backend.sanitizer.summary() == ""


@pytest.mark.parametrize("hazard, chip, body, x, largest", CASES, ids=[c[0] for c in CASES])
def test_the_sanitizer_changes_no_result(hazard, chip, body, x, largest):
    plain = probe(body, chip, x=x)
    watched, _ = probe(body, chip, sanitize=True, x=x)
    np.testing.assert_array_equal(plain, watched)


def test_report_forms():
    _, backend = probe(lambda f, x: f.relu(x=f.sub(x=x, y=x)), "any", sanitize=True, x=row(np.nan, np.inf))
    lines = backend.sanitizer.lines()
    assert lines[0].startswith("x (input): nan-coerced 1")
    assert any(line.startswith("sub_0 (sub): indeterminate 2") for line in lines)
    summary = backend.sanitizer.summary()
    assert "nan-coerced 1 at x" in summary and "indeterminate 2 at sub_0" in summary
    assert json.loads(backend.sanitizer.to_json())[0]["op"] == "x"


def test_sanitize_needs_the_simulators_engine_numerics():
    with pytest.raises(AnekitError, match=r"\[sim\] sanitize .* numerics 'engine'"):
        runtime.open("sim", sanitize=True, numerics="ieee")
    with pytest.raises(AnekitError, match=r"backend 'ane' runs the engine itself: sanitize"):
        runtime.check_numerics_options("ane", {"sanitize": True})
    runtime.check_numerics_options("sim", {"sanitize": True, "chip": "m1"})  # the simulator takes them


def test_unknown_chip_and_missing_data_are_one_line_errors():
    from anekit.engine import behaviour

    with pytest.raises(AnekitError, match=r"\[numerics\] unknown chip 'm9' \(choose one of: any, m1"):
        runtime.open("sim", chip="m9")
    with pytest.raises(AnekitError, match=r"no data for behaviour 'mac.subnormal-flush' on m3"):
        behaviour("mac.subnormal-flush").finding("m3")
    with pytest.raises(AnekitError, match=r"unknown behaviour 'mac.nope'"):
        behaviour("mac.nope")


def test_anekit_run_sanitize_text_and_json(tmp_path, capsys):
    from anekit.cli.main import main

    prog = tmp_path / "p.mil"
    prog.write_text(
        "program(1.3)\n{\n    func main<ios18>(tensor<fp16, [1, 64, 1, 32]> x) {\n"
        '            tensor<fp16, [1, 64, 1, 32]> y = mul(x = x, y = x)[name = string("y")];\n'
        '            tensor<fp16, [1, 64, 1, 32]> z = sub(x = y, y = y)[name = string("z")];\n'
        "    } -> (z);\n}\n"
    )
    x = np.full((1, 64, 1, 32), 300, np.float32)
    np.save(tmp_path / "x.npy", x)
    args = ["run", str(prog), "--input", f"x={tmp_path / 'x.npy'}", "--sanitize", "--chip", "m1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "(chip m1, numerics engine)" in out and "z (sub): indeterminate 2048" in out
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chip"] == "m1" and report["sanitizer"][0]["hazards"]["indeterminate"]["count"] == 2048
    for argv in (["run", str(prog), "--random", "1"], ["train", "--out", str(tmp_path / "t")]):
        with pytest.raises(SystemExit) as info:  # an unknown name is a usage error
            main([*argv, "--chip", "m7"])
        assert info.value.code == 2 and "unknown chip 'm7'" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()  # refused before anything was written


def test_anekit_train_sanitize_prints_one_line_per_checkpoint(tmp_path, monkeypatch, capsys):
    from anekit.cli.main import main

    monkeypatch.setenv("ANEKIT_CACHE", str(tmp_path / "cache"))
    base = ["train", "--steps", "4", "--checkpoint-every", "2", "--sample-steps", "0", "--chip", "m1"]
    assert main([*base, "--out", str(tmp_path / "a"), "--sanitize"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("sanitizer, steps up to")]
    assert [ln.split(":")[0] for ln in lines] == ["sanitizer, steps up to 2", "sanitizer, steps up to 4"]
    assert main([*base, "--out", str(tmp_path / "b")]) == 0
    a, b = (tmp_path / d / "loss.csv" for d in "ab")
    assert a.read_bytes() == b.read_bytes()  # the sanitizer changes no number of the run


def test_a_flushed_mac_operand_is_flushed_for_the_mac_only():
    """The MAC reads a subnormal operand as +0, but an elementwise op reading the same value keeps it (the
    engine keeps subnormals on the elementwise path), however the simulator flushes it."""
    tiny = 2.0**-24

    def body(f, x):
        y = f.mul(x=x, y=1.0)  # a fresh value holding subnormals
        a = f.matmul(x=y, y=fp16(np.ones((2, 2))))  # the MAC: flushed
        b = f.add(x=y, y=0.0)  # elementwise: kept
        return f.concat(values=(a, b), axis=1)

    out = probe(body, "m1", x=row(tiny, tiny))
    assert out.tolist() == [[0.0, 0.0, tiny, tiny]]
    square = probe(
        lambda f, x: f.matmul(x=f.mul(x=x, y=1.0), y=fp16(np.ones((2, 2)))), "m5", x=row(tiny, tiny)
    )
    assert square.tolist() == [[2 * tiny, 2 * tiny]]  # M5 keeps them
