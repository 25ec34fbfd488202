"""Hostile headers never hang: llama2.c, BLZT and tokenizer.bin headers whose counts promise more than the
file holds are refused from the file size before anything is allocated from them, by the readers and by
every command that uses them (``inspect``, ``sample``, ``train --init``): one ``anekit:`` line, exit 1,
within a time limit (the fuzz watchdog) and a memory bound (tracemalloc peak).

The expected sizes in the truncation messages are recomputed here from llama2.c's own layout (the
table in the llama2c module's docstring, summed by hand), not taken from the reader.
"""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from anekit.errors import AnekitError, FormatError
from anekit.llama.checkpoint import MAGIC as BLZT_MAGIC
from anekit.llama.checkpoint import load_checkpoint, parse_checkpoint
from anekit.llama.llama2c import (
    AK42_MAGIC,
    parse_llama2c,
    parse_tokenizer_bin,
    read_llama2c,
    read_tokenizer_bin,
)
from tests.conftest import corpus_path
from tests.fuzz_util import watchdog

SECONDS = 20  # per case; a hang (or an allocation from the header's counts) takes far longer
MEMORY = 64 << 20  # peak Python allocations of one case, files included


def _legacy(
    dim: int, hidden: int, layers: int, heads: int, kv: int, vocab: int, seq: int, body: int = 1024
) -> bytes:
    return struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq) + bytes(body)


def _ak42(dim: int, hidden: int, layers: int, heads: int, kv: int, vocab: int, seq: int) -> bytes:
    head = struct.pack("<Ii7iB", AK42_MAGIC, 1, dim, hidden, layers, heads, kv, vocab, seq, 1)
    return head.ljust(256, b"\0") + bytes(4096)


def _blzt(layers: int, vocab: int, dim: int, hidden: int, heads: int, seq: int) -> bytes:
    head = struct.pack("<10i", BLZT_MAGIC, 2, 0, 0, layers, vocab, dim, hidden, heads, seq)
    return head.ljust(96, b"\0") + bytes(4096)


MODELS = {
    "legacy n_layers 2^30": _legacy(64, 128, 2**30, 4, 4, 32, 16),
    "legacy n_layers 2^31-1": _legacy(64, 128, 2**31 - 1, 4, 4, 32, 16),
    "legacy dim 2^31-1": _legacy(2**31 - 1, 128, 2, 1, 1, 32, 16),
    "legacy dim 2^24 (even heads)": _legacy(2**24, 128, 2, 2, 2, 32, 16),
    "legacy vocab -2^31": _legacy(64, 128, 2, 4, 4, -(2**31), 16),
    "legacy vocab huge": _legacy(64, 128, 2, 4, 4, 2**31 - 1, 16),
    "legacy seq 2^31-1": _legacy(64, 128, 2, 4, 4, 32, 2**31 - 1),
    "legacy hidden 2^31-1": _legacy(64, 2**31 - 1, 2, 4, 4, 32, 16),
    "legacy all 1 but layers": _legacy(2, 1, 2**30, 1, 1, 1, 1),
    "legacy zero layers": _legacy(64, 128, 0, 4, 4, 32, 16),
    "legacy negative heads": _legacy(64, 128, 2, -4, 4, 32, 16),
    "ak42 n_layers 2^30": _ak42(64, 128, 2**30, 4, 4, 32, 16),
    "ak42 vocab 2^31-1": _ak42(64, 128, 2, 4, 4, 2**31 - 1, 16),
    "ak42 short": _ak42(64, 128, 2, 4, 4, 32, 16)[:100],
}
CHECKPOINTS = {
    "blzt n_layers 2^30": _blzt(2**30, 32, 64, 128, 4, 16),
    "blzt n_layers 2^31-1": _blzt(2**31 - 1, 32, 64, 128, 4, 16),
    "blzt dim 2^31-1": _blzt(2, 32, 2**31 - 1, 128, 1, 16),
    "blzt vocab 2^31-1": _blzt(2, 2**31 - 1, 64, 128, 4, 16),
    "blzt negative vocab": _blzt(2, -5, 64, 128, 4, 16),
    "blzt many heads": _blzt(2**20, 32, 2**16, 128, 2**15, 16),
    "blzt short header": _blzt(2, 32, 64, 128, 4, 16)[:50],
}
RNG = np.random.default_rng(4)
TOKENIZERS = {
    "random bytes": RNG.integers(0, 256, 5000, dtype=np.uint8).tobytes(),
    "max_token_length 2^32-1": struct.pack("<Ifi", 2**32 - 1, -1.0, 1) + b"a",
    "max_token_length 0": struct.pack("<Ifi", 0, -1.0, 0),
    "NaN score": struct.pack("<Ifi", 8, float("nan"), 1) + b"a",
    "inf score": struct.pack("<Ifi", 8, float("inf"), 1) + b"a",
    "length past max": struct.pack("<Ifi", 8, -1.0, 9) + b"a" * 9,
    "negative length": struct.pack("<Ifi", 8, -1.0, -1),
    "length 2^31-1": struct.pack("<Ifi", 2**31 - 1, -1.0, 2**31 - 1) + b"a",
    "ends inside a record": struct.pack("<Ifi", 8, -1.0, 1) + b"a" + struct.pack("<f", -2.0),
    "a llama2.c model header": _legacy(288, 768, 6, 6, 6, 32000, 256, body=64),
}


def _bounded(fn, *args):
    """Run ``fn`` under the watchdog and return (result or the error, peak bytes allocated)."""
    tracemalloc.start()
    try:
        with watchdog(SECONDS):
            try:
                out = fn(*args)
            except AnekitError as e:
                out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", MODELS)
def test_hostile_llama2c_headers_are_refused_by_the_reader(name, tmp_path):
    data = MODELS[name]
    for fn, arg in ((parse_llama2c, data), (read_llama2c, tmp_path / "m.bin")):
        (tmp_path / "m.bin").write_bytes(data)
        out, peak = _bounded(fn, arg)
        assert isinstance(out, AnekitError), name
        assert peak < MEMORY, (name, peak)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_hostile_blzt_headers_are_refused_by_the_reader(name, tmp_path):
    data = CHECKPOINTS[name]
    (tmp_path / "c.bin").write_bytes(data)
    for fn, arg in ((parse_checkpoint, data), (load_checkpoint, tmp_path / "c.bin")):
        out, peak = _bounded(fn, arg)
        assert isinstance(out, AnekitError), name
        assert peak < MEMORY, (name, peak)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_implausible_tokenizer_files_are_not_tokenizers(name, tmp_path):
    (tmp_path / "tokenizer.bin").write_bytes(TOKENIZERS[name])
    for fn, arg in (
        (parse_tokenizer_bin, TOKENIZERS[name]),
        (read_tokenizer_bin, tmp_path / "tokenizer.bin"),
    ):
        out, peak = _bounded(fn, arg)
        assert isinstance(out, FormatError) and str(out).startswith("[llama2c.tokenizer] "), (name, out)
        assert peak < MEMORY


def test_the_real_tokenizer_is_still_plausible():
    tok = read_tokenizer_bin(corpus_path("llama2c", "tokenizer.bin"))
    assert tok.vocab_size == 32000  # llama 2's vocabulary


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    out, peak = _bounded(main, argv)
    rc = out if isinstance(out, int) else 99
    err = capsys.readouterr().err
    assert peak < MEMORY, (argv, peak)
    return rc, err


def _one_anekit_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("anekit: "), err
    return lines[0]


@pytest.mark.parametrize("name", [*MODELS, *CHECKPOINTS])
@pytest.mark.parametrize("command", ["inspect", "sample"])
def test_hostile_headers_in_inspect_and_sample_are_one_line_errors(
    name, command, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("ANEKIT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.bin"
    path.write_bytes({**MODELS, **CHECKPOINTS}[name])
    argv = ["inspect", str(path)] if command == "inspect" else ["sample", str(path), "--steps", "1"]
    rc, err = _run(capsys, argv)
    assert rc == 1, (name, err)
    _one_anekit_line(err)


@pytest.mark.parametrize("name", ["legacy n_layers 2^30", "legacy vocab huge", "ak42 n_layers 2^30"])
def test_hostile_headers_in_train_init_are_one_line_errors(name, tmp_path, capsys, monkeypatch):
    pytest.importorskip("sentencepiece")
    monkeypatch.setenv("ANEKIT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "init.bin"
    path.write_bytes(MODELS[name])
    rc, err = _run(capsys, ["train", "--init", str(path), "--out", str(tmp_path / "out"), "--steps", "1"])
    assert rc == 1
    _one_anekit_line(err)


def _expected_size(cfg: dict[str, int]) -> int:
    """Bytes of a legacy llama2.c file, summed from the docstring's table (shared classifier)."""
    d, h, n, v, s = cfg["dim"], cfg["hidden_dim"], cfg["n_layers"], cfg["vocab_size"], cfg["seq_len"]
    kv = cfg["n_kv_heads"] * d // cfg["n_heads"]
    hd = d // cfg["n_heads"]
    floats = v * d + n * (d + d * d + 2 * kv * d + d * d + d + 3 * h * d) + d + 2 * s * (hd // 2)
    return 28 + 4 * floats


@pytest.mark.parametrize("cut", [28, 1000, 500_000, 1_056_536])
def test_a_truncated_model_says_where_in_inspect_as_in_sample(cut, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ANEKIT_CACHE", str(tmp_path / "cache"))
    real = corpus_path("llama2c", "stories260K.bin").read_bytes()
    cfg = dict(zip(("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"),
                   struct.unpack_from("<7i", real)))  # fmt: skip
    assert _expected_size(cfg) == len(real)
    path = tmp_path / "short.bin"
    path.write_bytes(real[:cut])
    said = f"truncated at byte {cut}, expected {len(real)}"
    for argv in (["inspect", str(path)], ["sample", str(path), "--steps", "1"]):
        rc, err = _run(capsys, argv)
        assert rc == 1 and said in _one_anekit_line(err), (argv, err)


def test_a_truncated_mlmodel_says_where(tmp_path, capsys):
    real = corpus_path("mlmodel", "tinygrad-test-73ae6d78.mlmodel").read_bytes()
    path = tmp_path / "short.mlmodel"
    path.write_bytes(real[:9000])
    rc, err = _run(capsys, ["inspect", str(path)])
    line = _one_anekit_line(err)
    assert rc == 1 and line.startswith("anekit: [mlmodel] ") and "truncated at byte 9000, expected" in line
    # the field that runs past the end is the model (field 500), which needs every byte of the real file
    assert f"expected {len(real)}" in line


# -- fuzzing the header parsers, with size limits ------------------------------------------------------


def _mutations(seed: bytes, span: int, n: int, rng: np.random.Generator) -> list[bytes]:
    interesting = (0, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 2**30, 2**24)
    out = []
    for _ in range(n):
        b = bytearray(seed)
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, span // 4)) * 4
            if rng.random() < 0.6:
                b[at : at + 4] = struct.pack("<I", int(rng.choice(interesting)))
            else:
                b[at] = int(rng.integers(0, 256))
        if rng.random() < 0.3:
            b = b[: int(rng.integers(0, len(b) + 1))]
        out.append(bytes(b))
    return out


def _fuzz(parse, inputs: list[bytes]) -> None:
    for data in inputs:
        tracemalloc.start()
        try:
            with watchdog(5):
                try:
                    parse(data)
                except FormatError:
                    pass
                except AnekitError as e:  # a config the engine cannot run is still an anekit error
                    assert str(e).startswith("["), e
            assert tracemalloc.get_traced_memory()[1] < MEMORY + 4 * len(data)
        finally:
            tracemalloc.stop()


def test_fuzz_llama2c_headers():
    rng = np.random.default_rng(1)
    real = corpus_path("llama2c", "stories260K.bin").read_bytes()
    _fuzz(parse_llama2c, _mutations(real, 28, 150, rng))
    _fuzz(parse_llama2c, _mutations(_ak42(64, 128, 2, 4, 4, 32, 16), 40, 150, rng))


def test_fuzz_blzt_headers():
    rng = np.random.default_rng(2)
    _fuzz(parse_checkpoint, _mutations(_blzt(2, 32, 64, 128, 4, 16), 96, 200, rng))


def test_fuzz_tokenizer_bin():
    rng = np.random.default_rng(3)
    real = corpus_path("llama2c", "tokenizer.bin").read_bytes()[:4000]
    _fuzz(parse_tokenizer_bin, _mutations(real, 4000, 200, rng))


def test_fuzz_inspect_identification(tmp_path):
    """Mutated model, checkpoint and tokenizer headers through inspect's identification and summary."""
    from anekit.inspect import dispatch

    rng = np.random.default_rng(5)
    real = corpus_path("llama2c", "stories260K.bin").read_bytes()[:20000]
    seeds = [real, _blzt(2, 32, 64, 128, 4, 16), corpus_path("llama2c", "tokenizer.bin").read_bytes()[:3000]]
    path = Path(tmp_path / "f.bin")
    for seed in seeds:
        for data in _mutations(seed, 96, 60, rng):
            path.write_bytes(data)
            _fuzz(lambda _: dispatch.inspect_path(path), [data])
