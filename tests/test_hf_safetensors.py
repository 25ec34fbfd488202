"""anekit.hf.safetensors_io against the ``safetensors`` package (both ways), independent bfloat16 oracles,
sharded checkpoints, and hostile files that must give one anekit error naming the tensor or field."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy as st_numpy
from safetensors import safe_open

from anekit.errors import AnekitError, OptionError
from anekit.hf.safetensors_io import (
    INDEX_NAME,
    SINGLE_NAME,
    SafetensorsError,
    TensorRef,
    bf16_bits_to_float32,
    float32_to_bf16_bits,
    open_checkpoint,
    parse_header,
    read_header,
    write_checkpoint,
    write_safetensors,
)
from anekit.inputs import InputError
from tests.fuzz_util import watchdog

RNG_SEED = 20240611


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(RNG_SEED)
    return {
        "model.embed_tokens.weight": rng.standard_normal((5, 4)).astype(np.float32),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((4, 4)).astype(np.float16),
        "model.positions": np.arange(7, dtype=np.int64) - 3,
    }


def _dtype_name(array: np.ndarray) -> str:
    return {
        "float32": "F32",
        "float16": "F16",
        "int64": "I64",
        "float64": "F64",
        "int8": "I8",
        "uint8": "U8",
    }[str(array.dtype)]


def _raw_file(path: Path, header: Any, buffer: bytes = b"", header_size: int | None = None) -> Path:
    """A safetensors file written byte by byte: ``header`` is a dict (dumped as JSON) or raw bytes."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    size = len(text) if header_size is None else header_size
    path.write_bytes(struct.pack("<Q", size) + text + buffer)
    return path


# ---------------------------------------------------------------------------------------------- the package


def test_reads_files_the_package_writes(tmp_path: Path) -> None:
    arrays = {**_arrays(), "flags": np.array([True, False, True]), "scalar": np.array(2.5, np.float64)}
    st_numpy.save_file(arrays, tmp_path / "x.safetensors", metadata={"format": "pt", "note": "ünïcode"})
    tensors, metadata = read_header(tmp_path / "x.safetensors")
    assert metadata == {"format": "pt", "note": "ünïcode"}
    assert set(tensors) == set(arrays)
    for name, array in arrays.items():
        got = tensors[name].raw()
        assert got.dtype == array.dtype and got.shape == array.shape, name
        np.testing.assert_array_equal(got, array)
        assert not got.flags.writeable
        np.testing.assert_array_equal(tensors[name].to_float32(), array.astype(np.float32))


def test_package_reads_files_we_write(tmp_path: Path) -> None:
    arrays = _arrays()
    path = write_safetensors(
        tmp_path / "ours.safetensors",
        {n: (_dtype_name(a), a) for n, a in arrays.items()},
        {"origin": "anekit"},
    )
    loaded = st_numpy.load_file(path)
    assert set(loaded) == set(arrays)
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype
        np.testing.assert_array_equal(loaded[name], array)
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "origin": "anekit"}


def test_our_bytes_equal_the_package_bytes(tmp_path: Path) -> None:
    """Same tensors, same metadata: the reference writer and ours give the same file, byte for byte."""
    arrays = {
        "c": np.ones((2, 3), np.float32),
        "a": np.zeros(5, np.float16),
        "b": np.arange(3, dtype=np.float32),
    }
    st_numpy.save_file(arrays, tmp_path / "ref.safetensors", metadata={"format": "pt"})
    write_safetensors(tmp_path / "ours.safetensors", {n: (_dtype_name(a), a) for n, a in arrays.items()})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


def test_bf16_file_we_write_is_bf16_to_the_package(tmp_path: Path) -> None:
    bits = np.array([[0x3F80, 0xC000, 0x7FC0], [0x0001, 0x8000, 0x7F80]], np.uint16)
    path = write_safetensors(
        tmp_path / "b.safetensors", {"w": ("BF16", bits), "f": ("F32", np.ones(2, np.float32))}
    )
    with safe_open(path, framework="numpy") as f:
        view = f.get_slice("w")
        assert view.get_dtype() == "BF16"
        assert view.get_shape() == [2, 3]
        np.testing.assert_array_equal(f.get_tensor("f"), np.ones(2, np.float32))
    ref = read_header(path)[0]["w"]
    assert (ref.dtype, ref.shape, ref.nbytes) == ("BF16", (2, 3), 12)
    raw = ref.raw()
    assert raw.dtype == np.uint16
    np.testing.assert_array_equal(raw, bits)
    assert path.read_bytes()[ref.offset : ref.offset + ref.nbytes] == bits.tobytes()
    np.testing.assert_array_equal(ref.to_float32().view(np.uint32), bits.astype(np.uint32) << 16)


def test_layout_is_aligned_and_the_header_padded(tmp_path: Path) -> None:
    tensors = {
        "i8": ("I8", np.ones(3, np.int8)),
        "f64": ("F64", np.ones(1)),
        "f16": ("F16", np.ones(1, np.float16)),
    }
    path = write_safetensors(tmp_path / "x.safetensors", tensors)
    (header_size,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert header_size % 8 == 0
    refs = read_header(path)[0]
    assert [name for name in refs] == ["f64", "f16", "i8"]  # itemsize descending
    assert all(ref.offset % np.dtype(tensors[ref.name][1].dtype).itemsize == 0 for ref in refs.values())


def test_empty_and_scalar_tensors_round_trip(tmp_path: Path) -> None:
    arrays = {"empty": np.zeros((0, 3), np.float32), "scalar": np.array(7.0, np.float32)}
    path = write_safetensors(tmp_path / "x.safetensors", {n: ("F32", a) for n, a in arrays.items()})
    loaded = st_numpy.load_file(path)
    refs = read_header(path)[0]
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)
        assert refs[name].raw().shape == array.shape
        np.testing.assert_array_equal(refs[name].to_float32(), array)


# ---------------------------------------------------------------------------------------------- bfloat16


def test_bf16_decode_is_exact_for_every_bit_pattern() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    got = bf16_bits_to_float32(bits)
    assert got.dtype == np.float32 and got.shape == bits.shape
    # Independent: the float32 whose top half is the pattern, through struct.
    want = np.array([struct.unpack("<f", struct.pack("<I", int(b) << 16))[0] for b in bits])
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan], want[~nan].astype(np.float32))
    assert np.array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))
    assert np.array_equal(got.view(np.uint32) >> 16, bits.astype(np.uint32))  # NaN payloads kept


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    """Nearest bfloat16 by value, computed in float64: the bf16 ulp at x's binade, np.rint's ties-to-even,
    overflow to inf past the largest bf16 plus half an ulp. For finite float32 ``x`` only."""
    a = np.abs(x.astype(np.float64))
    _, exponent = np.frexp(a)  # a = m * 2**exponent, m in [0.5, 1)
    ulp = np.exp2(
        np.maximum(exponent.astype(np.float64) - 8, -133)
    )  # 8 significant bits; subnormal ulp 2**-133
    rounded = np.rint(a / ulp) * ulp
    rounded[rounded >= 2.0**128] = np.inf
    value = np.copysign(rounded, x.astype(np.float64)).astype(np.float32)
    return (value.view(np.uint32) >> 16).astype(np.uint16)


def test_bf16_encode_matches_a_float64_reference() -> None:
    rng = np.random.default_rng(RNG_SEED)
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)  # ties and their neighbours
    patterns = np.concatenate(
        [
            (high[:, None] | lows[None, :]).ravel(),
            rng.integers(0, 1 << 32, 400_000, dtype=np.uint64).astype(np.uint32),
        ]
    )
    x = patterns.view(np.float32)
    finite = np.isfinite(x)
    got = float32_to_bf16_bits(x)
    np.testing.assert_array_equal(got[finite], _bf16_reference(x[finite]))
    inf = np.isinf(x)
    np.testing.assert_array_equal(got[inf], (patterns[inf] >> 16).astype(np.uint16))


def test_bf16_encode_edge_cases() -> None:
    f32 = np.float32
    cases = {
        1.0: 0x3F80,
        -2.0: 0xC000,
        float(np.finfo(f32).max): 0x7F80,  # above the largest bf16 + half an ulp: inf
        float(np.finfo(f32).tiny): 0x0080,  # smallest normal
        float(np.finfo(f32).smallest_subnormal): 0x0000,  # 2**-149 rounds to zero
        2.0**-133: 0x0001,  # smallest bf16 subnormal
        -0.0: 0x8000,
        float("inf"): 0x7F80,
        float("-inf"): 0xFF80,
        1.0 + 2.0**-8: 0x3F80,  # halfway, even neighbour below
        1.0 + 3 * 2.0**-8: 0x3F82,  # halfway, even neighbour above
    }
    got = float32_to_bf16_bits(np.array(list(cases), f32))
    assert [hex(g) for g in got] == [hex(v) for v in cases.values()]
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345, 0x7FFFFFFF], np.uint32).view(f32)
    encoded = float32_to_bf16_bits(nans)
    assert np.isnan(bf16_bits_to_float32(encoded)).all()
    assert ((encoded & 0x0040) != 0).all()  # quiet
    np.testing.assert_array_equal(encoded >> 15, [0, 1, 0, 1, 0])  # sign kept
    assert float32_to_bf16_bits(np.float32(1.0)).shape == ()


def test_bf16_helpers_refuse_other_dtypes() -> None:
    with pytest.raises(AnekitError, match="float32"):
        float32_to_bf16_bits(np.ones(2))  # float64 would be rounded twice
    with pytest.raises(AnekitError, match="uint16"):
        bf16_bits_to_float32(np.ones(2, np.int16))


# ---------------------------------------------------------------------------------------------- checkpoints


def _with_dtypes(arrays: dict[str, np.ndarray]) -> dict[str, tuple[str, np.ndarray]]:
    return {n: (_dtype_name(a), a) for n, a in arrays.items()}


def test_sharded_write_index_and_reread(tmp_path: Path) -> None:
    arrays = _arrays()  # 80, 32 and 56 bytes
    written = write_checkpoint(tmp_path, _with_dtypes(arrays), max_shard_bytes=120, metadata={"k": "v"})
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert written == [tmp_path / n for n in names] + [tmp_path / INDEX_NAME]
    text = (tmp_path / INDEX_NAME).read_text()
    index = json.loads(text)
    assert text == json.dumps(index, indent=2, sort_keys=True) + "\n"
    assert index["metadata"] == {"total_size": 80 + 32 + 56}
    assert index["weight_map"] == dict(zip(arrays, [names[0], names[0], names[1]]))
    for shard in names:
        with safe_open(tmp_path / shard, framework="numpy") as f:
            assert f.metadata() == {"format": "pt", "k": "v"}
    refs = open_checkpoint(tmp_path)
    assert list(refs) == list(arrays)
    for name, array in arrays.items():
        np.testing.assert_array_equal(refs[name].raw(), array)


def test_single_file_when_it_fits_and_stale_files_removed(tmp_path: Path) -> None:
    arrays = _arrays()
    write_checkpoint(tmp_path, _with_dtypes(arrays), max_shard_bytes=1)  # one tensor per shard
    assert len(list(tmp_path.glob("model-*-of-00003.safetensors"))) == 3
    written = write_checkpoint(tmp_path, _with_dtypes(arrays), max_shard_bytes=10_000)
    assert written == [tmp_path / SINGLE_NAME]
    assert sorted(p.name for p in tmp_path.iterdir()) == [SINGLE_NAME]
    loaded = st_numpy.load_file(tmp_path / SINGLE_NAME)
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)
    write_checkpoint(tmp_path, _with_dtypes(arrays), max_shard_bytes=100)
    assert not (tmp_path / SINGLE_NAME).exists()


def test_hand_made_sharded_checkpoint_opens(tmp_path: Path) -> None:
    arrays = _arrays()
    names = list(arrays)
    st_numpy.save_file({names[0]: arrays[names[0]]}, tmp_path / "a.safetensors")
    st_numpy.save_file({n: arrays[n] for n in names[1:]}, tmp_path / "b.safetensors")
    weight_map = {names[0]: "a.safetensors", names[1]: "b.safetensors", names[2]: "b.safetensors"}
    (tmp_path / INDEX_NAME).write_text(
        json.dumps({"metadata": {"total_size": 168}, "weight_map": weight_map})
    )
    refs = open_checkpoint(tmp_path)
    assert {n: r.path.name for n, r in refs.items()} == weight_map
    for name, array in arrays.items():
        np.testing.assert_array_equal(refs[name].raw(), array)


def test_single_file_wins_over_an_index_as_in_transformers(tmp_path: Path) -> None:
    st_numpy.save_file({"x": np.ones(2, np.float32)}, tmp_path / SINGLE_NAME)
    (tmp_path / INDEX_NAME).write_text("not even json")
    assert list(open_checkpoint(tmp_path)) == ["x"]


# ---------------------------------------------------------------------------------------------- bad files

ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
BUF8 = bytes(8)


def _bad_headers() -> dict[str, tuple[Any, bytes, int | None, str]]:
    """name -> (header, buffer, declared header size or None, text the error must contain)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    return {
        "header length past the file": ({"w": ENTRY}, BUF8, 10_000, "header_size"),
        "header length 2**63": ({"w": ENTRY}, BUF8, 2**63, "header_size"),
        "header not JSON": (b"{not json}", b"", None, "header"),
        "header not UTF-8": (b'{"\xff": 1}', b"", None, "header"),
        "header not an object": (b"[1, 2]", b"", None, "not an object"),
        "header nested 100000 deep": (deep, b"", None, "nested"),
        "integer of 5000 digits": (
            b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b"]}}",
            b"",
            None,
            "header",
        ),
        "unknown dtype": ({"w": {**ENTRY, "dtype": "F33"}}, BUF8, None, "w.dtype"),
        "shape and offsets disagree": ({"w": {**ENTRY, "shape": [3]}}, BUF8, None, "w.data_offsets"),
        "offsets past the buffer": ({"w": {**ENTRY, "data_offsets": [4, 12]}}, BUF8, None, "w.data_offsets"),
        "offsets reversed": ({"w": {**ENTRY, "data_offsets": [8, 0]}}, BUF8, None, "w.data_offsets"),
        "overlapping tensors": (
            {"a": ENTRY, "b": {**ENTRY, "data_offsets": [4, 12]}},
            bytes(12),
            None,
            "b.data_offsets",
        ),
        "gap between tensors": ({"a": {**ENTRY, "data_offsets": [4, 12]}}, bytes(12), None, "a.data_offsets"),
        "bytes after the last tensor": ({"a": ENTRY}, bytes(12), None, "data"),
        "negative dim": ({"w": {**ENTRY, "shape": [-2]}}, BUF8, None, "w.shape"),
        "zero dim after huge ones": (
            {"w": {**ENTRY, "shape": [2**62, 2**62, 0], "data_offsets": [0, 0]}},
            b"",
            None,
            "w.shape",
        ),
        "bool dim": ({"w": {**ENTRY, "shape": [True, 2]}}, BUF8, None, "w.shape"),
        "float offset": ({"w": {**ENTRY, "data_offsets": [0, 8.0]}}, BUF8, None, "w.data_offsets"),
        "missing field": ({"w": {"dtype": "F32", "shape": [2]}}, BUF8, None, "w"),
        "extra field": ({"w": {**ENTRY, "extra": 1}}, BUF8, None, "extra"),
        "entry not an object": ({"w": [1]}, BUF8, None, "w"),
        "metadata value not a string": (
            {"__metadata__": {"format": 1}, "w": ENTRY},
            BUF8,
            None,
            "__metadata__.format",
        ),
        "metadata not an object": ({"__metadata__": "pt", "w": ENTRY}, BUF8, None, "__metadata__"),
        "tensor named twice": (b'{"w": ' + json.dumps(ENTRY).encode() + b', "w": {}}', BUF8, None, "w"),
    }


@pytest.mark.parametrize("case", list(_bad_headers()))
def test_bad_header_is_one_error_naming_the_field(tmp_path: Path, case: str) -> None:
    header, buffer, size, field = _bad_headers()[case]
    path = _raw_file(tmp_path / "bad.safetensors", header, buffer, size)
    with watchdog(20), pytest.raises(SafetensorsError) as info:
        read_header(path)
    assert field in info.value.field or field in str(info.value)
    assert str(info.value).startswith("[safetensors] ")
    with pytest.raises(SafetensorsError):
        parse_header(path.read_bytes())


@pytest.mark.parametrize("keep", [0, 5, 8, 40, -1])
def test_truncated_file(tmp_path: Path, keep: int) -> None:
    write_safetensors(tmp_path / "ok.safetensors", _with_dtypes(_arrays()))
    data = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:keep])
    with pytest.raises(SafetensorsError, match=r"header_size|data_offsets|data"):
        read_header(tmp_path / "cut.safetensors")


def test_huge_declared_tensor_is_refused_without_allocating(tmp_path: Path) -> None:
    shape = [2**40]
    tracemalloc.start()
    try:
        for offsets, match in (([0, 4 * 2**40], "not a range inside"), ([0, 8], "is not the size")):
            path = _raw_file(
                tmp_path / "huge.safetensors", {"w": {**ENTRY, "shape": shape, "data_offsets": offsets}}, BUF8
            )
            with pytest.raises(SafetensorsError, match=match) as info:
                read_header(path)
            assert info.value.field == "w.data_offsets"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / SINGLE_NAME)
    with watchdog(10):
        with pytest.raises(InputError, match="FIFO"):
            open_checkpoint(tmp_path)
        with pytest.raises(InputError, match="FIFO"):
            read_header(tmp_path / SINGLE_NAME)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="a directory"):
        read_header(tmp_path)


def test_an_empty_directory_names_the_files_looked_for(tmp_path: Path) -> None:
    with pytest.raises(SafetensorsError, match=f"{SINGLE_NAME} nor {INDEX_NAME}"):
        open_checkpoint(tmp_path)
    with pytest.raises(SafetensorsError, match="no such directory"):
        open_checkpoint(tmp_path / "absent")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(SafetensorsError, match="a regular file, not a directory"):
        open_checkpoint(tmp_path / "file")


def _sharded(tmp_path: Path, weight_map: dict[str, Any], shards: dict[str, list[int]]) -> Path:
    """A checkpoint directory ``tmp_path/ckpt``; shard paths are relative to it (and may leave it)."""
    arrays = _arrays()
    names = list(arrays)
    directory = tmp_path / "ckpt"
    for shard, held in shards.items():
        (directory / shard).parent.mkdir(parents=True, exist_ok=True)
        st_numpy.save_file({names[i]: arrays[names[i]] for i in held}, directory / shard)
    (directory / INDEX_NAME).write_text(json.dumps({"weight_map": weight_map}))
    return directory


def _names() -> list[str]:
    return list(_arrays())


@pytest.mark.parametrize(
    ("case", "weight_map", "shards", "field"),
    [
        ("missing shard", {0: "a.st", 1: "gone.st"}, {"a.st": [0]}, "weight_map['{1}']"),
        ("tensor the shard lacks", {0: "a.st", 1: "a.st"}, {"a.st": [0]}, "{1}"),
        ("shard holds an unlisted tensor", {0: "a.st"}, {"a.st": [0, 1]}, "{1}"),
        (
            "shard holds a tensor assigned elsewhere",
            {0: "a.st", 1: "b.st"},
            {"a.st": [0, 1], "b.st": [1]},
            "{1}",
        ),
        ("shard name climbs out", {0: "../a.st"}, {"../a.st": [0]}, "weight_map['{0}']"),
        ("shard name is a path", {0: "sub/a.st"}, {"sub/a.st": [0]}, "weight_map['{0}']"),
        ("shard name is the parent", {0: ".."}, {"a.st": [0]}, "weight_map['{0}']"),
        ("shard name not a string", {0: 3}, {"a.st": [0]}, "weight_map['{0}']"),
    ],
)
def test_bad_sharded_checkpoint(
    tmp_path: Path, case: str, weight_map: dict[int, Any], shards: dict[str, list[int]], field: str
) -> None:
    names = _names()
    directory = _sharded(tmp_path, {names[i]: s for i, s in weight_map.items()}, shards)
    with pytest.raises(SafetensorsError) as info:
        open_checkpoint(directory)
    assert field.format(*names) in info.value.field, case


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not JSON"),
        ('{"metadata": {}}', "weight_map"),
        ("[" * 1000 + "]" * 1000, "nested"),
        ('{"weight_map": {"a": "x.st", "a": "y.st"}}', "more than once"),
    ],
)
def test_bad_index_json(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / INDEX_NAME).write_text(text)
    with pytest.raises(AnekitError, match=match) as info:
        open_checkpoint(tmp_path)
    assert INDEX_NAME in str(info.value)


# ---------------------------------------------------------------------------------------------- the writer


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (("F32", np.ones((4, 4), np.float32)[:, ::2]), "C-contiguous"),
        (("F32", np.ones(2, np.float64)), "float64"),
        (("BF16", np.ones(2, np.float32)), "uint16"),
        (("F32", np.ones(2, ">f4")), "stored as"),
        (("F99", np.ones(2, np.float32)), "unknown dtype"),
        (("F32", [1.0, 2.0]), "numpy array"),
    ],
)
def test_writer_refuses_bad_arrays_and_writes_nothing(
    tmp_path: Path, value: tuple[str, Any], match: str
) -> None:
    good = ("F32", np.ones(2, np.float32))
    with pytest.raises(AnekitError, match=match) as info:
        write_safetensors(tmp_path / "x.safetensors", {"good": good, "bad.weight": value})
    assert "bad.weight" in str(info.value)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(AnekitError, match=match):
        write_checkpoint(tmp_path, {"good": good, "bad.weight": value}, max_shard_bytes=4)
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_bad_options(tmp_path: Path) -> None:
    tensors = {"w": ("F32", np.ones(2, np.float32))}
    with pytest.raises(AnekitError, match="'pt'"):
        write_safetensors(tmp_path / "x.safetensors", tensors, {"format": "np"})
    with pytest.raises(AnekitError, match="__metadata__"):
        write_safetensors(tmp_path / "x.safetensors", {"__metadata__": tensors["w"]})
    with pytest.raises(OptionError, match="max_shard_bytes"):
        write_checkpoint(tmp_path, tensors, max_shard_bytes=0)
    with pytest.raises(AnekitError, match="not an existing directory"):
        write_checkpoint(tmp_path / "absent", tensors)
    assert list(tmp_path.iterdir()) == []


def test_tensor_ref_is_a_frozen_value(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "x.safetensors", {"w": ("F32", np.ones(2, np.float32))})
    ref = read_header(path)[0]["w"]
    assert isinstance(ref, TensorRef) and ref.path == path and ref.nbytes == 8
    with pytest.raises(AttributeError):
        ref.name = "v"  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------- fuzz


def test_fuzzed_files_only_raise_anekit_errors(tmp_path: Path) -> None:
    arrays = {
        **_with_dtypes(_arrays()),
        "b": ("BF16", np.array([0x3F80, 0x7FC0], np.uint16)),
        "f8": ("F8_E4M3", np.array([1, 2], np.uint8)),
        "flags": ("BOOL", np.array([True, False])),
    }
    data = (write_safetensors(tmp_path / "ok.safetensors", arrays, {"k": "v"})).read_bytes()
    rng = np.random.default_rng(RNG_SEED)
    path = tmp_path / "fuzz.safetensors"
    for case in range(400):
        mutated = bytearray(data)
        if case % 4 == 0:
            mutated = mutated[: int(rng.integers(0, len(data)))]
        else:
            for at in rng.integers(0, len(data), int(rng.integers(1, 4))):
                mutated[at] = (
                    int(rng.integers(0, 256)) if case % 3 else mutated[at] ^ (1 << int(rng.integers(0, 8)))
                )
        path.write_bytes(bytes(mutated))
        with watchdog(10):
            try:
                for ref in read_header(path)[0].values():
                    ref.raw()
                    ref.to_float32()
            except AnekitError:
                pass
            with contextlib.suppress(AnekitError):
                parse_header(bytes(mutated))
