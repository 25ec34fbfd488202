"""The help of every command that takes a Hugging Face model directory says so (``sample MODEL``,
``export MODEL``, ``train --init MODEL``)."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from anekit.cli.main import build_parser

ENTRIES = [
    ("sample", "positional arguments: MODEL "),
    ("export", "positional arguments: MODEL "),
    ("train", " --init MODEL "),
]


def _help(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    return " ".join(out.getvalue().split())  # argparse's wrapping undone


def _entry(text: str, start: str) -> str:
    """The help of one argument: from ``start`` to the next option."""
    return re.split(r" --?[a-z]", text[text.index(start) + len(start) :], maxsplit=1)[0]


@pytest.mark.parametrize(("command", "start"), ENTRIES)
def test_the_model_argument_says_it_may_be_a_hugging_face_model_directory(command: str, start: str) -> None:
    text = _help(command)
    assert "Hugging Face model directory" in _entry(text, start), text
