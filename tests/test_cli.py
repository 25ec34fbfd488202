"""The ``anekit`` command: mil check / fmt and the demo, with clean errors and exit codes; every command's
``--help`` opens with a description."""

from __future__ import annotations

import argparse
import re

import pytest

from anekit import mil
from anekit.cli import demo
from anekit.cli.main import build_parser, main
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


def test_demo_times_compile_first_run_and_warm_run_apart(capsys):
    assert main(["demo"]) == 0
    text = capsys.readouterr().out
    timings = re.findall(
        r"compile [\d.]+ ms, first run [\d.]+ ms, warm run [\d.]+ ms \(median of (\d+)\)", text
    )
    assert timings == [str(demo.WARM_RUNS)] * 2, text
    assert "a warm run is the kernel alone" in text


def _demo_ends() -> list[tuple[str, list[str]]]:
    """Each end of each demo flag's range, with the other flags it needs to make a valid layer."""
    needs = {  # heads must divide dim into heads of an even size; kv heads must divide heads
        ("--dim", "lo"): ["--heads", "1", "--kv-heads", "1"],
        ("--heads", "lo"): ["--kv-heads", "1"],
        ("--heads", "hi"): ["--dim", "128", "--kv-heads", "64"],
        ("--kv-heads", "hi"): ["--dim", "128", "--heads", "64"],
    }
    ends = []
    for flag, _, lo, hi, _ in demo.DEMO_FLAGS:
        for end, value in (("lo", lo), ("hi", hi)):
            ends.append((f"{flag}={value}", [flag, str(value), *needs.get((flag, end), [])]))
    return ends


@pytest.mark.parametrize(("end", "argv"), _demo_ends(), ids=[e for e, _ in _demo_ends()])
def test_demo_runs_at_each_end_of_the_ranges_its_help_advertises(end, argv, capsys):
    """What ``demo --help`` advertises, the strict simulator compiles; one step outside is a usage error."""
    flag, value = argv[0], int(argv[1])
    lo, hi = next((lo, hi) for f, _, lo, hi, _ in demo.DEMO_FLAGS if f == flag)
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert f"{lo} .. {hi} (default" in " ".join(capsys.readouterr().out.split())
    assert main(["demo", *argv]) == 0, capsys.readouterr().err
    outside = str(value - 1 if value == lo else value + 1)
    with pytest.raises(SystemExit) as e:
        main(["demo", flag, outside, *argv[2:]])
    assert e.value.code == 2 and f"must be in {lo} .. {hi}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("model.mlpackage", "a CoreML package: `anekit lint` checks the program inside it"),
        ("folder", "a directory, not a MIL text file"),
    ],
)
def test_mil_check_of_a_directory_says_what_it_is(name, says, tmp_path, capsys):
    (tmp_path / name).mkdir()
    assert main(["mil", "check", str(tmp_path / name)]) == 1
    err = capsys.readouterr().err
    assert err == f"{tmp_path / name}: FAIL [mil] cannot read {tmp_path / name}: {says}" + (
        ", `anekit inspect` describes it\n" if name.endswith("mlpackage") else "\n"
    )
    assert "Errno" not in err


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    found = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child, p in action.choices.items():
                    walk(f"{name} {child}".strip(), p)

    walk("", build_parser())
    return found[1:]


@pytest.mark.parametrize(("name", "parser"), _all_parsers(), ids=[n for n, _ in _all_parsers()])
def test_every_command_opens_its_help_with_a_description(name, parser):
    assert parser.description, f"anekit {name} --help has no description"
    help_text = parser.format_help()
    first = " ".join(parser.description.split()[:4])
    assert first in " ".join(help_text.split()), help_text
