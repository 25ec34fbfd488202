"""``anekit inspect ckpt.bin`` shows the run record an ``anekit train`` checkpoint carries after its
tensors: the settings, the data and tokenizer identities and the loss history, in text and in --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anekit.cli.main import main
from anekit.kernels.config import ModelConfig
from anekit.llama.checkpoint import CheckpointMeta, save_checkpoint
from anekit.llama.params import Params

CFG = ModelConfig(16, 24, 2, 4, 2, 32, 8, name="tiny")
LOSSES = [3.4657, 3.1, 2.875, 2.9, 2.5] * 6  # 30 steps: more than the text rendering lists


def run_record() -> dict:
    """A record shaped as ``anekit train`` writes it (only its keys' meaning matters to inspect)."""
    shape = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
    return {
        "format": "anekit train run",
        "version": 1,
        "config": {**{k: getattr(CFG, k) for k in shape}, "name": "tiny"},
        "train": {"steps": 30, "lr": 0.006, "accum": 4, "seed": 7},
        "data": {"path": "/data/stories.txt", "sha256": "ab" * 32},
        "tokenizer": {"path": "/data/tok512.model", "sha256": "cd" * 32, "file": "tokenizer.model"},
        "init": None,
        "marks": [[12, "budget"]],
        "state": {"step": 30, "adam_t": 30, "loss_scale": 1024.0, "losses": LOSSES},
    }


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    params = Params.init(CFG, seed=0)
    path = tmp_path / "ckpt.bin"
    save_checkpoint(
        path, params, params.zeros_like(), params.zeros_like(), CheckpointMeta(step=30), run_record()
    )
    return path


def test_inspect_json_holds_the_whole_run_record_and_a_loss_summary(ckpt, capsys):
    assert main(["inspect", str(ckpt), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    record = info["run_record"]
    summary = record.pop("loss_summary")
    assert record == run_record()  # as stored, the full loss history included
    assert summary == {"steps": 30, "first": 3.4657, "last": 2.5, "lowest": 2.5}
    assert info["config"]["n_kv_heads"] == 2  # the record's config: the BLZT header has no n_kv_heads


def test_inspect_text_shows_settings_identities_and_losses(ckpt, capsys):
    assert main(["inspect", str(ckpt)]) == 0
    text = capsys.readouterr().out
    lines = [line.strip() for line in text.splitlines()]
    assert "run_record:" in lines
    assert "train: accum=4, lr=0.006, seed=7, steps=30" in lines  # stored with its keys sorted
    assert f"data: path=/data/stories.txt, sha256={'ab' * 32}" in lines
    tokenizer = lines.index("tokenizer:")  # too long for one line: a block
    assert lines[tokenizer + 1 : tokenizer + 4] == [
        "file: tokenizer.model",
        "path: /data/tok512.model",
        f"sha256: {'cd' * 32}",
    ]
    assert any(line.startswith("losses: [3.4657, 3.1, 2.875") and "(30 in all)]" in line for line in lines)
    assert "loss_summary: steps=30, first=3.4657, last=2.5, lowest=2.5" in lines


def test_a_checkpoint_without_a_run_record_says_so(tmp_path, capsys):
    params = Params.init(CFG.with_(n_kv_heads=4), seed=0)
    path = tmp_path / "plain.bin"
    save_checkpoint(path, params, params.zeros_like(), params.zeros_like(), CheckpointMeta())
    assert main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_record"] is None
    assert main(["inspect", str(path)]) == 0
    assert "  run_record: -" in capsys.readouterr().out.splitlines()
