"""Weight files: where each goes in the model's temporary directory, and checks made before compiling.

Weights are handed to the descriptor as ``{"@model_path/<rel>": {"offset": 0, "data": NSData}}`` and
written to ``NSTemporaryDirectory()/<hexStringIdentifier>/<rel>`` before compiling (maderix/ANE
training/ane_runtime.h, mechramc/Orion core/ane_runtime.m).

Reserved names (rule weights.reserved-name): the same directory holds files that are not weights.
``model.mil`` is the MIL text every public project writes there before compiling, and the compiler
itself writes ``net.plist`` and ``data`` there (mechramc/Orion core/ane_runtime.m
``orion_program_patch_weights`` and experiments/spike_e5_patch.m copy both out of a compiled model's
directory: "The compiled ANE data file IS the BLOBFILE"). A weight whose path starts with one of these
names would be overwritten by, or overwrite, the framework's own file; it is refused at compile,
case-insensitively (macOS file systems usually are).

Names that carry the bytes (rule descriptor.hex-id-weights): the model's hexStringIdentifier, and so its
directory, follows the MIL text and the weight dictionary's keys, not the weight bytes (mechramc/Orion
core/ane_runtime.m ``orion_program_patch_weights``: "Same hexId as donor (same MIL text + weight dict
keys)"), and a load reads the compiled files of that directory (the same function loads a model from a
directory without compiling). Per-layer baked kernels share their MIL text and weight names, so without
care they share one directory: compiling layer j + 1 rewrites it and reloading layer j runs j + 1's
weights. So the engine gets every weight file under a name that carries the digest of its bytes
(``weights/w.bin`` -> ``weights/w-<16 hex digits>.bin``), in the dictionary and in the BLOBFILE paths of
the text it compiles (``content_names``, ``with_blob_paths``): different bytes, different keys, a
different directory. The program's own text and the kernel's names are unchanged.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from anekit.errors import AnekitError, BlobFormatError, CompilationFailed
from anekit.mil import types as T
from anekit.mil.ir import Function
from anekit.mil.values import BlobRef, Literal
from anekit.rules.checks import RESERVED_WEIGHT_NAMES, reserved_weight_name
from anekit.runtime.ane.api import MODEL_PATH
from anekit.runtime.base import WeightSource

# Rule weights.reserved-name (the rule book holds the names; see the module docstring for the evidence).
RESERVED_NAMES = RESERVED_WEIGHT_NAMES


def weight_files(weights: dict[str, WeightSource]) -> dict[str, bytes]:
    """{path relative to the model directory ("weights/x.bin"): bytes} for the weights given."""
    files: dict[str, bytes] = {}
    for key, source in weights.items():
        rel = key.removeprefix(MODEL_PATH)
        parts = PurePosixPath(rel).parts
        if not rel or rel.startswith("/") or "\\" in rel or ".." in parts:
            raise CompilationFailed(
                f"[compile] weight name '{key}' must be a path inside the model directory, like "
                "'@model_path/weights/w.bin'"
            )
        clash = reserved_weight_name(rel)
        if clash is not None:
            raise CompilationFailed(
                f"[compile] weight '{key}' collides with '{clash}', a file the framework keeps in the model "
                f"directory (rule weights.reserved-name; reserved: {', '.join(sorted(RESERVED_NAMES))}); "
                "put weights under '@model_path/weights/'"
            )
        if rel in files:
            raise CompilationFailed(f"[compile] weight file '{MODEL_PATH}{rel}' is given twice")
        if isinstance(source, (bytes, bytearray, memoryview)):
            files[rel] = bytes(source)
        elif not Path(source).is_file():
            raise CompilationFailed(f"[compile] weight file '{key}' -> {source} does not exist")
        else:
            try:
                files[rel] = Path(source).read_bytes()
            except OSError as e:
                raise CompilationFailed(f"[compile] weight '{key}': cannot read {source}: {e}") from e
    return files


DIGEST_CHARS = 16  # hex digits of the sha256 of a weight file's bytes kept in its name (64 bits)


def content_names(files: Mapping[str, bytes]) -> dict[str, str]:
    """{relative path: the same path with the digest of its bytes before the extension}."""
    names = {}
    for rel, blob in files.items():
        path = PurePosixPath(rel)
        digest = hashlib.sha256(blob).hexdigest()[:DIGEST_CHARS]
        names[rel] = str(path.with_name(f"{path.stem}-{digest}{path.suffix}"))
    return names


def with_blob_paths(fn: Function, names: Mapping[str, str]) -> Function:
    """A copy of ``fn`` whose BLOBFILE paths name the files as ``names`` renames them (``fn`` itself, which
    the caller's program shares, is left alone); ``fn`` when nothing is renamed."""
    if all(old == new for old, new in names.items()):
        return fn
    renamed = copy.deepcopy(fn)
    for _, lit in blob_literals(renamed):
        ref = lit.value
        assert isinstance(ref, BlobRef)
        rel = ref.path.removeprefix(MODEL_PATH)
        if rel in names:
            lit.value = BlobRef(MODEL_PATH + names[rel], ref.offset)
    return renamed


def blob_literals(fn: Function) -> Iterator[tuple[str, Literal]]:
    """(const name, literal) for every BLOBFILE value of the function."""
    for op in fn.ops:
        val = op.attributes.get("val") if op.op_type == "const" else None
        if isinstance(val, Literal) and isinstance(val.value, BlobRef):
            yield op.outputs[0].name, val
        for key, arg in op.inputs.items():
            for item in arg if isinstance(arg, tuple) else (arg,):
                if isinstance(item, Literal) and isinstance(item.value, BlobRef):
                    yield f"{op.name}.{key}", item


def check_weights(fn: Function, files: dict[str, bytes]) -> None:
    """Every BLOBFILE const has its file, and its blob fits the const's type: checked on the host,
    so the error names the const (the engine's own error would not)."""
    from anekit.blob import BlobFile

    opened: dict[str, Any] = {}
    try:
        for name, lit in blob_literals(fn):
            ref = lit.value
            assert isinstance(ref, BlobRef) and isinstance(lit.type, T.TensorType)
            rel = ref.path.removeprefix(MODEL_PATH)
            if rel not in files:
                known = ", ".join(MODEL_PATH + k for k in sorted(files)) or "none"
                raise CompilationFailed(
                    f"[compile] const '{name}' refers to weight file '{ref.path}', which was not given "
                    f"(weights given: {known})"
                )
            try:
                blob = opened.get(rel) or opened.setdefault(rel, BlobFile(files[rel]))
                blob.read(ref.offset, shape=tuple(int(d) for d in lit.type.shape), dtype=lit.type.dtype.name)
            except BlobFormatError as e:
                raise CompilationFailed(
                    f"[compile] const '{name}' ({lit.type}) at offset {ref.offset} of '{ref.path}': {e}"
                ) from e
            except (AnekitError, OSError) as e:
                raise CompilationFailed(f"[compile] const '{name}': cannot open '{ref.path}': {e}") from e
    finally:
        for blob in opened.values():
            blob.close()
