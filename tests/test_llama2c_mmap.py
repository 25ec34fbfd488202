"""Models read through read-only maps of their files: the same values as reading them whole, nothing
writable, a KV cache that grows with the positions run, and a sparse Llama-2-7B-shaped file (scaled down)
inspected and sampled in a subprocess whose private memory is limited to a sixth of the file."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from anekit.kernels.config import ConfigError, ModelConfig
from anekit.llama.checkpoint import CheckpointMeta, open_checkpoint, read_checkpoint, save_checkpoint
from anekit.llama.llama2c import Tokenizer, open_llama2c, parse_llama2c, write_tokenizer_bin
from anekit.llama.params import Params
from anekit.llama.sample import CpuDecoder
from tests.conftest import corpus_path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _map_base(a: np.ndarray) -> object:
    """The object at the bottom of an array's chain of bases."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_a_llama2c_model_is_mapped_read_only_with_the_values_of_a_whole_read():
    path = corpus_path("llama2c", "stories260K.bin")
    mapped, whole = open_llama2c(path), parse_llama2c(path.read_bytes())
    assert mapped.cfg == whole.cfg and mapped.cfg.name == "stories260K" and mapped.version == 0
    names = [n for n, _ in whole.params.tensors()]
    assert [n for n, _ in mapped.params.tensors()] == names
    for (name, a), (_, b) in zip(mapped.params.tensors(), whole.params.tensors()):
        assert not a.flags.writeable, name
        assert isinstance(_map_base(a), mmap.mmap), name
        np.testing.assert_array_equal(a, b, err_msg=name)
    np.testing.assert_array_equal(mapped.freq_cis_real, whole.freq_cis_real)
    with pytest.raises(ValueError, match="read-only"):
        mapped.params.embed[0, 0] = 1.0  # the file is never written through the map


def test_a_checkpoint_is_mapped_read_only_with_its_run_record(tmp_path: Path):
    cfg = ModelConfig(16, 24, 2, 4, 2, 11, 8, name="gqa")
    params = Params.init(cfg, seed=2, tied=False)
    path = tmp_path / "ckpt.bin"
    shape = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
    run = {"config": {k: getattr(cfg, k) for k in shape}, "note": "mapped"}
    save_checkpoint(path, params, params.zeros_like(), params.zeros_like(), CheckpointMeta(step=3), run)
    mapped, whole = open_checkpoint(path), read_checkpoint(path.read_bytes())
    assert mapped.run == whole.run == run and mapped.kv_source == "run record"
    assert mapped.params.cfg == cfg and mapped.meta.step == 3
    for (name, a), (_, b) in zip(mapped.params.tensors(), params.tensors()):
        assert not a.flags.writeable, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_the_kv_cache_grows_with_the_positions_run_and_gives_the_same_logits():
    cfg = ModelConfig(16, 24, 2, 4, 2, 13, 160, name="long")
    params = Params.init(cfg, seed=4)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 150)
    whole = CpuDecoder(params).forward_all(tokens, 0)  # (vocab, 150) in one prefill
    step = CpuDecoder(params)
    step.forward([int(tokens[0])], 0)
    assert step.keys.shape == (2, 64, cfg.kv_dim)  # not the whole context of 160 positions
    for pos in range(1, tokens.size):  # one position at a time, through two growths (64 -> 128 -> 160)
        logits = step.forward([int(tokens[pos])], pos)
        np.testing.assert_allclose(logits, whole[:, pos], rtol=1e-4, atol=1e-5)
    assert step.keys.shape == (2, 160, cfg.kv_dim)


def test_a_context_of_a_billion_positions_costs_only_the_positions_run(tmp_path: Path, capsys):
    """ak42 files store no RoPE tables, so nothing in the file bounds seq_len: the cache must not be
    sized by it (2^30 positions of keys and values would be 16 GiB here)."""
    from anekit.cli.main import main
    from anekit.llama.llama2c import write_llama2c

    cfg = ModelConfig(16, 24, 2, 4, 2, 11, 1 << 30, name="long")
    path = tmp_path / "long.bin"
    write_llama2c(path, Params.init(cfg, seed=1), version=1)
    assert path.stat().st_size < 1 << 16
    write_tokenizer_bin(tmp_path / "tokenizer.bin", numbered_tokenizer(cfg.vocab_size))
    assert main(["sample", str(path), "--steps", "5", "--seed", "1"]) == 0
    out, err = capsys.readouterr()
    assert len(out.split()) >= 1 and "stopped" in err


# -- a Llama-2-7B-shaped file larger than the private memory allowed ------------------------------------

# Llama-2-7B as llama2.c's export.py writes it (dim 4096, hidden 11008, 32 layers of 32 heads, 32000
# tokens, an unshared classifier: vocab_size negative, 2048 positions), its widths divided by four.
SCALED_7B = (1024, 2752, 32, 32, 32, -32000, 2048)


def sparse_llama2c(path: Path, dims: tuple[int, ...]) -> int:
    """A legacy llama2.c file with these header ints and zeros for weights, stored sparse: its size is
    summed here from the format's table (embed, per-layer weights, rms_final, two RoPE tables, wcls)."""
    dim, hidden, layers, heads, kv_heads, vocab, seq = dims
    head_dim = dim // heads
    kv = kv_heads * head_dim
    per_layer = dim + dim * dim + 2 * kv * dim + dim * dim + dim + 3 * hidden * dim
    floats = abs(vocab) * dim + layers * per_layer + dim + 2 * seq * (head_dim // 2)
    floats += abs(vocab) * dim if vocab < 0 else 0
    size = 28 + 4 * floats
    with path.open("wb") as f:
        f.write(struct.pack("<7i", *dims))
        f.truncate(size)  # a hole: no disk blocks, reads as zeros
    return size


def numbered_tokenizer(vocab_size: int) -> Tokenizer:
    """A tokenizer.bin-shaped vocabulary: llama's <unk>, BOS, EOS, then pieces " t3", " t4", ..."""
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b" t%d" % i for i in range(3, vocab_size)]
    return Tokenizer(pieces, [0.0] * vocab_size)


def _crc32_of_zeros(n: int) -> str:
    crc, block = 0, bytes(1 << 20)
    for at in range(0, n, len(block)):
        crc = zlib.crc32(block[: min(len(block), n - at)], crc)
    return f"{crc:08x}"


def _limited(argv: list[str], limit: int, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT / "src"),
        "ANEKIT_CACHE": str(cwd / "cache"),
        # A BLAS's per-thread buffers are private memory too: two threads, whatever the machine's cores.
        "OPENBLAS_NUM_THREADS": "2",
        "OMP_NUM_THREADS": "2",
    }
    cmd = ["prlimit", f"--data={limit}", sys.executable, "-m", "anekit.cli.main", *argv]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prlimit --data is Linux's RLIMIT_DATA")
@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")
def test_a_sparse_7b_shaped_model_is_inspected_and_sampled_in_a_sixth_of_its_size(tmp_path: Path):
    dims = SCALED_7B
    cfg = ModelConfig(*dims[:5], abs(dims[5]), dims[6])
    with pytest.raises(ConfigError, match="SDPA backward"):  # a shape the training kernels refuse ...
        cfg.check_kernels()
    path = tmp_path / "llama2-7b-scaled.bin"
    size = sparse_llama2c(path, dims)
    assert size > 1_800_000_000 and os.stat(path).st_blocks * 512 < 1 << 20  # ~1.9 GB, none on disk
    write_tokenizer_bin(tmp_path / "tokenizer.bin", numbered_tokenizer(32000))
    limit = size // 6  # private memory: a sixth of the model (the weights are read through the map)

    info = _limited(["inspect", str(path), "--json"], limit, tmp_path)  # ... which inspect does not apply
    assert info.returncode == 0, info.stderr
    summary = json.loads(info.stdout)
    shape = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
    assert summary["config"] == dict(zip(shape, (*dims[:5], 32000, dims[6])))
    assert summary["shared_classifier"] is False and summary["file_size"] == size
    tensors = summary["tensors"]
    assert len(tensors) == 3 + 9 * 32 and tensors[0]["name"] == "embed" and tensors[-1]["name"] == "wcls"
    for t in (tensors[0], tensors[1], tensors[-1]):  # every byte read through the map is a zero
        assert t["crc32"] == _crc32_of_zeros(4 * int(np.prod(t["shape"]))), t["name"]

    run = _limited(["sample", str(path), "--steps", "1", "--seed", "7"], limit, tmp_path)
    assert run.returncode == 0, run.stderr
    # zero weights: every logit is 0, so the token is a uniform draw of one of the pieces " tN" (N >= 3:
    # BOS cannot come first)
    piece = run.stdout.strip()
    assert piece.startswith("t") and 3 <= int(piece[1:]) < 32000, run.stdout
    assert "1 token generated, 1 position " in run.stderr and "--steps 1" in run.stderr
    assert "warning" not in run.stderr  # the tokenizer beside the model was used

    # export streams shard by shard from the map: a sharded package export of the same model, same limit
    out = tmp_path / "shards"
    exported = _limited(
        ["export", str(path), "--to", "mlpackage", str(out), "--shard-mb", "200"], limit, tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    assert (out / "shards.json").is_file() and len(list(out.glob("*.mlpackage"))) > 2
