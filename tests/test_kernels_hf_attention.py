"""The attention kernels with Hugging Face's variants (Qwen 2 biases, Qwen 3 q / k norm and head size,
Llama 3 rope scaling) against a float64 model written here, in the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import ModelConfig, attention_bwd, dynamic, forward
from anekit.kernels.config import RopeScaling
from anekit.llama import cpu_ops
from tests.kernel_weights import fp16_exact
from tests.test_llama_step_hf import BASE
from tests.test_llama_step_hf import CONFIGS as STEP_CONFIGS

# The step tests' configs (seq 32: a surface row needs 64 bytes), and shapes only the kernels are run at.
CONFIGS = {
    **STEP_CONFIGS,
    "head-dim-narrow": BASE.with_(attn_head_dim=4, qk_norm=True),  # q_dim 16 < dim 32
    "rope-scaling-bias": BASE.with_(rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8), qkv_bias=True),
    "mqa-norm-norope": BASE.with_(n_kv_heads=1, qk_norm=True, rope=False, attn_head_dim=12),
}


# -- the float64 model ---------------------------------------------------------------------------------


def _weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """One layer's weights, O(1) activations, rounded to fp16 values."""
    rng = np.random.default_rng(seed)
    d, q, kv, hd = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.head_dim

    def mat(o: int, i: int) -> np.ndarray:
        return fp16_exact(rng.standard_normal((o, i)) / np.sqrt(i))

    w = {"rms_att": fp16_exact(1 + 0.1 * rng.standard_normal(d))}
    w.update(wq=mat(q, d), wk=mat(kv, d), wv=mat(kv, d), wo=mat(d, q))
    if cfg.qkv_bias:
        w.update(
            {b: fp16_exact(0.5 * rng.standard_normal(n)) for b, n in (("bq", q), ("bk", kv), ("bv", kv))}
        )
    if cfg.qk_norm:
        w.update({n: fp16_exact(1 + 0.3 * rng.standard_normal(hd)) for n in ("q_norm", "k_norm")})
    return w


def _rope(x: np.ndarray, cfg: ModelConfig, inverse: bool = False) -> np.ndarray:
    """Each head's pairs (2j, 2j + 1) of x (C, S) turned by pos * freq_j as complex numbers."""
    c, s = x.shape
    hd = cfg.head_dim
    freq = cfg.rope_frequencies()  # (hd/2,), float64, Llama 3's scaling applied
    turn = np.exp((-1j if inverse else 1j) * freq[:, None] * np.arange(s)[None, :])  # (hd/2, S)
    z = x.reshape(c // hd, hd // 2, 2, s)  # (heads, hd/2, 2, S)
    r = (z[:, :, 0] + 1j * z[:, :, 1]) * turn  # (heads, hd/2, S)
    return np.stack([r.real, r.imag], axis=2).reshape(c, s)


def _norm(x: np.ndarray, w: np.ndarray, eps: float, width: int) -> np.ndarray:
    """RMSNorm over groups of ``width`` channels of x (C, S), scaled by w (width,)."""
    c, s = x.shape
    g = x.reshape(c // width, width, s)
    return (g / np.sqrt(np.mean(g * g, axis=1, keepdims=True) + eps) * w[None, :, None]).reshape(c, s)


def _kv_per_query_head(a: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """kv heads (kv_dim, S) -> (n_heads, hd, S): query head h reads kv head h // kv_group."""
    return np.repeat(a.reshape(cfg.n_kv_heads, cfg.head_dim, -1), cfg.kv_group, axis=0)


def _probs(q: np.ndarray, k: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Causal softmax probabilities (H, S query, S key)."""
    s, hd = q.shape[1], cfg.head_dim
    qh, kh = q.reshape(cfg.n_heads, hd, s), _kv_per_query_head(k, cfg)
    scores = np.einsum("hdi,hdj->hij", qh, kh) / np.sqrt(hd)  # (H, S, S)
    scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(axis=2, keepdims=True))
    return e / e.sum(axis=2, keepdims=True)


def _sdpa_fwd(cfg: ModelConfig, x: np.ndarray, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    xn = _norm(x, w["rms_att"], cfg.norm_eps, cfg.dim)
    q, k, v = w["wq"] @ xn, w["wk"] @ xn, w["wv"] @ xn
    if cfg.qkv_bias:
        q, k, v = q + w["bq"][:, None], k + w["bk"][:, None], v + w["bv"][:, None]
    out = {"q_pre": q, "k_pre": k} if cfg.qk_norm else {}
    if cfg.qk_norm:
        q, k = (
            _norm(q, w["q_norm"], cfg.norm_eps, cfg.head_dim),
            _norm(k, w["k_norm"], cfg.norm_eps, cfg.head_dim),
        )
    if cfg.rope:
        q, k = _rope(q, cfg), _rope(k, cfg)
    p = _probs(q, k, cfg)
    att = np.einsum("hij,hdj->hdi", p, _kv_per_query_head(v, cfg)).reshape(cfg.q_dim, -1)
    return {"o_out": w["wo"] @ att, "q": q, "k": k, "v": v, "attn_out": att, "xnorm": xn, **out}


def _sdpa_bwd(cfg: ModelConfig, q, k, v, do, wo) -> dict[str, np.ndarray]:
    """dv, probs, dp (flattened (H*S, S)), and dq / dk before RoPE, from the post-RoPE q, k."""
    s, hd, n = q.shape[1], cfg.head_dim, cfg.n_heads
    p = _probs(q, k, cfg)  # (H, S, S)
    da = (wo.T @ do).reshape(n, hd, s)  # (H, hd, S)
    dp = np.einsum("hdi,hdj->hij", da, _kv_per_query_head(v, cfg))  # (H, S, S)
    dv = np.einsum("hij,hdi->hdj", p, da).reshape(cfg.n_kv_heads, cfg.kv_group, hd, s).sum(axis=1)
    ds = p * (dp - np.sum(p * dp, axis=2, keepdims=True)) / np.sqrt(hd)  # (H, S, S)
    dq = np.einsum("hij,hdj->hdi", ds, _kv_per_query_head(k, cfg)).reshape(cfg.q_dim, s)
    dk = np.einsum("hij,hdi->hdj", ds, q.reshape(n, hd, s))  # (H, hd, S)
    dk = dk.reshape(cfg.n_kv_heads, cfg.kv_group, hd, s).sum(axis=1).reshape(cfg.kv_dim, s)
    if cfg.rope:
        dq, dk = _rope(dq, cfg, inverse=True), _rope(dk, cfg, inverse=True)
    flat = (n * s, s)
    return {
        "dv": dv.reshape(cfg.kv_dim, s),
        "probs": p.reshape(flat),
        "dp": dp.reshape(flat),
        "dq": dq,
        "dk": dk,
    }


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _inputs(cfg: ModelConfig, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    return _weights(cfg, seed), fp16_exact(
        np.random.default_rng(seed + 1).standard_normal((cfg.dim, cfg.seq_len))
    )


# -- the forward -----------------------------------------------------------------------------------------


def test_these_configs_are_kernel_configs_and_the_taps_keep_their_order():
    for cfg in CONFIGS.values():
        assert cfg.check_kernels() is cfg
    cfg = CONFIGS["qwen3-like"]
    assert forward.sdpa_fwd_layout(cfg).parts == (
        ("o_out", 32), ("q", 64), ("k", 32), ("v", 32), ("attn_out", 64), ("xnorm", 32),
        ("q_pre", 64), ("k_pre", 32),
    )  # fmt: skip
    assert forward.sdpa_fwd_layout(CONFIGS["bias"]).names == ["o_out", "q", "k", "v", "attn_out", "xnorm"]


@pytest.mark.parametrize("mode", ["baked", "dynamic"])
@pytest.mark.parametrize("name", CONFIGS)
def test_sdpa_fwd_matches_float64(name, mode):
    cfg = CONFIGS[name]
    w, x = _inputs(cfg, seed=1)
    if mode == "baked":
        got = forward.sdpa_fwd(cfg, w).run(runtime.open("sim"), x=x)
    else:
        got = dynamic.sdpa_fwd_dynamic(cfg).run(runtime.open("sim"), w, x=x)
    want = _sdpa_fwd(cfg, x, w)
    assert list(got) == forward.sdpa_fwd_layout(cfg).names
    assert set(got) == set(want)
    for tap in want:
        assert got[tap].shape == want[tap].shape, tap
        assert _rel(got[tap], want[tap]) < 1e-2, (tap, _rel(got[tap], want[tap]))


def test_rope_scaling_changes_what_the_kernel_computes():
    cfg = CONFIGS["rope-scaling"]
    w, x = _inputs(cfg, seed=2)
    got = forward.sdpa_fwd(cfg, w).run(runtime.open("sim"), x=x)["q"]
    plain = _sdpa_fwd(cfg.with_(rope_scaling=None), x, w)["q"]
    assert _rel(got, plain) > 0.05  # the low frequencies really are scaled (seq 32 > 8 / 1.0 positions)


# -- the backward ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_backward_kernels_match_float64(name):
    cfg = CONFIGS[name]
    w, x = _inputs(cfg, seed=3)
    taps = {k: fp16_exact(v) for k, v in _sdpa_fwd(cfg, x, w).items()}
    do = fp16_exact(np.random.default_rng(4).standard_normal((cfg.dim, cfg.seq_len)))
    want = _sdpa_bwd(cfg, taps["q"], taps["k"], taps["v"], do, w["wo"])
    sim = runtime.open("sim")
    b1 = attention_bwd.sdpa_bwd1(cfg, w).run(sim, q=taps["q"], k=taps["k"], v=taps["v"], do=do)
    for part in ("dv", "probs", "dp"):
        assert _rel(b1[part], want[part]) < 1e-2, part
    da = fp16_exact(w["wo"].T @ do)  # the dynamic pipeline's form: da given, no Wo baked
    b1da = attention_bwd.sdpa_bwd1(cfg, da_input=True).run(sim, q=taps["q"], k=taps["k"], v=taps["v"], da=da)
    for part in ("dv", "probs", "dp"):
        assert _rel(b1da[part], want[part]) < 1e-2, part
    probs, dp = fp16_exact(want["probs"]), fp16_exact(want["dp"])
    b2 = attention_bwd.sdpa_bwd2(cfg).run(sim, probs=probs, dp=dp, q=taps["q"], k=taps["k"])
    for part in ("dq", "dk"):
        assert _rel(b2[part], want[part]) < 1e-2, part
    dq, dk, dv = (fp16_exact(want[p]) for p in ("dq", "dk", "dv"))
    dx = w["wq"].T @ dq + w["wk"].T @ dk + w["wv"].T @ dv  # (dim, S)
    assert _rel(attention_bwd.qkv_bwd(cfg, w).run(sim, dq=dq, dk=dk, dv=dv)["dx"], dx) < 1e-2
    assert _rel(dynamic.qkv_bwd_dynamic(cfg).run(sim, w, dq=dq, dk=dk, dv=dv)["dx"], dx) < 1e-2


def test_head_rmsnorm_bwd_matches_finite_differences():
    cfg = CONFIGS["qwen3-like"]
    rng = np.random.default_rng(5)
    hd, eps = cfg.head_dim, 1e-2  # a large epsilon: its term in the gradient is checked too
    x = rng.standard_normal((cfg.q_dim, 6)) * np.array([1e-2, 0.1, 1, 3, 10, 0.3])
    w, dy = 1 + 0.3 * rng.standard_normal(hd), rng.standard_normal(x.shape)
    dx, dw = cpu_ops.head_rmsnorm_bwd(
        dy.astype(np.float32), x.astype(np.float32), w.astype(np.float32), eps, hd
    )
    assert dx.dtype == np.float32 and dw.shape == (hd,)

    def loss(xx: np.ndarray, ww: np.ndarray) -> float:
        return float(np.sum(dy * _norm(xx, ww, eps, hd)))

    h = 1e-6
    for _ in range(4):
        u, uw = rng.standard_normal(x.shape), rng.standard_normal(hd)
        fd = (loss(x + h * u, w) - loss(x - h * u, w)) / (2 * h)
        assert abs(fd - np.sum(dx * u)) <= 1e-4 * np.linalg.norm(dx) * np.linalg.norm(u)
        fd = (loss(x, w + h * uw) - loss(x, w - h * uw)) / (2 * h)
        assert abs(fd - np.sum(dw * uw)) <= 1e-4 * np.linalg.norm(dw) * np.linalg.norm(uw)
