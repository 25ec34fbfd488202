"""The anekit exception hierarchy: every error anekit raises derives from AnekitError."""

from __future__ import annotations

from typing import Any


def install_hint(extra: str) -> str:
    """How to install one of anekit's extras (``coreml``, ``hf``, ``fast``, ``plot``): anekit is installed
    from its checkout, not from a package index."""
    return f"pip install -e '.[{extra}]' in anekit's checkout"


class AnekitError(Exception):
    """Root of every error anekit raises on purpose."""

    def one_line(self) -> str:
        """The message on one line, as the command line prints it: a message listing several findings on
        their own lines (rules refused, types that do not match) keeps them, joined by "; "."""
        return "; ".join(line.strip() for line in str(self).splitlines() if line.strip())


class OptionError(AnekitError, ValueError):
    """An option given to an API that it does not take (a backend's precision or numerics, ...)."""


class FormatError(AnekitError, ValueError):
    """A binary or text file does not follow its format.

    Carries the format name, the field path, the byte offset, and the expected and actual values,
    so the message can say exactly where the input went wrong.
    """

    def __init__(
        self,
        fmt: str,
        field: str,
        message: str,
        *,
        offset: int | None = None,
        expected: Any = None,
        actual: Any = None,
    ) -> None:
        self.format = fmt
        self.field = field
        self.offset = offset
        self.expected = expected
        self.actual = actual
        where = f" at byte {offset:#x}" if offset is not None else ""
        detail = ""
        if expected is not None or actual is not None:
            detail = f" (expected {expected!r}, got {actual!r})"
        super().__init__(f"[{fmt}] {field}{where}: {message}{detail}")


class MilError(AnekitError):
    """Base of the errors about MIL programs."""


class MilSyntaxError(MilError, ValueError):
    """MIL text that does not parse; carries line, column and the offending line with a caret."""

    def __init__(
        self,
        message: str,
        *,
        line: int,
        column: int,
        line_text: str = "",
        source: str = "",
        caret_column: int | None = None,
    ) -> None:
        self.message = message
        self.line = line
        self.column = column
        self.line_text = line_text
        self.source = source
        where = f"{source}:" if source else ""
        text = f"[mil.parse] {where}{line}:{column}: {message}"
        caret = " " * ((caret_column or column) - 1) + "^"
        text += f"\n    {line_text}\n    {caret}"
        super().__init__(text)

    def one_line(self) -> str:
        """The first line, which says where (source:line:col) and what; the caret lines need a terminal."""
        return str(self).splitlines()[0]


class MilTypeError(MilError, TypeError):
    """An ill-typed op: names the op, its inputs' types and what was expected."""

    def __init__(
        self,
        op: str,
        message: str,
        *,
        input_types: dict[str, str] | None = None,
        where: str = "",
        problems: list[str] | None = None,
    ) -> None:
        self.op = op
        self.input_types = dict(input_types or {})
        self.problems = list(problems or [])  # every problem, when a verifier raises it for several
        self.reason = message
        self.where = where
        inputs = ", ".join(f"{k}: {v}" for k, v in self.input_types.items())
        loc = f" ({where})" if where else ""
        text = f"[{op}]{loc} {message}"
        if inputs:
            text += f"; inputs: ({inputs})"
        super().__init__(text)


class UnknownOpError(MilTypeError):
    """An op name the registry does not know."""

    def __init__(self, op: str, *, where: str = "") -> None:
        super().__init__(op, f"unknown op '{op}': no such op in the anekit MIL registry", where=where)


class MilVerifyError(MilError, ValueError):
    """A program that parses but breaks an IR rule (SSA, undefined use, type mismatch, missing output).

    ``problems`` lists every finding; the message shows them all.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        body = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"[mil.verify] {len(self.problems)} problem(s):\n{body}")


class MilDialectError(MilError, ValueError):
    """A program that cannot be written in the requested MIL dialect (e.g. an iOS18 op in ``ios16``).

    ``problems`` lists every op or type that does not fit; the message names each and the dialect.
    """

    def __init__(self, dialect: str, message: str, problems: list[str] | None = None) -> None:
        self.dialect = dialect
        self.problems = list(problems or [])
        body = "".join(f"\n  - {p}" for p in self.problems)
        super().__init__(f"[mil.dialect {dialect}] {message}{body}")


class BlobFormatError(FormatError):
    """A MILBlob v2 weight file that is truncated, corrupted or inconsistent."""

    def __init__(
        self, field: str, message: str, *, offset: int | None = None, expected: Any = None, actual: Any = None
    ) -> None:
        super().__init__("milblob", field, message, offset=offset, expected=expected, actual=actual)


class CoreMLFormatError(FormatError):
    """A CoreML package (.mlpackage) or model spec (.mlmodel) that anekit cannot read or write: names the
    file, the field (a protobuf field path, a Manifest key) or the op."""

    def __init__(
        self, field: str, message: str, *, offset: int | None = None, expected: Any = None, actual: Any = None
    ) -> None:
        self.reason = message
        super().__init__("mlpackage", field, message, offset=offset, expected=expected, actual=actual)


class CoreMLUnavailable(AnekitError, ImportError):
    """The CoreML entry points need coremltools' protobuf classes: the ``coreml`` extra is not installed."""


class AneRuntimeError(AnekitError):
    """Base of the runtime errors; they follow a kernel's lifecycle (create, compile, load, run, unload).

    Errors raised from a native ``NSError`` carry its ``domain``, ``code`` and ``description``.
    """

    domain: str | None = None
    code: int | None = None
    description: str | None = None


class SurfaceCreationFailed(AneRuntimeError):
    """A surface (IOSurface on the engine) could not be created, or was used with the wrong shape."""


class ClassNotFound(AneRuntimeError):
    """A private framework class is missing (the framework did not load, or changed)."""


class DescriptorCreationFailed(AneRuntimeError):
    """The model descriptor was rejected (MIL text or weight dictionary not accepted)."""


class ModelCreationFailed(AneRuntimeError):
    """The in-memory model object could not be allocated."""


class CompilationFailed(AneRuntimeError):
    """A program did not compile: bad MIL, unknown op, or a weight that does not fit its const."""


class LoadFailed(AneRuntimeError):
    """A compiled kernel could not be loaded (or was used while not loaded)."""


class EvalFailed(AneRuntimeError):
    """Running a kernel failed."""


class UnloadFailed(AneRuntimeError):
    """Unloading a kernel failed."""


class CompileBudgetExhausted(AneRuntimeError):
    """The backend has compiled as many programs as its budget allows (about 100 on the engine)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        super().__init__(
            f"[runtime] compile budget of {budget} programs is exhausted: the engine needs a fresh process "
            "(checkpoint and re-execute), or raise compile_budget on a backend that allows it"
        )
