"""Entry point of the ``anekit`` command: parses the subcommand and reports anekit errors cleanly.

Two kinds of error, each with its own form:

- **Usage errors** (exit status 2, argparse's form: the usage, then ``anekit CMD: error: ...``): what
  the command line alone shows to be wrong — an unknown flag or command, a missing argument, a value
  that does not parse as its type, lies outside its range (the message names the range), is not one of
  a flag's fixed choices or names nothing in the table it is looked up in (``--config`` presets,
  ``--chip``, ``--route``: the message lists the known names; see ``anekit.cli.flags``). Nothing is
  read or written.
- **anekit errors** (exit status 1, one line on stderr: ``anekit: [where] what``): everything found
  after that — input files, output locations (``anekit.outputs``), flags that contradict each other or
  the input, the program or model itself. Outputs are left as they were.

Every command's ``--help`` opens with a description: its own, or else its one-line summary.
"""

from __future__ import annotations

import os

# The kernels' host-side matrices are small: BLAS thread hand-offs cost more than they save (a
# training step of the default model runs ~3x faster single-threaded). Set before numpy loads;
# the user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from anekit import __version__
from anekit.cli import (
    cost_cmd,
    demo,
    doctor_cmd,
    export_cmd,
    inspect_cmd,
    kernels_cmd,
    lint_cmd,
    mil_cmd,
    run_cmd,
    sample_cmd,
    train_cmd,
)
from anekit.errors import AnekitError


class _Subcommands(argparse._SubParsersAction):
    """Subcommands whose ``--help`` opens with their one-line summary when they have no description."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        summary = kwargs.get("help")
        if kwargs.get("description") is None and summary:
            kwargs["description"] = summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else ".")
        return super().add_parser(name, **kwargs)


class _Parser(argparse.ArgumentParser):
    """anekit's parsers: their subcommands (and theirs, which are ``_Parser`` too) are ``_Subcommands``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="anekit", description="Program the Apple Neural Engine directly.")
    parser.add_argument("--version", action="version", version=f"anekit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    train_cmd.add_parser(sub)
    sample_cmd.add_parser(sub)
    mil_cmd.add_parser(sub)
    run_cmd.add_parser(sub)
    inspect_cmd.add_parser(sub)
    kernels_cmd.add_parser(sub)
    lint_cmd.add_parser(sub)
    export_cmd.add_parser(sub)
    cost_cmd.add_parser(sub)
    doctor_cmd.add_parser(sub)
    demo.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except AnekitError as e:
        print(f"anekit: {e.one_line()}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
