"""``anekit mil check FILE...`` (parse + verify) and ``anekit mil fmt FILE`` (canonical text)."""

from __future__ import annotations

import argparse
import stat
import sys
from pathlib import Path

from anekit import mil
from anekit.errors import AnekitError
from anekit.inputs import LIMITS, read_text, stat_input
from anekit.words import plural


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mil", help="work with MIL text: check (parse and verify) and fmt (canonical form)")
    msub = p.add_subparsers(dest="mil_command", metavar="ACTION")
    msub.required = True
    check = msub.add_parser("check", help="parse and verify MIL files; one line per file")
    check.add_argument("files", nargs="+", type=Path, metavar="FILE", help="MIL text files")
    check.set_defaults(run=run_check)
    fmt = msub.add_parser("fmt", help="print a MIL file in canonical form")
    fmt.add_argument("file", type=Path, metavar="FILE", help="a MIL text file")
    fmt.add_argument("--no-verify", action="store_true", help="format even if the program does not verify")
    fmt.set_defaults(run=run_fmt)


def _read(path: Path) -> str:
    """The text of a MIL file; one line saying why not (a directory, a package, a FIFO, not UTF-8, ...)."""
    st = stat_input(path, "[mil] cannot read")
    if st is not None and stat.S_ISDIR(st.st_mode) and path.suffix in (".mlpackage", ".mlmodelc"):
        raise AnekitError(
            f"[mil] cannot read {path}: a CoreML package: `anekit lint` checks the program inside it, "
            "`anekit inspect` describes it"
        )
    return read_text(path, "[mil] cannot read", LIMITS["mil"], "a MIL text file")


def run_check(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            prog = mil.verify(mil.parse(_read(path), str(path)))
        except AnekitError as e:
            failed += 1
            print(f"{path}: FAIL {e.one_line()}", file=sys.stderr)
            continue
        sigs = "; ".join(fn.signature() for fn in prog.functions.values())
        print(f"{path}: ok, {plural(prog.op_count(), 'op')}, {sigs}")
    return 1 if failed else 0


def run_fmt(args: argparse.Namespace) -> int:
    prog = mil.parse(_read(args.file), str(args.file))
    if not args.no_verify:
        mil.verify(prog)
    sys.stdout.write(mil.to_text(prog))
    return 0
