"""MILBlob v2 weight files: the record layout as data, a streaming writer, an mmap reader, ANE helpers.

One format serves both the CoreML ``weights/weight.bin`` and the ANE training API's "128-byte header"
weight blobs. All integers are little-endian::

    offset        size  record
    0             64    storage header   u32 count | u32 version = 2 | 56 reserved bytes
    64            64    blob metadata 0  u32 sentinel 0xDEADBEEF | u32 dtype | u64 size_in_bytes
                                         | u64 data_offset | u64 padding_bits | 32 reserved bytes
    128           n0    data 0           (data_offset = 128, size_in_bytes = n0)
    align64(128+n0)     blob metadata 1  zero bytes pad up to the next multiple of 64
    ... + 64      n1    data 1
    ...                 the file ends right after the last data byte (no trailing padding)

``BLOBFILE(path = ..., offset = uint64(X))`` in MIL names X, the offset of a blob's *metadata* record,
not of its data. A single fp16 weight is count 1, metadata at 64, data at 128.

Format facts this module relies on:

* The storage header is 64 bytes: count, version, then 56 reserved bytes (coremltools'
  ``storage_header`` has seven reserved u64 after the two u32). Some prose describes the reserved part
  as 48 bytes, which would make a 56-byte header and contradicts its own "64B" label; the real layout
  is the one above.
* ``padding_bits`` (the unused high bits of the last byte of a sub-byte blob) was reserved, and could
  hold anything, before iOS 18. It is checked for sub-byte dtypes only; for the others it is kept but
  not interpreted. Reserved bytes are kept as they were read, so re-encoding a record is exact.
* Sub-byte values are packed least significant bit first: element i occupies bits
  ``[i * bits, (i + 1) * bits)`` of the data read as one little-endian bit stream; signed int4 is two's
  complement in its four bits.
* Fused multi-chunk files from ANE weight generators put several metadata + data pairs one after
  another but may leave the header count at 1. The reader walks records (the next one starts at
  ``align64(data_offset + size_in_bytes)``, or exactly at the end of the data if a record is there) and
  warns with ``BlobWarning`` when the count disagrees. The writer always writes the true count.
* A stored ``data_offset`` is honoured even when it is not 64-byte aligned; it must lie after its own
  metadata record.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import queue
import secrets
import struct
import threading
import warnings
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Union

import numpy as np

from anekit.binfmt import Field, Record
from anekit.errors import BlobFormatError
from anekit.fp16 import f32_to_bf16_bits, f32_to_f16_bits

__all__ = [
    "ALIGNMENT",
    "BLOB_DTYPES",
    "HEADER",
    "HEADER_SIZE",
    "METADATA",
    "METADATA_SIZE",
    "SENTINEL",
    "VERSION",
    "BlobDType",
    "BlobEntry",
    "BlobFile",
    "BlobWarning",
    "BlobWriter",
    "Field",
    "Record",
    "align64",
    "blob_dtype",
    "build_blob_bytes",
    "describe",
    "fp16_blob",
    "fp16_blob_passthrough",
    "fp16_blob_transposed",
    "int8_blob",
    "multi_chunk_blob",
    "write_blobs",
]

SENTINEL = 0xDEADBEEF
"""First word of every blob metadata record."""
VERSION = 2
"""The only storage version this module reads and writes (version 1 is Espresso's blob_v1)."""
ALIGNMENT = 64
"""Metadata records (and, as written here, data) start at multiples of this many bytes."""


# --------------------------------------------------------------------------------------------------------
# record tables
# --------------------------------------------------------------------------------------------------------


HEADER = Record(
    "header",
    (
        Field("count", "I", 0),
        Field("version", "I", 4),
        Field("reserved", "56s", 8),
    ),
    size=64,
)
METADATA = Record(
    "metadata",
    (
        Field("sentinel", "I", 0),
        Field("dtype", "I", 4),
        Field("size_in_bytes", "Q", 8),
        Field("data_offset", "Q", 16),
        Field("padding_bits", "Q", 24),
        Field("reserved", "32s", 32),
    ),
    size=64,
)
HEADER_SIZE = HEADER.size
METADATA_SIZE = METADATA.size
assert HEADER_SIZE == ALIGNMENT and METADATA_SIZE == ALIGNMENT

_SENTINEL_BYTES = struct.pack("<I", SENTINEL)


def align64(n: int) -> int:
    """The smallest multiple of ``ALIGNMENT`` that is >= n."""
    return -(-n // ALIGNMENT) * ALIGNMENT


# --------------------------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlobDType:
    """A blob element type: its code in the metadata, MIL dtype name, width, and how ``read`` returns it.

    ``numpy`` is the dtype of the arrays ``BlobFile.read`` returns: bf16 comes back as its uint16 bit
    patterns and fp8 as uint8 codes (numpy has neither type); sub-byte types come back unpacked, one
    value per int8 (int4) or uint8 (uint1..uint6).
    """

    code: int
    name: str
    bits: int
    numpy: str

    @property
    def sub_byte(self) -> bool:
        return self.bits < 8

    @property
    def itemsize(self) -> int:
        """Bytes per element for byte-aligned types (0 for sub-byte types)."""
        return self.bits // 8 if self.bits >= 8 else 0

    @property
    def np(self) -> np.dtype:
        return np.dtype(self.numpy).newbyteorder("<")

    def value_range(self) -> tuple[int, int] | None:
        """Inclusive range of integer (and raw-code) types; None for fp16 / bf16 / fp32 values."""
        if self.name in ("fp16", "bf16", "fp32"):
            return None
        if self.name == "int4":
            return -8, 7
        if self.name.startswith("int"):
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, (1 << self.bits) - 1


_BLOB_DTYPE_TABLE: tuple[tuple[int, str, int, str], ...] = (
    # code, name (MIL dtype; fp8 has no MIL text spelling), bits per element, numpy dtype of read()
    (1, "fp16", 16, "float16"),
    (2, "fp32", 32, "float32"),
    (3, "uint8", 8, "uint8"),
    (4, "int8", 8, "int8"),
    (5, "bf16", 16, "uint16"),
    (6, "int16", 16, "int16"),
    (7, "uint16", 16, "uint16"),
    (8, "int4", 4, "int8"),
    (9, "uint1", 1, "uint8"),
    (10, "uint2", 2, "uint8"),
    (11, "uint4", 4, "uint8"),
    (12, "uint3", 3, "uint8"),
    (13, "uint6", 6, "uint8"),
    (14, "int32", 32, "int32"),
    (15, "uint32", 32, "uint32"),
    (16, "fp8e4m3", 8, "uint8"),
    (17, "fp8e5m2", 8, "uint8"),
)

BLOB_DTYPES: dict[int, BlobDType] = {row[0]: BlobDType(*row) for row in _BLOB_DTYPE_TABLE}
"""Blob dtypes by metadata code."""
_BY_NAME: dict[str, BlobDType] = {d.name: d for d in BLOB_DTYPES.values()}

DTypeLike = Union[int, str, BlobDType, Any]


def blob_dtype(dtype: DTypeLike) -> BlobDType:
    """The blob dtype for a metadata code, a MIL dtype name (``"fp16"``), or a MIL ``DType``."""
    if isinstance(dtype, BlobDType):
        return dtype
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        found = BLOB_DTYPES.get(int(dtype))
    else:
        found = _BY_NAME.get(str(getattr(dtype, "name", dtype)))
    if found is None:
        names = ", ".join(f"{d.code} {d.name}" for d in BLOB_DTYPES.values())
        raise BlobFormatError(
            "dtype", f"not a MILBlob dtype; known: {names}", expected="a code or MIL name", actual=dtype
        )
    return found


# --------------------------------------------------------------------------------------------------------
# sub-byte packing
# --------------------------------------------------------------------------------------------------------


def _pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack uint8 values (each < 2**bits, count a multiple of 8) LSB-first into ``count * bits / 8`` bytes.

    Eight values make exactly ``bits`` bytes: they are OR-ed into one little-endian u64 word, of which
    the low ``bits`` bytes are kept.
    """
    groups = values.reshape(-1, 8).astype(np.uint64)
    word = np.zeros(groups.shape[0], dtype="<u8")
    for j in range(8):
        word |= groups[:, j] << np.uint64(j * bits)
    return np.ascontiguousarray(word.view(np.uint8).reshape(-1, 8)[:, :bits]).reshape(-1)


def _unpack_bits(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Unpack ``count`` LSB-first ``bits``-wide values from uint8 ``data`` into a uint8 array."""
    groups = -(-count // 8)
    padded = np.zeros((groups, 8), dtype=np.uint8)
    flat = np.zeros(groups * bits, dtype=np.uint8)
    flat[: data.size] = data[: groups * bits]
    padded[:, :bits] = flat.reshape(groups, bits)
    word = padded.reshape(-1).view("<u8")
    out = np.empty((groups, 8), dtype=np.uint8)
    mask = np.uint64((1 << bits) - 1)
    for j in range(8):
        out[:, j] = (word >> np.uint64(j * bits)) & mask
    return out.reshape(-1)[:count]


def _sign_extend4(u: np.ndarray) -> np.ndarray:
    """Reinterpret 4-bit two's complement values held in uint8 as int8."""
    return ((u << np.uint8(4)).view(np.int8)) >> np.int8(4)


# --------------------------------------------------------------------------------------------------------
# encoding an input into blob bytes, chunk by chunk
# --------------------------------------------------------------------------------------------------------

_CHUNK_BYTES = 8 << 20  # input bytes converted per step: bounds the writer's working memory


@dataclass(frozen=True)
class _Encoded:
    """What ``append`` needs to know before writing, and the chunks of encoded bytes."""

    size_in_bytes: int
    padding_bits: int
    chunks: Iterator[Any]  # bytes-like


def _flat_chunks(a: np.ndarray, n: int) -> Iterator[np.ndarray]:
    """1-d pieces of at most ``n`` elements of ``a`` in C order, without copying ``a`` as a whole."""
    if a.size == 0:
        return
    if a.flags.c_contiguous:
        flat = a.reshape(-1)
        for start in range(0, flat.size, n):
            yield flat[start : start + n]
        return
    # "contig" makes the iterator copy strided runs into its buffer (reused: each piece is consumed at once).
    flags = ["external_loop", "buffered", "zerosize_ok"]
    # numpy's stubs leave out the "contig" op flag, which nditer documents and takes.
    yield from np.nditer(  # type: ignore[call-overload]
        a, flags=flags, op_flags=[["readonly", "contig"]], order="C", buffersize=n
    )


def _check_range(piece: np.ndarray, bd: BlobDType) -> None:
    limits = bd.value_range()
    if limits is None or piece.size == 0 or piece.dtype == np.bool_:
        return
    lo, hi = limits
    mn, mx = piece.min(), piece.max()
    if mn < lo or mx > hi:
        bad = mn if mn < lo else mx
        raise BlobFormatError(
            "data",
            f"value {bad} does not fit {bd.name} (range {lo}..{hi})",
            expected=f"{lo}..{hi}",
            actual=bad,
        )


def _encode(data: Any, bd: BlobDType, count: int | None, chunk_bytes: int) -> _Encoded:
    """Validate an input (array or raw bytes) for ``bd`` and plan its encoding."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return _encode_raw(data, bd, count)
    a = np.asarray(data)
    if count is not None and count != a.size:
        raise BlobFormatError("count", "count disagrees with the array size", expected=a.size, actual=count)
    kind = a.dtype.kind
    if kind not in "biuf":
        raise BlobFormatError(
            "data", f"cannot store a {a.dtype} array as {bd.name}", expected="numeric", actual=str(a.dtype)
        )
    if kind == "f" and bd.name not in ("fp16", "bf16", "fp32"):
        raise BlobFormatError(
            "data",
            f"{bd.name} needs integer values, got a {a.dtype} array (round it first)",
            expected="integer",
            actual=str(a.dtype),
        )
    per = max(1, chunk_bytes // max(1, a.dtype.itemsize))
    if bd.sub_byte:
        total = a.size * bd.bits
        padding = -total % 8
        return _Encoded((total + padding) // 8, padding, _sub_byte_chunks(a, bd, per - per % 8 or 8))
    size = a.size * bd.itemsize
    if bd.name in ("fp16", "bf16"):
        if a.dtype == np.uint16 or (bd.name == "fp16" and a.dtype == np.float16):
            return _Encoded(size, 0, _cast_chunks(a, np.dtype("<u2"), per, None, view=True))
        convert = f32_to_f16_bits if bd.name == "fp16" else f32_to_bf16_bits
        return _Encoded(size, 0, (convert(piece) for piece in _flat_chunks(a, per)))
    if bd.name == "fp32":
        return _Encoded(size, 0, _cast_chunks(a, np.dtype("<f4"), per, None, view=False))
    return _Encoded(size, 0, _cast_chunks(a, bd.np, per, bd, view=False))


def _encode_raw(data: bytes | bytearray | memoryview, bd: BlobDType, count: int | None) -> _Encoded:
    mv = memoryview(data)
    if not mv.c_contiguous:
        raise BlobFormatError("data", "raw data must be a contiguous buffer")
    mv = mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv
    n = mv.nbytes
    if not bd.sub_byte:
        if n % bd.itemsize:
            raise BlobFormatError(
                "data",
                f"{n} raw bytes are not a whole number of {bd.name} elements",
                expected=f"a multiple of {bd.itemsize}",
                actual=n,
            )
        if count is not None and count * bd.itemsize != n:
            raise BlobFormatError(
                "count",
                f"{n} raw bytes hold {n // bd.itemsize} elements",
                expected=n // bd.itemsize,
                actual=count,
            )
        return _Encoded(n, 0, iter((mv,)))
    if count is None:
        count = n * 8 // bd.bits
    total = count * bd.bits
    if count < 0 or -(-total // 8) != n:
        raise BlobFormatError(
            "count",
            f"{count} {bd.name} elements need {-(-total // 8)} bytes, got {n}",
            expected=n,
            actual=count,
        )
    return _Encoded(n, -total % 8, iter((mv,)))


def _cast_chunks(
    a: np.ndarray, target: np.dtype, per: int, bd: BlobDType | None, view: bool
) -> Iterator[Any]:
    for piece in _flat_chunks(a, per):
        if bd is not None:
            _check_range(piece, bd)
        if view:
            little = piece if piece.dtype.byteorder != ">" else piece.astype(piece.dtype.newbyteorder("<"))
            yield little.view(target)
        elif piece.dtype == target:
            yield piece
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                yield piece.astype(target)


def _sub_byte_chunks(a: np.ndarray, bd: BlobDType, per: int) -> Iterator[np.ndarray]:
    mask = np.uint8((1 << bd.bits) - 1)
    carry = np.empty(0, dtype=np.uint8)
    for piece in _flat_chunks(a, per):
        _check_range(piece, bd)
        vals = np.concatenate([carry, piece.astype(np.int16).astype(np.uint8) & mask])
        whole = vals.size - vals.size % 8
        carry = vals[whole:]
        if whole:
            yield _pack_bits(vals[:whole], bd.bits)
    if carry.size:
        tail = np.zeros(8, dtype=np.uint8)
        tail[: carry.size] = carry
        yield _pack_bits(tail, bd.bits)[: -(-carry.size * bd.bits // 8)]


# --------------------------------------------------------------------------------------------------------
# writer
# --------------------------------------------------------------------------------------------------------


def _write_chunks(f: BinaryIO, chunks: Iterator[Any], overlap: bool) -> int:
    """Write every chunk to ``f`` and return the byte count.

    With ``overlap`` a second thread does the writes (which release the GIL) while this one encodes the
    next chunk; at most two chunks wait in between, so memory stays bounded.
    """
    if not overlap:
        return sum(f.write(piece) for piece in chunks)
    pending: queue.Queue[Any] = queue.Queue(maxsize=2)
    failure: list[BaseException] = []
    written = 0

    def drain() -> None:
        nonlocal written
        while (piece := pending.get()) is not None:
            if not failure:
                try:
                    written += f.write(piece)
                except BaseException as e:  # handed to the encoding thread, re-raised there
                    failure.append(e)

    worker = threading.Thread(target=drain, name="anekit-blob-writer", daemon=True)
    worker.start()
    try:
        for piece in chunks:
            if failure:
                break
            pending.put(piece)
    finally:
        pending.put(None)
        worker.join()
    if failure:
        raise failure[0]
    return written


ArrayOrBytes = Union[np.ndarray, bytes, bytearray, memoryview, Any]


class _BlobStream:
    """Appends blobs to a seekable binary stream positioned at its start; ``_finish`` patches the count."""

    def __init__(self, stream: BinaryIO, *, chunk_bytes: int = _CHUNK_BYTES) -> None:
        self._f = stream
        self._chunk_bytes = chunk_bytes
        self._count = 0
        self._end = HEADER_SIZE
        self._f.write(HEADER.build(count=0, version=VERSION))

    @property
    def count(self) -> int:
        """Blobs appended so far."""
        return self._count

    def append(self, data: ArrayOrBytes, dtype: DTypeLike, *, count: int | None = None) -> int:
        """Append one blob and return the offset of its metadata record (what ``BLOBFILE(offset=)`` names).

        ``data`` is an array of values or already-encoded raw bytes. Arrays are stored in C order and
        converted to the blob dtype in chunks, so memory stays bounded whatever the size:

        * fp16 / bf16: float16 (fp16 only) and uint16 arrays are taken as bit patterns; anything else is
          converted as values with round-to-nearest-even (``anekit.fp16``).
        * fp32: any numeric array, converted as values.
        * integer dtypes, fp8 (raw uint8 codes) and sub-byte types: integer arrays whose values must fit;
          sub-byte values are packed LSB first with ``padding_bits`` recording the unused bits.

        Raw bytes are written as they are; for sub-byte dtypes ``count`` gives the number of elements
        (default: as many as fit). On any error the stream is left as it was before the call.
        """
        if self._count >= 0xFFFFFFFF:
            raise BlobFormatError(
                "header.count", "too many blobs for the u32 count", offset=0, actual=self._count
            )
        bd = blob_dtype(dtype)
        enc = _encode(data, bd, count, self._chunk_bytes)
        meta = align64(self._end)
        data_offset = meta + METADATA_SIZE
        record = METADATA.build(
            sentinel=SENTINEL,
            dtype=bd.code,
            size_in_bytes=enc.size_in_bytes,
            data_offset=data_offset,
            padding_bits=enc.padding_bits,
        )
        try:
            self._f.write(bytes(meta - self._end) + record)
            # Chunks of a contiguous array are fresh arrays or views of it, so they can wait in a queue while
            # the next one is converted (nditer pieces of a strided array reuse one buffer: no overlap).
            overlap = isinstance(data, np.ndarray) and data.flags.c_contiguous
            written = _write_chunks(self._f, enc.chunks, overlap and enc.size_in_bytes > self._chunk_bytes)
            if written != enc.size_in_bytes:
                raise AssertionError(f"blob encoder wrote {written} bytes, planned {enc.size_in_bytes}")
        except BaseException:
            close = getattr(enc.chunks, "close", None)
            if close is not None:
                close()
            self._f.seek(self._end)
            self._f.truncate(self._end)
            raise
        self._end = data_offset + written
        self._count += 1
        return meta

    def _finish(self) -> None:
        self._f.seek(0)
        self._f.write(HEADER.build(count=self._count, version=VERSION))
        self._f.seek(self._end)


class BlobWriter(_BlobStream):
    """Streams blobs into a MILBlob v2 file, atomically: a hidden temporary file beside ``path`` that
    replaces ``path`` only when ``close`` succeeds.

    Use it as a context manager; an exception inside the ``with`` (or ``abort()``) removes the temporary
    file and leaves any previous ``path`` untouched. Only one blob's chunk is in memory at a time. With
    ``fsync=True`` the data is flushed to disk before the rename.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, fsync: bool = False, chunk_bytes: int = _CHUNK_BYTES
    ) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._closed = True  # until the temporary file is set up
        self._tmp, fd = self._create_temp()
        try:
            stream = os.fdopen(fd, "w+b")
        except BaseException:
            os.close(fd)
            self._tmp.unlink(missing_ok=True)
            raise
        try:
            super().__init__(stream, chunk_bytes=chunk_bytes)
        except BaseException:
            stream.close()
            self._tmp.unlink(missing_ok=True)
            raise
        self._closed = False

    def _create_temp(self) -> tuple[Path, int]:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        while True:
            tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.tmp")
            try:
                return tmp, os.open(tmp, flags, 0o666)
            except FileExistsError:
                continue

    def append(self, data: ArrayOrBytes, dtype: DTypeLike, *, count: int | None = None) -> int:
        if self._closed:
            raise ValueError(f"[milblob] writer for {self.path} is closed")
        return super().append(data, dtype, count=count)

    append.__doc__ = _BlobStream.append.__doc__

    def close(self) -> None:
        """Patch the header count, then move the finished file into place."""
        if self._closed:
            return
        try:
            self._finish()
            self._f.flush()
            if self._fsync:
                os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        self._closed = True

    def abort(self) -> None:
        """Drop everything written: close and remove the temporary file."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._f.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.abort()


Items = Iterable[tuple[ArrayOrBytes, DTypeLike]]


def write_blobs(path: str | os.PathLike[str], items: Items) -> list[int]:
    """Write ``[(array_or_bytes, dtype), ...]`` to a MILBlob file; returns each blob's metadata offset."""
    with BlobWriter(path) as w:
        return [w.append(data, dtype) for data, dtype in items]


def build_blob_bytes(items: Items) -> tuple[bytes, list[int]]:
    """The MILBlob file for ``[(array_or_bytes, dtype), ...]`` in memory, and each blob's metadata offset."""
    buf = io.BytesIO()
    stream = _BlobStream(buf)
    offsets = [stream.append(data, dtype) for data, dtype in items]
    stream._finish()
    return buf.getvalue(), offsets


# --------------------------------------------------------------------------------------------------------
# reader
# --------------------------------------------------------------------------------------------------------


class BlobWarning(UserWarning):
    """A MILBlob file that reads but does not follow the format to the letter (e.g. a wrong header count)."""


@dataclass(frozen=True)
class BlobEntry:
    """One blob's metadata record, as stored (``reserved`` kept so ``to_bytes`` re-encodes it exactly)."""

    metadata_offset: int
    dtype_code: int
    size_in_bytes: int
    data_offset: int
    padding_bits: int
    reserved: bytes = field(default=bytes(32), repr=False)

    @property
    def blob_dtype(self) -> BlobDType:
        return BLOB_DTYPES[self.dtype_code]

    @property
    def dtype(self) -> str:
        """MIL dtype name (``"fp16"``; ``"fp8e4m3"`` / ``"fp8e5m2"`` for the fp8 codes)."""
        return self.blob_dtype.name

    @property
    def data_end(self) -> int:
        return self.data_offset + self.size_in_bytes

    @property
    def elements(self) -> int:
        """Number of values in the blob."""
        bd = self.blob_dtype
        if bd.sub_byte:
            return (self.size_in_bytes * 8 - self.padding_bits) // bd.bits
        return self.size_in_bytes // bd.itemsize

    def to_bytes(self) -> bytes:
        """The 64-byte metadata record."""
        return METADATA.build(
            sentinel=SENTINEL,
            dtype=self.dtype_code,
            size_in_bytes=self.size_in_bytes,
            data_offset=self.data_offset,
            padding_bits=self.padding_bits,
            reserved=self.reserved,
        )


Source = Union[str, os.PathLike, bytes, bytearray, memoryview]


class BlobFile:
    """A MILBlob v2 file opened for reading: memory-mapped (or over a bytes-like), header checked at once,
    records parsed on demand.

    ``read`` returns read-only zero-copy views for byte-aligned dtypes. Arrays already handed out stay
    valid after ``close`` (the mapping lives as long as they do).
    """

    def __init__(self, source: Source) -> None:
        self._mmap: mmap.mmap | None = None
        self._entries: list[BlobEntry] | None = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            mv = memoryview(source)
            if not mv.c_contiguous:
                raise BlobFormatError("source", "buffer must be contiguous")
            self._buf: Any = mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv
            self.name = "<bytes>"
        else:
            self.name = os.fspath(source)
            with open(source, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    self._buf = b""
                else:
                    self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    self._buf = self._mmap
        self.size = len(self._buf)
        try:
            self._read_header()
        except BlobFormatError:
            self.close()
            raise

    def _read_header(self) -> None:
        if self.size < HEADER_SIZE:
            raise BlobFormatError(
                "header",
                f"file is {self.size} bytes, shorter than the {HEADER_SIZE}-byte storage header",
                offset=0,
                expected=HEADER_SIZE,
                actual=self.size,
            )
        h = HEADER.parse(self._buf, 0)
        if h["version"] != VERSION:
            raise BlobFormatError(
                "header.version",
                "unsupported storage version (MILBlob v2 only; version 1 is Espresso blob_v1)",
                offset=HEADER.offset_of("version"),
                expected=VERSION,
                actual=h["version"],
            )
        self.header_count: int = h["count"]
        self.header_reserved: bytes = h["reserved"]
        room = (self.size - HEADER_SIZE) // METADATA_SIZE  # metadata records the file could hold at most
        if self.header_count > room:
            raise BlobFormatError(
                "header.count",
                f"header declares {self.header_count} blobs; a {self.size}-byte file holds at most {room}",
                offset=HEADER.offset_of("count"),
                expected=f"<= {room}",
                actual=self.header_count,
            )

    # -- records --------------------------------------------------------------------------------------

    def entry_at(self, metadata_offset: int) -> BlobEntry:
        """Parse and check the metadata record at ``metadata_offset`` (a ``BLOBFILE`` offset)."""
        buf = self._buffer()
        m = int(metadata_offset)
        if m < HEADER_SIZE:
            raise BlobFormatError(
                "metadata_offset",
                "points into the storage header",
                offset=m,
                expected=f">= {HEADER_SIZE}",
                actual=m,
            )
        if m > self.size - METADATA_SIZE:
            raise BlobFormatError(
                "metadata",
                f"a 64-byte metadata record does not fit in the file ({self.size} bytes)",
                offset=m,
                expected=METADATA_SIZE,
                actual=max(0, self.size - m),
            )
        r = METADATA.parse(buf, m)

        def err(name: str, message: str, expected: Any, actual: Any) -> BlobFormatError:
            return BlobFormatError(
                f"metadata.{name}",
                message,
                offset=m + METADATA.offset_of(name),
                expected=expected,
                actual=actual,
            )

        if r["sentinel"] != SENTINEL:
            raise err("sentinel", "not a blob metadata record", hex(SENTINEL), hex(r["sentinel"]))
        bd = BLOB_DTYPES.get(r["dtype"])
        if bd is None:
            raise err("dtype", "unknown blob dtype code", f"1..{max(BLOB_DTYPES)}", r["dtype"])
        size, data, pad = r["size_in_bytes"], r["data_offset"], r["padding_bits"]
        if data < m + METADATA_SIZE or data > self.size:
            raise err(
                "data_offset",
                f"data must start after its metadata record and inside the file ({self.size} bytes)",
                f"{m + METADATA_SIZE}..{self.size}",
                data,
            )
        if size > self.size - data:
            raise err(
                "size_in_bytes",
                f"data at {data:#x} runs past the end of the file ({self.size} bytes)",
                f"<= {self.size - data}",
                size,
            )
        if bd.sub_byte:
            bits = size * 8 - pad
            if pad >= 8 or (size == 0 and pad) or bits % bd.bits:
                raise err(
                    "padding_bits",
                    f"{size} bytes less {pad} padding bits is not a whole number of {bd.name} values",
                    "0..7 leaving a multiple of " + str(bd.bits),
                    pad,
                )
        elif size % bd.itemsize:
            raise err(
                "size_in_bytes",
                f"not a whole number of {bd.itemsize}-byte {bd.name} elements",
                f"a multiple of {bd.itemsize}",
                size,
            )
        return BlobEntry(m, bd.code, size, data, pad, r["reserved"])

    @property
    def entries(self) -> list[BlobEntry]:
        """Every blob in file order, found by walking the records (warns if the header count disagrees)."""
        if self._entries is None:
            self._entries = self._walk()
        return list(self._entries)

    def _record_at(self, pos: int) -> bool:
        return pos <= self.size - METADATA_SIZE and self._buffer()[pos : pos + 4] == _SENTINEL_BYTES

    def _walk(self) -> list[BlobEntry]:
        found: list[BlobEntry] = []
        pos = HEADER_SIZE
        while True:
            within = len(found) < self.header_count
            if not within and not self._record_at(pos):
                break
            if within and pos > self.size - METADATA_SIZE:
                raise BlobFormatError(
                    "header.count",
                    f"header declares {self.header_count} blobs but the file ends after {len(found)}",
                    offset=HEADER.offset_of("count"),
                    expected=self.header_count,
                    actual=len(found),
                )
            entry = self.entry_at(pos)
            found.append(entry)
            pos = align64(entry.data_end)
            if not self._record_at(pos) and self._record_at(entry.data_end):
                pos = entry.data_end  # chunks written back to back, without alignment padding
        if len(found) != self.header_count:
            warnings.warn(
                f"[milblob] {self.name}: header count is {self.header_count} but {len(found)} blob records "
                "follow one another; reading all of them",
                BlobWarning,
                stacklevel=3,
            )
        return found

    # -- data -----------------------------------------------------------------------------------------

    def raw(self, metadata_offset: int) -> memoryview:
        """The blob's stored bytes, zero-copy."""
        e = self.entry_at(metadata_offset)
        return memoryview(self._buffer())[e.data_offset : e.data_end].toreadonly()

    def read(
        self, metadata_offset: int, shape: Sequence[int] | None = None, dtype: DTypeLike | None = None
    ) -> np.ndarray:
        """The blob's values: a read-only zero-copy view (byte-aligned dtypes) or an unpacked copy (sub-byte).

        ``dtype`` and ``shape``, if given, are what the MIL const declares; a blob that disagrees raises
        BlobFormatError naming both. See ``BlobDType`` for the numpy dtype of each blob dtype.
        """
        e = self.entry_at(metadata_offset)
        bd = e.blob_dtype
        if dtype is not None:
            want = blob_dtype(dtype)
            if want.code != bd.code:
                raise BlobFormatError(
                    "metadata.dtype",
                    f"blob at {e.metadata_offset:#x} holds {bd.name}, the const declares {want.name}",
                    offset=e.metadata_offset + METADATA.offset_of("dtype"),
                    expected=want.name,
                    actual=bd.name,
                )
        n = e.elements
        if bd.sub_byte:
            raw = np.frombuffer(self._buffer(), dtype=np.uint8, count=e.size_in_bytes, offset=e.data_offset)
            arr = _unpack_bits(raw, bd.bits, n)
            if bd.name == "int4":
                arr = _sign_extend4(arr)
            arr.flags.writeable = False
        else:
            arr = np.frombuffer(self._buffer(), dtype=bd.np, count=n, offset=e.data_offset)
            if arr.flags.writeable:
                arr.flags.writeable = False
        if shape is None:
            return arr
        dims = tuple(int(d) for d in shape)
        if any(d < 0 for d in dims) or int(np.prod(dims, dtype=object)) != n:
            raise BlobFormatError(
                "metadata.size_in_bytes",
                f"blob at {e.metadata_offset:#x} holds {n} {bd.name} values, "
                f"the const declares shape {list(dims)}",
                offset=e.metadata_offset + METADATA.offset_of("size_in_bytes"),
                expected=list(dims),
                actual=n,
            )
        return arr.reshape(dims)

    def crc32(self, metadata_offset: int) -> int:
        """CRC-32 (zlib) of the blob's stored bytes."""
        return zlib.crc32(self.raw(metadata_offset))

    # -- lifetime -------------------------------------------------------------------------------------

    def _buffer(self) -> Any:
        if self._buf is None:
            raise ValueError(f"[milblob] {self.name} is closed")
        return self._buf

    def close(self) -> None:
        """Release the mapping (deferred while arrays read from it are alive)."""
        if self._mmap is not None:
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None
        self._buf = None

    def __enter__(self) -> BlobFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[BlobEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def describe(source: Source | BlobFile) -> list[dict[str, Any]]:
    """One dict per blob: metadata and data offsets, dtype, size, padding bits, values, CRC-32 of the data.

    A ``BlobFile`` given here is left open; anything else is opened and closed.
    """
    f = source if isinstance(source, BlobFile) else BlobFile(source)
    try:
        return [
            {
                "metadata_offset": e.metadata_offset,
                "data_offset": e.data_offset,
                "dtype": e.dtype,
                "dtype_code": e.dtype_code,
                "size_in_bytes": e.size_in_bytes,
                "padding_bits": e.padding_bits,
                "elements": e.elements,
                "crc32": f.crc32(e.metadata_offset),
            }
            for e in f.entries
        ]
    finally:
        if f is not source:
            f.close()


# --------------------------------------------------------------------------------------------------------
# ANE training API conveniences (fp16 weights, one file per weight)
# --------------------------------------------------------------------------------------------------------


def _values(w: Any, what: str, matrix: bool = False) -> np.ndarray:
    """``w`` as a float array of values (integers widened to float32, so none is taken as fp16 bits)."""
    a = np.asarray(w)
    if a.dtype.kind not in "biuf":
        raise BlobFormatError(what, f"expects numeric weights, got {a.dtype}", actual=str(a.dtype))
    if a.dtype.kind != "f":
        a = a.astype(np.float32)
    if matrix and a.ndim != 2:
        raise BlobFormatError(what, "expects a 2-d [rows, cols] weight", expected=2, actual=a.ndim)
    return a


def fp16_blob(w: Any) -> bytes:
    """A single-weight fp16 blob of ``w`` (row-major, rounded to nearest even); its data starts at 128."""
    return build_blob_bytes([(_values(w, "fp16_blob"), "fp16")])[0]


def fp16_blob_transposed(w: Any) -> bytes:
    """``fp16_blob`` of the transpose: a [rows, cols] weight stored as [cols, rows] row-major."""
    return build_blob_bytes([(_values(w, "fp16_blob_transposed", matrix=True).T, "fp16")])[0]


def fp16_blob_passthrough(a: Any) -> bytes:
    """A single-weight blob of an array that is already float16, stored bit for bit."""
    arr = np.asarray(a)
    if arr.dtype != np.float16:
        raise BlobFormatError(
            "fp16_blob_passthrough", "expects a float16 array", expected="float16", actual=str(arr.dtype)
        )
    return build_blob_bytes([(arr, "fp16")])[0]


def multi_chunk_blob(ws: Sequence[Any], transposed: bool = False) -> tuple[bytes, list[int]]:
    """Several fp16 weights in one file (fused QKV, FFN W1 + W3), each chunk's metadata right after the
    previous chunk's data; returns the bytes and each chunk's metadata offset.

    Chunk k's metadata is at ``64 + k * cs`` with ``cs = 64 + align64(elements * 2)``, the training API's
    ``64 + elements * 2`` whenever a chunk's data is a multiple of 64 bytes (any weight with a multiple of
    32 elements); otherwise data is zero-padded to keep records aligned. The header count is the true
    number of chunks.
    """
    items = []
    for i, w in enumerate(ws):
        a = _values(w, f"multi_chunk_blob[{i}]", matrix=transposed)
        items.append((a.T if transposed else a, "fp16"))
    return build_blob_bytes(items)


def int8_blob(w: Any) -> tuple[bytes, float]:
    """Per-tensor symmetric int8 quantization of ``w`` as a single int8 blob; returns (bytes, scale).

    ``scale = max|w| / 127`` and ``q = clip(round(w / scale), -127, 127)``, computed in float64 with
    round-half-to-even, so ``q * scale`` approximates ``w`` and -128 is never used. An all-zero ``w`` gets
    scale 1.0. Non-finite weights are rejected.
    """
    a = np.asarray(w)
    if a.dtype.kind not in "biuf":
        raise BlobFormatError("int8_blob", f"cannot quantize a {a.dtype} array", actual=str(a.dtype))
    peak = 0.0
    for piece in _flat_chunks(a, 1 << 20):
        p = piece.astype(np.float64)
        if not np.isfinite(p).all():
            raise BlobFormatError("int8_blob", "weights must be finite to quantize", actual="inf/nan")
        peak = max(peak, float(np.abs(p).max()))
    scale = peak / 127.0 if peak > 0 else 1.0
    q = np.empty(a.shape, dtype=np.int8)
    flat = q.reshape(-1)
    start = 0
    for piece in _flat_chunks(a, 1 << 20):
        stop = start + piece.size
        flat[start:stop] = np.clip(np.rint(piece.astype(np.float64) / scale), -127, 127)
        start = stop
    return build_blob_bytes([(q, "int8")])[0], scale
