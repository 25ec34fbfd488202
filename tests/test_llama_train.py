"""``anekit train``: the loss falls, the budget stops a run before it is exceeded, bad runs stop cleanly
(restarts, resume and interruptions: test_train_resume.py and test_train_signals.py)."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.cli.main import main
from anekit.kernels import ModelConfig
from anekit.llama import Params
from anekit.llama.checkpoint import load_checkpoint_file
from anekit.training.loop import TrainConfig, TrainingDiverged, TrainState, train


def _tiny_state(seed: int = 0) -> tuple[ModelConfig, TrainState]:
    cfg = ModelConfig(32, 64, 2, 4, 2, 64, 32, name="tiny")
    return cfg, TrainState.fresh(Params.init(cfg, seed=seed), TrainConfig())


class _Repeat:
    """A dataset of one short repeating pattern: a model must learn it quickly."""

    def batch(self, rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        start = int(rng.integers(0, 8))
        window = (np.arange(start, start + seq_len + 1) % 8) + 3
        return window[:-1], window[1:]


def test_the_loss_falls():
    cfg, state = _tiny_state()
    tc = TrainConfig(steps=40, accum=2, lr=1e-2, warmup=5)
    assert train(runtime.open("sim", compile_budget=10**6), state, _Repeat(), tc) == "done"
    assert state.losses[0] > np.log(cfg.vocab_size) - 0.5
    assert np.mean(state.losses[-5:]) < 0.5 * state.losses[0]


def test_a_nan_loss_stops_with_the_step_and_phase():
    _cfg, state = _tiny_state()
    state.params.rms_final[...] = np.nan  # on the host: the engine itself turns NaN into +inf (numerics)
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 0 \(micro-step 0, forward phase\)"):
        train(runtime.open("sim"), state, _Repeat(), TrainConfig(steps=2, accum=1))


def test_the_budget_stops_before_a_batch_that_would_exceed_it():
    _cfg, state = _tiny_state()
    backend = runtime.open("sim", compile_budget=12)  # 1 shared kernel + 10 per batch: one batch fits
    assert train(backend, state, _Repeat(), TrainConfig(steps=5, accum=1)) == "budget"
    assert state.step == 1 and backend.compile_count == 11


def test_resume_with_a_different_config_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ANEKIT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "1", "--accum", "1", "--sample-steps", "0"]) == 0
    run = load_checkpoint_file(out / "ckpt.bin").run
    assert run["config"]["name"] == "default" and len(run["state"]["losses"]) == 1
    assert (
        main(["train", "--out", str(out), "--resume", "--config", "stories260K", "--sample-steps", "0"]) == 1
    )
    assert "stories260K" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "none"), "--resume"]) == 1
    assert "no checkpoint" in capsys.readouterr().err


def test_bad_data_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ANEKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "shards").mkdir()
    assert main(["train", "--out", str(tmp_path / "o"), "--data", str(tmp_path / "shards")]) == 1
    assert "shard" in capsys.readouterr().err
    (tmp_path / "shards" / "a.bin").write_bytes(b"\x01\x00\x02")
    assert main(["train", "--out", str(tmp_path / "o"), "--data", str(tmp_path / "shards")]) == 1
    assert "odd" in capsys.readouterr().err.lower()


def test_dynamic_weights_train_within_a_tiny_compile_budget():
    """Dynamic mode compiles its eight kernels once: 20 optimizer steps fit in a budget of 9."""
    _cfg, state = _tiny_state()
    backend = runtime.open("sim", compile_budget=9)
    tc = TrainConfig(steps=20, accum=2, lr=1e-2, warmup=3, weights="dynamic")
    assert train(backend, state, _Repeat(), tc) == "done"
    assert backend.compile_count == 8
    assert np.mean(state.losses[-3:]) < 0.7 * state.losses[0]


def _train_past_the_headroom(steps: int) -> tuple[TrainState, list[bool], TrainConfig]:
    """A tiny model trained ``steps`` steps from a loss scale past the MAC headroom: the state, whether
    each step was skipped, and the settings."""
    _cfg, state = _tiny_state()
    tc = TrainConfig(steps=steps, accum=1, loss_scale=2.0**22)
    state = TrainState.fresh(state.params, tc)
    skipped: list[bool] = []
    train(
        runtime.open("sim", compile_budget=10**6),
        state,
        _Repeat(),
        tc,
        on_step=lambda r: skipped.append(r.skipped),
    )
    return state, skipped, tc


def test_a_loss_scale_past_the_mac_headroom_is_halved_before_it_overflows():
    """Scaled gradients are kept under half the MAC port's 2^15 ceiling (the engine's overflow forms, +inf
    and the +0 of inf - inf, come after it): a scale of 2^22 is halved step by step, no update applied
    while the gradients are over the headroom, and training then goes on."""
    from anekit.llama.step import GRADIENT_HEADROOM, StepResult

    assert GRADIENT_HEADROOM == 16384
    assert StepResult(1.0, True, 16384.0).overflowed and not StepResult(1.0, True, 16383.0).overflowed
    state, skipped, _ = _train_past_the_headroom(30)
    assert skipped[0] and state.loss_scale < 2.0**22 and not all(skipped)
    assert np.all(np.isfinite(state.losses))


def test_a_budget_smaller_than_one_step_is_an_error_before_the_first_step():
    """A budget below one step's compiles (1 shared + 5 per layer, baked) would re-execute forever without a
    step: it is refused before anything compiles, naming the budget needed."""
    from anekit.training.loop import BudgetTooSmall, first_step_compiles

    cfg, state = _tiny_state()
    need = first_step_compiles(cfg, "baked")
    assert need == 11
    backend = runtime.open("sim", compile_budget=need - 1)
    with pytest.raises(BudgetTooSmall, match=f"pass compile_budget={need} or more"):
        train(backend, state, _Repeat(), TrainConfig(steps=3, accum=1))
    assert state.step == 0 and backend.compile_count == 0
    assert train(
        runtime.open("sim", compile_budget=need), state, _Repeat(), TrainConfig(steps=3, accum=1)
    ) == ("budget")
    assert state.step == 1  # exactly the budget: one step per process, so every restart makes progress


def test_weight_decay_shrinks_the_matrices_and_never_the_rmsnorm_scales():
    """AdamW with zero gradients moves a weight only by its decay: every 2-D matrix shrinks by lr * wd,
    every RMSNorm scale (rms_att, rms_ffn, rms_final) stays exactly as it was (llama2.c decays only the
    matrices)."""
    from anekit.training.loop import apply_adamw

    _cfg, state = _tiny_state()
    before = {k: a.copy() for k, a in state.params.tensors()}
    tc = TrainConfig(weight_decay=0.1, warmup=0)
    apply_adamw(state, state.params.zeros_like(), tc)
    norms = [k for k, a in before.items() if a.ndim == 1]
    assert any("rms_final" in k for k in norms) and any("rms_att" in k for k in norms)
    for k, a in state.params.tensors():
        if a.ndim == 1:
            assert np.array_equal(a, before[k]), k
        else:
            np.testing.assert_allclose(a, before[k] * (1 - tc.lr_at(0) * tc.weight_decay), rtol=1e-6)


def test_a_skipped_step_does_not_advance_the_adam_step_in_the_checkpoint_header(tmp_path):
    """An overflowed step (skipped: no update) counts as a step but not as an Adam step: the header's and
    the run record's adam_t are the number of applied updates, so a resumed run's bias correction is right."""
    from anekit.training.blzt import RunRecord as Run
    from anekit.training.blzt import save_run as _save
    from anekit.training.identity import Source

    state, skipped, tc = _train_past_the_headroom(8)
    assert any(skipped) and not all(skipped)
    spec = Run(
        state.params.cfg, tc, Source(None, "0" * 64), Source(None, "0" * 64), "tokenizer.bin", None, []
    )
    _save(tmp_path / "ckpt.bin", state, spec, 1.0)
    ck = load_checkpoint_file(tmp_path / "ckpt.bin")
    applied = skipped.count(False)
    assert ck.meta.step == 8 and ck.meta.adam_t == applied == state.adam_t
    assert ck.run["state"]["adam_t"] == applied
