"""Forward kernels of one transformer layer and of the head (final norm, classifier, softmax).

Weights are given as llama2.c lays them out: matrices (out, in) — wq (dim, dim), wk / wv (kv_dim, dim),
wo (dim, dim), w1 / w3 (hidden, dim), w2 (dim, hidden) — and vectors rms_att / rms_ffn / rms_final
(dim,), embed (vocab, dim). ``weights=None`` generates the program from shapes only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.config import ModelConfig
from anekit.kernels.spec import KernelSpec, Layout

Weights = Mapping[str, np.ndarray] | None


def sdpa_fwd_layout(cfg: ModelConfig) -> Layout:
    """Taps of the SDPA forward kernel, in order."""
    d, kv = cfg.dim, cfg.kv_dim
    return Layout.of(
        [("o_out", d), ("q", d), ("k", kv), ("v", kv), ("attn_out", d), ("xnorm", d)], cfg.seq_len
    )


def sdpa_fwd(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """RMSNorm, Q/K/V projections, RoPE (when enabled), causal attention, Wo.

    Input x: [1, dim, 1, S]. Output taps: o_out (Wo @ attention), q and k (after RoPE), v, attn_out
    (attention before Wo), xnorm (the normalised input).
    """
    kb = KernelBuilder("sdpa_fwd", cfg, Layout.of([("x", cfg.dim)], cfg.seq_len), weights)
    d, kv = cfg.dim, cfg.kv_dim
    x = kb.part("x")  # (1, dim, 1, S)
    xn = kb.rmsnorm(x, kb.vector("rms_att", "rms_att", d), "att_norm")
    q = kb.conv(xn, kb.matrix("wq", "wq", d, d), "q")  # (1, dim, 1, S)
    k = kb.conv(xn, kb.matrix("wk", "wk", kv, d), "k")  # (1, kv_dim, 1, S)
    v = kb.conv(xn, kb.matrix("wv", "wv", kv, d), "v")
    if cfg.rope:
        q = kb.rope(q, d, "q_rope")
        k = kb.rope(k, kv, "k_rope")
    probs = kb.attention_probs(kb.heads(q, cfg.n_heads, "qh"), kb.heads(k, cfg.n_kv_heads, "kh"), "att")
    att = kb.merge_heads(kb.attend(probs, kb.heads(v, cfg.n_kv_heads, "vh"), "att"), cfg.n_heads, "att")
    o = kb.conv(att, kb.matrix("wo", "wo", d, d), "o")
    return kb.finish(sdpa_fwd_layout(cfg), {"o_out": o, "q": q, "k": k, "v": v, "attn_out": att, "xnorm": xn})
