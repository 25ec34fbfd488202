"""The ``anekit`` command: mil check / fmt and the demo, with clean errors and exit codes."""

from __future__ import annotations

import pytest

from anekit import mil
from anekit.cli.main import main
from tests.conftest import corpus_files
from tests.test_mil_parser import GENERATED


def test_mil_check_prints_one_line_per_file(tmp_path, capsys):
    good = tmp_path / "good.mil"
    good.write_text(GENERATED)
    assert main(["mil", "check", str(good)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{good}: ok, 15 ops, main<ios18>(x: tensor<fp16, [1, 64, 1, 16]>")


def test_mil_check_fails_on_a_bad_file_and_goes_on(tmp_path, capsys):
    good, bad, missing = tmp_path / "good.mil", tmp_path / "bad.mil", tmp_path / "missing.mil"
    good.write_text(GENERATED)
    bad.write_text(GENERATED.replace("y=x);", "y=x)"))
    assert main(["mil", "check", str(bad), str(good), str(missing)]) == 1
    captured = capsys.readouterr()
    assert f"{good}: ok" in captured.out
    assert f"{bad}: FAIL [mil.parse] {bad}:6:" in captured.err
    assert f"{missing}: FAIL [mil] cannot read" in captured.err


@pytest.mark.parametrize("path", corpus_files("mil", "*.mil"), ids=lambda p: p.name)
def test_mil_check_accepts_the_corpus(path, capsys):
    assert main(["mil", "check", str(path)]) == 0


def test_mil_fmt_prints_canonical_text(tmp_path, capsys):
    src = tmp_path / "k.mil"
    src.write_text(GENERATED)
    assert main(["mil", "fmt", str(src)]) == 0
    out = capsys.readouterr().out
    assert out == mil.to_text(mil.parse(GENERATED))
    assert "mul(x = x, y = x)" in out


def test_mil_fmt_reports_type_errors(tmp_path, capsys):
    src = tmp_path / "k.mil"
    src.write_text(GENERATED.replace("tensor<fp16, [1,64,1,16]> sq", "tensor<fp32, [1,64,1,16]> sq"))
    assert main(["mil", "fmt", str(src)]) == 1
    assert "[mul]" in capsys.readouterr().err


def test_demo_runs_and_checks_its_kernels(capsys):
    assert main(["demo", "--seq", "32"]) == 0
    text = capsys.readouterr().out
    assert text.count("round trip ok") == 2
    assert "All kernels round-trip as MIL text and match their float64 references" in text


def test_demo_exits_1_when_a_kernel_disagrees_with_its_reference(capsys, monkeypatch):
    from anekit.kernels import reference

    real = reference.ffn_fwd

    def off_by_a_bit(cfg, x, w):
        want = real(cfg, x, w)
        return {tap: v * 1.1 for tap, v in want.items()}  # 10% off: far beyond fp16 tolerance

    monkeypatch.setattr(reference, "ffn_fwd", off_by_a_bit)
    assert main(["demo", "--seq", "32"]) == 1
    assert "demo FAILED" in capsys.readouterr().err


def test_demo_rejects_a_config_the_engine_cannot_run(capsys):
    assert main(["demo", "--dim", "60", "--heads", "8"]) == 1
    assert "dim 60 is not divisible by n_heads 8" in capsys.readouterr().err
