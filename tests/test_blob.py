"""MILBlob v2 weight files: layout, round trips for every dtype, ANE helpers, bad input, crash safety, CLI."""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

from anekit import blob
from anekit.blob import (
    ALIGNMENT,
    BLOB_DTYPES,
    HEADER,
    METADATA,
    SENTINEL,
    VERSION,
    BlobFile,
    BlobWarning,
    BlobWriter,
    build_blob_bytes,
    describe,
    fp16_blob,
    fp16_blob_passthrough,
    fp16_blob_transposed,
    int8_blob,
    multi_chunk_blob,
    write_blobs,
)
from anekit.cli import inspect_cmd
from anekit.errors import AnekitError, BlobFormatError
from anekit.fp16 import bf16_bits_to_f32
from anekit.mil.types import DTYPES
from tests.conftest import corpus_files

# The layout written out by hand (independent of anekit.blob's tables).
HDR = struct.Struct("<II56s")  # count, version, reserved
META = struct.Struct("<IIQQQ32s")  # sentinel, dtype, size_in_bytes, data_offset, padding_bits, reserved


def header(count: int, version: int = 2) -> bytes:
    return HDR.pack(count, version, bytes(56))


def meta(dtype: int, size: int, data_offset: int, padding: int = 0, sentinel: int = 0xDEADBEEF) -> bytes:
    return META.pack(sentinel, dtype, size, data_offset, padding, bytes(32))


def random_values(code: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Values covering the whole range of a dtype; float types as raw bit patterns (NaNs included)."""
    name = BLOB_DTYPES[code].name
    if name in ("fp16", "bf16"):
        return rng.integers(0, 1 << 16, n, dtype=np.uint16)
    if name == "fp32":
        return rng.integers(0, 1 << 32, n, dtype=np.uint32).view(np.float32)
    lo, hi = BLOB_DTYPES[code].value_range()
    return rng.integers(lo, hi, n, endpoint=True, dtype=np.int64)


def as_comparable(code: int, a: np.ndarray) -> np.ndarray:
    """Bit patterns for float types (so NaN payloads compare), values otherwise."""
    name = BLOB_DTYPES[code].name
    if name == "fp16":
        return np.asarray(a).view(np.uint16)
    if name == "fp32":
        return np.asarray(a, dtype=np.float32).view(np.uint32)
    return np.asarray(a).astype(np.int64)


# -- the tables --------------------------------------------------------------------------------------


def test_record_tables_are_64_bytes_and_round_trip():
    assert (HEADER.size, METADATA.size, ALIGNMENT, SENTINEL, VERSION) == (64, 64, 64, 0xDEADBEEF, 2)
    assert [(f.name, f.offset) for f in METADATA.fields] == [
        ("sentinel", 0),
        ("dtype", 4),
        ("size_in_bytes", 8),
        ("data_offset", 16),
        ("padding_bits", 24),
        ("reserved", 32),
    ]
    values = {"count": 7, "version": 2, "reserved": bytes(range(56))}
    raw = HEADER.build(**values)
    assert raw == HDR.pack(7, 2, bytes(range(56)))
    assert HEADER.parse(raw) == values and HEADER.build(**HEADER.parse(raw)) == raw
    m = {"sentinel": SENTINEL, "dtype": 5, "size_in_bytes": 2**40, "data_offset": 128, "padding_bits": 3}
    m["reserved"] = b"\xaa" * 32
    assert METADATA.build(**m) == META.pack(*m.values()) and METADATA.parse(METADATA.build(**m)) == m


def test_dtype_table_matches_mil_types():
    assert sorted(BLOB_DTYPES) == list(range(1, 18))
    for code, d in BLOB_DTYPES.items():
        assert blob.blob_dtype(code) is d and blob.blob_dtype(d.name) is d
        if d.name.startswith("fp8"):
            assert d.bits == 8
            continue
        assert d.name in DTYPES and DTYPES[d.name].bits == d.bits, d
        assert blob.blob_dtype(DTYPES[d.name]) is d
    assert (BLOB_DTYPES[16].name, BLOB_DTYPES[17].name) == ("fp8e4m3", "fp8e5m2")
    with pytest.raises(BlobFormatError, match="dtype"):
        blob.blob_dtype("fp64")
    with pytest.raises(BlobFormatError, match="dtype"):
        blob.blob_dtype(18)


# -- round trips ------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(BLOB_DTYPES), ids=lambda c: BLOB_DTYPES[c].name)
def test_every_dtype_round_trips_through_a_file(tmp_path, code):
    rng = np.random.default_rng(code)
    arrays = [random_values(code, n, rng) for n in (1, 7, 8, 9, 100, 1001, 0)]
    path = tmp_path / "w.bin"
    with BlobWriter(path) as w:
        offsets = [w.append(a, code) for a in arrays]
    assert all(off % 64 == 0 for off in offsets) and offsets[0] == 64
    raw = path.read_bytes()
    assert HDR.unpack_from(raw, 0)[:2] == (len(arrays), 2)
    with BlobFile(path) as f:
        entries = f.entries
        assert [e.metadata_offset for e in entries] == offsets
        for a, e in zip(arrays, entries):
            assert e.dtype_code == code and e.dtype == BLOB_DTYPES[code].name
            assert e.data_offset == e.metadata_offset + 64 and e.data_offset % 64 == 0
            assert e.elements == a.size
            assert raw[e.metadata_offset : e.data_offset] == e.to_bytes()  # build(parse(b)) == b
            got = f.read(e.metadata_offset, shape=a.shape, dtype=BLOB_DTYPES[code].name)
            if BLOB_DTYPES[code].name == "bf16":
                assert np.array_equal(got, a)
                assert np.array_equal(bf16_bits_to_f32(got).view(np.uint32) >> 16, a.astype(np.uint32))
            else:
                assert np.array_equal(as_comparable(code, got), as_comparable(code, a))
            # raw bytes in, the same record and bytes out
            with BlobWriter(tmp_path / "raw.bin") as rw:
                rw.append(f.raw(e.metadata_offset), code, count=e.elements)
            again = (tmp_path / "raw.bin").read_bytes()
            (g,) = BlobFile(again).entries
            assert (g.dtype_code, g.size_in_bytes, g.padding_bits) == (code, e.size_in_bytes, e.padding_bits)
            assert again[128:] == raw[e.data_offset : e.data_end]


def test_raw_sub_byte_bytes_need_a_count_to_know_the_padding(tmp_path):
    data, (off,) = build_blob_bytes([(bytes([0x7F, 0x00]), "uint6")])  # default: as many as fit
    assert (BlobFile(data).entry_at(off).elements, BlobFile(data).entry_at(off).padding_bits) == (2, 4)
    data, (off,) = build_blob_bytes([(bytes(3), "uint6")])
    assert (BlobFile(data).entry_at(off).elements, BlobFile(data).entry_at(off).padding_bits) == (4, 0)
    with BlobWriter(tmp_path / "w.bin") as w:
        off = w.append(bytes(3), "uint6", count=3)
        with pytest.raises(BlobFormatError, match="count"):
            w.append(bytes(3), "uint6", count=5)
        with pytest.raises(BlobFormatError, match="count"):
            w.append(np.zeros(4), "uint6", count=5)
    f = BlobFile(tmp_path / "w.bin")
    assert f.entry_at(off).padding_bits == 6 and f.read(off).size == 3 and len(f.entries) == 1


@pytest.mark.parametrize(
    ("values", "name", "packed", "padding"),
    [
        ([1, 2, 3, 4, 5, 6, 7, 0], "uint3", [0xD1, 0x58, 0x1F], 0),
        ([-1, 2, -8], "int4", [0x2F, 0x08], 4),
        ([1, 0, 1, 1, 0, 0, 0, 0, 1], "uint1", [0x0D, 0x01], 7),
        ([63, 1], "uint6", [0x7F, 0x00], 4),
        ([3, 0, 1, 2, 1], "uint2", [0x93, 0x01], 6),
        ([15, 1, 7], "uint4", [0x1F, 0x07], 4),
    ],
)
def test_sub_byte_packing_is_lsb_first(values, name, packed, padding):
    data, (off,) = build_blob_bytes([(np.array(values), name)])
    f = BlobFile(data)
    e = f.entry_at(off)
    assert bytes(f.raw(off)) == bytes(packed) and e.padding_bits == padding
    assert f.read(off).tolist() == values


def test_streaming_in_small_chunks_and_from_strided_arrays_gives_the_same_bytes(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((67, 45)).astype(np.float32)
    q = rng.integers(-8, 8, (37, 11))
    items = [
        (w, "fp16"),
        (w.T, "fp16"),
        (w, "bf16"),
        (w.T, "fp32"),
        (q.T, "int4"),
        (q, "int16"),
        (q.T, "uint32"),
    ]
    items[-1] = (np.abs(q.T), "uint32")
    reference = [
        (np.ascontiguousarray(a), d) if a.dtype.kind != "f" else (np.ascontiguousarray(a, np.float32), d)
        for a, d in items
    ]
    expected, offsets = build_blob_bytes(reference)
    for chunk_bytes in (8, 100, 4096):
        path = tmp_path / f"c{chunk_bytes}.bin"
        with BlobWriter(path, chunk_bytes=chunk_bytes) as bw:
            assert [bw.append(a, d) for a, d in items] == offsets
        assert path.read_bytes() == expected
    f = BlobFile(expected)
    assert np.array_equal(f.read(offsets[1], shape=(45, 67)), w.T.astype(np.float16))
    assert np.array_equal(f.read(offsets[4], shape=(11, 37)), q.T)


def test_fp16_conversion_rounds_like_numpy_and_keeps_float16_bits():
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((33, 17)) * np.logspace(-9, 5, 17)).astype(np.float32)
    w[0, :6] = [65504, 65520, -1e9, 2.0**-25, 3 * 2.0**-26, -0.0]
    f = BlobFile(fp16_blob(w))
    with np.errstate(over="ignore"):
        ref = w.astype(np.float16)
    assert np.array_equal(f.read(64).view(np.uint16), ref.reshape(-1).view(np.uint16))
    bits = rng.integers(0, 1 << 16, 500, dtype=np.uint16)
    assert np.array_equal(
        BlobFile(fp16_blob_passthrough(bits.view(np.float16))).read(64).view(np.uint16), bits
    )
    with pytest.raises(BlobFormatError, match="float16"):
        fp16_blob_passthrough(w)


# -- the ANE training API conveniences ---------------------------------------------------------------


def test_single_fp16_blob_matches_the_training_api_layout_byte_for_byte():
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 8 - 0.5
    b = fp16_blob(w)
    expected = bytearray(128)
    expected[0] = 0x01  # count
    expected[4] = 0x02  # version
    expected[64:68] = bytes([0xEF, 0xBE, 0xAD, 0xDE])  # sentinel
    expected[68] = 0x01  # dtype fp16
    expected[72:76] = (12 * 2).to_bytes(4, "little")  # data size in bytes
    expected[80:84] = (128).to_bytes(4, "little")  # data offset
    assert b[:128] == bytes(expected)
    assert b[128:] == w.astype(np.float16).tobytes() and len(b) == 128 + 24


def test_fp16_blob_transposed_stores_the_transpose():
    w = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
    b = fp16_blob_transposed(w)
    assert b[128:] == np.ascontiguousarray(w.T).astype(np.float16).tobytes()
    assert b[:128] == fp16_blob(w.T)[:128]
    with pytest.raises(BlobFormatError, match="2-d"):
        fp16_blob_transposed(np.zeros(3))


@pytest.mark.parametrize("transposed", [False, True])
def test_multi_chunk_offsets_follow_the_training_api(transposed):
    rng = np.random.default_rng(4)
    ws = [rng.standard_normal((16, 8)).astype(np.float32) for _ in range(3)]  # 128 values = 256 bytes
    data, offsets = multi_chunk_blob(ws, transposed=transposed)
    cs = 64 + 128 * 2
    assert offsets == [64, 64 + cs, 64 + 2 * cs]
    assert HDR.unpack_from(data)[0] == 3 and len(data) == 64 + 3 * cs
    f = BlobFile(data)
    for off, w in zip(offsets, ws):
        ref = w.T if transposed else w
        assert np.array_equal(f.read(off, shape=ref.shape, dtype="fp16"), ref.astype(np.float16))


def test_multi_chunk_pads_chunks_whose_data_is_not_64_byte_multiple():
    ws = [np.ones((3, 5), np.float32), 2 * np.ones((3, 5), np.float32)]  # 30 bytes each
    data, offsets = multi_chunk_blob(ws)
    assert offsets == [64, 64 + 64 + 64]
    assert BlobFile(data).read(offsets[1]).tolist() == [2.0] * 15


def test_int8_blob_matches_an_independent_float64_quantization():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((31, 29)).astype(np.float32)
    w[3, 3] = -4.25  # the peak, negative
    w[0, :4] = np.array([0.5, 1.5, -2.5, 0]) * (4.25 / 127)  # exact halves: ties go to even
    data, scale = int8_blob(w)
    ref_scale = float(np.max(np.abs(w.astype(np.float64)))) / 127.0
    ref = np.clip(np.round(w.astype(np.float64) / ref_scale), -127, 127).astype(np.int8)
    assert scale == ref_scale
    q = BlobFile(data).read(64, shape=w.shape, dtype="int8")
    assert np.array_equal(q, ref) and q[3, 3] == -127 and q.min() >= -127
    assert q[0, :4].tolist() == ref[0, :4].tolist()
    assert np.max(np.abs(q * scale - w)) <= scale / 2 + 1e-12
    assert int8_blob(np.zeros((2, 2)))[1] == 1.0
    with pytest.raises(BlobFormatError, match="finite"):
        int8_blob(np.array([1.0, np.inf]))


# -- reading variants seen in the wild ---------------------------------------------------------------


def test_non_aligned_data_offset_is_honoured():
    values = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    data_offset = 64 + 64 + 7
    raw = header(1) + meta(2, 12, data_offset) + b"\x99" * 7 + values.tobytes()
    f = BlobFile(raw)
    assert f.entries[0].data_offset == data_offset
    assert f.read(64).tolist() == values.tolist()


@pytest.mark.parametrize("n", [128, 15], ids=["aligned-chunks", "back-to-back-chunks"])
def test_count_one_multi_chunk_file_reads_every_chunk_with_a_warning(n):
    """As ANE weight generators write fused blobs: count 1, chunk k's record at 64 + k * (64 + n * 2)."""
    chunks = [np.full(n, k + 1, np.float16) for k in range(3)]
    raw = bytearray(header(1))
    offsets = []
    for c in chunks:
        offsets.append(len(raw))
        raw += meta(1, c.nbytes, len(raw) + 64) + c.tobytes()
    assert offsets == [64 + k * (64 + n * 2) for k in range(3)]
    f = BlobFile(bytes(raw))
    with pytest.warns(BlobWarning, match="header count is 1 but 3"):
        entries = f.entries
    assert [e.metadata_offset for e in entries] == offsets
    for k, off in enumerate(offsets):
        assert f.read(off).tolist() == [k + 1] * n


def test_empty_files_and_empty_blobs():
    assert BlobFile(header(0)).entries == []
    data, offsets = build_blob_bytes(
        [(np.zeros(0, np.float32), "fp16"), (b"", "uint4"), (np.ones(1), "fp32")]
    )
    assert offsets == [64, 128, 192]
    f = BlobFile(data)
    assert [f.read(o).size for o in offsets] == [0, 0, 1]
    with pytest.warns(BlobWarning, match="header count is 0 but 1"):
        assert len(BlobFile(header(0) + meta(3, 1, 128) + b"\x05").entries) == 1


def test_reader_sources_views_and_close(tmp_path):
    data, (off,) = build_blob_bytes([(np.arange(6, dtype=np.float32), "fp32")])
    path = tmp_path / "w.bin"
    path.write_bytes(data)
    for source in (path, str(path), data, bytearray(data), memoryview(data)):
        with BlobFile(source) as f:
            a = f.read(off, shape=(2, 3))
            assert a.tolist() == [[0, 1, 2], [3, 4, 5]] and not a.flags.writeable
        assert a.sum() == 15  # still valid after close
        with pytest.raises(ValueError, match="closed"):
            f.read(off)
    with BlobFile(path) as f:
        assert np.shares_memory(f.read(off), f.read(off))  # views of the one mapping


def test_describe_gives_offsets_dtypes_sizes_and_crc32(tmp_path):
    path = tmp_path / "w.bin"
    offsets = write_blobs(path, [(np.ones((4, 4)), "fp16"), (np.arange(9) % 7, "uint3")])
    rows = describe(path)
    raw = path.read_bytes()
    assert [r["metadata_offset"] for r in rows] == offsets
    assert [(r["dtype"], r["size_in_bytes"], r["padding_bits"], r["elements"]) for r in rows] == [
        ("fp16", 32, 0, 16),
        ("uint3", 4, 5, 9),
    ]
    for r in rows:
        assert r["crc32"] == zlib.crc32(raw[r["data_offset"] : r["data_offset"] + r["size_in_bytes"]])


# -- bad input -----------------------------------------------------------------------------------------

GOOD = header(1) + meta(2, 8, 128) + np.array([1, 2], np.float32).tobytes()


def corrupt(at: int, fmt: str, value: int, base: bytes = GOOD) -> bytes:
    b = bytearray(base)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


@pytest.mark.parametrize(
    ("raw", "field", "offset"),
    [
        (GOOD[:40], "header", 0x0),
        (b"", "header", 0x0),
        (corrupt(4, "<I", 1), "header.version", 0x4),
        (corrupt(64, "<I", 0xDEADBEEE), "metadata.sentinel", 0x40),
        (corrupt(68, "<I", 99), "metadata.dtype", 0x44),
        (corrupt(68, "<I", 0), "metadata.dtype", 0x44),
        (corrupt(80, "<Q", 10**6), "metadata.data_offset", 0x50),
        (corrupt(80, "<Q", 64), "metadata.data_offset", 0x50),
        (corrupt(72, "<Q", 2**64 - 1), "metadata.size_in_bytes", 0x48),
        (corrupt(80, "<Q", 2**64 - 64, corrupt(72, "<Q", 128)), "metadata.data_offset", 0x50),
        (corrupt(72, "<Q", 16), "metadata.size_in_bytes", 0x48),
        (corrupt(72, "<Q", 6), "metadata.size_in_bytes", 0x48),
        (corrupt(68, "<I", 12), "metadata.padding_bits", 0x58),  # uint3: 64 bits is not a multiple of 3
        (corrupt(88, "<Q", 9, corrupt(68, "<I", 11)), "metadata.padding_bits", 0x58),
        (corrupt(0, "<I", 2), "header.count", 0x0),
        (GOOD[:100], "header.count", 0x0),
    ],
)
def test_bad_files_raise_blob_format_errors_that_say_where(tmp_path, raw, field, offset):
    path = tmp_path / "bad.bin"
    path.write_bytes(raw)
    for source in (raw, path):
        with pytest.raises(BlobFormatError) as info:
            f = BlobFile(source)
            for e in f.entries:
                f.read(e.metadata_offset)
        err = info.value
        assert (err.field, err.offset) == (field, offset)
        assert str(err).startswith(f"[milblob] {field} at byte {offset:#x}: ")


def test_entry_at_checks_the_offset_itself():
    f = BlobFile(GOOD)
    with pytest.raises(BlobFormatError, match=r"metadata_offset at byte 0x0"):
        f.entry_at(0)
    with pytest.raises(BlobFormatError, match=r"\] metadata at byte 0x3b9aca00"):
        f.entry_at(10**9)
    with pytest.raises(BlobFormatError, match=r"metadata.sentinel at byte 0x48"):
        f.entry_at(72)


def test_read_checks_the_declared_dtype_and_shape():
    f = BlobFile(GOOD)
    with pytest.raises(BlobFormatError, match=r"metadata.dtype at byte 0x44: .*fp32.*fp16") as info:
        f.read(64, dtype="fp16")
    assert (info.value.expected, info.value.actual) == ("fp16", "fp32")
    with pytest.raises(BlobFormatError, match=r"metadata.size_in_bytes at byte 0x48: .*\[3, 1\]") as info:
        f.read(64, shape=(3, 1), dtype="fp32")
    assert (info.value.expected, info.value.actual) == ([3, 1], 2)
    assert f.read(64, shape=(2, 1), dtype=2).shape == (2, 1)


@pytest.mark.parametrize("path", corpus_files("ane_weights", "*"), ids=lambda p: p.name)
def test_corpus_espresso_and_raw_weights_are_not_milblob(path):
    with pytest.raises(BlobFormatError) as info:
        BlobFile(path).entries  # noqa: B018
    assert info.value.field in ("header", "header.version")


@pytest.mark.parametrize(
    ("data", "dtype", "match"),
    [
        (np.array([1.5]), "int8", "integer values"),
        (np.array([128]), "int8", r"value 128 does not fit int8"),
        (np.array([8]), "int4", "does not fit int4"),
        (np.array([-1]), "uint2", "does not fit uint2"),
        (np.array([256]), "fp8e4m3", "does not fit fp8e4m3"),
        (np.array(["a"]), "fp16", "cannot store"),
        (b"\x00\x01\x02", "fp16", "whole number"),
        (np.zeros(3), "fp64", "not a MILBlob dtype"),
    ],
)
def test_writer_rejects_values_that_do_not_fit(data, dtype, match):
    with pytest.raises(BlobFormatError, match=match):
        build_blob_bytes([(data, dtype)])


def test_a_failed_append_leaves_the_writer_usable(tmp_path):
    path = tmp_path / "w.bin"
    bad = np.arange(100_000) % 20  # values >= 16 appear after the first chunk
    bad[:64] = 0
    with BlobWriter(path, chunk_bytes=64) as w:
        first = w.append(np.ones(3), "fp32")
        with pytest.raises(BlobFormatError, match="uint4"):
            w.append(bad, "uint4")
        second = w.append(np.arange(3), "uint8")
    assert (first, second) == (64, 192)
    f = BlobFile(path)
    assert len(f.entries) == 2 and f.read(second).tolist() == [0, 1, 2]


class FailingStream(io.BytesIO):
    """A stream whose writes fail once it holds more than ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def write(self, b) -> int:  # type: ignore[override]
        if self.tell() + memoryview(b).nbytes > self.limit:
            raise OSError(28, "No space left on device")
        return super().write(b)


@pytest.mark.parametrize("limit", [150, 300, 5000, 60_000])
def test_a_failing_write_is_raised_and_rolled_back(limit):
    stream = FailingStream(limit)
    w = blob._BlobStream(stream, chunk_bytes=1024)
    first = w.append(np.ones(8), "fp16")
    end = stream.tell()
    with pytest.raises(OSError, match="No space"):
        w.append(np.arange(40_000, dtype=np.float32), "fp16")  # several chunks: writes in a second thread
    assert stream.tell() == end and len(stream.getvalue()) == end and w.count == 1
    w._finish()
    assert [e.metadata_offset for e in BlobFile(stream.getvalue()).entries] == [first]


# -- crash safety --------------------------------------------------------------------------------------


def test_an_exception_inside_the_writer_leaves_the_old_file_untouched(tmp_path):
    path = tmp_path / "weights.bin"
    write_blobs(path, [(np.arange(10, dtype=np.float32), "fp16")])
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="boom"), BlobWriter(path) as w:
        w.append(np.zeros(1000, np.float32), "fp32")
        raise RuntimeError("boom")
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["weights.bin"]
    w = BlobWriter(tmp_path / "other.bin")
    w.append(b"\x00\x01", "fp16")
    w.abort()
    assert sorted(os.listdir(tmp_path)) == ["weights.bin"]


def test_the_writer_replaces_the_file_only_on_close(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"old")
    w = BlobWriter(path)
    w.append(np.ones(4), "fp16")
    assert path.read_bytes() == b"old"
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.append(np.ones(1), "fp16")
    assert BlobFile(path).header_count == 1 and len(os.listdir(tmp_path)) == 1


# -- CLI -----------------------------------------------------------------------------------------------


def run_inspect(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="anekit")
    inspect_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.run(args)


def test_inspect_prints_one_line_per_blob_and_a_summary(tmp_path, capsys):
    path = tmp_path / "w.bin"
    write_blobs(path, [(np.ones((8, 8)), "fp16"), (np.arange(5), "uint3")])
    assert run_inspect(["inspect", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    crc = zlib.crc32(path.read_bytes()[128 : 128 + 128])
    assert lines[1].split() == ["0x40", "0x80", "fp16", "128", "0", f"{crc:08x}"]
    assert lines[2].split()[:5] == ["0x100", "0x140", "uint3", "2", "1"]
    assert lines[3] == f"{path}: MILBlob v2, 2 blobs, 130 data bytes, file 322 bytes, header count 2"


def test_inspect_json_and_warnings(tmp_path, capsys):
    path = tmp_path / "fused.bin"
    c = np.ones(32, np.float16)
    path.write_bytes(header(1) + meta(1, 64, 128) + c.tobytes() + meta(1, 64, 256) + c.tobytes())
    assert run_inspect(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "milblob" and info["header_count"] == 1
    assert [e["metadata_offset"] for e in info["entries"]] == [64, 192]
    assert "header count is 1 but 2" in info["warnings"][0]
    assert run_inspect(["inspect", str(path)]) == 0
    assert "warning: [milblob]" in capsys.readouterr().out


def test_inspect_rejects_other_files_with_an_anekit_error(tmp_path):
    other = tmp_path / "model.espresso.bin"
    other.write_bytes(bytes(200))
    with pytest.raises(AnekitError, match=r"\[inspect\] .*not a file kind anekit can inspect.*MILBlob"):
        run_inspect(["inspect", str(other)])
    with pytest.raises(AnekitError, match="cannot read"):
        run_inspect(["inspect", str(tmp_path / "missing.bin")])
    broken = tmp_path / "broken.bin"
    broken.write_bytes(corrupt(68, "<I", 99))
    with pytest.raises(BlobFormatError, match=r"metadata\.dtype"):
        run_inspect(["inspect", str(broken)])


@pytest.mark.parametrize("path", corpus_files("ane_weights", "*"), ids=lambda p: p.name)
def test_the_corpus_weight_files_are_raw_ane_weights_not_milblob(path: Path, capsys):
    assert run_inspect(["inspect", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "ane_weights"


def test_no_warning_for_well_formed_files():
    data, _ = build_blob_bytes([(np.ones(3), "fp16"), (np.ones(70, np.uint8), "uint1")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(BlobFile(data).entries) == 2
