"""``anekit train --init MODEL`` without ``--tokenizer``: the tokenizer beside MODEL (as ``anekit sample``
looks for it) when its vocabulary is the model's, else the built-in corpus tokenizer with one warning
line, never silently (a llama2.c model trained with its own tokenizer would start at a loss far above the
uniform one, ln(vocab), and learn the built-in ids anew)."""

from __future__ import annotations

import shutil
from pathlib import Path

from anekit.cli.main import main
from anekit.kernels import PRESETS
from anekit.llama import checkpoint
from anekit.llama.llama2c import Tokenizer, write_llama2c, write_tokenizer_bin
from anekit.llama.params import Params
from tests.conftest import corpus_path

QUICK = ["--steps", "1", "--accum", "1", "--sample-steps", "0"]
CFG = PRESETS["stories260K"]  # llama2.c's 512-token model


def _model(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "stories260K.bin"
    write_llama2c(path, Params.init(CFG, seed=1))
    return path


def _tokenizer_512(path: Path) -> Path:
    """A llama2.c tokenizer.bin of 512 pieces: the three specials, the 256 byte pieces, letter pairs."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = [(a + b).encode() for a in letters for b in letters]
    vocab = [b"<unk>", b"\n<s>\n", b"\n</s>\n", *(f"<0x{i:02X}>".encode() for i in range(256))]
    vocab += pairs[: 512 - len(vocab)]
    write_tokenizer_bin(path, Tokenizer(vocab, [0.0] * len(vocab)))
    return path


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("anekit: warning: [train] --init")]


def _train(model: Path, out: Path, *extra: str) -> int:
    return main(["train", "--init", str(model), "--config", "stories260K", "--out", str(out), *QUICK, *extra])


def test_without_a_tokenizer_beside_it_the_builtin_one_is_used_with_one_warning(tmp_path, cache, capsys):
    model = _model(tmp_path / "m")
    assert _train(model, tmp_path / "out") == 0
    (line,) = _warnings(capsys.readouterr().err)
    assert line.startswith(
        f"anekit: warning: [train] --init {model}: no --tokenizer, and none of tokenizer.model, tokenizer.bin "
        "beside it (the model has 512): training with the built-in corpus tokenizer"
    )
    assert line.endswith("pass its own with --tokenizer")


def test_a_tokenizer_beside_it_of_another_vocabulary_is_named_in_the_warning(tmp_path, cache, capsys):
    model = _model(tmp_path / "m")
    shutil.copy(corpus_path("llama2c", "tokenizer.bin"), model.parent / "tokenizer.bin")  # llama2.c's 32000
    assert _train(model, tmp_path / "out") == 0
    (line,) = _warnings(capsys.readouterr().err)
    assert "no --tokenizer, and tokenizer.bin beside it has 32000 tokens (the model has 512)" in line


def test_the_tokenizer_beside_it_is_the_runs_without_a_warning(tmp_path, cache, capsys):
    model = _model(tmp_path / "m")
    tok = _tokenizer_512(model.parent / "tokenizer.bin")
    out = tmp_path / "out"
    assert _train(model, out) == 0
    assert _warnings(capsys.readouterr().err) == []
    assert (out / "tokenizer.bin").read_bytes() == tok.read_bytes()  # the run's copy is that file
    record = checkpoint.read_run_record(out / "ckpt.bin")
    assert record is not None and Path(record["tokenizer"]["path"]) == tok.resolve()


def test_tokenizer_flag_wins_over_the_one_beside_it(tmp_path, cache, capsys):
    model = _model(tmp_path / "m")
    shutil.copy(corpus_path("llama2c", "tokenizer.bin"), model.parent / "tokenizer.bin")
    tok = _tokenizer_512(tmp_path / "tok512.bin")
    out = tmp_path / "out"
    assert _train(model, out, "--tokenizer", str(tok)) == 0
    assert _warnings(capsys.readouterr().err) == []
    assert (out / "tokenizer.bin").read_bytes() == tok.read_bytes()


def test_a_checkpoint_trained_on_the_builtin_tokenizer_starts_again_without_a_warning(
    tmp_path, cache, capsys
):
    first = tmp_path / "first"
    assert main(["train", "--out", str(first), *QUICK]) == 0
    (first / "tokenizer.model").unlink()  # only its run record says which tokenizer it was trained with
    assert main(["train", "--init", str(first / "ckpt.bin"), "--out", str(tmp_path / "second"), *QUICK]) == 0
    assert _warnings(capsys.readouterr().err) == []
