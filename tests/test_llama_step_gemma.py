"""A whole training step of a Gemma 3 model on the engine kernels (norms x * (1 + w), post-norms, GeGLU,
q / k norm, its attention scale, sliding-window layers with their own RoPE base beside full ones, scaled
embeddings with a tied classifier), both weight modes, against float64 finite differences of a Gemma 3
model written here from transformers' modeling_gemma3.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import ModelConfig
from anekit.llama import Params
from anekit.llama.kernel_sets import first_compiles, make_kernels
from anekit.llama.step import Timer, eval_loss, forward_layers, train_step
from tests.test_llama_step_hf import _step  # one step, its gradients unscaled

# Two layers, the first sliding (window 8 of 32 positions) with RoPE base 10^4, the second full with 10^6;
# q_dim 64 != dim 32; query_pre_attn_scalar 24 (not head_dim 16).
CFG = ModelConfig(
    32,
    48,
    2,
    4,
    2,
    64,
    32,
    norm_eps=1e-6,
    rope_theta=1e6,
    attn_head_dim=16,
    qk_norm=True,
    norm_offset=1.0,
    post_norms=True,
    mlp_act="gelu_tanh",
    embed_scale=math.sqrt(32),
    attn_scale=24**-0.5,
    sliding_window=8,
    layer_types=("sliding", "full"),
    rope_local_theta=1e4,
    name="gemma3-tiny",
)


def _params(cfg: ModelConfig, seed: int) -> Params:
    """Tied weights large enough that every gradient is well above fp16 noise, rounded to fp16 values;
    the norm weights w near 0 (the norms scale by 1 + w)."""
    p = Params.init(cfg, seed=seed, tied=True)
    rng = np.random.default_rng(seed + 1)
    for _, a in p.tensors():
        if a.ndim == 2:
            a[...] = rng.standard_normal(a.shape) / np.sqrt(a.shape[1])
        else:
            a[...] = 0.2 * rng.standard_normal(a.shape)
        a[...] = a.astype(np.float16).astype(np.float32)
    return p


# -- the float64 model -------------------------------------------------------------------------------


def _norm(x: np.ndarray, w: np.ndarray, eps: float, width: int) -> np.ndarray:
    """Gemma3RMSNorm over groups of ``width`` channels of x (C, T): x / rms(x) * (1 + w), w (width,)."""
    c, t = x.shape
    g = x.reshape(c // width, width, t)
    return (g / np.sqrt(np.mean(g * g, axis=1, keepdims=True) + eps) * (1.0 + w[None, :, None])).reshape(c, t)


def _rope(x: np.ndarray, hd: int, theta: float) -> np.ndarray:
    """Each head's pairs (2j, 2j + 1) of x (C, T) turned by pos * theta^(-2j / hd), as complex numbers."""
    c, t = x.shape
    freq = theta ** (-np.arange(0, hd, 2) / hd)  # (hd/2,)
    turn = np.exp(1j * freq[:, None] * np.arange(t)[None, :])  # (hd/2, T)
    z = x.reshape(c // hd, hd // 2, 2, t)
    r = (z[:, :, 0] + 1j * z[:, :, 1]) * turn  # (heads, hd/2, T)
    return np.stack([r.real, r.imag], axis=2).reshape(c, t)


def _gelu_tanh(a: np.ndarray) -> np.ndarray:
    return 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a**3)))


def _layers(w: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """The residual stream (dim, T) after every layer."""
    eps, hd, t, heads, kvh = 1e-6, 16, tokens.shape[0], 4, 2
    x = w["embed"][tokens].T * math.sqrt(32)  # (dim, T): embeddings times sqrt(hidden_size)
    i_pos, j_pos = np.arange(t)[:, None], np.arange(t)[None, :]
    for i, (window, theta) in enumerate([(8, 1e4), (0, 1e6)]):
        lw = {k.split(".")[-1]: v for k, v in w.items() if k.startswith(f"layers.{i}.")}
        visible = (j_pos <= i_pos) & ((j_pos > i_pos - window) if window else True)  # (T, T)
        xn = _norm(x, lw["rms_att"], eps, 32)
        q, k, v = lw["wq"] @ xn, lw["wk"] @ xn, lw["wv"] @ xn
        q, k = _norm(q, lw["q_norm"], eps, hd), _norm(k, lw["k_norm"], eps, hd)
        q, k = _rope(q, hd, theta), _rope(k, hd, theta)
        qh = q.reshape(heads, hd, t)
        kh = np.repeat(k.reshape(kvh, hd, t), heads // kvh, axis=0)  # (H, hd, T)
        vh = np.repeat(v.reshape(kvh, hd, t), heads // kvh, axis=0)
        s = np.where(visible, np.einsum("hdi,hdj->hij", qh, kh) * 24**-0.5, -np.inf)  # (H, T, T)
        p = np.exp(s - s.max(axis=2, keepdims=True))
        p /= p.sum(axis=2, keepdims=True)
        o = lw["wo"] @ np.einsum("hij,hdj->hdi", p, vh).reshape(heads * hd, t)  # (dim, T)
        x = x + _norm(o, lw["post_att_norm"], eps, 32)
        xn = _norm(x, lw["rms_ffn"], eps, 32)
        y = lw["w2"] @ (_gelu_tanh(lw["w1"] @ xn) * (lw["w3"] @ xn))
        x = x + _norm(y, lw["post_ffn_norm"], eps, 32)
    return x


def _loss(w: dict[str, np.ndarray], tokens: np.ndarray, targets: np.ndarray) -> float:
    """Mean cross-entropy of the float64 model; the tied classifier reads the embeddings unscaled."""
    logits = w["embed"] @ _norm(_layers(w, tokens), w["rms_final"], 1e-6, 32)  # (vocab, T)
    z = logits - logits.max(axis=0, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(axis=0)) - z[targets, np.arange(tokens.shape[0])]))


def _window(seed: int) -> tuple[np.ndarray, np.ndarray]:
    w = np.random.default_rng(seed).integers(0, CFG.vocab_size, CFG.seq_len + 1)
    return w[:-1], w[1:]


@pytest.mark.parametrize("mode", ["baked", "dynamic"])
def test_forward_matches_the_float64_layers(mode):
    params = _params(CFG, seed=3)
    tokens, _ = _window(seed=4)
    kernels = make_kernels(runtime.open("sim"), CFG, mode)
    kernels.compile(params, Timer())
    x, _ = forward_layers(kernels, params, tokens, Timer())
    kernels.close()
    want = _layers({k: v.astype(np.float64) for k, v in params.tensors()}, tokens)
    assert np.abs(x - want).max() < 2e-2 * np.abs(want).max()


@pytest.mark.parametrize("mode", ["baked", "dynamic"])
def test_step_gradients_match_float64_finite_differences(mode):
    params = _params(CFG, seed=7)
    tokens, targets = _window(seed=8)
    loss, grads = _step(CFG, params, mode, tokens, targets)
    w = {k: v.astype(np.float64) for k, v in params.tensors()}
    want_loss = _loss(w, tokens, targets)
    assert abs(loss - want_loss) < 5e-3 * want_loss
    got = dict(grads.tensors())
    assert set(got) == set(w) and "layers.0.post_ffn_norm" in got  # the post-norms have gradients too
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
            fd = (_loss(plus, tokens, targets) - _loss(minus, tokens, targets)) / (2 * h)
            an = float(np.sum(g * u))
            assert abs(fd - an) <= 3e-2 * np.linalg.norm(g), f"{key}: fd {fd:.4e}, step {an:.4e}"


def test_dynamic_mode_compiles_each_kinds_attention_once():
    params = _params(CFG, seed=12)
    backend = runtime.open("sim")
    kernels = make_kernels(backend, CFG, "dynamic")
    for _ in range(2):
        kernels.compile(params, Timer())
    # one SDPA backward 2 per kind; the five shared kernels; SDPA forward and backward 1 per kind
    assert backend.compile_count == first_compiles(CFG, "dynamic") == 2 + 5 + 2 * 2
    tokens, targets = _window(seed=13)
    train_step(kernels, params, params.zeros_like(), tokens, targets, Timer())
    kernels.close()


def test_baked_mode_compiles_each_kinds_sdpa_backward_2_once_and_every_layer_per_batch():
    params = _params(CFG, seed=14)
    backend = runtime.open("sim")
    kernels = make_kernels(backend, CFG, "baked")
    kernels.compile(params, Timer())
    assert backend.compile_count == first_compiles(CFG, "baked") == 2 + 5 * CFG.n_layers
    kernels.close()


def test_validation_loss_is_the_float64_models():
    params = _params(CFG, seed=15)
    tokens, targets = _window(seed=16)
    kernels = make_kernels(runtime.open("sim"), CFG, "dynamic")
    kernels.compile(params, Timer())
    total, count = eval_loss(kernels, params, tokens, targets, None, Timer())
    kernels.close()
    want = _loss({k: v.astype(np.float64) for k, v in params.tensors()}, tokens, targets)
    assert count == CFG.seq_len and abs(total / count - want) < 5e-3 * want
