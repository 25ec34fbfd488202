"""One ``train()`` optimizer step against an independent float64 implementation of the update.

The gradients come from the float64 oracle (tests/llama_reference.py); accumulation (the mean over
micro-steps), the global-norm clip, AdamW (bias-corrected moments, decay of 2-D weights only) and the
warmup + cosine schedule are written here from their definitions. The simulator runs in fp32
precision so that anekit's gradients agree with float64 to ~1e-6 and the comparison is tight; the
fp16 loss-scale path is checked on its own (an overflow halves the scale and skips the update).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import ModelConfig
from anekit.llama import Params
from anekit.training.loop import TrainConfig, TrainState, train
from tests import llama_reference as ref

CFG = ModelConfig(32, 64, 2, 4, 2, 64, 32, name="tiny")


class _Windows:
    """Random token windows drawn from the rng train() hands over (the documented (seed, step, micro))."""

    def batch(self, rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        w = rng.integers(0, CFG.vocab_size, seq_len + 1)
        return w[:-1], w[1:]


def _lr(tc: TrainConfig, step: int) -> float:
    """Linear warmup over the first ``warmup`` steps (step 0 already trains), then cosine to min_lr."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    t = min(1.0, (step - tc.warmup) / max(1, tc.steps - tc.warmup))
    return tc.min_lr + (tc.lr - tc.min_lr) * (1 + math.cos(math.pi * t)) / 2


def _reference_grads(params: Params, tc: TrainConfig, step: int) -> dict[str, np.ndarray]:
    """Mean of the micro-steps' float64 gradients, clipped to the global norm ``tc.grad_clip``."""
    total: dict[str, np.ndarray] = {}
    for micro in range(tc.accum):
        tokens, targets = _Windows().batch(np.random.default_rng([tc.seed, step, micro]), CFG.seq_len)
        _, g = ref.loss_and_grads(params, tokens, targets)
        for name, a in g.tensors():
            total[name] = total.get(name, 0.0) + np.asarray(a, np.float64) / tc.accum
    norm = math.sqrt(sum(float(np.sum(a * a)) for a in total.values()))
    if norm > tc.grad_clip:
        total = {k: v * (tc.grad_clip / norm) for k, v in total.items()}
    return total


def _one_step(tc: TrainConfig) -> tuple[TrainState, Params, dict[str, np.ndarray]]:
    params = Params.init(CFG, seed=3)
    before = params.copy()
    state = TrainState.fresh(params, tc)
    want_g = _reference_grads(before, tc, 0)
    sim = runtime.open("sim", precision="fp32", compile_budget=10**6)
    assert train(sim, state, _Windows(), tc) == "done"
    return state, before, want_g


@pytest.mark.parametrize("grad_clip", [1e9, 0.05], ids=["no-clip", "clipped"])
def test_one_step_matches_an_independent_adamw_update(grad_clip):
    tc = TrainConfig(steps=1, accum=3, lr=1e-2, warmup=4, weight_decay=0.1, grad_clip=grad_clip)
    state, before, want_g = _one_step(tc)
    assert state.step == 1 and state.adam_t == 1
    lr = _lr(tc, 0)
    m, v = dict(state.adam_m.tensors()), dict(state.adam_v.tensors())
    after, old = dict(state.params.tensors()), dict(before.tensors())
    for name, g in want_g.items():
        # First moments: (1 - b1) g and (1 - b2) g^2 of the accumulated, clipped gradient.
        # fp32 kernels against float64: agreement to ~1e-3 of each tensor's largest entry.
        scale = float(np.max(np.abs(g)))
        np.testing.assert_allclose(m[name], (1 - tc.beta1) * g, rtol=0, atol=1e-3 * scale, err_msg=name)
        np.testing.assert_allclose(
            v[name], (1 - tc.beta2) * g * g, rtol=0, atol=2e-3 * scale * scale, err_msg=name
        )
        # The update, with anekit's own (just checked) moments: Adam's bias-corrected step plus the
        # decoupled decay, which applies to matrices only (not RMSNorm scales).
        m_hat, v_hat = m[name] / (1 - tc.beta1), v[name] / (1 - tc.beta2)
        decay = tc.weight_decay if old[name].ndim == 2 else 0.0
        expected = old[name] - lr * (m_hat / (np.sqrt(v_hat) + 1e-8) + decay * old[name])
        np.testing.assert_allclose(after[name], expected, rtol=1e-5, atol=1e-7, err_msg=name)


def test_the_schedule_warms_up_from_the_first_step_then_follows_the_cosine():
    for tc in (TrainConfig(steps=50, warmup=10), TrainConfig(steps=7, warmup=1, lr=1e-3, min_lr=0.0)):
        got = [tc.lr_at(s) for s in range(tc.steps)]
        want = [_lr(tc, s) for s in range(tc.steps)]
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert got[0] > 0 and math.isclose(got[tc.warmup - 1], tc.lr)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_an_fp16_overflow_halves_the_loss_scale_and_skips_the_update():
    tc = TrainConfig(steps=1, accum=2, loss_scale=2.0**40)  # far past fp16: the gradients overflow
    params = Params.init(CFG, seed=3)
    snapshot = {k: v.copy() for k, v in params.tensors()}
    state = TrainState.fresh(params, tc)
    assert train(runtime.open("sim", compile_budget=10**6), state, _Windows(), tc) == "done"
    assert state.loss_scale == 2.0**39  # halved, not doubled
    assert state.adam_t == 0 and state.step == 1  # the batch counts, the update does not happen
    for name, a in state.params.tensors():
        np.testing.assert_array_equal(a, snapshot[name], err_msg=name)
