"""Lint one program: the rule book's checks over it, its weight files and the ones it lacks, as a result
that prints one finding per line or goes into JSON.

Finding the programs (in files, directories, CoreML packages, Python files) is the loader's work
(``anekit.tools.loader``); ``anekit.tools.lint`` joins the two for ``anekit lint``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from anekit.mil.ir import Program
from anekit.rules.checks import Finding, WeightFiles, check_program


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
    weights: WeightFiles | None = None,
    route: str = "direct",
    missing_weights: Iterable[str] = (),
    macos: str = "",
) -> LintResult:
    """Check one program for ``chip`` and ``route`` ("direct": the in-memory route, "e5rt", or "coreml"
    for a package's program, whose buffers are CoreML's) under macOS ``macos`` ("15", "26.3"; "": every
    version). ``weights``: the files its BLOBFILE paths resolve to (None: not checked);
    ``missing_weights``: one line per value whose file is not there."""
    return LintResult(
        target, check_program(program, chip, weights, route, macos), missing_weights=list(missing_weights)
    )
