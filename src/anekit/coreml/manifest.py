"""The package layout: ``Manifest.json`` (the form coremltools writes) and paths that stay inside the package.

::

    NAME.mlpackage/
      Manifest.json                         {"fileFormatVersion": "1.0.0",
                                             "itemInfoEntries": {UUID: {author, description, name, path}},
                                             "rootModelIdentifier": UUID of the model spec entry}
      Data/com.apple.CoreML/model.mlmodel   the Model protobuf (entry path "com.apple.CoreML/model.mlmodel")
      Data/com.apple.CoreML/weights/        the weights entry ("com.apple.CoreML/weights"): weight.bin

Entry paths are relative to ``Data/``; ``@model_path/`` in a BLOBFILE value names the folder of the
model spec. Every path read from a package is resolved by ``inside``: relative, no ``..``, and no
symlink leading out of the package — such paths are refused, never followed.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from anekit import jsonio
from anekit.errors import CoreMLFormatError

MANIFEST = "Manifest.json"
DATA = "Data"
AUTHOR = "com.apple.CoreML"
MODEL_ENTRY = "com.apple.CoreML/model.mlmodel"
WEIGHTS_ENTRY = "com.apple.CoreML/weights"
WEIGHT_FILE = "weight.bin"
WEIGHT_PATH = "@model_path/weights/weight.bin"  # what BLOBFILE values of a package name
MODEL_PATH = "@model_path/"
FILE_FORMAT_VERSION = "1.0.0"
MAX_MANIFEST_BYTES = 1 << 20


@dataclass(frozen=True)
class Entry:
    """One item of the Manifest."""

    identifier: str
    author: str
    description: str
    name: str
    path: str


def manifest_json(model_description: str = "CoreML Model Specification") -> tuple[str, str]:
    """The Manifest text of a package holding a model spec and its weights, and the root identifier."""
    model_id, weights_id = str(uuid.uuid4()), str(uuid.uuid4())
    doc = {
        "fileFormatVersion": FILE_FORMAT_VERSION,
        "itemInfoEntries": {
            model_id: {
                "author": AUTHOR,
                "description": model_description,
                "name": "model.mlmodel",
                "path": MODEL_ENTRY,
            },
            weights_id: {
                "author": AUTHOR,
                "description": "CoreML Model Weights",
                "name": "weights",
                "path": WEIGHTS_ENTRY,
            },
        },
        "rootModelIdentifier": model_id,
    }
    return json.dumps(doc, indent=4) + "\n", model_id


def inside(root: Path, relative: str, field: str) -> Path:
    """``root / relative`` when it stays inside ``root``: a relative path without ``..`` whose every
    existing component is a real directory / file or a symlink resolving inside ``root``."""
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or relative.startswith(("/", "\\")) or ":" in pure.parts[0]:
        raise CoreMLFormatError(field, "path must be relative to the package", actual=relative)
    if any(part == ".." for part in pure.parts) or "\\" in relative or "\0" in relative:
        raise CoreMLFormatError(field, "path leaves the package ('..')", actual=relative)
    real_root = Path(os.path.realpath(root))
    path = root
    for part in pure.parts:
        if part in ("", "."):
            continue
        path = path / part
        if path.is_symlink():
            target = Path(os.path.realpath(path))
            if target != real_root and real_root not in target.parents:
                raise CoreMLFormatError(
                    field, f"'{path}' is a symlink leading out of the package (to {target}); not followed",
                    actual=relative,
                )  # fmt: skip
    return path


def read_manifest(package: Path) -> tuple[Entry, dict[str, Entry]]:
    """The root model entry and every entry of a package's Manifest.json."""
    field = MANIFEST
    mpath = inside(package, MANIFEST, field)
    try:
        with open(mpath, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise CoreMLFormatError(field, f"{package} has no {MANIFEST}: not a CoreML package") from None
    except OSError as e:
        raise CoreMLFormatError(field, f"cannot read {mpath}: {e}") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise CoreMLFormatError(field, f"larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        doc: Any = jsonio.loads(raw, f"{package}/{MANIFEST}")  # depth-limited: never a RecursionError
    except jsonio.JsonError as e:
        raise CoreMLFormatError(field, str(e)) from None
    if not isinstance(doc, dict):
        raise CoreMLFormatError(field, "must be a JSON object", actual=type(doc).__name__)
    items = doc.get("itemInfoEntries")
    if not isinstance(items, dict):
        raise CoreMLFormatError(f"{field}.itemInfoEntries", "missing or not an object")
    entries: dict[str, Entry] = {}
    for key, item in items.items():
        efield = f"{field}.itemInfoEntries[{key}]"
        if not isinstance(item, dict):
            raise CoreMLFormatError(efield, "not an object")
        values = {k: item.get(k, "") for k in ("author", "description", "name", "path")}
        bad = [k for k, v in values.items() if not isinstance(v, str)]
        if bad:
            raise CoreMLFormatError(f"{efield}.{bad[0]}", "must be a string")
        entries[key] = Entry(key, **values)
    root = doc.get("rootModelIdentifier")
    if not isinstance(root, str) or root not in entries:
        raise CoreMLFormatError(
            f"{field}.rootModelIdentifier", "names no entry of itemInfoEntries", actual=root
        )
    return entries[root], entries


def model_file(package: Path, entry: Entry) -> Path:
    """The model spec file a Manifest entry points to (inside ``Data/``), checked to exist."""
    field = f"{MANIFEST}.itemInfoEntries[{entry.identifier}].path"
    path = inside(package, f"{DATA}/{entry.path}", field)
    if not path.is_file():
        raise CoreMLFormatError(field, f"points nowhere: {path} is not a file", actual=entry.path)
    return path


def weight_file(model_dir: Path, package: Path, file_name: str, field: str) -> Path:
    """The file a BLOBFILE ``fileName`` (``@model_path/...``) names, inside the package."""
    if not file_name.startswith(MODEL_PATH):
        raise CoreMLFormatError(
            f"{field}.fileName", f"weight file name must start with {MODEL_PATH}", actual=file_name
        )
    rel_model = model_dir.relative_to(package).as_posix()
    path = inside(package, f"{rel_model}/{file_name[len(MODEL_PATH) :]}", f"{field}.fileName")
    if not path.is_file():
        raise CoreMLFormatError(f"{field}.fileName", f"weight file {path} does not exist", actual=file_name)
    return path
