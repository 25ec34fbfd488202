"""LoRA's default learning rate moves the loss within the README's short run (20 steps, the default
alpha of 2 x rank, the README's chat data). Measured: on the README's model (the exported default run)
the validation loss fell 4.40 -> 4.34 in 20 steps at the former default 1e-4 and 4.40 -> 3.70 at 1e-3;
on this test's random-weight model (at the uniform loss ln 512 = 6.24) by 0.01 at 1e-4 and 0.12 at 1e-3."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from anekit.cli.main import main
from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

pytest.importorskip("tokenizers")

LLAMA = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=512)  # fmt: skip
STEPS = 20  # the README's example: --steps 20 --val-every 5


def _data(folder: Path) -> Path:
    """The README's chat data: three prompts and completions, four times over for training."""
    folder.mkdir()
    rows = [{"prompt": f"Who is {n}?", "completion": f"{n} is a little dog."} for n in ("Tom", "Lily", "Ben")]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    (folder / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_the_default_lora_learning_rate_lowers_the_validation_loss_in_a_short_run(tmp_path, capsys):
    model = tmp_path / "llama"
    info = make_tokenizer(model, 512)
    make_checkpoint(
        model, small("smollm2", **LLAMA, bos_token_id=info.bos_id, eos_token_id=info.eos_id), seed=3
    )
    out = tmp_path / "run"
    args = ["train", "--init", str(model), "--lora", "8", "--data", str(_data(tmp_path / "chat")), "--out",
            str(out), "--steps", str(STEPS), "--val-every", "10", "--sample-steps", "0"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    with (out / "loss.csv").open() as f:
        val = {int(r["step"]): float(r["val_loss"]) for r in csv.DictReader(f) if r["val_loss"]}
    assert val[STEPS] < val[0] - 0.06, val  # at least 1% of the uniform loss gone in 20 steps
