"""A whole training step of Hugging Face attention variants (Qwen 2 biases, Qwen 3 q / k norm and head
size, Llama 3 rope scaling), both weight modes, against float64 finite differences of a model written
here and the CPU forward's loss."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import ModelConfig
from anekit.kernels.config import RopeScaling
from anekit.llama import Params, cpu_ops
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.sample import forward_logits
from anekit.llama.step import Timer, train_step, unscale

BASE = ModelConfig(32, 48, 2, 4, 2, 64, 32)  # seq 32: a surface row needs 64 bytes
CONFIGS = {
    "qwen3-like": BASE.with_(attn_head_dim=16, qkv_bias=True, qk_norm=True),  # q_dim 64 != dim 32
    "bias": BASE.with_(qkv_bias=True),
    "qk-norm": BASE.with_(qk_norm=True),
    "head-dim": BASE.with_(attn_head_dim=16),
    "rope-scaling": BASE.with_(rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8)),
}


def _params(cfg: ModelConfig, seed: int) -> Params:
    """Weights large enough that every gradient is well above fp16 noise, rounded to fp16 values."""
    p = Params.init(cfg, seed=seed, tied=False)
    rng = np.random.default_rng(seed + 1)
    for name, a in p.tensors():
        if a.ndim == 2:
            a[...] = rng.standard_normal(a.shape) / np.sqrt(a.shape[1])
        elif name.split(".")[-1] in ("bq", "bk", "bv"):
            a[...] = 0.5 * rng.standard_normal(a.shape)
        else:
            a[...] = 1 + 0.2 * rng.standard_normal(a.shape)
        a[...] = a.astype(np.float16).astype(np.float32)
    return p


# -- the float64 model -------------------------------------------------------------------------------


def _norm(x: np.ndarray, w: np.ndarray, eps: float, width: int) -> np.ndarray:
    """RMSNorm over groups of ``width`` channels of x (C, T), scaled by w (width,)."""
    c, t = x.shape
    g = x.reshape(c // width, width, t)
    return (g / np.sqrt(np.mean(g * g, axis=1, keepdims=True) + eps) * w[None, :, None]).reshape(c, t)


def _rope(x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Each head's pairs (2j, 2j + 1) of x (C, T) turned by pos * freq_j, as complex numbers."""
    c, t = x.shape
    hd = cfg.head_dim
    turn = np.exp(1j * cfg.rope_frequencies()[:, None] * np.arange(t)[None, :])  # (hd/2, T)
    z = x.reshape(c // hd, hd // 2, 2, t)
    r = (z[:, :, 0] + 1j * z[:, :, 1]) * turn  # (heads, hd/2, T)
    return np.stack([r.real, r.imag], axis=2).reshape(c, t)


def _loss(cfg: ModelConfig, w: dict[str, np.ndarray], tokens: np.ndarray, targets: np.ndarray) -> float:
    """Mean cross-entropy of the float64 model with the named weights ``w`` (Params.tensors() names)."""
    eps, hd, t = cfg.norm_eps, cfg.head_dim, tokens.shape[0]
    x = w["embed"][tokens].T  # (dim, T)
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg.n_layers):
        lw = {k.split(".")[-1]: v for k, v in w.items() if k.startswith(f"layers.{i}.")}
        xn = _norm(x, lw["rms_att"], eps, cfg.dim)
        q, k, v = lw["wq"] @ xn, lw["wk"] @ xn, lw["wv"] @ xn
        if cfg.qkv_bias:
            q, k, v = q + lw["bq"][:, None], k + lw["bk"][:, None], v + lw["bv"][:, None]
        if cfg.qk_norm:
            q, k = _norm(q, lw["q_norm"], eps, hd), _norm(k, lw["k_norm"], eps, hd)
        if cfg.rope:
            q, k = _rope(q, cfg), _rope(k, cfg)
        qh = q.reshape(cfg.n_heads, hd, t)
        kh = np.repeat(k.reshape(cfg.n_kv_heads, hd, t), cfg.kv_group, axis=0)  # (H, hd, T)
        vh = np.repeat(v.reshape(cfg.n_kv_heads, hd, t), cfg.kv_group, axis=0)
        s = np.where(causal, np.einsum("hdi,hdj->hij", qh, kh) / np.sqrt(hd), -np.inf)  # (H, T, T)
        p = np.exp(s - s.max(axis=2, keepdims=True))
        p /= p.sum(axis=2, keepdims=True)
        x = x + lw["wo"] @ np.einsum("hij,hdj->hdi", p, vh).reshape(cfg.q_dim, t)
        xn = _norm(x, lw["rms_ffn"], eps, cfg.dim)
        a, b = lw["w1"] @ xn, lw["w3"] @ xn
        x = x + lw["w2"] @ (a / (1 + np.exp(-a)) * b)
    logits = w["wcls"] @ _norm(x, w["rms_final"], eps, cfg.dim)  # (vocab, T)
    z = logits - logits.max(axis=0, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(axis=0)) - z[targets, np.arange(t)]))


def _window(cfg: ModelConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
    w = np.random.default_rng(seed).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    return w[:-1], w[1:]


def _step(cfg: ModelConfig, params: Params, mode: str, tokens, targets) -> tuple[float, Params]:
    kernels = make_kernels(runtime.open("sim"), cfg, mode)
    kernels.compile(params, Timer())
    grads = params.zeros_like()
    scale = 256.0
    result = train_step(kernels, params, grads, tokens, targets, Timer(), loss_scale=scale)
    kernels.close()
    assert result.finite and not result.overflowed
    assert unscale(grads, 1.0 / scale)
    return result.loss, grads


@pytest.mark.parametrize("mode", ["baked", "dynamic"])
@pytest.mark.parametrize("name", CONFIGS)
def test_step_gradients_match_float64_finite_differences(name, mode):
    cfg = CONFIGS[name]
    params = _params(cfg, seed=7)
    tokens, targets = _window(cfg, seed=8)
    loss, grads = _step(cfg, params, mode, tokens, targets)
    w = {k: v.astype(np.float64) for k, v in params.tensors()}
    want_loss = _loss(cfg, w, tokens, targets)
    assert abs(loss - want_loss) < 5e-3 * want_loss
    got = dict(grads.tensors())
    assert set(got) == set(w)  # every parameter has its gradient: bq / bk / bv / q_norm / k_norm included
    rng = np.random.default_rng(9)
    h = 1e-4
    for key, g in got.items():
        g = g.astype(np.float64)
        # Along the step's own gradient g, and along g on a random half of its entries: the directional
        # derivative of the float64 loss must equal <g, u> (a wrong or missing component breaks either).
        for u in (g, g * (rng.random(g.shape) < 0.5)):
            u = u / np.linalg.norm(u)
            plus, minus = dict(w), dict(w)
            plus[key], minus[key] = w[key] + h * u, w[key] - h * u
            fd = (_loss(cfg, plus, tokens, targets) - _loss(cfg, minus, tokens, targets)) / (2 * h)
            an = float(np.sum(g * u))
            assert abs(fd - an) <= 3e-2 * np.linalg.norm(g), f"{key}: fd {fd:.4e}, step {an:.4e}"


@pytest.mark.parametrize("name", CONFIGS)
def test_step_loss_is_the_cpu_forwards_cross_entropy(name):
    cfg = CONFIGS[name]
    params = _params(cfg, seed=10)
    tokens, targets = _window(cfg, seed=11)
    loss, _ = _step(cfg, params, "dynamic", tokens, targets)
    want, _ = cpu_ops.cross_entropy(forward_logits(params, tokens), targets)
    assert abs(loss - want) < 5e-3 * want


def test_dynamic_mode_compiles_once_with_hf_attention():
    cfg = CONFIGS["qwen3-like"]
    params = _params(cfg, seed=12)
    backend = runtime.open("sim")
    kernels = make_kernels(backend, cfg, "dynamic")
    for _ in range(2):
        kernels.compile(params, Timer())
    assert backend.compile_count == 1 + 7
    tokens, targets = _window(cfg, seed=13)
    train_step(kernels, params, params.zeros_like(), tokens, targets, Timer())
    kernels.close()
