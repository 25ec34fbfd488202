"""Fine-tuning Gemma 3 through the command line, as a Llama or Qwen model is fine-tuned: LoRA lowers the
validation loss and writes PEFT adapters, full fine-tuning writes a model directory that imports, and the
trained model's logits are those of the independent float64 Gemma 3 forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from anekit.hf.adapters import read_adapters
from anekit.hf.model import load_model
from anekit.llama.sample import forward_logits
from tests import gemma3_reference as ref
from tests.hf_fixtures import make_tokenizer
from tests.test_hf_train import _sums, _val_column
from tests.test_models_gemma3 import CONFIG, make_gemma3

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gemma3_train")
    model = root / "gemma3"
    info = make_tokenizer(model, 512, "llama3")
    make_gemma3(
        model, dict(CONFIG, vocab_size=512, bos_token_id=info.bos_id, eos_token_id=info.eos_id), seed=2
    )
    return model, _sums(root / "data", 9, 70)


def test_lora_lowers_the_validation_loss_and_writes_peft_adapters(workspace, tmp_path, capsys):
    model, data = workspace
    out = tmp_path / "lora"
    args = ["train", "--init", str(model), "--lora", "4", "--data", str(data), "--out", str(out), "--steps",
            "12", "--seq", "32", "--lr", "5e-3", "--val-every", "4", "--sample-steps", "0"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    val = _val_column(out)
    assert sorted(val) == [0, 4, 8, 12]
    assert val[12] < val[0] - 0.2, val  # seq 32 > the window of 5: the sliding layers train banded
    adapters = read_adapters(out / "adapters", load_model(model).cfg)
    assert adapters.spec.targets == ("q", "v") and all(np.abs(b).max() > 0 for b in adapters.b.values())


def test_full_fine_tuning_writes_a_model_the_float64_gemma_forward_agrees_with(workspace, tmp_path, capsys):
    model, data = workspace
    out = tmp_path / "full"
    args = ["train", "--init", str(model), "--data", str(data), "--out", str(out), "--steps", "4", "--seq",
            "32", "--lr", "1e-3", "--val-every", "2", "--sample-steps", "0"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    trained, original = load_model(out / "model").params, load_model(model).params
    moved = {n for (n, a), (_, b) in zip(trained.tensors(), original.tensors()) if not np.array_equal(a, b)}
    # every kind of weight trains: the (1 + w) norms, the post-norms, the q / k norms, the projections
    assert {"layers.0.post_att_norm", "layers.2.post_ffn_norm", "layers.1.q_norm", "layers.3.w1"} <= moved
    config, tensors = ref.load(out / "model")
    ids = [1, 17, 5, 42, 9, 30, 2, 11, 60, 3, 7, 8]  # longer than the window of 5
    want = ref.forward(config, tensors, ids)  # (T, vocab) float64
    got = forward_logits(trained, ids).T  # (T, vocab)
    assert np.max(np.abs(got - want)) < 1e-3 * max(1.0, float(np.max(np.abs(want))))
