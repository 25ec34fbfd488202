"""Fine-tuning Hugging Face models with the training kernels (``anekit train --init HF_DIR``): LoRA with the
validation loss falling and written to loss.csv, adapters that PEFT's layout holds and that fuse to the
trained model, exact resume, full fine-tuning, and the refusals."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from anekit.errors import AnekitError
from anekit.hf.adapters import read_adapters
from anekit.hf.model import load_model
from anekit.hf.training import HFOptions, hf_run
from anekit.llama.sample import forward_logits
from anekit.training.options import TrainOptions
from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

pytest.importorskip("tokenizers")

# Qwen 3's structure (own head size, q/k norm) at a size the simulator trains in seconds.
QWEN = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            num_hidden_layers=2, vocab_size=512)  # fmt: skip


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hf_train")
    model = root / "qwen"
    info = make_tokenizer(model, 512, "qwen")
    config = small("qwen3", **QWEN, bos_token_id=info.eos_id, eos_token_id=info.eos_id)
    make_checkpoint(model, config, dtype="bfloat16", seed=2, std=0.05)
    return model, _sums(root / "data", 9, 70)


def _sums(data: Path, n: int, train: int) -> Path:
    """A data directory of "what is a plus b?" prompts and completions (a, b < n): the first ``train``
    to train.jsonl, the rest to valid.jsonl."""
    data.mkdir()
    rows = [
        {"prompt": f"what is {a} plus {b}?", "completion": str(a + b)} for a in range(n) for b in range(n)
    ]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:train]))
    (data / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[train:]))
    return data


def _lora_args(model: Path, data: Path, out: Path, steps: int = 12) -> list[str]:
    return ["train", "--init", str(model), "--lora", "4", "--data", str(data), "--out", str(out), "--steps",
            str(steps), "--seq", "32", "--lr", "5e-3", "--val-every", "4", "--sample-steps", "0"]  # fmt: skip


def _val_column(out: Path) -> dict[int, float]:
    with (out / "loss.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["step", "loss", "val_loss"]
    return {int(r["step"]): float(r["val_loss"]) for r in rows if r["val_loss"]}


def test_lora_fine_tuning_lowers_the_validation_loss_and_writes_peft_adapters(workspace, tmp_path, capsys):
    model, data = workspace
    out = tmp_path / "run"
    assert main(_lora_args(model, data, out)) == 0
    printed = capsys.readouterr().out
    assert "val loss" in printed and f"wrote {out / 'state.safetensors'}, {out / 'adapters'}" in printed
    val = _val_column(out)
    assert sorted(val) == [0, 4, 8, 12]  # before the first step, every --val-every, after the last
    assert val[12] < val[0] - 0.5, val
    base = load_model(model)
    adapters = read_adapters(out / "adapters", base.cfg)  # PEFT's layout, read back into anekit's
    assert adapters.spec.rank == 4 and adapters.spec.targets == ("q", "v")
    assert all(np.abs(b).max() > 0 for b in adapters.b.values())  # trained: B left zero


def test_fused_adapters_give_the_trained_models_logits(workspace, tmp_path, capsys):
    from anekit.hf.adapters import fuse

    model, data = workspace
    out = tmp_path / "run"
    assert main(_lora_args(model, data, out, steps=3)) == 0
    assert (
        main(["fuse", str(model), str(out / "adapters"), str(tmp_path / "fused"), "--dtype", "float32"]) == 0
    )
    capsys.readouterr()
    run = hf_run(TrainOptions(out=out, resume=True), HFOptions())  # the trained adapters, from the state
    tokens = np.array([5, 40, 300, 7, 99])
    want = forward_logits(fuse(load_model(model).params, run.trainable.adapters), tokens)
    got = forward_logits(load_model(tmp_path / "fused").params, tokens)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # sampling with the adapters merged in memory prints what sampling the fused directory prints
    args = ["--prompt", "what is 2 plus 3?", "--temperature", "0", "--steps", "20"]
    assert main(["sample", str(model), "--adapters", str(out / "adapters"), *args]) == 0
    merged = capsys.readouterr().out
    assert main(["sample", str(tmp_path / "fused"), *args]) == 0
    assert capsys.readouterr().out == merged


def test_a_stopped_lora_run_resumes_to_the_uninterrupted_adapters(workspace, tmp_path, capsys):
    model, data = workspace
    assert main(_lora_args(model, data, tmp_path / "whole", steps=6)) == 0
    options = TrainOptions(out=tmp_path / "part", init=model, data=data, steps=6, lr=5e-3)
    run = hf_run(options, HFOptions(lora=4, seq=32, val_every=4))
    try:
        assert run.train(should_stop=lambda: run.state.step >= 2).reason == "stopped"
    finally:
        run.close()
    assert main(["train", "--out", str(tmp_path / "part"), "--resume", "--sample-steps", "0"]) == 0
    capsys.readouterr()
    base = load_model(model).cfg
    a, b = (
        read_adapters(tmp_path / "whole" / "adapters", base),
        read_adapters(tmp_path / "part" / "adapters", base),
    )
    for key in a.a:
        assert np.array_equal(a.a[key], b.a[key]) and np.array_equal(a.b[key], b.b[key]), key
    assert _val_column(tmp_path / "whole") == _val_column(tmp_path / "part")


def test_full_fine_tuning_writes_a_model_directory_that_imports(workspace, tmp_path, capsys):
    model, data = workspace
    out = tmp_path / "full"
    args = ["train", "--init", str(model), "--data", str(data), "--out", str(out), "--steps", "4", "--seq",
            "32", "--lr", "1e-3", "--val-every", "2", "--sample-steps", "0"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    trained = load_model(out / "model").params
    original = load_model(model).params
    moved = [n for (n, a), (_, b) in zip(trained.tensors(), original.tensors()) if not np.array_equal(a, b)]
    assert "layers.0.wq" in moved and "layers.1.q_norm" in moved  # every weight trains, Qwen 3's norms too
    assert (out / "tokenizer.json").is_file() and (out / "model" / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--lora-targets", "q,x"], "unknown target 'x'"),
        (["--weights", "baked"], "trains with dynamic weights"),
        (["--tokenizer", "t.model"], "--tokenizer does not apply"),
        (["--data", "/nonexistent/data"], "cannot read /nonexistent/data"),
    ],
)
def test_hf_training_refusals_are_one_line_and_write_nothing(workspace, tmp_path, capsys, extra, says):
    model, data = workspace
    out = tmp_path / "run"
    code = main([*_lora_args(model, data, out), *extra])
    err = capsys.readouterr().err
    assert code in (1, 2) and says in err, err
    assert not out.exists()


def test_lora_flags_need_a_hugging_face_model(tmp_path, capsys):
    assert main(["train", "--lora", "4", "--out", str(tmp_path / "o"), "--steps", "1"]) == 1
    assert "--lora applies to a Hugging Face model" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_resume_refuses_a_contradicting_rank(workspace, tmp_path, capsys):
    model, data = workspace
    out = tmp_path / "run"
    assert main(_lora_args(model, data, out, steps=1)) == 0
    capsys.readouterr()
    with pytest.raises(
        AnekitError, match=r"^\[train\] resume=True: lora=8 contradicts the run in .* \(lora=4\)"
    ):
        hf_run(TrainOptions(out=out, resume=True), HFOptions(lora=8))  # Python names its parameters
    assert main(["train", "--out", str(out), "--resume", "--lora", "8", "--sample-steps", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"anekit: [train] --resume: --lora 8 contradicts the run in {out} (--lora 4); ")
    assert err.rstrip().endswith("start a new one with --force") and err.count("\n") == 1


@pytest.mark.parametrize("shape, style, layers", [("smollm2", "llama3", 2), ("qwen3", "qwen", 1)])
def test_lora_on_real_head_counts_and_vocabularies_lowers_the_validation_loss(tmp_path, capsys, shape, style,
                                                                                layers):  # fmt: skip
    """SmolLM2-135M's and Qwen3-0.6B's shapes (heads, head size, widths, 49152 / 151936-token vocabularies),
    a few layers: LoRA on the kernels lowers the validation loss."""
    model = tmp_path / shape
    vocab = small(shape)["vocab_size"]
    info = make_tokenizer(model, vocab, style)
    ids = {
        "bos_token_id": info.bos_id if info.bos_id is not None else info.eos_id,
        "eos_token_id": info.eos_id,
    }
    make_checkpoint(model, small(shape, num_hidden_layers=layers, **ids), dtype="bfloat16", seed=4, std=0.05)
    data = _sums(tmp_path / "data", 6, 30)
    out = tmp_path / "run"
    args = ["train", "--init", str(model), "--lora", "8", "--data", str(data), "--out", str(out), "--steps", "6",
            "--accum", "1", "--seq", "32", "--lr", "2e-2", "--val-every", "6", "--sample-steps", "0"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    val = _val_column(out)
    assert sorted(val) == [0, 6] and val[6] < val[0] - 1.0, val


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda r: r["state"].update(step="3"), "state.step"),
        (lambda r: r.update(lora={"rank": 0, "alpha": 8, "targets": ["q"]}), "lora.rank"),
        (lambda r: r["state"].pop("losses"), "state.losses"),
        (lambda r: r["state"].update(val_losses={"x": 1.0}), "keys must be steps"),
        (lambda r: r.update(seq="long"), "seq"),
    ],
)
def test_a_damaged_hf_run_record_is_one_line_naming_the_field(workspace, tmp_path, capsys, damage, says):
    from anekit.hf.safetensors_io import read_header, write_safetensors
    from anekit.hf.training import RUN_KEY

    model, data = workspace
    out = tmp_path / "run"
    assert main(_lora_args(model, data, out, steps=1)) == 0
    refs, metadata = read_header(out / "state.safetensors")
    record = json.loads(metadata[RUN_KEY])
    damage(record)
    tensors = {name: (ref.dtype, np.array(ref.raw())) for name, ref in refs.items()}
    write_safetensors(out / "state.safetensors", tensors, {RUN_KEY: json.dumps(record)})
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--sample-steps", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
