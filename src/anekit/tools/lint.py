"""Lint paths: every program the loader finds at them, checked against the rule book.

A target is a ``.mil`` file (its BLOBFILE weights resolved next to it, as ``@model_path`` is), a CoreML
package (the program inside, its weights, and the package-scope rules), a directory (every ``.mil``
below it: a kernel dump, a compiled model's folder), or a Python file whose module-level programs are
linted after running it (``anekit.tools.loader.python_programs``: its ``__main__`` block does not run,
what it prints goes to stderr). Read, parse and verify problems are results of their own
(``mil.syntax``), so one bad file never hides the others. A macOS version ("26", "15.3") judges every
program under that major version: evidence observed under other versions does not count
(``anekit.engine.evidence.POLICY``).
"""

from __future__ import annotations

from pathlib import Path

from anekit.engine.evidence import check_macos, check_route
from anekit.errors import AnekitError
from anekit.inputs import InputError, shown
from anekit.rules.checks import check_chip, check_package
from anekit.rules.lint import LintResult, lint_program
from anekit.tools.loader import Kind, Loaded, load, locate

WHERE = "[lint]"


def lint_paths(
    paths: list[Path], chip: str = "any", route: str | None = None, macos: str = ""
) -> list[LintResult]:
    """Lint every program found in ``paths`` (files and directories) for ``chip`` and ``route`` (None:
    ``direct`` for programs, ``coreml`` for the program inside a CoreML package) under macOS ``macos``
    ("": every version)."""
    check_chip(chip)
    if route is not None:
        check_route(route, "lint")
    check_macos(macos, "lint")
    results: list[LintResult] = []
    for path in paths:
        for kind, file in locate(path, WHERE, "tree", expected="a file to lint"):
            results.extend(lint_file(kind, file, chip, route, macos))
    return results


def lint_file(
    kind: Kind, path: Path, chip: str = "any", route: str | None = None, macos: str = ""
) -> list[LintResult]:
    """The results for one file ``locate`` found; a file that cannot be read, parsed or verified (or a
    package that does not load) is one result holding that problem. A Python file that does not run,
    or defines no program, is refused."""
    if kind == "python":
        return [lint_loaded(p, chip, route, macos) for p in load(kind, path, WHERE)]
    try:
        (loaded,) = load(kind, path, WHERE)
    except InputError as e:  # a FIFO named *.mil in a directory, a device, a file over the limit, ...
        return [LintResult(str(path), problem=str(e).replace(f" {shown(path)}:", ":", 1))]
    except AnekitError as e:
        return [LintResult(str(path), problem=str(e).splitlines()[0])]
    return [lint_loaded(loaded, chip, route, macos)]


def lint_loaded(loaded: Loaded, chip: str = "any", route: str | None = None, macos: str = "") -> LintResult:
    """One loaded program checked: its weight files (a Python file's programs: not checked), the values
    whose file is not there, and a package's package-scope rules."""
    if loaded.kind == "python":
        return lint_program(loaded.program, loaded.target, chip, route=route or "direct", macos=macos)
    folder = loaded.path.parent
    missing = [f"const '{c.const}' reads {c.path}, which is not in {folder}" for c in loaded.missing]
    result = lint_program(
        loaded.program,
        loaded.target,
        chip,
        dict(loaded.weights),
        route or loaded.route or "direct",
        missing,
        macos,
    )
    if loaded.weight_bytes is not None:
        result.findings.extend(check_package(loaded.weight_bytes, loaded.target, chip))
    return result
