"""``anekit inspect FILE [--json]`` and ``anekit inspect --diff A B``: recognise artifacts by their content,
describe them, and show what differs between two of one kind."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from anekit.errors import AnekitError
from anekit.inspect import dispatch
from anekit.words import plural


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="describe an artifact: .hwx, task descriptors, E5 descriptors, MILBlob weights, MIL, "
        "llama2.c / BLZT / tokenizer files, CoreML bundles and their metadata.json / coremldata.bin, raw "
        "ANECompiler .weights, `anekit kernels dump` directories",
        description="Recognise FILE by its content (not its name) and describe it; with --diff, show "
        "field by field what differs between two files of the same kind.",
    )
    p.add_argument("file", type=Path, nargs="?", metavar="FILE", help="the file (or directory) to describe")
    p.add_argument("--diff", type=Path, nargs=2, metavar=("A", "B"), help="compare two files of one kind")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.set_defaults(run=run)


def _json_default(value: Any) -> Any:
    """numpy scalars and bytes a decoder may leave in a summary."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


def _print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=_json_default)
    sys.stdout.write("\n")


def run(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.diff is None):
        raise AnekitError("[inspect] give one FILE to describe, or --diff A B to compare two files")
    if args.diff is not None:
        result = dispatch.diff(*args.diff)
        if args.json:
            _print_json(result)
        else:
            sys.stdout.write("\n".join(dispatch.render_diff(result)) + "\n")
        return 0
    kind, info = dispatch.inspect_path(args.file)
    if args.json:
        _print_json(info)
    else:
        sys.stdout.write("\n".join(dispatch.render(kind, info)) + "\n")
    found = dispatch.problems(kind, info)
    if found:  # described above, and failed: the first problem is the one line, the description has all
        sys.stdout.flush()
        more = (
            f" (and {plural(len(found) - 1, 'more problem')}: see the description)" if len(found) > 1 else ""
        )
        raise AnekitError(found[0] + more)
    return 0
