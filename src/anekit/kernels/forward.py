"""Forward kernels of one transformer layer and of the head (final norm, classifier, softmax).

Weights are given as llama2.c lays them out: matrices (out, in) — wq (q_dim, dim), wk / wv (kv_dim,
dim), wo (dim, q_dim) (q_dim = n_heads x head_dim, = dim for llama2.c models), w1 / w3 (hidden, dim),
w2 (dim, hidden) — and vectors rms_att / rms_ffn / rms_final (dim,), embed (vocab, dim); Hugging Face
models add bq (q_dim,), bk / bv (kv_dim,) and q_norm / k_norm (head_dim,) where their config says so,
Gemma 3 post_att_norm / post_ffn_norm (dim,). ``weights=None`` generates the program from shapes only.

The layer's two forward kernels are written once, ``sdpa_forward`` and ``ffn_forward``, over a weight
source (``anekit.kernels.source``): ``sdpa_fwd`` / ``ffn_fwd`` give them baked weights, and
``dynamic.sdpa_fwd_dynamic`` / ``ffn_fwd_dynamic`` weights packed into the input.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.config import ModelConfig
from anekit.kernels.source import Baked, WeightSource
from anekit.kernels.spec import KernelSpec, Layout

Weights = Mapping[str, np.ndarray] | None


def sdpa_fwd_layout(cfg: ModelConfig) -> Layout:
    """Taps of the SDPA forward kernel, in order: o_out (dim), q (q_dim), k, v (kv_dim), attn_out (q_dim),
    xnorm (dim), then, with a q / k norm only, q_pre (q_dim) and k_pre (kv_dim), and with post-norms only
    o_pre (dim). New taps go at the end, so the offsets of the others never move."""
    d, q, kv = cfg.dim, cfg.q_dim, cfg.kv_dim
    taps = [("o_out", d), ("q", q), ("k", kv), ("v", kv), ("attn_out", q), ("xnorm", d)]
    if cfg.qk_norm:
        taps += [("q_pre", q), ("k_pre", kv)]
    if cfg.post_norms:
        taps += [("o_pre", d)]
    return Layout.of(taps, cfg.seq_len)


def sdpa_fwd(cfg: ModelConfig, weights: Weights = None, *, kind: str = "full") -> KernelSpec:
    """RMSNorm, Q/K/V projections (plus biases), the per-head q / k RMSNorm, RoPE (when enabled), causal
    attention, Wo, and the post-attention RMSNorm (Gemma 3).

    Weights: rms_att (dim,), wq (q_dim, dim), wk / wv (kv_dim, dim), wo (dim, q_dim); with
    ``cfg.qkv_bias`` also bq (q_dim,), bk / bv (kv_dim,), added after the projections; with
    ``cfg.qk_norm`` also q_norm / k_norm (head_dim,), the scales of Qwen 3's per-head RMSNorm of q and
    k (epsilon cfg.norm_eps), applied before RoPE. Input x: [1, dim, 1, S]. Output taps
    (``sdpa_fwd_layout``): o_out (Wo @ attention), q and k (after the norm and RoPE), v, attn_out
    (attention before Wo), xnorm (the normalised input); with a q / k norm also q_pre and k_pre, the
    projections (biases included) before the norm, which the host needs for the norm's backward.

    Gemma 3 (``cfg.post_norms``): o_out is Wo @ attention RMS-normalised by post_att_norm (dim,), the value
    the residual adds, and the tap o_pre holds Wo @ attention before that norm (the host's backward of
    it). Every norm scale is ``cfg.norm_offset`` + its weight (``KernelBuilder.norm_scale``); ``kind``
    "sliding" bands the mask to ``cfg.sliding_window`` and takes the sliding layers' RoPE tables.
    """
    kb = KernelBuilder("sdpa_fwd", cfg, Layout.of([("x", cfg.dim)], cfg.seq_len), weights, kind)
    return sdpa_forward(cfg, Baked(kb))


def sdpa_forward(cfg: ModelConfig, src: WeightSource) -> KernelSpec:
    """The SDPA forward kernel written once, its weights from ``src`` (baked: ``sdpa_fwd``; packed:
    ``dynamic.sdpa_fwd_dynamic``)."""
    kb = src.kb
    d, qd, kv = cfg.dim, cfg.q_dim, cfg.kv_dim
    x = src.act("x")  # (1, dim, 1, S)
    xn = kb.rmsnorm(x, src.scale("rms_att", d), "att_norm")  # (1, dim, 1, S)
    rows = src.shared_rows(xn)  # the products of xn share its transpose when packed
    q = src.linear(xn, "wq", "q", rows)  # (1, q_dim, 1, S)
    k = src.linear(xn, "wk", "k", rows)  # (1, kv_dim, 1, S)
    v = src.linear(xn, "wv", "v", rows)  # (1, kv_dim, 1, S)
    if cfg.qkv_bias:  # Qwen 2
        q = kb.f.add(x=q, y=src.bias("bq", qd), name="q_bias")  # (1, q_dim, 1, S)
        k = kb.f.add(x=k, y=src.bias("bk", kv), name="k_bias")  # (1, kv_dim, 1, S)
        v = kb.f.add(x=v, y=src.bias("bv", kv), name="v_bias")  # (1, kv_dim, 1, S)
    taps = {}
    if cfg.qk_norm:  # Qwen 3: each head of q and k RMS-normalised before RoPE
        taps = {"q_pre": q, "k_pre": k}
        q = kb.head_rmsnorm(q, cfg.n_heads, src.head_scale("q_norm", cfg.n_heads), "qn")  # (1, q_dim, 1, S)
        k = kb.head_rmsnorm(
            k, cfg.n_kv_heads, src.head_scale("k_norm", cfg.n_kv_heads), "kn"
        )  # (1, kv, 1, S)
    if cfg.rope:
        q = kb.rope(q, qd, "q_rope")  # (1, q_dim, 1, S)
        k = kb.rope(k, kv, "k_rope")  # (1, kv_dim, 1, S)
    probs = kb.attention_probs(kb.heads(q, cfg.n_heads, "qh"), kb.heads(k, cfg.n_kv_heads, "kh"), "att")
    att = kb.merge_heads(kb.attend(probs, kb.heads(v, cfg.n_kv_heads, "vh"), "att"), cfg.n_heads, "att")
    o = src.linear(att, "wo", "o")  # (1, dim, 1, S); att (1, q_dim, 1, S)
    if cfg.post_norms:  # Gemma 3: the block's output normalised before the residual add
        taps["o_pre"] = o
        o = kb.rmsnorm(o, src.scale("post_att_norm", d), "post_att_norm")  # (1, dim, 1, S)
    taps.update({"o_out": o, "q": q, "k": k, "v": v, "attn_out": att, "xnorm": xn})
    return src.finish(sdpa_fwd_layout(cfg), taps)


def ffn_fwd_layout(cfg: ModelConfig) -> Layout:
    """Taps of the FFN forward kernel, in order (with post-norms, ffn_pre (dim) last)."""
    d, h = cfg.dim, cfg.hidden_dim
    taps = [("ffn_out", d), ("h1", h), ("h3", h), ("silu_out", h), ("x2norm", d)]
    if cfg.post_norms:
        taps += [("ffn_pre", d)]
    return Layout.of(taps, cfg.seq_len)


def ffn_fwd(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """RMSNorm (rms_ffn), W1 and W3 projections, the gate (SwiGLU, or Gemma's GeGLU), W2, and the
    post-FFN RMSNorm (Gemma 3).

    Input x: [1, dim, 1, S], the residual stream after attention. Output taps: ffn_out (W2 output),
    h1 (W1 output), h3 (W3 output), silu_out (act(h1) * h3, the W2 input, whatever ``cfg.mlp_act``),
    x2norm (the normalised input). With ``cfg.post_norms`` ffn_out is the W2 output RMS-normalised by
    post_ffn_norm and the tap ffn_pre holds the W2 output itself.
    """
    kb = KernelBuilder("ffn_fwd", cfg, Layout.of([("x", cfg.dim)], cfg.seq_len), weights)
    return ffn_forward(cfg, Baked(kb))


def ffn_forward(cfg: ModelConfig, src: WeightSource) -> KernelSpec:
    """The FFN forward kernel written once, its weights from ``src`` (baked: ``ffn_fwd``; packed:
    ``dynamic.ffn_fwd_dynamic``)."""
    kb, d = src.kb, cfg.dim
    x = src.act("x")  # (1, dim, 1, S)
    xn = kb.rmsnorm(x, src.scale("rms_ffn", d), "ffn_norm")  # (1, dim, 1, S)
    rows = src.shared_rows(xn)
    h1 = src.linear(xn, "w1", "h1", rows)  # (1, hidden, 1, S)
    h3 = src.linear(xn, "w3", "h3", rows)  # (1, hidden, 1, S)
    gate = kb.gate(h1, h3)  # (1, hidden, 1, S): SwiGLU or GeGLU
    y = src.linear(gate, "w2", "ffn")  # (1, dim, 1, S)
    taps = {"ffn_out": y, "h1": h1, "h3": h3, "silu_out": gate, "x2norm": xn}
    if cfg.post_norms:  # Gemma 3
        taps["ffn_pre"] = y
        taps["ffn_out"] = kb.rmsnorm(y, src.scale("post_ffn_norm", d), "post_ffn_norm")  # (1, dim, 1, S)
    return src.finish(ffn_fwd_layout(cfg), taps)


def final_rmsnorm(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """The final RMSNorm before the classifier (scale rms_final).

    Input x: [1, dim, 1, S], the last layer's residual stream. Output: xnorm [1, dim, 1, S].
    """
    layout = Layout.of([("x", cfg.dim)], cfg.seq_len)
    kb = KernelBuilder("final_rmsnorm", cfg, layout, weights)
    x = kb.part("x")  # (1, dim, 1, S)
    xn = kb.rmsnorm(x, kb.norm_scale("rms_final", "rms_final", cfg.dim), "final_norm")  # (1, dim, 1, S)
    return kb.finish(Layout.of([("xnorm", cfg.dim)], cfg.seq_len), {"xnorm": xn})


def classifier_fwd(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """Logits of the tied classifier: one 1x1 conv with the embedding [vocab, dim, 1, 1] as weight.

    Input x: [1, dim, 1, S] (the final RMSNorm's output). Output: logits [1, vocab, 1, S].
    """
    cfg.check_kernels()  # the vocabulary is this kernel's channels
    kb = KernelBuilder("classifier_fwd", cfg, Layout.of([("x", cfg.dim)], cfg.seq_len), weights)
    x = kb.part("x")  # (1, dim, 1, S)
    logits = kb.conv(x, kb.matrix("embed", "embed", cfg.vocab_size, cfg.dim), "logits")  # (1, vocab, 1, S)
    return kb.finish(Layout.of([("logits", cfg.vocab_size)], cfg.seq_len), {"logits": logits})


def softmax_vocab(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """Softmax over the vocabulary (channels) of each position; no weights (``weights`` is ignored).

    Input logits: [1, vocab, 1, S]. Output: probs [1, vocab, 1, S].
    """
    cfg.check_kernels()  # the vocabulary is this kernel's channels
    layout = Layout.of([("logits", cfg.vocab_size)], cfg.seq_len)
    kb = KernelBuilder("softmax_vocab", cfg, layout, weights)
    logits = kb.part("logits")  # (1, vocab, 1, S)
    probs = kb.f.softmax(x=logits, axis=1, name="probs")  # (1, vocab, 1, S)
    return kb.finish(Layout.of([("probs", cfg.vocab_size)], cfg.seq_len), {"probs": probs})
