"""``anekit sample`` finds the model's own tokenizer or says what it used: --tokenizer, one in an export's
shard directory or beside MODEL, the one a checkpoint's run record names; a tokenizer whose vocabulary is
not the model's is a one-line error naming what to pass, and the built-in tokenizer is never a silent
fallback."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from anekit.cli.main import main
from anekit.kernels.config import ModelConfig
from anekit.llama.checkpoint import CheckpointMeta, save_checkpoint
from anekit.llama.llama2c import Tokenizer, write_tokenizer_bin
from anekit.llama.params import Params
from tests.conftest import corpus_path


def numbered_tokenizer(vocab_size: int, tag: bytes = b"t") -> Tokenizer:
    """llama's <unk>, BOS, EOS, then pieces " t3", " t4", ...: sampled text shows which ids it holds."""
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b" %s%d" % (tag, i) for i in range(3, vocab_size)]
    return Tokenizer(pieces, [0.0] * vocab_size)


def ids_printed(text: str, tag: str = "t") -> list[int]:
    words = text.split()
    assert words and all(w.startswith(tag) and w[len(tag) :].isdigit() for w in words), text
    return [int(w[len(tag) :]) for w in words]


def sample(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["sample", *argv, "--seed", "3"])
    out, err = capsys.readouterr()
    return rc, out, err


# -- llama2.c model files -----------------------------------------------------------------------------


def test_no_tokenizer_at_all_says_the_built_in_one_is_used(tmp_path, cache, capsys):
    pytest.importorskip("sentencepiece")
    model = tmp_path / "stories260K.bin"
    shutil.copyfile(corpus_path("llama2c", "stories260K.bin"), model)  # alone: no tokenizer beside it
    rc, out, err = sample(capsys, str(model), "--steps", "4")
    assert rc == 0 and out.strip(), err
    warning = err.splitlines()[0]
    said = (
        "anekit: warning: [sample] no --tokenizer and none of tokenizer.model, tokenizer.bin in "
        f"{tmp_path}: using the built-in corpus tokenizer (512-token BPE"
    )
    assert warning.startswith(said), warning
    assert "pass its own with --tokenizer" in warning


def test_a_tokenizer_beside_the_model_with_another_vocabulary_is_an_error(tmp_path, cache, capsys):
    model = tmp_path / "stories260K.bin"
    shutil.copyfile(corpus_path("llama2c", "stories260K.bin"), model)
    write_tokenizer_bin(tmp_path / "tokenizer.bin", numbered_tokenizer(300))  # fewer ids than the model's 512
    rc, out, err = sample(capsys, str(model), "--steps", "4")
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("anekit: [sample] the tokenizer "), err
    assert (
        f"{tmp_path / 'tokenizer.bin'} (found beside stories260K.bin) has 300 tokens but the model's " in err
    )
    assert "vocab_size is 512" in err and "pass --tokenizer TOK, the 512-token tokenizer" in err


def test_a_tokenizer_beside_the_model_with_its_vocabulary_is_used_quietly(tmp_path, cache, capsys):
    model = tmp_path / "stories260K.bin"
    shutil.copyfile(corpus_path("llama2c", "stories260K.bin"), model)
    write_tokenizer_bin(tmp_path / "tokenizer.bin", numbered_tokenizer(512))
    rc, out, err = sample(capsys, str(model), "--steps", "6", "--temperature", "0")
    assert rc == 0 and "warning" not in err, err
    assert len(ids_printed(out)) == 6


# -- checkpoints: the run record names the tokenizer ------------------------------------------------------

TINY = ModelConfig(16, 24, 2, 2, 2, 40, 16, name="tiny")


def checkpoint_naming(path: Path, tokenizer: Path) -> None:
    """A checkpoint whose run record names ``tokenizer`` as ``anekit train`` does (path and sha256)."""
    params = Params.init(TINY, seed=1)
    params.embed *= 30  # sharp logits: greedy text that differs from token to token
    shape = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
    sha = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    record = {
        "config": {k: getattr(TINY, k) for k in shape},
        "tokenizer": {"path": str(tokenizer), "sha256": sha, "file": "tokenizer.bin"},
    }
    save_checkpoint(path, params, params.zeros_like(), params.zeros_like(), CheckpointMeta(), record)


def _trained_with_a_tokenizer(tmp_path: Path) -> tuple[Path, Path]:
    """A tokenizer under data/ and a checkpoint under run/ whose run record names it."""
    trained_with = tmp_path / "data" / "tok.bin"
    trained_with.parent.mkdir()
    write_tokenizer_bin(trained_with, numbered_tokenizer(TINY.vocab_size, b"w"))
    ckpt = tmp_path / "run" / "ckpt.bin"
    ckpt.parent.mkdir()
    checkpoint_naming(ckpt, trained_with)
    return trained_with, ckpt


def test_a_checkpoint_samples_with_the_tokenizer_its_run_record_names(tmp_path, cache, capsys):
    _, ckpt = _trained_with_a_tokenizer(tmp_path)
    rc, out, err = sample(capsys, str(ckpt), "--steps", "8", "--temperature", "0")
    assert rc == 0 and "warning" not in err, err
    assert len(ids_printed(out, "w")) >= 1


def test_a_tokenizer_that_is_not_the_run_records_is_an_error_naming_the_right_one(tmp_path, cache, capsys):
    trained_with, ckpt = _trained_with_a_tokenizer(tmp_path)
    other = numbered_tokenizer(TINY.vocab_size, b"x")  # the same size, other pieces
    write_tokenizer_bin(ckpt.parent / "tokenizer.bin", other)
    for argv in ([], ["--tokenizer", str(ckpt.parent / "tokenizer.bin")]):
        rc, out, err = sample(capsys, str(ckpt), "--steps", "4", *argv)
        assert rc == 1 and out == "" and err.count("\n") == 1, err
        assert "is not the one the model was trained with" in err
        sha = hashlib.sha256(trained_with.read_bytes()).hexdigest()[:12]
        assert f"pass --tokenizer {trained_with}, the tokenizer the run record names (sha256 {sha})" in err


# -- exported packages: a shard directory holds its tokenizer ---------------------------------------------


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("coremltools")
    from anekit.coreml.model_export import export_mlpackage
    from anekit.llama.llama2c import read_llama2c

    _, params = read_llama2c(corpus_path("llama2c", "stories260K.bin"))
    out = tmp_path_factory.mktemp("export") / "shards"
    report = export_mlpackage(params, out, shard_mb=1)
    assert report.sharded and (out / "shards.json").is_file()
    return out


def fresh_copy(shard_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "shards"
    shutil.copytree(shard_dir, out)
    return out


def test_sample_uses_the_tokenizer_in_a_shard_directory(shard_dir, tmp_path, cache, capsys):
    shards = fresh_copy(shard_dir, tmp_path)
    write_tokenizer_bin(shards / "tokenizer.bin", numbered_tokenizer(512))
    for model in (shards, shards / "shards.json"):
        rc, out, err = sample(capsys, str(model), "--steps", "3", "--temperature", "0")
        assert rc == 0 and "warning" not in err, err
        assert len(ids_printed(out)) == 3


def test_a_shard_directorys_tokenizer_of_another_vocabulary_is_one_error(shard_dir, tmp_path, cache, capsys):
    shards = fresh_copy(shard_dir, tmp_path)
    write_tokenizer_bin(shards / "tokenizer.bin", numbered_tokenizer(1000))
    rc, out, err = sample(capsys, str(shards), "--steps", "3")
    assert rc == 1 and out == "" and err.count("\n") == 1, err
    assert f"the tokenizer {shards / 'tokenizer.bin'} (found in shards) has 1000 tokens" in err
    assert "pass --tokenizer TOK, the 512-token tokenizer the model was trained with" in err


def test_a_shard_directory_without_a_tokenizer_says_the_built_in_one_is_used(
    shard_dir, tmp_path, cache, capsys
):
    pytest.importorskip("sentencepiece")
    shards = fresh_copy(shard_dir, tmp_path)
    rc, out, err = sample(capsys, str(shards), "--steps", "3")
    assert rc == 0 and out.strip(), err
    said = (
        "anekit: warning: [sample] no --tokenizer and none of tokenizer.model, tokenizer.bin in "
        f"{shards}, {tmp_path}: using the built-in corpus tokenizer"
    )
    assert err.startswith(said), err


def test_export_writes_the_models_tokenizer_where_sample_finds_it(tmp_path, cache, capsys):
    """`anekit export` copies the tokenizer beside MODEL into a shard directory (or beside one package),
    and `anekit sample` on the export then uses it without --tokenizer or a warning; a different
    tokenizer already there is refused, before anything is written, unless --force replaces it."""
    folder = tmp_path / "model"
    folder.mkdir()
    model = folder / "m.bin"
    shutil.copy(corpus_path("llama2c", "stories260K.bin"), model)
    write_tokenizer_bin(folder / "tokenizer.bin", numbered_tokenizer(512))
    assert main(["export", str(model), "--to", "mlpackage", str(tmp_path / "s"), "--shard-mb", "1"]) == 0
    assert f"wrote {tmp_path / 's' / 'tokenizer.bin'}" in capsys.readouterr().out
    assert (tmp_path / "s" / "tokenizer.bin").read_bytes() == (folder / "tokenizer.bin").read_bytes()
    rc, out, err = sample(capsys, str(tmp_path / "s"), "--steps", "3", "--temperature", "0")
    assert rc == 0 and "warning" not in err and len(ids_printed(out)) == 3, err
    single = tmp_path / "one"
    single.mkdir()
    write_tokenizer_bin(single / "tokenizer.bin", numbered_tokenizer(512, b"other"))
    assert main(["export", str(model), "--to", "mlpackage", str(single / "m.mlpackage")]) == 1
    out, err = capsys.readouterr()
    assert err == (
        f"anekit: [export] {single / 'tokenizer.bin'}: a different tokenizer is there (--force replaces it "
        f"with the model's, {folder / 'tokenizer.bin'})\n"
    )
    assert sorted(p.name for p in single.iterdir()) == ["tokenizer.bin"]  # nothing written
    assert main(["export", str(model), "--to", "mlpackage", str(single / "m.mlpackage"), "--force"]) == 0
    capsys.readouterr()
    assert (single / "tokenizer.bin").read_bytes() == (folder / "tokenizer.bin").read_bytes()
    rc, out, err = sample(capsys, str(single / "m.mlpackage"), "--steps", "3", "--temperature", "0")
    assert rc == 0 and "warning" not in err and len(ids_printed(out)) == 3, err
    bare = tmp_path / "bare.bin"
    shutil.copy(model, bare)
    assert main(["export", str(bare), "--to", "mlpackage", str(tmp_path / "b.mlpackage")]) == 0
    assert "no tokenizer beside MODEL" in capsys.readouterr().out


def test_export_refuses_a_tokenizer_of_another_vocabulary_before_writing(tmp_path, cache, capsys):
    model = corpus_path("llama2c", "stories260K.bin")
    write_tokenizer_bin(tmp_path / "big.bin", numbered_tokenizer(1000))
    out = tmp_path / "m.mlpackage"
    assert (
        main(["export", str(model), "--to", "mlpackage", str(out), "--tokenizer", str(tmp_path / "big.bin")])
        == 1
    )
    err = capsys.readouterr().err
    assert "[export] --tokenizer: the tokenizer" in err and "has 1000 tokens, the model 512" in err
    assert not out.exists()
    assert main(["export", str(model), "--to", "mlpackage", str(out)]) == 0  # the corpus's 32000-token one
    assert "has 32000 tokens, the model 512: not copied" in capsys.readouterr().out
