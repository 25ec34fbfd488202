"""A LoRA training step through the kernels: the adapters' gradients against float64 finite differences of
the float64 model (tests/test_llama_step_hf.py's, with W0 + scale * B A in place of each adapted matrix),
and the frozen weights left alone."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.hf.adapters import FIELDS, Adapters, LoraSpec
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import Timer, train_step
from anekit.training.lora import LoraTrainable, MergedParams, frozen_base
from tests.test_llama_step_hf import BASE, CONFIGS, _loss, _params, _window

SPEC = LoraSpec(rank=4, alpha=8.0, targets=tuple(FIELDS))  # every matrix adapted: scale 2


def _adapters(cfg, seed: int) -> Adapters:
    ad = Adapters.init(SPEC, cfg, np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    for b in ad.b.values():  # B nonzero, so that A's gradient is too
        b[...] = 0.3 * rng.standard_normal(b.shape).astype(np.float32)
    return ad


def _merged64(params, adapters) -> dict[str, np.ndarray]:
    w = {k: v.astype(np.float64) for k, v in params.tensors()}
    for (layer, name), a in adapters.a.items():
        b = adapters.b[layer, name].astype(np.float64)
        w[f"layers.{layer}.{name}"] = w[f"layers.{layer}.{name}"] + SPEC.scale * b @ a.astype(np.float64)
    return w


@pytest.mark.parametrize("mode", ["dynamic", "baked"])
@pytest.mark.parametrize("name", ["plain", "qwen3-like"])
def test_adapter_gradients_match_float64_finite_differences(name, mode):
    cfg = BASE if name == "plain" else CONFIGS[name]
    params = _params(cfg, seed=3)
    base = frozen_base(params)
    adapters = _adapters(cfg, seed=4)
    trainable = LoraTrainable(base, adapters)
    tokens, targets = _window(cfg, seed=5)
    kernels = make_kernels(runtime.open("sim"), cfg, mode)
    kernels.compile(trainable.params, Timer())
    scale = 256.0
    result = train_step(kernels, trainable.params, trainable.sink(kernels), tokens, targets, Timer(), scale)
    kernels.close()
    assert result.finite and trainable.unscale(1.0 / scale)
    w = _merged64(base, adapters)
    assert abs(result.loss - _loss(cfg, w, tokens, targets)) < 5e-3 * result.loss
    h = 1e-4
    rng = np.random.default_rng(6)
    for which, grads, factors in (
        ("A", trainable.grads.da, adapters.a),
        ("B", trainable.grads.db, adapters.b),
    ):
        for key, g in grads.items():
            g = g.astype(np.float64)
            assert np.linalg.norm(g) > 0, (which, key)
            for u in (g, g * (rng.random(g.shape) < 0.5)):
                u = u / np.linalg.norm(u)
                original = factors[key].copy()
                try:
                    factors[key][...] = original + h * u
                    plus = _loss(cfg, _merged64(base, adapters), tokens, targets)
                    factors[key][...] = original - h * u
                    minus = _loss(cfg, _merged64(base, adapters), tokens, targets)
                finally:
                    factors[key][...] = original
                fd, an = (plus - minus) / (2 * h), float(np.sum(g * u))
                assert abs(fd - an) <= 3e-2 * np.linalg.norm(g), f"{which}{key}: fd {fd:.4e}, step {an:.4e}"


def test_merged_weights_are_the_fp16_base_plus_scale_b_a_and_follow_the_adapters():
    cfg = CONFIGS["qwen3-like"]
    params = _params(cfg, seed=1)
    base = frozen_base(params)
    assert base.layers[0].wq.dtype == np.float16 and base.layers[0].rms_att.dtype == np.float32
    adapters = _adapters(cfg, seed=2)
    merged = MergedParams(base, adapters)
    w = merged.kernel_weights(1)
    a, b = adapters.a[1, "wv"].astype(np.float64), adapters.b[1, "wv"].astype(np.float64)
    want = base.layers[1].wv.astype(np.float64) + SPEC.scale * b @ a
    np.testing.assert_allclose(w["wv"], want, rtol=1e-6, atol=1e-6)
    adapters.b[1, "wv"] += 1.0
    assert np.array_equal(merged.kernel_weights(1)["wv"], w["wv"])  # cached until refreshed
    merged.refresh()
    assert not np.array_equal(merged.kernel_weights(1)["wv"], w["wv"])


def test_an_adam_step_moves_only_the_adapters():
    cfg = BASE
    from anekit.training.loop import TrainConfig, TrainState

    params = _params(cfg, seed=8)
    base = frozen_base(params)
    before = {k: v.copy() for k, v in base.tensors()}
    adapters = _adapters(cfg, seed=9)
    a0 = {k: v.copy() for k, v in adapters.a.items()}
    trainable = LoraTrainable(base, adapters)
    for g in trainable.grads.da.values():
        g[...] = 0.01
    for g in trainable.grads.db.values():
        g[...] = -0.01
    state = TrainState(base, None, None)
    trainable.apply(state, TrainConfig(lr=1e-2, warmup=1, weight_decay=0.0))
    assert state.adam_t == 1
    assert all(np.array_equal(v, before[k]) for k, v in base.tensors())
    assert all(not np.array_equal(adapters.a[k], a0[k]) for k in a0)
