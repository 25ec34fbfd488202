"""Fuzzing the MILBlob reader: mutated files either read or raise BlobFormatError, quickly, never anything else."""

from __future__ import annotations

import contextlib
import struct
import time
import warnings

import numpy as np
import pytest

from anekit.blob import HEADER, METADATA, BlobFile, BlobWarning, build_blob_bytes, describe
from anekit.errors import BlobFormatError

U64_VALUES = (0, 1, 2, 7, 63, 64, 65, 127, 128, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 64, 2**64 - 1)


def valid_files() -> list[tuple[bytes, list[int]]]:
    rng = np.random.default_rng(0)
    mixed = build_blob_bytes(
        [
            (rng.standard_normal((5, 7)).astype(np.float32), "fp16"),
            (rng.integers(0, 8, 11), "uint3"),
            (rng.integers(-8, 8, 9), "int4"),
            (rng.standard_normal(6), "fp32"),
            (rng.integers(-128, 128, 33), "int8"),
            (rng.integers(0, 2, 70), "uint1"),
            (rng.integers(0, 64, 5), "uint6"),
            (rng.integers(0, 1 << 16, 4, dtype=np.uint16), "bf16"),
        ]
    )
    # The fused multi-chunk shape of ANE weight generators: count 1, chunks back to back.
    fused = bytearray(struct.pack("<II56s", 1, 2, bytes(56)))
    offsets = []
    for k in range(3):
        chunk = np.full(15, k, np.float16).tobytes()
        offsets.append(len(fused))
        fused += struct.pack("<IIQQQ32s", 0xDEADBEEF, 1, len(chunk), len(fused) + 64, 0, bytes(32)) + chunk
    return [mixed, (bytes(fused), offsets)]


def field_positions(offsets: list[int]) -> list[tuple[int, str]]:
    """(byte position, struct code) of every numeric header and metadata field."""
    spots = [(f.offset, f.code) for f in HEADER.fields if not f.code.endswith("s")]
    for m in offsets:
        spots += [(m + f.offset, f.code) for f in METADATA.fields if not f.code.endswith("s")]
    return spots


def mutate(raw: bytes, offsets: list[int], rng: np.random.Generator) -> bytes:
    b = bytearray(raw)
    for _ in range(int(rng.integers(1, 4))):
        kind = rng.integers(0, 4)
        if kind == 0:  # bit flips, mostly in the records
            for _ in range(int(rng.integers(1, 9))):
                if rng.random() < 0.7:
                    base = int(rng.choice([0, *offsets]))
                    pos = base + int(rng.integers(0, 64))
                else:
                    pos = int(rng.integers(0, max(1, len(b))))
                if pos < len(b):
                    b[pos] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:  # truncation
            del b[int(rng.integers(0, len(b) + 1)) :]
        else:  # a field overwritten with a random or boundary value
            pos, code = field_positions(offsets)[int(rng.integers(0, len(field_positions(offsets))))]
            width = struct.calcsize("<" + code)
            limit = 1 << (8 * width)
            pick = rng.random()
            if pick < 0.4:
                value = int(rng.integers(0, limit - 1, dtype=np.uint64, endpoint=True))
            elif pick < 0.8:
                value = U64_VALUES[int(rng.integers(0, len(U64_VALUES)))] % limit
            else:
                value = (len(raw) + int(rng.integers(-70, 70))) % limit
            if pos + width <= len(b):
                struct.pack_into("<" + code, b, pos, value)
    return bytes(b)


def read_everything(source, offsets: list[int]) -> None:
    """Everything a consumer might do; only BlobFormatError may escape."""
    f = BlobFile(source)
    try:
        for e in f.entries:
            a = f.read(e.metadata_offset)
            assert a.size == e.elements
            f.crc32(e.metadata_offset)
        for off in offsets:
            with contextlib.suppress(BlobFormatError):
                f.read(off, shape=(f.entry_at(off).elements,))
        describe(source)
    finally:
        f.close()


@pytest.mark.parametrize("which", [0, 1], ids=["mixed", "fused-count-1"])
def test_mutated_files_read_or_raise_blob_format_error(which):
    raw, offsets = valid_files()[which]
    rng = np.random.default_rng(1234 + which)
    outcomes = {"ok": 0, "error": 0}
    slowest = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BlobWarning)
        read_everything(raw, offsets)  # the unmutated file reads
        for case in range(1500):
            data = mutate(raw, offsets, rng)
            start = time.perf_counter()
            try:
                read_everything(data, offsets)
                outcomes["ok"] += 1
            except BlobFormatError as e:
                assert str(e).startswith("[milblob] "), e
                outcomes["error"] += 1
            except Exception as e:  # pragma: no cover - the failure being tested for
                pytest.fail(f"case {case}: {type(e).__name__}: {e} on {data.hex()}")
            slowest = max(slowest, time.perf_counter() - start)
    assert outcomes["ok"] > 50 and outcomes["error"] > 300, outcomes
    assert slowest < 0.5


def test_mutated_files_on_disk_too(tmp_path):
    raw, offsets = valid_files()[0]
    rng = np.random.default_rng(99)
    path = tmp_path / "w.bin"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BlobWarning)
        for _ in range(100):
            path.write_bytes(mutate(raw, offsets, rng))
            with contextlib.suppress(BlobFormatError):
                read_everything(path, offsets)


def test_every_truncation_of_a_valid_file():
    raw, offsets = valid_files()[0]
    for n in range(len(raw)):
        with pytest.raises(BlobFormatError):
            read_everything(raw[:n], offsets)
