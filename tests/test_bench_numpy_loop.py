"""The benchmarks' plain numpy llama2.c loop (benchmarks/bench_step_vs_numpy.py ``NumpyLlama``) computes
what it claims: its gradients against central finite differences of its own float64 loss, its float32
gradients against the float64 ones, and its AdamW step against a float64 AdamW written here.

The benchmarks compare anekit's training against this loop, so a wrong gradient there would make every
ratio meaningless; its loss and gradients are checked against the tests' float64 llama2.c oracle too."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from anekit.kernels import ModelConfig
from anekit.llama import Params

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_step_vs_numpy.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_step_vs_numpy", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_step_vs_numpy", module)
    spec.loader.exec_module(module)
    return module


bench = _bench()
# small, with grouped kv heads (2 query heads per kv head) so the head batching and the kv sums are used
CFG = ModelConfig(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=40, seq_len=12)


def _params(seed: int = 0) -> Params:
    p = Params.init(CFG, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for _, a in p.tensors():  # norms away from one, so their gradients are not symmetric by accident
        if a.ndim == 1:
            a[...] = 1 + 0.3 * rng.standard_normal(a.shape).astype(a.dtype)
        else:
            a *= 5  # larger weights: attention that is not uniform, gradients that matter
    return p


def _tokens(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    w = np.random.default_rng(seed).integers(0, CFG.vocab_size, CFG.seq_len + 1)
    return w[:-1], w[1:]


def test_gradients_match_finite_differences() -> None:
    model = bench.NumpyLlama(CFG, _params(), dtype=np.float64)
    tokens, targets = _tokens()
    model.grads(tokens, targets)
    analytic = {k: v.copy() for k, v in model.g.items()}
    rng = np.random.default_rng(3)
    h = 1e-5
    for name, w in model.w.items():
        for _ in range(3):
            idx = tuple(int(rng.integers(0, n)) for n in w.shape)
            if name == "embed":  # a row that is read: an input token's
                idx = (int(tokens[rng.integers(0, len(tokens))]), idx[1])
            keep = w[idx]
            w[idx] = keep + h
            up = model.grads(tokens, targets)
            w[idx] = keep - h
            down = model.grads(tokens, targets)
            w[idx] = keep
            numeric = (up - down) / (2 * h)
            assert analytic[name][idx] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (name, idx)


def test_float32_gradients_match_float64() -> None:
    tokens, targets = _tokens(1)
    m64 = bench.NumpyLlama(CFG, _params(1), dtype=np.float64)
    m32 = bench.NumpyLlama(CFG, _params(1))
    assert m32.grads(tokens, targets) == pytest.approx(m64.grads(tokens, targets), rel=1e-5)
    for name, g in m64.g.items():
        np.testing.assert_allclose(
            m32.g[name], g, rtol=2e-3, atol=2e-4 * float(np.abs(g).max()), err_msg=name
        )


def test_matches_the_float64_oracle() -> None:
    """Loss and every gradient against the project's independent float64 llama2.c oracle."""
    from tests.llama_reference import loss_and_grads

    params, (tokens, targets) = _params(2), _tokens(2)
    ref_loss, ref = loss_and_grads(params, tokens, targets)
    for dtype, rtol in ((np.float64, 1e-9), (np.float32, 2e-3)):
        model = bench.NumpyLlama(CFG, params, dtype=dtype)
        assert model.grads(tokens, targets) == pytest.approx(ref_loss, rel=rtol)
        for name, g in ref.tensors():
            scale = float(np.abs(g).max())
            np.testing.assert_allclose(
                model.g[name], g, rtol=rtol, atol=rtol * scale, err_msg=f"{name} {dtype}"
            )


@pytest.mark.parametrize("fused", [True, False])
def test_adamw_matches_float64_adamw(fused: bool) -> None:
    model = bench.NumpyLlama(CFG, _params(4))
    if not fused:
        model._tmp = np.empty_like(model.flat)
    tokens, targets = _tokens(4)
    w0 = {k: v.astype(np.float64) for k, v in model.w.items()}
    m = {k: np.zeros_like(v) for k, v in w0.items()}
    v_ = {k: np.zeros_like(v) for k, v in w0.items()}
    lr, b1, b2, wd, clip = 1e-3, 0.9, 0.95, 0.1, 0.5
    update = bench.ADAMW if fused else bench._adamw_numpy
    before = bench.ADAMW
    bench.ADAMW = update
    try:
        for t in (1, 2):
            model.grads(tokens, targets)
            g = {k: a.astype(np.float64) for k, a in model.g.items()}
            norm = math.sqrt(sum(float((a * a).sum()) for a in g.values()))
            assert norm > clip  # the clip is exercised
            s = min(1.0, clip / (norm + 1e-6))
            model.adamw(lr, b1, b2, wd, clip)
            for k in w0:
                gk = g[k] * s
                m[k] = b1 * m[k] + (1 - b1) * gk
                v_[k] = b2 * v_[k] + (1 - b2) * gk * gk
                if w0[k].ndim == 2:
                    w0[k] *= 1 - lr * wd
                w0[k] -= lr * (m[k] / (1 - b1**t)) / (np.sqrt(v_[k] / (1 - b2**t)) + 1e-8)
                np.testing.assert_allclose(model.w[k], w0[k], rtol=1e-5, atol=1e-6, err_msg=f"{k} step {t}")
    finally:
        bench.ADAMW = before
