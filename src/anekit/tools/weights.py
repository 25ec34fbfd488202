"""Weights resolution: which weight files a program's BLOBFILE values refer to, and where they are.

A MIL program names its weight files as ``BLOBFILE(path = string("@model_path/weights/x.bin"), ...)``;
``@model_path`` is the folder the program was read from. The files are found beside the program
(``beside``), or in a location given with the program (``from_source``: a model directory holding
``weights/...``, a weights directory, or one weight file).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from anekit.errors import AnekitError
from anekit.inputs import stat_input
from anekit.mil import Literal, Program
from anekit.mil.values import BlobRef

MODEL_PATH = "@model_path/"  # the folder a program was read from, in its BLOBFILE paths


@dataclass(frozen=True)
class BlobConst:
    """One value read from a weight file: the op that reads it and the BLOBFILE path it names."""

    const: str  # the op's first output (or its op type, for an op without outputs)
    path: str  # "@model_path/weights/x.bin"


@dataclass(frozen=True)
class Resolved:
    """The weight files found for a program (BLOBFILE path -> file) and the values whose file is not
    there, in program order."""

    files: dict[str, Path]
    missing: tuple[BlobConst, ...] = ()


class MissingWeightFile(AnekitError):
    """A BLOBFILE names a weight file that is not beside the program."""


def blob_consts(program: Program) -> list[BlobConst]:
    """Every value the program reads from a weight file (attributes and literal inputs), in op order."""
    found = []
    for fn in program.functions.values():
        for op in fn.ops:
            values = [*op.attributes.values(), *(a for a in op.inputs.values() if isinstance(a, Literal))]
            for v in values:
                if isinstance(v, Literal) and isinstance(v.value, BlobRef):
                    found.append(BlobConst(op.outputs[0].name if op.outputs else op.op_type, v.value.path))
    return found


def const_blobs(program: Program) -> list[BlobConst]:
    """The values of ``const`` ops (their ``val``) read from a weight file, in op order."""
    found = []
    for fn in program.functions.values():
        for op in fn.ops:
            val = op.attributes.get("val")
            if isinstance(val, Literal) and isinstance(val.value, BlobRef):
                found.append(BlobConst(op.outputs[0].name if op.outputs else op.name, val.value.path))
    return found


def blob_paths(program: Program) -> dict[str, str]:
    """Every weight file the program refers to, with the first const that refers to it."""
    paths: dict[str, str] = {}
    for c in blob_consts(program):
        paths.setdefault(c.path, c.const)
    return paths


def beside(program: Program, folder: Path) -> Resolved:
    """The ``@model_path/...`` files under ``folder`` (the program's own folder) that its consts read;
    the consts whose file is not there (or whose path is not an ``@model_path`` one) are listed in
    ``missing``."""
    files: dict[str, Path] = {}
    missing = []
    for c in const_blobs(program):
        file = folder / c.path.removeprefix(MODEL_PATH)
        if c.path.startswith(MODEL_PATH) and (c.path in files or file.is_file()):
            files[c.path] = file
        else:  # not there, or not a path in the program's folder at all
            missing.append(c)
    return Resolved(files, tuple(missing))


def require_beside(
    program: Program, folder: Path, where: str = "[weights]", hint: str = ""
) -> dict[str, Path]:
    """``beside``, refusing the first weight file (in BLOBFILE path order) that is not there: a
    ``MissingWeightFile`` naming the const, the BLOBFILE path and the file looked for (then ``hint``)."""
    needed = blob_paths(program)
    found = {p: folder / p.removeprefix(MODEL_PATH) for p in needed if p.startswith(MODEL_PATH)}
    for path, file in sorted(found.items()):
        if not file.is_file():
            raise MissingWeightFile(
                f"{where} const '{needed[path]}' refers to weight file '{path}', which is not beside the "
                f"program ({file} does not exist){hint}"
            )
    return found


def from_source(
    source: Path, program: Program, where: str = "[weights]", label: str = "weights"
) -> dict[str, Path]:
    """The weight files ``source`` holds for ``program``: one file (the BLOBFILE of its name, or the only
    one the program reads), or every file under a directory, by its ``@model_path`` path (a weights
    directory's files also as ``@model_path/weights/...``). ``label`` names ``source`` in messages."""
    if stat_input(source, f"{where} {label}") is None:  # a name too long for the OS: one line too
        raise AnekitError(f"{where} weights '{source}' do not exist")
    needed = blob_paths(program)
    if source.is_file():
        matches = {p: source for p in needed if Path(p).name == source.name}
        if not matches and len(needed) == 1:
            matches = {next(iter(needed)): source}
        return matches
    found: dict[str, Path] = {}
    for f in sorted(source.rglob("*")):
        if f.is_file():
            rel = f.relative_to(source).as_posix()
            found[MODEL_PATH + rel] = f
            found.setdefault(MODEL_PATH + "weights/" + rel, f)
    return found


def weight_map(
    source: Path | None,
    program: Program,
    folder: Path | None = None,
    where: str = "[weights]",
    hint: str = "",
    label: str = "weights",
) -> dict[str, Path]:
    """``{"@model_path/weights/x.bin": path}`` for the weight files ``program`` needs: from ``source``
    when one is given, else each ``@model_path/...`` file under ``folder`` (a missing one is refused,
    ``require_beside``); neither: none."""
    if source is not None:
        return from_source(source, program, where, label)
    return {} if folder is None else require_beside(program, folder, where, hint)
