"""``anekit lint FILE_OR_DIR... [--chip CHIP] [--route ROUTE] [--macos V] [--json]``: the rule book's
findings, one per line, each saying the chip, route (and macOS version) it was judged for and the rule's
verdict per chip on that route."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from anekit.cli import flags
from anekit.engine.evidence import check_macos
from anekit.errors import AnekitError
from anekit.rules import CHIPS, ROUTES
from anekit.rules.doc import markdown
from anekit.tools.lint import lint_paths
from anekit.tools.loader import is_package
from anekit.words import plural


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "lint",
        help="check MIL programs against what the Neural Engine accepts",
        description="Check .mil files, kernel dump directories, CoreML packages and Python files defining "
        "programs against the rule book. One finding per line: rule id, severity, where, why, source. Exit "
        "status 1 when an error rule fails. A Python file is executed to find its programs (its "
        "module-level Program objects): lint only files you would run; its `if __name__ == "
        '"__main__":` block is not run, and what it prints goes to stderr.',
    )
    p.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="FILE_OR_DIR",
        help=".mil file, directory, .mlpackage, or .py file (executed, as `python FILE` would, less its "
        "__main__ block)",
    )
    p.add_argument("--rules", action="store_true", help="print the rule book (Markdown) and exit")
    p.add_argument(
        "--chip",
        type=flags.chip,
        default="any",
        metavar="CHIP",
        help=f"the chip to check for: any, {', '.join(CHIPS)} (default: any — an error only where every chip "
        "refuses, a warning where some do)",
    )
    p.add_argument(
        "--route",
        type=flags.route,
        metavar="ROUTE",
        help=f"how the program reaches the engine: {', '.join(ROUTES)} (default: direct for MIL and Python "
        "files — the in-memory route anekit's backend drives —, coreml for packages)",
    )
    p.add_argument(
        "--macos",
        type=_macos,
        default="",
        metavar="V",
        help="the macOS version to judge for: a major version (15, 26) or a full one (15.3, 26.0.1); "
        "evidence observed under other major versions then does not count (default: none — all the evidence "
        "counts)",
    )
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--errors-only", action="store_true", help="print only findings of error severity")
    p.set_defaults(run=run_lint)


def run_lint(args: argparse.Namespace) -> int:
    if args.rules:
        print(markdown())
        return 0
    if not args.paths:
        raise AnekitError("[lint] name at least one FILE_OR_DIR (or --rules to list the rule book)")
    results = lint_paths(args.paths, args.chip, args.route, args.macos)
    if args.errors_only:
        for r in results:
            r.findings = [f for f in r.findings if f.is_error]
    errors = sum(r.errors for r in results)
    warnings = sum(r.warnings for r in results)
    if args.json:
        doc = {
            "chip": args.chip,
            "route": _route_said(args.route, args.paths),
            "macos": args.macos,
            "errors": errors,
            "warnings": warnings,
            "programs": [r.as_dict() for r in results],
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in results:
            for line in r.lines():
                print(line)
        route = _route_said(args.route, args.paths)
        os_ = f", macOS: {args.macos}" if args.macos else ""
        print(
            f"{plural(len(results), 'program')}: {plural(errors, 'error')}, {plural(warnings, 'warning')} "
            f"(chip: {args.chip}, route: {route}{os_})"
        )
    return 1 if errors else 0


def _route_said(route: str | None, paths: list[Path]) -> str:
    """The route(s) the programs were judged for: the one asked, else direct (coreml for packages)."""
    if route is not None:
        return route
    packages = any(is_package(p) for p in paths)
    return "direct (coreml for packages)" if packages else "direct"


def _macos(value: str) -> str:
    """``--macos``: a version number (argparse reports the problem as a usage error)."""
    try:
        check_macos(value, "lint")
    except AnekitError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("[lint] ")) from None
    return value.strip()
