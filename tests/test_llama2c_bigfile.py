"""A llama2.c model larger than the address space the process may use (RLIMIT_AS): a sparse file of
Llama-2-7B's shape (26.9 GB) under a limit of a few GiB is inspected from its header, sampling and
exporting it are refused in one line saying both figures before anything is read, and a model twice the
limit is sampled and exported through one window of the file per tensor."""

from __future__ import annotations

import json
import mmap
import os
import re
import resource
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anekit.kernels.config import ModelConfig
from anekit.llama.llama2c import open_llama2c, parse_llama2c, write_llama2c, write_tokenizer_bin
from anekit.llama.params import Params
from tests.test_llama2c_mmap import SCALED_7B, numbered_tokenizer

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the limit is Linux's RLIMIT_AS, the usage its /proc"
)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30

# Llama-2-7B as llama2.c's export.py writes it from Meta's checkpoint: dim 4096, hidden 11008, 32 layers
# of 32 heads (no GQA), 32000 tokens with an unshared classifier (vocab_size negative), 2048 positions.
LLAMA2_7B = (4096, 11008, 32, 32, 32, -32000, 2048)
# Its parameter count as Meta's model card and Hugging Face report it ("6,738,415,616" for
# meta-llama/Llama-2-7b-hf): embed + 32 x (4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096) + norm + lm_head.
LLAMA2_7B_PARAMETERS = 6_738_415_616


def _legacy_bytes(dims: tuple[int, ...]) -> int:
    """Bytes of a legacy llama2.c file, summed from llama2.c's run.c reader (memory_map_weights): the
    header, embed, the nine per-layer arrays, rms_final, two RoPE tables of seq x head_dim / 2, wcls."""
    dim, hidden, layers, heads, kv_heads, vocab, seq = dims
    head_dim = dim // heads
    kv = kv_heads * head_dim
    per_layer = dim + dim * dim + kv * dim + kv * dim + dim * dim + dim + hidden * dim + dim * hidden
    per_layer += hidden * dim
    floats = abs(vocab) * dim + layers * per_layer + dim + 2 * seq * (head_dim // 2)
    return 28 + 4 * (floats + (abs(vocab) * dim if vocab < 0 else 0))


def _sparse(path: Path, dims: tuple[int, ...]) -> int:
    """A legacy file of these header ints and zero weights, as a hole; skips when the filesystem cannot
    hold it sparse (it would cost its size on disk)."""
    size = _legacy_bytes(dims)
    try:
        with path.open("wb") as f:
            f.write(struct.pack("<7i", *dims))
            f.truncate(size)
    except OSError as e:
        path.unlink(missing_ok=True)
        pytest.skip(f"the filesystem of {path.parent} cannot hold a sparse {size}-byte file ({e})")
    if os.stat(path).st_blocks * 512 > 1 << 24:
        path.unlink()
        pytest.skip(f"the filesystem of {path.parent} stores holes as data")
    return size


@pytest.fixture
def llama2_7b(tmp_path: Path) -> Path:
    path = tmp_path / "llama2-7b.bin"
    assert _sparse(path, LLAMA2_7B) == 26_954_711_068
    write_tokenizer_bin(tmp_path / "tokenizer.bin", numbered_tokenizer(32000))
    return path


def _limited(argv: list[str], limit: int, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """``anekit ARGV`` in a process whose address space is limited to ``limit`` bytes."""

    def limit_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT / "src"),
        "ANEKIT_CACHE": str(cwd / "cache"),
        "OPENBLAS_NUM_THREADS": "2",  # a BLAS thread's buffers are address space too
        "OMP_NUM_THREADS": "2",
    }
    cmd = [sys.executable, "-m", "anekit.cli.main", *argv]
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=limit_address_space
    )


def _refusal(run: subprocess.CompletedProcess, limit: int) -> str:
    """The one line of a refusal in words: exit 1, nothing on stdout, both figures, no errno."""
    assert run.returncode == 1, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr and "Errno" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("anekit: ["), run.stderr
    line = lines[0]
    need = re.search(r"needs (\d+\.\d) GiB of address space", line)
    assert need is not None, line
    assert float(need.group(1)) > limit / GiB, line
    assert f"this process may use {limit / GiB:.1f} GiB" in line, line
    return line


def test_a_7b_model_is_described_from_its_header_under_4_gib(llama2_7b: Path):
    size = os.stat(llama2_7b).st_size
    run = _limited(["inspect", str(llama2_7b), "--json"], 4 * GiB, llama2_7b.parent, timeout=20)
    assert run.returncode == 0, run.stderr
    info = json.loads(run.stdout)
    shape = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
    assert info["config"] == dict(zip(shape, (4096, 11008, 32, 32, 32, 32000, 2048)))
    assert info["parameters"] == LLAMA2_7B_PARAMETERS and info["file_size"] == size
    assert info["shared_classifier"] is False and info["rope_tables_stored"] is True
    tensors = info["tensors"]
    assert len(tensors) == 3 + 9 * 32
    first, last = tensors[0], tensors[-1]
    assert (first["name"], first["offset"], first["shape"]) == ("embed", 28, [32000, 4096])
    assert (last["name"], last["offset"]) == ("wcls", size - 4 * 32000 * 4096)  # the file's last bytes
    assert "crc32" not in last and "header" in info["tensor_crc32"]  # 26.9 GB are not read to describe it
    text = _limited(["inspect", str(llama2_7b)], 4 * GiB, llama2_7b.parent, timeout=20)
    assert text.returncode == 0 and "parameters: 6738415616" in text.stdout, text.stderr


def test_sampling_a_7b_model_for_its_whole_context_is_refused_before_anything_is_read(llama2_7b: Path):
    # 2048 positions x 32 layers x 4096 channels x float32, keys and values: 2 GiB of cache alone
    limit = 3 * GiB
    run = _limited(["sample", str(llama2_7b), "--steps", "2048"], limit, llama2_7b.parent, timeout=20)
    line = _refusal(run, limit)
    assert line.startswith("anekit: [sample] ") and "a KV cache of 2.0 GiB for 2048 positions" in line
    assert run.stdout == ""


def test_exporting_a_7b_model_is_refused_before_anything_is_read_or_written(llama2_7b: Path):
    out = llama2_7b.parent / "out"
    out.mkdir()
    limit = 1 * GiB  # the 500 MiB classifier, its fp16 copy and the tables of a stage do not fit
    run = _limited(
        ["export", str(llama2_7b), "--to", "mlpackage", str(out / "m.mlpackage"), "--shard-mb", "1000"],
        limit,
        llama2_7b.parent,
        timeout=20,
    )
    assert _refusal(run, limit).startswith("anekit: [export] ")
    # unsharded, its 262 MB embedding is over the 250 MB a package may hold: said from the shapes, within
    # the time limit (reading the 26.9 GB to check them first took half a minute)
    run = _limited(
        ["export", str(llama2_7b), "--to", "mlpackage", str(out / "m.mlpackage")], 4 * GiB, out, 20
    )
    assert run.returncode == 1 and "the embedding alone holds 262.1 MB" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert sorted(os.listdir(out)) == []  # no package, no temporary, no lock left


def test_train_init_of_a_7b_model_is_refused_from_its_header(llama2_7b: Path):
    out = llama2_7b.parent / "run"
    run = _limited(["train", "--init", str(llama2_7b), "--out", str(out)], 4 * GiB, llama2_7b.parent, 20)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "dim 4096 (not 64)" in run.stderr and "no preset has its shape" in run.stderr
    assert not out.exists()


def test_train_init_that_cannot_fit_four_copies_is_refused_in_words(tmp_path: Path):
    # stories110M's shape (llama2.c's README): weights, gradients and two Adam moments are 16 bytes per
    # parameter, 1.6 GiB for its 109.5M, over a 1 GiB limit
    dims = (768, 2048, 12, 12, 12, 32000, 256)
    path = tmp_path / "stories110M.bin"
    _sparse(path, dims)
    write_tokenizer_bin(tmp_path / "tokenizer.bin", numbered_tokenizer(32000))
    params = 32000 * 768 + 12 * (4 * 768 * 768 + 3 * 768 * 2048 + 2 * 768) + 768  # tied classifier
    out = tmp_path / "run"
    argv = ["train", "--init", str(path), "--config", "stories110M", "--out", str(out)]
    run = _limited([*argv, "--tokenizer", str(tmp_path / "tokenizer.bin")], GiB, tmp_path, timeout=20)
    line = _refusal(run, GiB)
    assert line.startswith("anekit: [train] ") and f"two Adam moments of {params} parameters" in line
    assert f"at least {16 * params / GiB:.1f} GiB" in line
    assert not out.exists()


def test_a_model_twice_the_address_space_is_sampled_a_tensor_at_a_time(tmp_path: Path):
    path = tmp_path / "llama2-7b-scaled.bin"
    size = _sparse(path, SCALED_7B)
    write_tokenizer_bin(tmp_path / "tokenizer.bin", numbered_tokenizer(32000))
    limit = GiB  # the file is 1.9 GB: mapped whole it cannot be
    assert size > 1.7 * limit
    run = _limited(["sample", str(path), "--steps", "1", "--seed", "7"], limit, tmp_path)
    assert run.returncode == 0, run.stderr
    piece = run.stdout.strip()  # zero weights: zero logits (finite), a uniform draw of a piece " tN"
    assert piece.startswith("t") and 3 <= int(piece[1:]) < 32000, run.stdout
    assert "1 token generated, 1 position " in run.stderr


def test_a_model_twice_the_address_space_is_exported_a_tensor_at_a_time(tmp_path: Path):
    path = tmp_path / "llama2-7b-scaled.bin"
    size = _sparse(path, SCALED_7B)
    out = tmp_path / "out"
    out.mkdir()
    run = _limited(["export", str(path), "--to", "llama2c", str(out / "model.bin")], GiB, tmp_path)
    assert run.returncode == 0, run.stderr
    written = out / "model.bin"
    assert os.stat(written).st_size == size
    with written.open("rb") as f:
        assert struct.unpack("<7i", f.read(28)) == SCALED_7B
        f.seek(size - 4 * 32000 * 1024)
        assert f.read(1 << 20) == bytes(1 << 20)  # wcls: the zeros of the source


def test_a_model_twice_the_address_space_is_exported_as_packages_a_tensor_at_a_time(tmp_path: Path):
    path = tmp_path / "llama2-7b-scaled.bin"
    _sparse(path, SCALED_7B)
    out = tmp_path / "shards"
    run = _limited(["export", str(path), "--to", "mlpackage", str(out), "--shard-mb", "200"], GiB, tmp_path)
    assert run.returncode == 0, run.stderr
    assert (out / "shards.json").is_file() and len(list(out.glob("*.mlpackage"))) > 2


# -- the windows themselves ------------------------------------------------------------------------------


def _map_of(a: np.ndarray) -> mmap.mmap:
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    assert isinstance(a, memoryview) and isinstance(a.obj, mmap.mmap)
    return a.obj


def test_a_model_read_through_windows_has_the_values_of_a_whole_read(tmp_path: Path):
    cfg = ModelConfig(48, 80, 3, 6, 3, 37, 16, name="gqa")
    path = tmp_path / "gqa.bin"
    write_llama2c(path, Params.init(cfg, seed=5, tied=False))
    data = path.read_bytes()
    whole = parse_llama2c(data)
    windowed = open_llama2c(path, windows=True)
    assert windowed.params.count() == whole.params.count() and windowed.params.tied is False
    pairs = zip(windowed.params.tensors(), whole.params.tensors(), strict=True)
    for (name, a), (other, b) in pairs:
        assert name == other and not a.flags.writeable, name
        assert len(_map_of(a)) < len(data) // 2, name  # its own window, not a map of the file
        np.testing.assert_array_equal(a, b, err_msg=name)
    layer = windowed.params.layers[-1]
    with pytest.raises(AttributeError, match="read-only"):
        layer.wq = np.zeros((48, 48), np.float32)
    # written back one tensor at a time: the same bytes, stored RoPE tables included
    write_llama2c(tmp_path / "again.bin", windowed)
    assert (tmp_path / "again.bin").read_bytes() == data


def test_the_file_is_mapped_whole_unless_that_takes_over_half_the_address_space_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from anekit import addrspace

    path = tmp_path / "small.bin"
    write_llama2c(path, Params.init(ModelConfig(32, 48, 2, 4, 2, 19, 8, name="small"), seed=1))
    size = os.stat(path).st_size
    monkeypatch.setattr(addrspace, "limit", lambda: None)  # unlimited: one map of the whole file
    assert len(_map_of(open_llama2c(path).params.embed)) == size
    monkeypatch.setattr(addrspace, "limit", lambda: addrspace.in_use() + 2 * size + (1 << 20))
    assert len(_map_of(open_llama2c(path).params.embed)) == size
    monkeypatch.setattr(addrspace, "limit", lambda: addrspace.in_use() + 2 * size - (1 << 16))
    assert len(_map_of(open_llama2c(path).params.embed)) < size  # a window of the embedding alone


def test_the_sampler_refuses_a_prompt_whose_prefill_cannot_fit(monkeypatch: pytest.MonkeyPatch):
    """Checked again once the prompt's length is known: its attention scores (heads x T x positions
    float32, three of them) are what a long prompt adds."""
    from anekit import addrspace
    from anekit.llama.sample import Sampler

    cfg = ModelConfig(64, 96, 2, 8, 8, 40, 1024, name="wide")
    sampler = Sampler(Params.init(cfg, seed=3), numbered_tokenizer(cfg.vocab_size))
    kv = 2 * cfg.n_layers * cfg.seq_len * cfg.kv_dim * 4  # 1 MiB for the whole context
    monkeypatch.setattr(addrspace, "limit", lambda: addrspace.in_use() + 2 * kv)
    assert len(list(sampler.generate_ids([1], cfg.seq_len, seed=1))) >= 1  # one token's prefill fits
    long_prompt = [1] + [5] * 1000  # 8 heads x 1001 x 1024 x 4 bytes x 3: 94 MiB of scores
    with pytest.raises(addrspace.AddressSpaceError, match=r"\[sample\] sampling 1024 positions needs"):
        next(iter(sampler.generate_ids(long_prompt, cfg.seq_len, seed=1)))
