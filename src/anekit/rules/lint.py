"""Lint targets: find the programs in files and directories and run the rule book's checks on each.

A target is a ``.mil`` file (its BLOBFILE weights resolved next to it, as ``@model_path`` is), a
CoreML package (``.mlpackage``: the program inside, its weights, and the package-scope rules), a
directory (every ``model.mil`` below it: a kernel dump, a compiled model's folder), or a Python file
whose module-level ``Program`` objects (and objects with a ``program`` attribute, e.g. a generated
``KernelSpec``) are linted after running it. Parse and verify problems are reported as findings of
their own (``mil.syntax``), so one bad file never hides the others.

Linting a Python file executes it, as ``python FILE`` would (its folder first on ``sys.path``,
``sys.argv == [FILE]``), except that its ``__name__`` is ``RUN_NAME``, not ``"__main__"``: an
``if __name__ == "__main__":`` block does not run. What it prints goes to stderr, so the findings (and
``--json``) own stdout.
"""

from __future__ import annotations

import contextlib
import runpy
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from anekit.engine.evidence import check_route
from anekit.errors import AnekitError
from anekit.inputs import LIMITS, InputError, check_input, kind_of, read_text, shown, stat_input
from anekit.mil import parse, verify
from anekit.mil.ir import Program
from anekit.mil.values import BlobRef, Literal
from anekit.rules.checks import Finding, WeightFiles, check_chip, check_package, check_program

MODEL_PATH = "@model_path/"
RUN_NAME = "__anekit_lint__"  # the __name__ a linted Python file runs under (not "__main__")


@dataclass
class LintResult:
    """The findings for one program (``problem`` set when it could not be read at all)."""

    target: str
    findings: list[Finding] = field(default_factory=list)
    problem: str | None = None
    missing_weights: list[str] = field(default_factory=list)  # BLOBFILEs whose file is not there

    @property
    def errors(self) -> int:
        return sum(f.is_error for f in self.findings) + (self.problem is not None) + len(self.missing_weights)

    @property
    def warnings(self) -> int:
        return sum(not f.is_error for f in self.findings)

    def lines(self) -> Iterator[str]:
        if self.problem is not None:
            yield f"{self.target}: mil.syntax error: {self.problem}"
        for missing in self.missing_weights:
            yield f"{self.target}: mil.weights error: {missing}"
        for f in self.findings:
            at = f":{f.line}" if f.line else ""
            yield f"{self.target}{at}: {f}"

    def as_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "problem": self.problem,
            "missing_weights": list(self.missing_weights),
            "findings": [f.as_dict() for f in self.findings],
        }


def lint_program(
    program: Program,
    target: str,
    chip: str = "any",
    weights_dir: Path | None = None,
    weights: WeightFiles | None = None,
    route: str = "direct",
) -> LintResult:
    """Check one program; BLOBFILE paths resolve through ``weights`` or against ``weights_dir`` (the
    ``@model_path`` folder). ``route``: "direct" (the in-memory route), "e5rt", or "coreml" for a
    package's program (its buffers are CoreML's)."""
    missing: list[str] = []
    if weights is None and weights_dir is not None:
        weights = _weight_files(program, weights_dir)
        missing = [
            f"const '{name}' reads {ref}, which is not in {weights_dir}"
            for name, ref in _blob_refs(program)
            if ref not in weights
        ]
    return LintResult(target, check_program(program, chip, weights, route), missing_weights=missing)


def lint_paths(paths: list[Path], chip: str = "any", route: str | None = None) -> list[LintResult]:
    """Lint every program found in ``paths`` (files and directories) for ``chip`` and ``route`` (None:
    ``direct`` for programs, ``coreml`` for the program inside a CoreML package)."""
    check_chip(chip)
    if route is not None:
        check_route(route, "lint")
    results: list[LintResult] = []
    for path in paths:
        st = stat_input(path, "[lint]")
        if st is None:
            raise AnekitError(f"[lint] {shown(path)}: no such file or directory")
        if stat.S_ISDIR(st.st_mode):
            if path.suffix == ".mlpackage":
                results.append(_lint_package(path, chip, route))
                continue
            found = sorted(path.rglob("*.mil"))
            if not found:
                raise AnekitError(f"[lint] {path}: no .mil file below this directory")
            results.extend(_lint_mil(p, chip, route or "direct") for p in found)
        elif not stat.S_ISREG(st.st_mode):  # a FIFO would block the open, a device never ends
            raise AnekitError(f"[lint] cannot read {shown(path)}: {kind_of(st.st_mode)}, not a file to lint")
        elif path.suffix == ".mlmodel":
            results.append(_lint_package(path, chip, route))
        elif path.suffix == ".py":
            results.extend(_lint_python(path, chip, route or "direct"))
        else:
            results.append(_lint_mil(path, chip, route or "direct"))
    return results


def _lint_mil(path: Path, chip: str, route: str) -> LintResult:
    try:
        text = read_text(path, "cannot read", LIMITS["mil"], "a MIL text file")
    except InputError as e:  # a FIFO named *.mil in a directory, a device, a file over the limit, ...
        return LintResult(str(path), problem=str(e).replace(f" {shown(path)}:", ":", 1))
    try:
        program = verify(parse(text, str(path)))
    except AnekitError as e:
        return LintResult(str(path), problem=str(e).splitlines()[0])
    return lint_program(program, str(path), chip, path.parent, route=route)


def _lint_package(path: Path, chip: str, route: str | None) -> LintResult:
    """The program inside a CoreML package, then the package-scope rules (its weight size)."""
    from anekit.coreml import load_mlpackage

    try:
        pkg = load_mlpackage(path)
    except AnekitError as e:
        return LintResult(str(path), problem=str(e).splitlines()[0])
    result = lint_program(pkg.program, str(path), chip, weights=pkg.weights, route=route or "coreml")
    result.findings.extend(check_package(pkg.weight_bytes, str(path), chip))
    return result


@contextlib.contextmanager
def _as_script(path: Path) -> Iterator[None]:
    """``sys.argv`` and ``sys.path`` as ``python FILE`` sets them, and stdout sent to stderr, while the
    file runs; all restored after."""
    argv, search = sys.argv[:], sys.path[:]
    sys.argv[:] = [str(path)]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.argv[:], sys.path[:] = argv, search


def _lint_python(path: Path, chip: str, route: str) -> list[LintResult]:
    check_input(path, "[lint] cannot read", LIMITS["python"], "a Python file")
    try:
        with _as_script(path):
            namespace = runpy.run_path(str(path), run_name=RUN_NAME)
    except SystemExit as e:  # sys.exit() at module level: it stops the file, not anekit
        raise AnekitError(f"[lint] {path}: running it failed: it called sys.exit({e.code!r})") from None
    except Exception as e:  # the user's own code: any failure becomes one clear line
        raise AnekitError(f"[lint] {path}: running it failed: {type(e).__name__}: {e}") from e
    results = []
    for name, value in namespace.items():
        if name.startswith("_"):
            continue
        program = value if isinstance(value, Program) else _program_attribute(value)
        if isinstance(program, Program):
            results.append(lint_program(program, f"{path}::{name}", chip, route=route))
    if not results:
        raise AnekitError(f"[lint] {path}: defines no module-level Program (or object with a .program)")
    return results


def _program_attribute(value: object) -> object:
    """``value.program``, or None; a function builder (whose attributes build ops) has none."""
    try:
        return getattr(value, "program", None)
    except AnekitError:  # FunctionBuilder: "unknown op 'program'"
        return None


def _blob_refs(program: Program) -> list[tuple[str, str]]:
    """(const name, BLOBFILE path) of every weight the program reads from a file."""
    refs = []
    for fn in program.functions.values():
        for op in fn.ops:
            val = op.attributes.get("val")
            if isinstance(val, Literal) and isinstance(val.value, BlobRef):
                refs.append((op.outputs[0].name if op.outputs else op.name, val.value.path))
    return refs


def _weight_files(program: Program, folder: Path) -> dict[str, Path]:
    """BLOBFILE path -> file, for the referenced files that exist under ``folder``."""
    files: dict[str, Path] = {}
    for fn in program.functions.values():
        for op in fn.ops:
            val = op.attributes.get("val")
            if isinstance(val, Literal) and isinstance(val.value, BlobRef):
                ref = val.value.path
                if ref.startswith(MODEL_PATH):
                    candidate = folder / ref[len(MODEL_PATH) :]
                    if candidate.is_file():
                        files[ref] = candidate
    return files
