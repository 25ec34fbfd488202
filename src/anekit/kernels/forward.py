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


def ffn_fwd_layout(cfg: ModelConfig) -> Layout:
    """Taps of the FFN forward kernel, in order."""
    d, h = cfg.dim, cfg.hidden_dim
    return Layout.of([("ffn_out", d), ("h1", h), ("h3", h), ("silu_out", h), ("x2norm", d)], cfg.seq_len)


def ffn_fwd(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """RMSNorm (rms_ffn), W1 and W3 projections, SiLU gate, W2.

    Input x: [1, dim, 1, S], the residual stream after attention. Output taps: ffn_out (W2 output),
    h1 (W1 output), h3 (W3 output), silu_out (silu(h1) * h3, the W2 input), x2norm (the normalised
    input).
    """
    kb = KernelBuilder("ffn_fwd", cfg, Layout.of([("x", cfg.dim)], cfg.seq_len), weights)
    d, h = cfg.dim, cfg.hidden_dim
    x = kb.part("x")  # (1, dim, 1, S)
    xn = kb.rmsnorm(x, kb.vector("rms_ffn", "rms_ffn", d), "ffn_norm")  # (1, dim, 1, S)
    h1 = kb.conv(xn, kb.matrix("w1", "w1", h, d), "h1")  # (1, hidden, 1, S)
    h3 = kb.conv(xn, kb.matrix("w3", "w3", h, d), "h3")  # (1, hidden, 1, S)
    sig = kb.f.sigmoid(x=h1, name="h1_sigmoid")  # (1, hidden, 1, S)
    silu = kb.f.mul(x=h1, y=sig, name="h1_silu")  # (1, hidden, 1, S)
    gate = kb.f.mul(x=silu, y=h3, name="gate")  # (1, hidden, 1, S)
    y = kb.conv(gate, kb.matrix("w2", "w2", d, h), "ffn")  # (1, dim, 1, S)
    return kb.finish(ffn_fwd_layout(cfg), {"ffn_out": y, "h1": h1, "h3": h3, "silu_out": gate, "x2norm": xn})


def final_rmsnorm(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """The final RMSNorm before the classifier (scale rms_final).

    Input x: [1, dim, 1, S], the last layer's residual stream. Output: xnorm [1, dim, 1, S].
    """
    layout = Layout.of([("x", cfg.dim)], cfg.seq_len)
    kb = KernelBuilder("final_rmsnorm", cfg, layout, weights)
    x = kb.part("x")  # (1, dim, 1, S)
    xn = kb.rmsnorm(x, kb.vector("rms_final", "rms_final", cfg.dim), "final_norm")  # (1, dim, 1, S)
    return kb.finish(Layout.of([("xnorm", cfg.dim)], cfg.seq_len), {"xnorm": xn})


def classifier_fwd(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """Logits of the tied classifier: one 1x1 conv with the embedding [vocab, dim, 1, 1] as weight.

    Input x: [1, dim, 1, S] (the final RMSNorm's output). Output: logits [1, vocab, 1, S].
    """
    kb = KernelBuilder("classifier_fwd", cfg, Layout.of([("x", cfg.dim)], cfg.seq_len), weights)
    x = kb.part("x")  # (1, dim, 1, S)
    logits = kb.conv(x, kb.matrix("embed", "embed", cfg.vocab_size, cfg.dim), "logits")  # (1, vocab, 1, S)
    return kb.finish(Layout.of([("logits", cfg.vocab_size)], cfg.seq_len), {"logits": logits})


def softmax_vocab(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """Softmax over the vocabulary (channels) of each position; no weights (``weights`` is ignored).

    Input logits: [1, vocab, 1, S]. Output: probs [1, vocab, 1, S].
    """
    layout = Layout.of([("logits", cfg.vocab_size)], cfg.seq_len)
    kb = KernelBuilder("softmax_vocab", cfg, layout, weights)
    logits = kb.part("logits")  # (1, vocab, 1, S)
    probs = kb.f.softmax(x=logits, axis=1, name="probs")  # (1, vocab, 1, S)
    return kb.finish(Layout.of([("probs", cfg.vocab_size)], cfg.seq_len), {"probs": probs})
