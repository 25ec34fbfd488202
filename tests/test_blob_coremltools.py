"""Every blob dtype code pinned to coremltools' own MILBlob storage (its C++ reader and writer): a file
anekit writes is read back by coremltools, and a file coremltools writes is read by anekit, value for
value. Swapping two codes (e.g. int16 / uint16) fails here. bf16 and the fp8 codes have no coremltools
writer or reader; they are pinned by tests/test_blob.py against the reference document only."""

from __future__ import annotations

import numpy as np
import pytest

from anekit.blob import BlobFile, write_blobs

storage = pytest.importorskip("coremltools.libmilstoragepython", reason="coremltools (the coreml extra)")

RNG = np.random.default_rng(0)
# anekit dtype name -> (coremltools' method suffix, values as anekit takes them, as coremltools returns them)
CASES = {
    "fp16": ("fp16", RNG.standard_normal(37).astype(np.float16)),
    "fp32": ("float", RNG.standard_normal(37).astype(np.float32)),
    "uint8": ("uint8", RNG.integers(0, 256, 37).astype(np.uint8)),
    "int8": ("int8", RNG.integers(-128, 128, 37).astype(np.int8)),
    "int16": ("int16", RNG.integers(-(2**15), 2**15, 37).astype(np.int16)),
    "uint16": ("uint16", RNG.integers(0, 2**16, 37).astype(np.uint16)),
    "int32": ("int32", RNG.integers(-(2**31), 2**31, 37).astype(np.int32)),
    "uint32": ("uint32", RNG.integers(0, 2**32, 37).astype(np.uint32)),
    "int4": ("int4", RNG.integers(-8, 8, 40).astype(np.int8)),
    "uint4": ("uint4", RNG.integers(0, 16, 40).astype(np.uint8)),
    "uint1": ("uint1", RNG.integers(0, 2, 64).astype(np.uint8)),
    "uint2": ("uint2", RNG.integers(0, 4, 64).astype(np.uint8)),
    "uint3": ("uint3", RNG.integers(0, 8, 64).astype(np.uint8)),
    "uint6": ("uint6", RNG.integers(0, 64, 64).astype(np.uint8)),
}


def _as_ct(name: str, values: np.ndarray) -> np.ndarray:
    return values.view(np.uint16) if name == "fp16" else values


@pytest.mark.parametrize("name", sorted(CASES))
def test_coremltools_reads_what_anekit_writes(tmp_path, name):
    suffix, values = CASES[name]
    path = tmp_path / "w.bin"
    (offset,) = write_blobs(path, [(values, name)])
    got = getattr(storage._BlobStorageReader(str(path)), f"read_{suffix}_data")(offset)
    np.testing.assert_array_equal(np.asarray(got), _as_ct(name, values))


@pytest.mark.parametrize("name", sorted(CASES))
def test_anekit_reads_what_coremltools_writes(tmp_path, name):
    suffix, values = CASES[name]
    path = tmp_path / "w.bin"
    writer = storage._BlobStorageWriter(str(path))
    offset = getattr(writer, f"write_{suffix}_data")(_as_ct(name, values))
    del writer  # flushes and closes the file
    f = BlobFile(path)
    entry = f.entry_at(offset)
    assert entry.dtype == name
    np.testing.assert_array_equal(f.read(offset), values)
    f.close()
