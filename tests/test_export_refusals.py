"""``anekit export`` refusals that come before any write: a tokenizer whose vocabulary is not the model's
(--to llama2c as for packages) and --check-residency off macOS."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from anekit.cli.main import main
from anekit.kernels.config import ModelConfig
from anekit.llama.llama2c import Tokenizer, write_llama2c, write_tokenizer_bin
from anekit.llama.params import Params

CFG = ModelConfig(32, 48, 2, 4, 2, 512, 16, name="tiny")


def _byte_tokenizer(path: Path) -> Path:
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % b for b in range(256)]
    write_tokenizer_bin(path, Tokenizer(pieces, [0.0] * len(pieces)))
    return path


@pytest.fixture
def model(tmp_path: Path) -> Path:
    src = tmp_path / "src" / "m.bin"
    src.parent.mkdir()
    write_llama2c(src, Params.init(CFG, seed=2))
    return src


def test_llama2c_export_refuses_a_tokenizer_of_another_vocabulary(tmp_path, model, capsys):
    tok = _byte_tokenizer(tmp_path / "bytes.bin")  # 259 tokens beside a 512-token model
    out = tmp_path / "o" / "model.bin"
    out.parent.mkdir()
    assert main(["export", str(model), "--to", "llama2c", str(out), "--tokenizer", str(tok)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "259 tokens, the model 512" in err, err
    assert list(out.parent.iterdir()) == []


def test_llama2c_export_does_not_copy_a_mismatched_tokenizer_found_beside_the_model(tmp_path, model, capsys):
    _byte_tokenizer(model.parent / "tokenizer.bin")
    out = tmp_path / "o" / "model.bin"
    out.parent.mkdir()
    assert main(["export", str(model), "--to", "llama2c", str(out)]) == 0
    assert "not copied" in capsys.readouterr().out
    assert [p.name for p in out.parent.iterdir()] == ["model.bin"]


@pytest.mark.skipif(sys.platform == "darwin", reason="off macOS only: on a Mac the check can run")
def test_check_residency_off_macos_is_refused_before_anything_is_written(tmp_path, model, capsys):
    out = tmp_path / "o" / "model.mlpackage"
    out.parent.mkdir()
    assert main(["export", str(model), "--to", "mlpackage", str(out), "--check-residency"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--check-residency" in err and "macOS" in err, err
    assert list(out.parent.iterdir()) == []
