"""``anekit train``'s checks of what it is asked to train before any work: the tokenizer a preset needs,
and an ``--init`` model that does not fit the preset (the fields that differ, the ``--config`` to pass)."""

from __future__ import annotations

from pathlib import Path

import pytest

from anekit.cli.main import main
from anekit.kernels import PRESETS, ModelConfig
from anekit.llama import checkpoint
from anekit.llama.llama2c import write_llama2c
from anekit.llama.params import Params
from tests.conftest import corpus_path

QUICK = ["--steps", "1", "--accum", "1", "--sample-steps", "0"]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("anekit: [train] "), err
    return lines[0]


@pytest.mark.parametrize("name", [n for n, cfg in PRESETS.items() if cfg.vocab_size == 32000])
def test_a_32000_token_preset_without_a_tokenizer_says_which_to_pass_before_any_work(
    name, tmp_path, cache, capsys
):
    out = tmp_path / "out"
    assert main(["train", "--config", name, "--steps", "5", "--out", str(out)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert f"--config {name} needs a 32000-token tokenizer: pass it with --tokenizer" in line
    assert "llama2.c's tokenizer.bin" in line and "sentencepiece" not in line
    assert not out.exists() and not cache.exists()  # no output, and no BPE training was even tried


def test_a_32000_token_preset_trains_with_llama2c_tokenizer(tmp_path, cache, capsys):
    tok = corpus_path("llama2c", "tokenizer.bin")
    out = tmp_path / "out"
    assert main(["train", "--config", "stories15M", "--tokenizer", str(tok), *QUICK, "--out", str(out)]) == 0
    assert "trained 1 step:" in capsys.readouterr().out
    assert (out / "ckpt.bin").is_file() and (out / "tokenizer.bin").read_bytes() == tok.read_bytes()


def _llama2c(path: Path, cfg: ModelConfig) -> Path:
    write_llama2c(path, Params.init(cfg, seed=1))
    return path


def _blzt(path: Path, cfg: ModelConfig) -> Path:
    params = Params.init(cfg, seed=1)
    checkpoint.save_checkpoint(
        path, params, params.zeros_like(), params.zeros_like(), checkpoint.CheckpointMeta()
    )
    return path


@pytest.mark.parametrize("write", [_llama2c, _blzt], ids=["llama2c", "blzt"])
def test_init_of_another_preset_names_the_fields_that_differ_and_the_config_to_pass(
    write, tmp_path, cache, capsys
):
    model = write(tmp_path / "model.bin", PRESETS["stories260K"])
    out = tmp_path / "out"
    assert main(["train", "--init", str(model), "--out", str(out), *QUICK]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "ModelConfig(" not in line
    assert line.startswith(f"anekit: [train] --init {model} does not fit the default preset (no --config): ")
    assert "hidden_dim 172 (not 176), n_layers 5 (not 4), n_heads 8 (not 4)" in line
    assert line.endswith("; pass --config stories260K")
    assert not out.exists()
    assert main(["train", "--init", str(model), "--config", "stories260K", "--out", str(out), *QUICK]) == 0
    assert (out / "ckpt.bin").is_file()


def test_init_of_a_shape_no_preset_has_says_so(tmp_path, cache, capsys):
    model = _llama2c(tmp_path / "odd.bin", PRESETS["default"].with_(n_layers=3, name="odd"))
    assert main(["train", "--init", str(model), "--config", "default", "--out", str(tmp_path / "o")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert (
        f"--init {model} does not fit --config default: its n_layers 3 (not 4); no preset has its shape"
        in line
    )
