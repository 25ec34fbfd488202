"""Every flag of every command (``train`` aside: its flags are its own work) has help text, every numeric
flag shows its default and range in ``--help``, and ``--config default`` works wherever a preset does."""

from __future__ import annotations

import argparse
import re

import pytest

from anekit.cli import flags
from anekit.cli.main import build_parser, main

OWN_FLAGS_ELSEWHERE = {"train"}  # resume, its flags and signals are handled with the trainer


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """(name, parser) of every leaf command: ``run``, ``kernels dump``, ``mil check`` ..."""
    found = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found.append((name, parser))
        for sub in subs:
            for child, p in sub.choices.items():
                walk(f"{name} {child}".strip(), p)

    walk("", build_parser())
    return [(n, p) for n, p in found if n.split()[0] not in OWN_FLAGS_ELSEWHERE]


COMMANDS = _commands()


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize(("name", "parser"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_argument_has_help(name: str, parser: argparse.ArgumentParser) -> None:
    missing = [a.dest for a in _arguments(parser) if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, f"anekit {name}: no help for {missing}"


@pytest.mark.parametrize(("name", "parser"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_numeric_flags_are_range_checked_and_show_their_default(name: str, parser: argparse.ArgumentParser):
    for action in _arguments(parser):
        if action.type in (int, float):
            pytest.fail(f"anekit {name} {action.dest}: a bare {action.type.__name__} (use anekit.cli.flags)")
        if getattr(action.type, "__name__", "") not in ("integer", "number"):
            continue
        text = action.help % {"default": action.default} if "%(default)" in action.help else action.help
        assert re.search(r"\d+ \.\. \d+|[\[(][-\d.e]+, [-\d.e]+|inf[\])]|>=? \d", text), (
            f"{name} {action.dest}: {text}"
        )
        assert "default" in text, f"anekit {name} {action.dest}: the default is not in its help: {text}"


def test_the_range_parsers_refuse_what_lies_outside() -> None:
    steps = flags.int_range(1, 10)
    assert steps("1") == 1 and steps("10") == 10
    for bad in ("0", "11", "-1", "1.0", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=r"1 \.\. 10"):
            steps(bad)
    top_p = flags.float_range(0, 1, lo_open=True)
    assert top_p("1") == 1.0 and top_p("1e-9") == 1e-9
    for bad in ("0", "1.01", "nan", "inf", "-inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"\(0, 1\]"):
            top_p(bad)
    assert flags.seed(str(flags.SEED_MAX)) == flags.SEED_MAX


def test_config_default_works_wherever_a_preset_does(tmp_path, capsys) -> None:
    """``default`` (anekit train's model) is a preset like the others: kernels dump, cost and doctor
    take it (sample and export: in test_cli_bad_input's table and here with a checkpoint's config)."""
    assert main(["kernels", "dump", "--config", "default", str(tmp_path / "k")]) == 0
    assert main(["cost", "--config", "default"]) == 0
    assert main(["cost", str(tmp_path / "k")]) == 0
    assert "default" in capsys.readouterr().out
    for name, parser in COMMANDS:
        for action in _arguments(parser):
            if "--config" in action.option_strings:
                assert "default" in action.help, f"anekit {name} --config help names the presets"
