"""Open "a program at this path": MIL text, a CoreML package, a compiled model, a kernels dump, a Python
file defining programs; each program with the weight files it reads.

One program (``open_program``, as ``anekit run`` takes it):

* a ``.mil`` file: its BLOBFILE weights found beside it (``@model_path`` is its folder), or in a location
  given with it (``anekit.tools.weights``);
* a CoreML package (``.mlpackage`` directory or ``.mlmodel`` file): the program inside, its weights, its
  default function; it takes the ``coreml`` route;
* a compiled model (a directory holding ``model.mil``, as an ``.mlmodelc``): that program and the
  weights beside it; ``coreml`` route too (CoreML allocates its buffers, as a package's).

Every program a path holds (``locate`` then ``load``, as ``anekit lint`` and ``anekit cost`` take them): a
file, a package, or a directory walked by one of two layouts, ``tree`` (every ``.mil`` below it) or
``dump`` (a kernels dump: each kernel folder's ``model.mil``, else the ``.mil`` files of a flat folder).
A Python file's programs are its module-level ``Program`` objects (and objects with a ``program``
attribute, e.g. a generated ``KernelSpec``) after running it (``python_programs``).

Every refusal is an ``AnekitError`` naming the path and what was expected there; ``where`` is the
"[command]" a message starts with.
"""

from __future__ import annotations

import contextlib
import runpy
import stat
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from anekit.errors import AnekitError
from anekit.inputs import LIMITS, InputError, check_input, kind_of, read_text, shown, stat_input
from anekit.mil import Program, parse
from anekit.mil import verify as verify_program
from anekit.tools.weights import BlobConst, beside, weight_map

Kind = Literal["mil", "package", "compiled", "python"]
Layout = Literal["tree", "dump"]

COMPILED_MIL = "model.mil"  # the program inside a compiled CoreML model (.mlmodelc) or a dump's kernel
PACKAGE_SUFFIXES = (".mlpackage", ".mlmodel")
PYTHON_SUFFIXES = (".py", ".pyw")
PACKAGE_ROUTE = "coreml"  # packages and compiled models: CoreML allocates their buffers
RUN_NAME = "__anekit_lint__"  # the __name__ a Python file runs under (not "__main__")


class PathKindError(AnekitError):
    """A path that holds nothing of the kinds expected there (a directory without a program, ...)."""


@dataclass(frozen=True)
class Loaded:
    """A program opened from a path: what it is, the weight files it reads and how it runs."""

    target: str  # how reports name it: the path, or "FILE.py::name" for a Python file's program
    path: Path  # the file or directory it was read from
    kind: Kind
    program: Program
    weights: Mapping[str, Path] = field(default_factory=dict)  # BLOBFILE path -> file
    missing: tuple[BlobConst, ...] = ()  # values whose weight file is not there
    function: str = "main"  # the function to run by default (a package names its own)
    route: str | None = None  # the route its kind implies ("coreml"); None: the caller's (direct)
    weight_bytes: int | None = None  # a package's total weight size

    @property
    def name(self) -> str:
        """A short name: a kernel folder's name for its ``model.mil``, else the file's stem."""
        return self.path.parent.name if self.path.name == COMPILED_MIL else self.path.stem


def is_package(path: Path) -> bool:
    """Whether ``path`` names a CoreML package by its suffix."""
    return path.suffix in PACKAGE_SUFFIXES


def read_mil(path: Path, what: str = "cannot read", *, verify: bool = True, kind: Kind = "mil") -> Loaded:
    """The MIL text file ``path`` parsed (and verified), with the weight files found beside it (those not
    there in ``missing``). ``what`` starts a read failure's message ("[run] cannot read")."""
    text = read_text(path, what, LIMITS["mil"], "a MIL text file")
    program = parse(text, str(path))
    if verify:
        program = verify_program(program)
    found = beside(program, path.parent)
    route = PACKAGE_ROUTE if kind == "compiled" else None
    return Loaded(str(path), path, kind, program, found.files, found.missing, route=route)


def read_package(path: Path) -> Loaded:
    """The program inside a CoreML package, its weights and its default function."""
    from anekit.coreml import load_mlpackage

    pkg = load_mlpackage(path)
    return Loaded(
        str(path),
        path,
        "package",
        pkg.program,
        dict(pkg.weights),
        function=pkg.default_function,
        route=PACKAGE_ROUTE,
        weight_bytes=pkg.weight_bytes,
    )


def program_kind(path: Path, where: str = "[load]") -> Kind:
    """What one program at ``path`` is: a package (by its suffix), a compiled model (a directory holding
    ``model.mil``) or MIL text (anything else, read as such); a directory without ``model.mil`` is
    refused."""
    if is_package(path):
        return "package"
    st = stat_input(path, f"{where} cannot read")
    if st is not None and stat.S_ISDIR(st.st_mode):
        if not (path / COMPILED_MIL).is_file():
            raise PathKindError(
                f"{where} cannot read {path}: a directory without a {COMPILED_MIL} "
                "(give a .mil file, a .mlpackage or a compiled .mlmodelc)"
            )
        return "compiled"
    return "mil"


def open_program(
    path: Path,
    weights: Path | None = None,
    *,
    where: str = "[load]",
    verify: bool = False,
    hint: str = "",
    label: str = "weights",
) -> Loaded:
    """The one program at ``path`` (MIL text, a package or a compiled model) with its weight files: a
    package's own; for MIL text, those ``weights`` holds (a model directory, a weights directory or one
    file; ``label`` names it in messages), else those beside the program, a missing one refused (its
    message ends with ``hint``). ``verify``: verify the program as well as parse it."""
    kind = program_kind(path, where)
    if kind == "package":
        if weights is not None:
            raise AnekitError(f"{where} {path}: a CoreML package carries its own weights")
        return read_package(path)
    file = path / COMPILED_MIL if kind == "compiled" else path
    loaded = read_mil(file, f"{where} cannot read", verify=verify, kind=kind)
    files = weight_map(weights, loaded.program, file.parent, where, hint, label)
    return Loaded(loaded.target, file, kind, loaded.program, files, route=loaded.route)


def locate(
    path: Path, where: str = "[load]", layout: Layout = "tree", expected: str = "a program file"
) -> list[tuple[Kind, Path]]:
    """Every program file ``path`` holds, with its kind: the file itself (by its suffix: an ``.mlmodel``,
    a Python file, else MIL text), a package directory, or the files a directory holds by ``layout``. A
    path that is not there, holds no program, or is neither a file nor a directory (``expected`` says
    what it should have been) is refused."""
    st = stat_input(path, f"{where} cannot read")
    if st is None:
        raise InputError(f"{where} {shown(path)}: no such file or directory")
    if stat.S_ISDIR(st.st_mode):
        if path.suffix == ".mlpackage":
            return [("package", path)]
        files = programs_below(path, where) if layout == "tree" else dump_programs(path, where)
        return [("mil", f) for f in files]
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the open, a device never ends
        raise InputError(f"{where} cannot read {shown(path)}: {kind_of(st.st_mode)}, not {expected}")
    if path.suffix == ".mlmodel":  # a package's model file on its own
        return [("package", path)]
    if path.suffix in PYTHON_SUFFIXES:
        return [("python", path)]
    return [("mil", path)]


def programs_below(directory: Path, where: str = "[load]") -> list[Path]:
    """Every ``.mil`` file below ``directory`` (a kernels dump, compiled models' folders), sorted."""
    found = sorted(directory.rglob("*.mil"))
    if not found:
        raise PathKindError(f"{where} {directory}: no .mil file below this directory")
    return found


def dump_programs(directory: Path, where: str = "[load]") -> list[Path]:
    """A kernels dump's programs: each kernel folder's ``model.mil`` (a folder that lost it is refused,
    unless no folder holds one), else the ``.mil`` files of a flat folder."""
    kernels = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    missing = [k.name for k in kernels if not (k / COMPILED_MIL).is_file()]
    if kernels and missing and len(missing) < len(kernels):  # a kernels dump with kernels lost
        raise PathKindError(f"{where} {directory}: kernel folder(s) {', '.join(missing)} hold no model.mil")
    files = sorted(directory.glob(f"*/{COMPILED_MIL}")) or sorted(directory.glob("*.mil"))
    if not files:
        raise PathKindError(f"{where} {directory}: no model.mil or .mil files in this directory")
    return files


def load(kind: Kind, path: Path, where: str = "[load]", what: str = "cannot read") -> list[Loaded]:
    """The programs of one file ``locate`` found: a MIL file's (parsed and verified), a package's, or a
    Python file's (``python_programs``)."""
    if kind == "package":
        return [read_package(path)]
    if kind == "python":
        return python_programs(path, where)
    return [read_mil(path, what, kind=kind)]


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


def python_programs(path: Path, where: str = "[load]") -> list[Loaded]:
    """The module-level programs of the Python file ``path``, after running it as ``python FILE`` would
    (its folder first on ``sys.path``, ``sys.argv == [FILE]``) but under ``__name__ == RUN_NAME``: an
    ``if __name__ == "__main__":`` block does not run. What it prints goes to stderr."""
    check_input(path, f"{where} cannot read", LIMITS["python"], "a Python file")
    try:
        with _as_script(path):
            namespace = runpy.run_path(str(path), run_name=RUN_NAME)
    except SystemExit as e:  # sys.exit() at module level: it stops the file, not anekit
        raise AnekitError(f"{where} {path}: running it failed: it called sys.exit({e.code!r})") from None
    except Exception as e:  # the user's own code: any failure becomes one clear line
        raise AnekitError(f"{where} {path}: running it failed: {type(e).__name__}: {e}") from e
    found = []
    for name, value in namespace.items():
        if name.startswith("_"):
            continue
        program = value if isinstance(value, Program) else _program_attribute(value)
        if isinstance(program, Program):
            found.append(Loaded(f"{path}::{name}", path, "python", program))
    if not found:
        raise PathKindError(f"{where} {path}: defines no module-level Program (or object with a .program)")
    return found


def _program_attribute(value: object) -> object:
    """``value.program``, or None; a function builder (whose attributes build ops) has none."""
    try:
        return getattr(value, "program", None)
    except AnekitError:  # FunctionBuilder: "unknown op 'program'"
        return None
