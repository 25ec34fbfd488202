"""A MILBlob whose header declares more blobs than the file can hold is refused on open, by every reader
(the simulator's weight path as ``anekit inspect``), naming the field — before it was read by one and
refused by the other."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.blob import BlobFile, BlobFormatError, build_blob_bytes
from anekit.errors import CompilationFailed
from anekit.mil import tensor

PATH = "@model_path/weights/w.bin"


def _hostile(count: int) -> bytes:
    data, _ = build_blob_bytes([(np.eye(4, dtype=np.float32).reshape(4, 4, 1, 1), "fp16")])
    return struct.pack("<I", count) + data[4:]


@pytest.mark.parametrize("count", [2**32 - 1, 2])
def test_a_count_past_what_the_file_holds_is_refused_on_open(count):
    with pytest.raises(
        BlobFormatError, match=r"header\.count.*header declares \d+ blobs; a \d+-byte file holds at most 1"
    ):
        BlobFile(_hostile(count))
    assert BlobFile(_hostile(1)).header_count == 1  # the true count
    assert BlobFile(_hostile(0)).header_count == 0  # too small a count is read (fused files), with a warning


def test_the_simulator_refuses_such_a_weight_file_as_inspect_does():
    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, 32])})
    def prog(f, x):
        return f.conv(x=x, weight=f.weight(tensor("fp16", [4, 4, 1, 1]), PATH, 64, name="w"))

    sim = runtime.open("sim", strict=False)
    assert sim.compile(prog, {PATH: _hostile(1)})
    with pytest.raises(CompilationFailed, match="header declares 4294967295 blobs"):
        sim.compile(prog, {PATH: _hostile(2**32 - 1)})
