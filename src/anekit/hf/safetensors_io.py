"""Safetensors files read and written by anekit itself: a strict memory-mapped reader, an atomic writer.

Byte layout (integers little-endian)::

    offset 0       u64 N           size of the header in bytes (at most MAX_HEADER_BYTES)
    offset 8       N bytes         UTF-8 JSON object, padded with spaces (the writer pads 8 + N to 8):
                                     {"__metadata__": {str: str},                        (optional)
                                      NAME: {"dtype": "F32", "shape": [d0, d1, ...],
                                             "data_offsets": [begin, end]}, ...}
    offset 8 + N   data buffer     each tensor's bytes, C order, little-endian; [begin, end) is relative
                                   to the buffer's start, and the tensors tile the buffer exactly

Why anekit reads the format itself rather than through the ``safetensors`` package: numpy has no
bfloat16, and the package's numpy API cannot return a BF16 tensor. Reading it here gives one
memory-mapped path for every dtype (a BF16 tensor comes back as its raw uint16 bits, decoded exactly by
``bf16_bits_to_float32``) and errors that name the tensor, the field and the byte offset. The package is
the reference the tests compare against, both ways.

The reader (``read_header`` / ``parse_header``) checks everything before any tensor is mapped or
allocated: the file is a regular file (a FIFO or a directory is one ``InputError`` line, never a hang),
N fits the file and ``MAX_HEADER_BYTES``, the header is a JSON object (``anekit.jsonio``'s size and depth
limits, no duplicate keys), each entry holds exactly dtype / shape / data_offsets of the right types,
the dtype is known, the shape's byte count equals ``end - begin``, the offsets lie in the buffer, and —
as the reference reader requires — the tensors neither overlap nor leave gaps or trailing bytes.
``__metadata__`` maps strings to strings.

A checkpoint directory (``open_checkpoint``) holds ``model.safetensors`` or
``model.safetensors.index.json`` plus its shards. When both are present the single file is read, as
transformers does: its ``from_pretrained`` tries ``SAFE_WEIGHTS_NAME`` before ``SAFE_WEIGHTS_INDEX_NAME``
for a local directory (huggingface/transformers ``src/transformers/modeling_utils.py``). ``write_checkpoint``
never leaves both: it removes the other form's files once the new ones are in place.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anekit.binfmt import Field, Record
from anekit.errors import AnekitError, FormatError, OptionError
from anekit.fileio import atomic_write
from anekit.inputs import LIMITS, check_input, kind_of, read_bytes, shown, stat_input
from anekit.jsonio import JsonError, loads

FORMAT = "safetensors"
PREFIX = Record("safetensors.prefix", [Field("header_size", "Q", 0)], 8)  # the u64 N before the header
MAX_HEADER_BYTES = 100_000_000  # the reference implementation's MAX_HEADER_SIZE
MAX_HEADER_DEPTH = 4  # a valid header nests 3 deep (root, entry, shape); anything deeper is refused early
HEADER_ALIGN = 8  # the writer pads the header with spaces so the buffer starts 8-aligned
MAX_BYTE_COUNT = 2**63 - 1  # the largest array numpy makes; far beyond any file
METADATA_KEY = "__metadata__"
ENTRY_KEYS = ("dtype", "shape", "data_offsets")
FORMAT_METADATA = {"format": "pt"}  # transformers' safetensors loading expects format "pt"

SINGLE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
SHARD_NAME = "model-{index:05d}-of-{count:05d}.safetensors"  # as transformers names shards
_SHARD_PATTERN = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")

# The safetensors dtype strings anekit reads and writes, and the numpy dtype of their storage
# (little-endian). BF16 and the 8-bit floats are stored as their raw bits: numpy has no such types.
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_RAW_BITS = ("BF16", "F8_E4M3", "F8_E5M2")  # stored as bits; to_float32 decodes only BF16


class SafetensorsError(FormatError):
    """A safetensors file or checkpoint directory that does not follow the format: names the tensor or
    header part (``field``) and the byte offset where it went wrong."""

    def __init__(
        self, field: str, message: str, *, offset: int | None = None, expected: Any = None, actual: Any = None
    ) -> None:
        super().__init__(FORMAT, field, message, offset=offset, expected=expected, actual=actual)


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lies in a safetensors file; ``raw`` maps it, ``to_float32`` decodes a copy."""

    name: str
    dtype: str  # the safetensors dtype string ("F32", "BF16", ...)
    shape: tuple[int, ...]
    path: Path
    offset: int  # absolute byte offset of the tensor's first byte in the file
    nbytes: int

    def raw(self) -> np.ndarray:
        """A read-only memory-mapped view of the tensor in its storage dtype (BF16: uint16 bits)."""
        dtype = DTYPES[self.dtype]
        try:
            if self.nbytes == 0:  # mmap cannot map zero bytes
                empty = np.zeros(self.shape, dtype)
                empty.flags.writeable = False
                return empty
            mapped = np.memmap(self.path, dtype=dtype, mode="r", offset=self.offset, shape=self.shape)
        except (OSError, ValueError) as e:  # the file shrank or vanished since its header was read
            raise SafetensorsError(
                self.name, f"cannot map {self.nbytes} bytes of {shown(self.path)}: {e}", offset=self.offset
            ) from e
        return np.asarray(mapped)

    def to_float32(self) -> np.ndarray:
        """A new float32 array of the tensor's values (BF16 decoded exactly; integers and bools converted)."""
        if self.dtype == "BF16":
            return bf16_bits_to_float32(self.raw())
        if self.dtype in _RAW_BITS:
            raise SafetensorsError(self.name, f"anekit does not decode {self.dtype} to float32; use raw()")
        return self.raw().astype(np.float32)


# ---------------------------------------------------------------------------------------------- bfloat16


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 bit patterns (uint16): exact, the bits shifted left by 16."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise AnekitError(f"[bf16] bit patterns must be uint16, not {bits.dtype}")
    wide = bits.astype(np.uint32)
    wide <<= np.uint32(16)  # in place: a 0-d array stays an array
    return wide.view(np.float32)


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) nearest to float32 ``values``, ties to even; overflow gives inf,
    a NaN stays a NaN (its sign and top payload bits kept, made quiet)."""
    values = np.asarray(values)
    if values.dtype != np.float32:  # a float64 would be rounded twice (to float32, then to bf16)
        raise AnekitError(f"[bf16] values must be float32, not {values.dtype}")
    bits32 = np.ascontiguousarray(values).reshape(values.shape).view(np.uint32)
    u = bits32.astype(np.uint64)  # 64 bits: the sum below cannot wrap
    lsb = (u >> np.uint64(16)) & np.uint64(1)
    rounded = (u + np.uint64(0x7FFF) + lsb) >> np.uint64(16)  # ties go to the even (lsb 0) neighbour
    quiet_nan = (u >> np.uint64(16)) | np.uint64(0x0040)
    return np.asarray(np.where(np.isnan(values), quiet_nan, rounded).astype(np.uint16))


# ---------------------------------------------------------------------------------------------- reading


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, TensorRef], dict[str, str]]:
    """The tensors and ``__metadata__`` of the safetensors file ``path``; only its header is read."""
    path = Path(path)
    size = check_input(path, "[safetensors] cannot read", expected="a safetensors file").st_size
    if size < PREFIX.size:
        raise SafetensorsError(
            "header_size", f"the file holds {size} bytes, fewer than the 8-byte header size", offset=0
        )
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise SafetensorsError("file", f"cannot open {shown(path)}: {e.strerror}") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
            raise SafetensorsError("file", f"{shown(path)} is no longer a regular file")
        prefix = _read_exactly(f, PREFIX.size, 0)
        header_size = _check_header_size(PREFIX.parse(prefix)["header_size"], st.st_size)
        header = _read_exactly(f, header_size, PREFIX.size)
    return parse_header(prefix + header, file_size=st.st_size, path=path)


def _read_exactly(f: Any, count: int, offset: int) -> bytes:
    data = f.read(count)
    if len(data) != count:
        raise SafetensorsError("header", f"the file ended after {len(data)} of {count} bytes", offset=offset)
    return data


def _check_header_size(header_size: int, file_size: int) -> int:
    """``header_size`` (N) when the header fits ``MAX_HEADER_BYTES`` and a file of ``file_size`` bytes."""
    if header_size > MAX_HEADER_BYTES:
        raise SafetensorsError(
            "header_size",
            f"header of {header_size} bytes is over the {MAX_HEADER_BYTES}-byte limit",
            offset=0,
        )
    if PREFIX.size + header_size > file_size:
        raise SafetensorsError(
            "header_size",
            f"header of {header_size} bytes runs past the end of the {file_size}-byte file",
            offset=0,
        )
    return header_size


def parse_header(
    data: bytes | memoryview, *, file_size: int | None = None, path: str | os.PathLike[str] = "<bytes>"
) -> tuple[dict[str, TensorRef], dict[str, str]]:
    """The tensors and metadata described by ``data``, which starts with the 8-byte size and holds the whole
    header (and possibly the buffer); ``file_size`` is the file's size (default: ``len(data)``)."""
    data = bytes(data[: PREFIX.size + MAX_HEADER_BYTES])
    file_size = len(data) if file_size is None else file_size
    if len(data) < PREFIX.size:
        raise SafetensorsError(
            "header_size", f"{len(data)} bytes, fewer than the 8-byte header size", offset=0
        )
    header_size = _check_header_size(PREFIX.parse(data)["header_size"], file_size)
    if len(data) < PREFIX.size + header_size:
        raise SafetensorsError(
            "header", f"only {len(data) - PREFIX.size} of {header_size} bytes given", offset=8
        )
    header = _parse_json(data[PREFIX.size : PREFIX.size + header_size])
    start = PREFIX.size + header_size
    metadata = _check_metadata(header.pop(METADATA_KEY, {}))
    spans = [_check_entry(name, entry, file_size - start) for name, entry in header.items()]
    _check_tiling(spans, file_size - start, start)
    tensors = {
        name: TensorRef(name, dtype, shape, Path(path), start + begin, end - begin)
        for name, dtype, shape, begin, end in spans
    }
    return tensors, metadata


def _parse_json(text: bytes) -> dict[str, Any]:
    """The header's JSON object (jsonio's limits), refusing a key given twice."""
    try:
        header = loads(text, "header", max_depth=MAX_HEADER_DEPTH, max_bytes=MAX_HEADER_BYTES)
        json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except JsonError as e:
        raise SafetensorsError("header", str(e).removeprefix("header: "), offset=8) from None
    except SafetensorsError:
        raise
    except ValueError as e:  # an integer of more than 4300 digits, which jsonio does not catch
        raise SafetensorsError("header", f"not JSON ({e})", offset=8) from None
    if not isinstance(header, dict):
        raise SafetensorsError("header", f"a JSON {type(header).__name__}, not an object", offset=8)
    return header


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' object hook: the object of ``pairs``, or SafetensorsError naming a key given twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise SafetensorsError(key, "appears more than once in a header object", offset=8)
        seen.add(key)
    return dict(pairs)


def _check_metadata(metadata: Any) -> dict[str, str]:
    if not isinstance(metadata, dict):
        raise SafetensorsError(METADATA_KEY, f"a JSON {type(metadata).__name__}, not an object", offset=8)
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise SafetensorsError(
                f"{METADATA_KEY}.{key}", f"a JSON {type(value).__name__}, not a string", offset=8
            )
    return metadata


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_entry(name: str, entry: Any, buffer_size: int) -> tuple[str, str, tuple[int, ...], int, int]:
    """(name, dtype, shape, begin, end) of one header entry, each field checked."""
    if not isinstance(entry, dict):
        raise SafetensorsError(name, f"a JSON {type(entry).__name__}, not an object", offset=8)
    if set(entry) != set(ENTRY_KEYS):
        missing = [k for k in ENTRY_KEYS if k not in entry]
        extra = sorted(set(entry) - set(ENTRY_KEYS))
        why = f"lacks {missing}" if missing else f"has unknown keys {extra}"
        raise SafetensorsError(name, f"entry {why}", expected=list(ENTRY_KEYS))
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise SafetensorsError(f"{name}.dtype", "unknown dtype", expected=sorted(DTYPES), actual=dtype)
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise SafetensorsError(f"{name}.shape", "not a list of non-negative integers", actual=shape)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise SafetensorsError(f"{name}.data_offsets", "not a list of two integers", actual=offsets)
    begin, end = offsets
    if not 0 <= begin <= end <= buffer_size:
        raise SafetensorsError(
            f"{name}.data_offsets",
            f"[{begin}, {end}] is not a range inside the {buffer_size}-byte data buffer",
        )
    need = _byte_count(name, shape, DTYPES[dtype].itemsize)
    if need != end - begin:
        raise SafetensorsError(
            f"{name}.data_offsets",
            f"shape {shape} of {dtype} is not the size of [{begin}, {end}] (in bytes)",
            expected=need,
            actual=end - begin,
        )
    return name, dtype, tuple(shape), begin, end


def _byte_count(name: str, shape: list[int], itemsize: int) -> int:
    """The bytes of ``shape``. Its non-zero dimensions alone must stay within ``MAX_BYTE_COUNT``, as numpy
    requires even of an empty array; the running product stops there, so a hostile rank cannot stall it."""
    count = itemsize
    for d in shape:
        count *= d or 1
        if count > MAX_BYTE_COUNT:
            raise SafetensorsError(f"{name}.shape", f"{shape} spans more than {MAX_BYTE_COUNT} bytes")
    return 0 if 0 in shape else count


def _check_tiling(
    spans: list[tuple[str, str, tuple[int, ...], int, int]], buffer_size: int, start: int
) -> None:
    """The tensors cover the buffer exactly, in offset order: no overlap, no gap, nothing after the last."""
    at = 0
    for name, _, _, begin, end in sorted(spans, key=lambda s: (s[3], s[4])):
        if begin < at:
            raise SafetensorsError(
                f"{name}.data_offsets",
                f"overlaps the tensor before it (which ends at {at})",
                offset=start + begin,
            )
        if begin > at:
            raise SafetensorsError(
                f"{name}.data_offsets", f"leaves a gap of {begin - at} bytes before it", offset=start + at
            )
        at = end
    if at != buffer_size:
        raise SafetensorsError(
            "data", f"{buffer_size - at} bytes after the last tensor belong to none", offset=start + at
        )


# ---------------------------------------------------------------------------------------------- checkpoints


def open_checkpoint(directory: str | os.PathLike[str]) -> dict[str, TensorRef]:
    """Every tensor of the Hugging Face model directory ``directory`` (single file or sharded; see the
    module docstring for which wins when both are present)."""
    directory = Path(directory)
    st = stat_input(directory, "[safetensors] cannot read")
    if st is None or not stat.S_ISDIR(st.st_mode):
        what = "no such directory" if st is None else f"{kind_of(st.st_mode)}, not a directory"
        raise SafetensorsError("checkpoint", f"{shown(directory)}: {what}")
    if stat_input(directory / SINGLE_NAME, "[safetensors] cannot read") is not None:
        return read_header(directory / SINGLE_NAME)[0]
    if stat_input(directory / INDEX_NAME, "[safetensors] cannot read") is not None:
        return _open_sharded(directory)
    raise SafetensorsError(
        "checkpoint", f"{shown(directory)} holds neither {SINGLE_NAME} nor {INDEX_NAME} (looked for both)"
    )


def _read_weight_map(index_path: Path) -> dict[str, str]:
    """The index's ``weight_map`` (tensor name -> shard file name), each shard name a plain file name."""
    what = f"[safetensors] index {shown(index_path)}"
    text = read_bytes(index_path, "[safetensors] cannot read", LIMITS["json"], "a JSON index file")
    try:
        index = loads(text, what)
        json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except SafetensorsError as e:
        raise SafetensorsError(f"{INDEX_NAME}: {e.field}", "appears more than once") from None
    except JsonError:
        raise
    except ValueError as e:  # an integer of more than 4300 digits, which jsonio does not catch
        raise SafetensorsError(INDEX_NAME, f"not JSON ({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise SafetensorsError(f"{INDEX_NAME}: weight_map", "missing, or not a JSON object")
    for name, shard in weight_map.items():
        field = f"{INDEX_NAME}: weight_map[{name!r}]"
        if not isinstance(shard, str):
            raise SafetensorsError(field, f"a JSON {type(shard).__name__}, not a shard file name")
        if not shard or shard in (".", "..") or "/" in shard or "\\" in shard or "\0" in shard:
            raise SafetensorsError(
                field, "not a plain file name inside the checkpoint directory", actual=shard
            )
    return weight_map


def _open_sharded(directory: Path) -> dict[str, TensorRef]:
    """The tensors of a sharded checkpoint, the index and the shards' headers agreeing exactly."""
    weight_map = _read_weight_map(directory / INDEX_NAME)
    found: dict[str, TensorRef] = {}
    for shard in dict.fromkeys(weight_map.values()):
        if stat_input(directory / shard, "[safetensors] cannot read") is None:
            first = next(name for name, s in weight_map.items() if s == shard)
            raise SafetensorsError(
                f"{INDEX_NAME}: weight_map[{first!r}]", f"names shard {shard}, which {shown(directory)} lacks"
            )
        for name, ref in read_header(directory / shard)[0].items():
            if name not in weight_map:
                raise SafetensorsError(name, f"shard {shard} holds it, but {INDEX_NAME} does not list it")
            if weight_map[name] != shard:
                raise SafetensorsError(
                    name, f"shard {shard} holds it, but {INDEX_NAME} assigns it to {weight_map[name]}"
                )
            found[name] = ref
    missing = [name for name in weight_map if name not in found]
    if missing:
        raise SafetensorsError(
            missing[0], f"{INDEX_NAME} assigns it to {weight_map[missing[0]]}, which does not hold it"
        )
    return {name: found[name] for name in weight_map}


# ---------------------------------------------------------------------------------------------- writing


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, tuple[str, np.ndarray]],
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write ``tensors`` (name -> (dtype string, array in that dtype's storage)) to ``path`` atomically,
    with ``{"format": "pt"}`` added to ``metadata``. Tensors are laid out by itemsize (largest first) then
    name, so each starts aligned to its itemsize; the header is padded with spaces to a multiple of 8."""
    arrays = {name: _check_tensor(name, dtype, array) for name, (dtype, array) in tensors.items()}
    header = _build_header(arrays, _full_metadata(metadata))
    path = Path(path)
    with atomic_write(path) as f:
        f.write(PREFIX.build(header_size=len(header)))
        f.write(header)
        for _, array in _layout(arrays):
            f.write(array.reshape(-1).data.cast("B"))
    return path


def _check_tensor(name: Any, dtype: Any, array: Any) -> tuple[str, np.ndarray]:
    """(dtype, array) when ``array`` is a C-contiguous ndarray in ``dtype``'s storage, else AnekitError."""
    where = f"[safetensors] tensor {name!r}"
    if not isinstance(name, str) or name == METADATA_KEY:
        raise AnekitError(f"{where}: a tensor name is a string other than {METADATA_KEY!r}")
    if dtype not in DTYPES:
        raise AnekitError(f"{where}: unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    if not isinstance(array, np.ndarray):
        raise AnekitError(f"{where}: a numpy array is needed, not {type(array).__name__}")
    if array.dtype != DTYPES[dtype]:
        raise AnekitError(f"{where}: {dtype} is stored as {DTYPES[dtype]}, but the array is {array.dtype}")
    if not array.flags.c_contiguous:
        raise AnekitError(f"{where}: the array is not C-contiguous (np.ascontiguousarray it first)")
    return dtype, array


def _full_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    given = dict(metadata or {})
    for key, value in given.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise AnekitError(f"[safetensors] metadata {key!r}: keys and values are strings, not {value!r}")
    if given.get("format", "pt") != "pt":
        raise AnekitError(
            f"[safetensors] metadata format {given['format']!r}: Hugging Face loaders expect 'pt'"
        )
    return {**FORMAT_METADATA, **given}


def _layout(arrays: dict[str, tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """(name, array) in file order: itemsize descending, then name."""
    order = sorted(arrays, key=lambda name: (-arrays[name][1].itemsize, name))
    return [(name, arrays[name][1]) for name in order]


def _build_header(arrays: dict[str, tuple[str, np.ndarray]], metadata: dict[str, str]) -> bytes:
    """The JSON header, padded with spaces so that 8 + its length is a multiple of ``HEADER_ALIGN``."""
    header: dict[str, Any] = {METADATA_KEY: metadata}
    at = 0
    for name, array in _layout(arrays):
        header[name] = {
            "dtype": arrays[name][0],
            "shape": list(array.shape),
            "data_offsets": [at, at + array.nbytes],
        }
        at += array.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return text + b" " * (-len(text) % HEADER_ALIGN)


def write_checkpoint(
    directory: str | os.PathLike[str],
    tensors: Mapping[str, tuple[str, np.ndarray]],
    max_shard_bytes: int | None = None,
    metadata: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write ``tensors`` into the existing ``directory`` as ``model.safetensors`` when they fit
    ``max_shard_bytes`` (or it is None), else as shards filled greedily in the given order plus
    ``model.safetensors.index.json`` (written last). Files of the other form, or stale shards, are removed
    once the new files are in place. Returns the paths written."""
    directory = Path(directory)
    st = stat_input(directory, "[safetensors] cannot write")
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise AnekitError(f"[safetensors] cannot write {shown(directory)}: not an existing directory")
    if max_shard_bytes is not None and (not _is_int(max_shard_bytes) or max_shard_bytes <= 0):
        raise OptionError(
            f"[safetensors] max_shard_bytes must be a positive integer, not {max_shard_bytes!r}"
        )
    arrays = {name: _check_tensor(name, dtype, array) for name, (dtype, array) in tensors.items()}
    full = _full_metadata(metadata)
    groups = _shard_groups(arrays, max_shard_bytes)
    if len(groups) <= 1:
        written = [write_safetensors(directory / SINGLE_NAME, arrays, full)]
    else:
        written = _write_shards(directory, arrays, groups, full)
    _remove_stale(directory, written)
    return written


def _shard_groups(arrays: dict[str, tuple[str, np.ndarray]], max_shard_bytes: int | None) -> list[list[str]]:
    """Tensor names per shard, filled greedily in the given order; a tensor over the limit has its own."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, (_, array) in arrays.items():
        if max_shard_bytes is not None and groups[-1] and size + array.nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += array.nbytes
    return groups


def _write_shards(
    directory: Path,
    arrays: dict[str, tuple[str, np.ndarray]],
    groups: list[list[str]],
    metadata: dict[str, str],
) -> list[Path]:
    written, weight_map = [], {}
    for i, names in enumerate(groups):
        shard = SHARD_NAME.format(index=i + 1, count=len(groups))
        written.append(write_safetensors(directory / shard, {n: arrays[n] for n in names}, metadata))
        weight_map.update(dict.fromkeys(names, shard))
    total = sum(array.nbytes for _, array in arrays.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with atomic_write(directory / INDEX_NAME) as f:
        f.write((json.dumps(index, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))
    return [*written, directory / INDEX_NAME]


def _remove_stale(directory: Path, written: list[Path]) -> None:
    """Remove the checkpoint files of ``directory`` that this write did not produce."""
    keep = {p.name for p in written}
    for p in directory.iterdir():
        ours = p.name in (SINGLE_NAME, INDEX_NAME) or _SHARD_PATTERN.match(p.name)
        if ours and p.name not in keep and not p.is_dir():
            p.unlink(missing_ok=True)
