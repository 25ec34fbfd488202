"""``save_mlpackage``: an anekit Program as an ML Program .mlpackage, written atomically, weights streamed.

Each ``const`` is placed by size: data of at least ``blob_threshold`` bytes goes to the package's one
``weights/weight.bin`` (written through ``anekit.blob``, converted chunk by chunk) and the const refers
to it as ``BLOBFILE(@model_path/weights/weight.bin, offset of its metadata record)``; smaller data stays
inline in the protobuf. Consts that already refer to weight files (anekit's kernels write one file per
weight) take their values from ``weights`` and are copied, raw, into weight.bin with new offsets. Data
is stored once: consts of equal dtype, shape and bytes (in one function or in several) share one blob.
Below iOS18 only fp16 / fp32 / uint8 / int8 data goes to the weight file, as coremltools does
(``converters/mil/backend/mil/load.py`` ``should_use_weight_file``).

The package is built in a hidden temporary directory beside the target and renamed into place only
when complete: a failure at any step leaves nothing behind (and an existing package, with
``overwrite=True``, untouched).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from anekit.blob import BlobFile, BlobWriter
from anekit.coreml._proto import proto
from anekit.coreml.manifest import (
    DATA,
    MANIFEST,
    MODEL_ENTRY,
    WEIGHT_FILE,
    WEIGHT_PATH,
    WEIGHTS_ENTRY,
    manifest_json,
)
from anekit.coreml.spec import program_to_model
from anekit.coreml.values import literal_to_value, tensor_bytes
from anekit.errors import AnekitError, CoreMLFormatError
from anekit.fileio import remove_stale_temporaries, replace_path, temporary_dir
from anekit.fp16 import bf16_bits_to_f32
from anekit.mil import types as T
from anekit.mil.builder import weight_file_dtypes
from anekit.mil.ir import Function, Op, Program
from anekit.mil.values import BlobRef, Literal, tensor_literal
from anekit.mil.verify import verify

DEFAULT_BLOB_THRESHOLD = 1024

WeightSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]


def stored_bytes(t: T.TensorType) -> int:
    """Bytes a tensor's data takes in a weight file (sub-byte values packed)."""
    n = t.numel or 0
    return -(-n * t.dtype.bits // 8)


def goes_to_weight_file(t: T.TensorType, fn: Function) -> bool:
    """Whether a const of this type may be stored in the weight file of a function of this opset."""
    allowed = weight_file_dtypes(fn.opset)
    return t.dtype.name in allowed and t.is_static


class _Placer:
    """Decides, for every literal of the program, inline value or weight-file value (writing the data).

    ``adopted``: the one source weight file that was copied whole as the package's weight.bin, so its
    blobs keep their offsets and nothing is re-encoded (``writer`` is then None: see ``_adoptable``).
    """

    def __init__(
        self,
        writer: BlobWriter | None,
        threshold: int | None,
        weights: Mapping[str, WeightSource],
        adopted: str | None = None,
    ) -> None:
        self.writer = writer
        self.threshold = threshold
        self.weights = weights
        self.adopted = adopted
        self.files: dict[str, BlobFile] = {}
        self.copied: dict[tuple[str, int], int] = {}
        self.appended: dict[tuple[str, tuple[Any, ...], bytes], int] = {}

    def source(self, ref: BlobRef, where: str) -> BlobFile:
        blob = self.files.get(ref.path)
        if blob is not None:
            return blob
        for key in (ref.path, ref.path.removeprefix("@model_path/")):
            if key in self.weights:
                src = self.weights[key]
                break
        else:
            known = ", ".join(sorted(self.weights)) or "none"
            raise CoreMLFormatError(
                where, f"refers to weight file '{ref.path}', which was not given (weights: {known})"
            )
        try:
            blob = BlobFile(src)
        except OSError as e:
            raise CoreMLFormatError(where, f"cannot open weight file '{ref.path}': {e}") from None
        self.files[ref.path] = blob
        return blob

    def __call__(self, lit: Literal, fn: Function, where: str, blob_ok: bool) -> Any:
        t = lit.type
        if not isinstance(t, T.TensorType) or not isinstance(lit.value, (np.ndarray, BlobRef)):
            return literal_to_value(lit, where)
        eligible = blob_ok and goes_to_weight_file(t, fn)
        if isinstance(lit.value, BlobRef):
            return self._external(lit, t, lit.value, fn, where, eligible)
        if eligible and self.threshold is not None and stored_bytes(t) >= self.threshold:
            assert self.writer is not None, "an adopted weight file leaves nothing to append"
            values = _blob_values(lit)
            key = (t.dtype.name, tuple(t.shape), _digest(values))  # equal values are stored once
            if key not in self.appended:
                self.appended[key] = self.writer.append(values, t.dtype.name)
            return literal_to_value(Literal(t, BlobRef(WEIGHT_PATH, self.appended[key])), where)
        return literal_to_value(lit, where)

    def _external(
        self, lit: Literal, t: T.TensorType, ref: BlobRef, fn: Function, where: str, eligible: bool
    ) -> Any:
        blob = self.source(ref, where)
        shape = tuple(int(d) for d in t.shape)
        entry = blob.entry_at(ref.offset)
        if entry.dtype != t.dtype.name or entry.elements != (t.numel or 0):
            raise CoreMLFormatError(
                where,
                f"blob at {ref.offset} of '{ref.path}' holds {entry.elements} {entry.dtype} values; "
                f"the const declares {t}",
            )
        small = self.threshold is not None and entry.size_in_bytes < self.threshold
        if eligible and not small and self.adopted == ref.path:  # the file is weight.bin as it is
            return literal_to_value(Literal(t, BlobRef(WEIGHT_PATH, ref.offset)), where)
        if eligible and not small:
            assert self.writer is not None, "an adopted weight file leaves nothing to append"
            key = (ref.path, ref.offset)
            if key not in self.copied:
                self.copied[key] = self.writer.append(blob.raw(ref.offset), entry.dtype, count=entry.elements)
            return literal_to_value(Literal(t, BlobRef(WEIGHT_PATH, self.copied[key])), where)
        values = blob.read(ref.offset, shape=shape, dtype=t.dtype.name)
        if t.dtype.name == "bf16":
            values = bf16_bits_to_f32(values).reshape(shape)
        return literal_to_value(tensor_literal(t.dtype, values, shape), where)

    def close(self) -> None:
        for blob in self.files.values():
            blob.close()


def _adoptable(program: Program, weights: Mapping[str, WeightSource], threshold: int | None) -> str | None:
    """The BLOBFILE path of a weight file that can become weight.bin as it is, or None.

    That is the case when the program refers to exactly one weight file, given as a file, and no inline
    const would be appended: copying the file whole (the kernel's fast copy) then replaces decoding and
    re-encoding every blob, and offsets stay valid. Consts of that file that stay inline (under the
    threshold, or of a dtype the opset keeps inline) are read as usual; their blobs stay in the copy,
    unreferenced, as do blobs no const refers to.
    """
    refs: set[str] = set()
    for fn in program.functions.values():
        for op in fn.ops:
            for lit in _literals(op):
                t = lit.type
                if not isinstance(t, T.TensorType):
                    continue
                if isinstance(lit.value, BlobRef):
                    refs.add(lit.value.path)
                elif threshold is not None and stored_bytes(t) >= threshold and goes_to_weight_file(t, fn):
                    return None  # an inline const that would have to be appended
    if len(refs) != 1:
        return None
    (path,) = refs
    source = weights.get(path, weights.get(path.removeprefix("@model_path/")))
    return path if isinstance(source, (str, os.PathLike)) and Path(source).is_file() else None


def _adopt(weights: Mapping[str, WeightSource], path: str, dest: Path, consume: bool) -> Path:
    """Put the source file of ``path`` at ``dest``: moved when ``consume`` allows and the file system
    does, copied otherwise (the kernel's fast copy, no decoding)."""
    source = weights.get(path, weights.get(path.removeprefix("@model_path/")))
    assert isinstance(source, (str, os.PathLike))
    if consume:
        with contextlib.suppress(OSError):  # another file system: copy instead
            os.replace(source, dest)
            return dest
    shutil.copyfile(source, dest)
    return dest


def _literals(op: Op) -> list[Literal]:
    """Every literal of an op: its attributes and its inline inputs (tuples flattened)."""
    found = [v for v in op.attributes.values() if isinstance(v, Literal)]
    for arg in op.inputs.values():
        for a in arg if isinstance(arg, tuple) else (arg,):
            if isinstance(a, Literal):
                found.append(a)
    return found


def _digest(values: Any) -> bytes:
    """A digest of an array's bytes (its dtype and shape are keyed beside it)."""
    data = values if isinstance(values, (bytes, bytearray)) else np.ascontiguousarray(values).data.cast("B")
    return hashlib.blake2b(data, digest_size=16).digest()


def _blob_values(lit: Literal) -> Any:
    """What ``BlobWriter.append`` takes for an inline literal: its values (fp16 as float16 bits)."""
    assert isinstance(lit.type, T.TensorType) and isinstance(lit.value, np.ndarray)
    if lit.type.dtype.name == "bf16":
        return tensor_bytes(lit)  # anekit holds bf16 as float32 values already rounded to bf16
    return lit.value


def save_mlpackage(
    program: Program,
    path: str | os.PathLike[str],
    *,
    weights: Mapping[str, WeightSource] | None = None,
    blob_threshold: int | None = DEFAULT_BLOB_THRESHOLD,
    default_function: str | None = None,
    description: str | None = None,
    overwrite: bool = False,
    consume_weights: bool = False,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write ``program`` as an ML Program package at ``path`` (``.mlpackage``); returns the path.

    ``weights`` maps the weight files the program's BLOBFILE consts name (``@model_path/weights/x.bin``)
    to their bytes or files. ``blob_threshold``: consts of at least this many bytes go to weight.bin,
    smaller ones inline; None keeps each const where the program has it (inline values inline,
    BLOBFILE values in weight.bin) — the form for a program built with ``Builder(blob_storage=True)``.
    ``default_function``: the function CoreML runs by default ("main", or the first function).
    An existing ``path`` is refused unless ``overwrite``. ``consume_weights``: the weight files given are
    the caller's scratch files, so one that becomes weight.bin as it is may be moved in, not copied (and
    is then gone, whether the save succeeds or not). ``metadata``: entries of the model's userDefined
    metadata (strings).
    """
    p = proto()  # CoreMLUnavailable before anything touches the disk
    path = Path(path)
    if path.suffix != ".mlpackage":
        raise CoreMLFormatError(str(path), "a CoreML package path must end in .mlpackage")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise CoreMLFormatError(str(path), "already exists; pass overwrite=True to replace it")
    if blob_threshold is not None and blob_threshold < 0:
        raise CoreMLFormatError("blob_threshold", "must be >= 0 (or None)", actual=blob_threshold)
    program = verify(program)
    if default_function is None:
        default_function = "main" if "main" in program.functions else next(iter(program.functions))
    remove_stale_temporaries(path.parent, "package")  # what a killed writer left beside it
    tmp = temporary_dir(path, "package")  # named by kind and pid: a later writer removes it if stale
    try:
        model_dir = tmp / DATA / MODEL_ENTRY.rsplit("/", 1)[0]
        weights_dir = tmp / DATA / WEIGHTS_ENTRY
        weights_dir.mkdir(parents=True)
        adopted = _adoptable(program, weights or {}, blob_threshold)
        if adopted is not None:  # one weight file, all of it going to weight.bin: take it whole
            weights = {adopted: _adopt(weights or {}, adopted, weights_dir / WEIGHT_FILE, consume_weights)}
        writing = BlobWriter(weights_dir / WEIGHT_FILE) if adopted is None else contextlib.nullcontext()
        with writing as writer:
            placer = _Placer(writer, blob_threshold, weights or {}, adopted)
            try:
                model = program_to_model(
                    program,
                    placer,
                    default_function=default_function,
                    description=description,
                    metadata=metadata,
                )
            finally:
                placer.close()
        assert isinstance(model, p.Model.Model)
        try:
            data = model.SerializeToString()
        except Exception as e:  # protobuf's own refusal (e.g. over 2 GB inline): one anekit error
            raise CoreMLFormatError(MODEL_ENTRY, f"the model spec does not serialize: {e}") from e
        (model_dir / MODEL_ENTRY.rsplit("/", 1)[1]).write_bytes(data)
        text, _ = manifest_json()
        (tmp / MANIFEST).write_text(text, encoding="utf-8")
        replace_path(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        if isinstance(e, (AnekitError, OSError, KeyboardInterrupt)) or not isinstance(e, Exception):
            raise
        raise AnekitError(f"[mlpackage] writing {path} failed: {type(e).__name__}: {e}") from e
    return path
