"""Reading the corpus programs (``programs/<name>.mil``) and building the weight files they read.

The weight files are not copies of the projects' own (those were random, or trained checkpoints): they
are built here, at import time, with ``anekit.blob.build_blob_bytes``, one file per BLOBFILE path,
holding one blob per distinct offset the program refers to, in offset order. Building them checks that
every offset the program names is where a MILBlob writer puts a blob's metadata record (64 for a
file's first blob), so an offset that points anywhere else fails here, at import. The values are
deterministic: a causal mask for ``mask`` files (0 on and below the diagonal, -65504 above, as the
projects' own ``get_mask_blob`` writes it), RoPE tables for ``rope_cos`` / ``rope_sin`` (the formula of
maderix/ANE ``mil_dynamic.h``), ones for norm scales, zeros for biases, and small random values (fixed
seed per file and offset) for everything else.
"""

from __future__ import annotations

import zlib
from functools import cache
from pathlib import Path

import numpy as np

from anekit import mil
from anekit.blob import build_blob_bytes
from anekit.mil.values import BlobRef, Literal
from tests.engine_corpus import Case

PROGRAMS = Path(__file__).parent / "programs"


def program(name: str) -> str:
    """The MIL text of ``programs/<name>.mil``."""
    return (PROGRAMS / f"{name}.mil").read_text()


def _literals(arg: object):
    if isinstance(arg, Literal):
        yield arg
    elif isinstance(arg, tuple):
        for a in arg:
            yield from _literals(a)


def blob_refs(text: str) -> dict[str, dict[int, tuple[str, tuple[int, ...]]]]:
    """Every BLOBFILE the program refers to: path -> offset -> (dtype, shape)."""
    refs: dict[str, dict[int, tuple[str, tuple[int, ...]]]] = {}
    for fn in mil.parse(text).functions.values():
        for op in fn.ops:
            for arg in (*op.attributes.values(), *op.inputs.values()):
                for lit in _literals(arg):
                    if isinstance(lit.value, BlobRef):
                        shape = tuple(int(d) for d in lit.type.shape)
                        refs.setdefault(lit.value.path, {})[lit.value.offset] = (lit.type.dtype.name, shape)
    return refs


def _values(path: str, offset: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    name = path.rsplit("/", 1)[-1]
    if dtype in ("int8", "uint8"):
        rng = np.random.default_rng(zlib.crc32(f"{path}@{offset}".encode()))
        return rng.integers(-2 if dtype == "int8" else 0, 3, size=shape).astype(dtype)
    if "mask" in name:
        s_q, s_k = shape[-2], shape[-1]
        causal = np.where(np.arange(s_k)[None, :] <= np.arange(s_q)[:, None], 0.0, -65504.0)
        return np.broadcast_to(causal, shape).astype(np.float16)
    if name.startswith("rope_"):
        seq, hd = shape[-2], shape[-1]
        theta = np.arange(seq, dtype=np.float32)[:, None] / np.power(
            np.float32(10000.0), 2.0 * np.arange(hd // 2, dtype=np.float32) / np.float32(hd)
        )
        table = np.cos(theta) if "cos" in name else np.sin(theta)
        return np.broadcast_to(np.repeat(table, 2, axis=1), shape).astype(np.float16)
    stem = name.removesuffix(".bin")
    if stem.startswith(("rms", "ln_f_g")) or stem.endswith("_g"):
        return np.ones(shape, np.float16)
    if stem.endswith("_b"):
        return np.zeros(shape, np.float16)
    rng = np.random.default_rng(zlib.crc32(f"{path}@{offset}".encode()))
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return (rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float16)


def weights_for(
    text: str, values: dict[tuple[str, int], np.ndarray] | None = None
) -> dict[str, bytes] | None:
    """The weight files a program reads (BLOBFILE path -> file bytes), or None when it reads none.

    ``values`` replaces the values of chosen blobs, keyed by (path, offset).
    """
    refs = blob_refs(text)
    values = values or {}
    if not refs:
        return None
    files: dict[str, bytes] = {}
    for path, by_offset in refs.items():
        offsets = sorted(by_offset)
        items = [
            (values[(path, o)] if (path, o) in values else _values(path, o, *by_offset[o]), by_offset[o][0])
            for o in offsets
        ]
        data, written = build_blob_bytes(items)
        if written != offsets:
            raise ValueError(
                f"[engine_corpus] {path}: the program refers to blobs at offsets {offsets}, "
                f"a MILBlob file holding them has them at {written}"
            )
        files[path] = data
    return files


def case(
    name: str,
    chips: tuple[str, ...],
    route: str,
    source: str,
    observed: str,
    *,
    program_name: str | None = None,
    values: dict[tuple[str, int], np.ndarray] | None = None,
    contested: tuple[str, ...] = (),
    macos: str = "",
) -> Case:
    """A Case whose MIL is ``programs/<program_name or name>.mil``, with the weight files it reads."""
    text = program(program_name or name)
    weights = weights_for(text, values) if values else _shared_weights(text)
    return Case(name, text, chips, route, source, observed, weights, contested, macos)


@cache
def _shared_weights(text: str) -> dict[str, bytes] | None:
    """The default weight files of a program, built once however many cases share the program."""
    return weights_for(text)
