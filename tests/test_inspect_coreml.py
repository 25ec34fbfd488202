"""CoreML .mlmodel specs: the corpus files summarise, hand-built specs decode, corrupt ones fail cleanly."""

from __future__ import annotations

import contextlib
import random

import pytest

from anekit.errors import FormatError
from anekit.inspect import coreml
from tests.conftest import corpus_files

MLMODELS = corpus_files("mlmodel", "*.mlmodel")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _spec() -> bytes:
    feature = lambda name: _field(1, name.encode())  # noqa: E731
    description = _field(1, feature("x")) + _field(10, feature("y"))
    layer = _field(1, b"fc") + _field(2, b"x") + _field(3, b"y") + _field(140, b"")
    return _varint(1 << 3) + _varint(4) + _field(2, description) + _field(500, _field(1, layer))


def test_a_hand_built_spec_decodes():
    data = _spec()
    assert coreml.detect(data)
    s = coreml.summarize(data)
    assert s["specification_version"] == 4 and s["inputs"] == ["x"] and s["outputs"] == ["y"]
    assert s["model_type"] == "neuralNetwork"
    assert s["layers"] == [{"name": "fc", "type": "innerProduct", "inputs": ["x"], "outputs": ["y"]}]


@pytest.mark.parametrize("path", MLMODELS, ids=lambda p: p.name)
def test_corpus_specs_summarise(path):
    data = path.read_bytes()
    assert coreml.detect(data)
    s = coreml.summarize(data)
    assert s["specification_version"] == 1 and s["model_type"] == "neuralNetwork"
    assert s["inputs"][0] == "image" and s["outputs"] == ["probs"]
    types = [layer["type"] for layer in s["layers"]]
    assert types in (["add"], ["innerProduct", "bias"])  # the sum model, and the gemm models


def test_other_files_are_not_taken_for_specs():
    for folder, pattern in (("mil", "*.mil"), ("hwx", "*.hwx"), ("llama2c", "*.bin"), ("ane_td", "*.bin")):
        for path in corpus_files(folder, pattern):
            assert not coreml.detect(path.read_bytes()[:4096]), path.name


@pytest.mark.parametrize(
    "data, message",
    [(b"\x08", "varint runs past the end"), (b"\x08\x01\x12\x05ab", "truncated at byte 6, expected 9"),
     (b"\x08\x01\x0b", "unsupported wire type 3"), (b"\x12\x00", "specificationVersion")],
)  # fmt: skip
def test_malformed_specs_name_the_problem(data, message):
    with pytest.raises(FormatError, match=message):
        coreml.summarize(data)


def test_fuzzed_specs_raise_only_format_errors():
    seeds = [_spec()] + [p.read_bytes() for p in MLMODELS]
    rng = random.Random(11)
    for seed in seeds:
        for _ in range(300):
            data = bytearray(seed)
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(data))
                if rng.random() < 0.2:
                    del data[i:]
                    if not data:
                        break
                else:
                    data[i] = rng.randrange(256)
            with contextlib.suppress(FormatError):
                coreml.summarize(bytes(data))
