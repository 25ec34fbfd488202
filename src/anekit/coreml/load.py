"""``load_mlpackage``: an ML Program .mlpackage (or bare .mlmodel spec) back into an anekit Program.

Reading checks everything it is given and follows nothing out of the package: the Manifest's root entry,
the model protobuf (an ML Program; NeuralNetwork specs are refused by name), every op against the
registry, and every BLOBFILE value against its weight file (the offset must be a metadata record whose
dtype and size match the const). Weight files are memory-mapped to check their records and are never
read as a whole: ``MLPackage.weights`` maps each ``@model_path/...`` name to its file, which the
simulator maps again when it compiles. Every problem is a ``CoreMLFormatError`` naming the file and the
field (or op). The program is a ``PackageProgram``: it carries its route ("coreml"), so
``runtime.open("sim").compile(pkg.program, pkg.weights)`` applies the CoreML route's rules.
``open_session`` gives a package's functions, their states kept between calls, as one ``Session``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anekit.blob import BlobFile
from anekit.coreml._proto import proto
from anekit.coreml.manifest import MODEL_PATH, model_file, read_manifest, weight_file
from anekit.coreml.spec import model_to_program
from anekit.errors import AnekitError, CoreMLFormatError, FormatError
from anekit.mil import types as T
from anekit.mil.ir import Program
from anekit.mil.values import Literal, blob_literal
from anekit.mil.verify import verify
from anekit.runtime.base import Backend
from anekit.runtime.session import Session, StatesSource

MAX_SPEC_BYTES = 2 << 30  # protobuf's own limit on one message


class PackageProgram(Program):
    """A Program read from a CoreML package. It says which route it takes: the simulator's strict compile
    judges it by the CoreML route's rules unless told otherwise (``SimBackend(route=None)``), since CoreML
    allocates a package's buffers and the direct route's surface rules do not hold for them."""

    __slots__ = ()
    route = "coreml"


@dataclass(frozen=True)
class MLPackage:
    """A loaded package: the program (consts inline or BLOBFILE references), its weight files, and its
    default function, specification version, path and short description."""

    program: Program
    weights: Mapping[str, Path]
    default_function: str
    spec_version: int
    path: Path
    description: str = ""
    model_file: Path = field(default=Path(), repr=False)

    @property
    def weight_bytes(self) -> int:
        """Total size of the package's weight files."""
        return sum(p.stat().st_size for p in set(self.weights.values()))


class _Blobs:
    """Resolves and checks BLOBFILE values; remembers the files for ``MLPackage.weights``."""

    def __init__(self, package: Path | None, model_dir: Path) -> None:
        self.package = package
        self.model_dir = model_dir
        self.files: dict[str, Path] = {}
        self.open: dict[Path, BlobFile] = {}

    def __call__(self, file_name: str, offset: int, t: T.TensorType, where: str) -> Literal:
        if self.package is None:
            raise CoreMLFormatError(where, "a bare .mlmodel spec has no weight files", actual=file_name)
        path = self.files.get(file_name)  # resolved (and checked) once per weight file
        if path is None:
            path = weight_file(self.model_dir, self.package, file_name, where)
        blob = self.open.get(path)
        if blob is None:
            try:
                blob = self.open[path] = BlobFile(path)
            except OSError as e:
                raise CoreMLFormatError(where, f"cannot open weight file {path}: {e}") from None
            except FormatError as e:
                raise CoreMLFormatError(f"{where} ({path.name})", str(e)) from None
        try:
            entry = blob.entry_at(offset)
        except FormatError as e:
            raise CoreMLFormatError(
                f"{where}.offset",
                f"{offset} is not a blob metadata record of {path.name}: {e}",
                actual=offset,
            ) from None
        want = t.numel or 0
        if entry.dtype != t.dtype.name or entry.elements != want:
            raise CoreMLFormatError(
                where,
                f"blob at {offset} of {path.name} holds {entry.elements} {entry.dtype} values; "
                f"the value declares {t}",
                expected=f"{want} {t.dtype.name}",
                actual=f"{entry.elements} {entry.dtype}",
            )
        self.files[file_name] = path
        return blob_literal(t, file_name, offset)

    def close(self) -> None:
        for blob in self.open.values():
            blob.close()


def _read_spec(path: Path) -> Any:
    p = proto()
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_SPEC_BYTES:
                raise CoreMLFormatError(
                    path.name, "model spec larger than protobuf's 2 GB limit", actual=size
                )
            raw = f.read(size)
    except OSError as e:
        raise CoreMLFormatError(path.name, f"cannot read {path}: {e}") from None
    model = p.Model.Model()
    try:
        model.ParseFromString(raw)
    except Exception as e:  # google.protobuf.message.DecodeError and friends
        raise CoreMLFormatError(path.name, f"not a CoreML Model protobuf ({type(e).__name__}: {e})") from None
    return model


def load_mlpackage(path: str | os.PathLike[str]) -> MLPackage:
    """Read a .mlpackage directory (or a bare .mlmodel spec) into an ``MLPackage``."""
    proto()
    path = Path(path)
    try:
        return _load(path)
    except OSError as e:  # a path the file system refuses (too long, a loop, permissions)
        raise CoreMLFormatError(str(path), f"cannot read the package: {e}") from None


def _load(path: Path) -> MLPackage:
    package: Path | None
    if path.is_dir():
        package = path
        root, _ = read_manifest(package)
        spec_path = model_file(package, root)
    elif path.is_file():
        package, spec_path = None, path
    else:
        raise CoreMLFormatError(str(path), "no such package or model file")
    where = str(spec_path.relative_to(package)) if package is not None else spec_path.name
    model = _read_spec(spec_path)
    blobs = _Blobs(package, spec_path.parent)
    try:
        read, default = model_to_program(model, blobs)
        program = verify(PackageProgram(read.functions, read.version, read.attributes))
    except CoreMLFormatError as e:
        raise CoreMLFormatError(
            f"{where}: {e.field}", e.reason, offset=e.offset, expected=e.expected, actual=e.actual
        ) from None
    except AnekitError as e:  # verification and type errors, named by op
        raise CoreMLFormatError(where, f"the program does not verify: {e}") from None
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as e:
        raise CoreMLFormatError(where, f"malformed model spec ({type(e).__name__}: {e})") from None
    finally:
        blobs.close()
    return MLPackage(
        program=program,
        weights=dict(blobs.files),
        default_function=default,
        spec_version=int(model.specificationVersion),
        path=path,
        description=model.description.metadata.shortDescription,
        model_file=spec_path,
    )


__all__ = ["MODEL_PATH", "MLPackage", "PackageProgram", "load_mlpackage"]


def open_session(
    path: str | os.PathLike[str], backend: Backend | None = None, states: StatesSource | None = None
) -> Session:
    """A ``Session`` (``anekit.runtime.session``) over a CoreML package: its program, weights and route;
    ``backend`` default ``runtime.open()``, ``states`` a states file or mapping to start from."""
    pkg = load_mlpackage(path)
    return Session(pkg.program, pkg.weights, backend, states)
