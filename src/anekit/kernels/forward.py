"""Forward kernels of one transformer layer and of the head (final norm, classifier, softmax).

Weights are given as llama2.c lays them out: matrices (out, in) — wq (q_dim, dim), wk / wv (kv_dim,
dim), wo (dim, q_dim) (q_dim = n_heads x head_dim, = dim for llama2.c models), w1 / w3 (hidden, dim),
w2 (dim, hidden) — and vectors rms_att / rms_ffn / rms_final (dim,), embed (vocab, dim); Hugging Face
models add bq (q_dim,), bk / bv (kv_dim,) and q_norm / k_norm (head_dim,) where their config says so,
Gemma 3 post_att_norm / post_ffn_norm (dim,). ``weights=None`` generates the program from shapes only.

The layer's two forward kernels are no writing of the layer of their own: ``sdpa_forward`` and
``ffn_forward`` lower the model family's attention and MLP blocks (``anekit.models``: Llama, Qwen,
Gemma 3) through ``mil_blocks.MilBlocks``, over a weight source (``anekit.kernels.source``):
``sdpa_fwd`` / ``ffn_fwd`` give them baked weights, ``dynamic.sdpa_fwd_dynamic`` / ``ffn_fwd_dynamic``
weights packed into the input.

The training route's ``norm`` "host" (``anekit.kernels.route``) moves every channel RMSNorm of the two
kernels to the host, as maderix/ANE's dynamic pipeline (training/training_dynamic/mil_dynamic.h:
"RMSNorm done on CPU" from cb474e1 on, and at c3c5094 "RMSNorm stays on CPU (ANE can't handle RMS + 3
matmuls without BNNS fallback)") and ncdrone/rustane's sdpa_fwd / ffn kernels do: the kernel's input x
is the normalised input the host computed, so it has no rms_att / rms_ffn weight and no ``xnorm`` /
``x2norm`` tap (the host holds that value: ``anekit.llama.step`` puts it under the same key), and with
Gemma 3's post-norms its ``o_out`` / ``ffn_out`` is Wo's / W2's output itself, which the host
normalises (no ``o_pre`` / ``ffn_pre`` tap). Qwen 3's and Gemma 3's per-head q / k norm stays in the
SDPA kernel (it sits between the projections and RoPE; moving it would split the kernel in two): the one
RMSNorm such a route's kernels still compute, the construct ``rmsnorm.peak-normalised`` applied per head
(``KernelBuilder.head_rmsnorm``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.config import ModelConfig
from anekit.kernels.mil_blocks import MilBlocks
from anekit.kernels.source import Baked, WeightSource
from anekit.kernels.spec import KernelSpec, Layout
from anekit.mil import Var
from anekit.models import model_for
from anekit.models.blocks import LayerPlan, Rope

Weights = Mapping[str, np.ndarray] | None


def sdpa_fwd_layout(cfg: ModelConfig, norm: str = "engine") -> Layout:
    """Taps of the SDPA forward kernel, in order: o_out (dim), q (q_dim), k, v (kv_dim), attn_out (q_dim),
    xnorm (dim), then, with a q / k norm only, q_pre (q_dim) and k_pre (kv_dim), and with post-norms only
    o_pre (dim). New taps go at the end, so the offsets of the others never move. ``norm`` "host": no
    xnorm and no o_pre (the host holds the one and computes from o_out what the other fed)."""
    d, q, kv = cfg.dim, cfg.q_dim, cfg.kv_dim
    taps = [("o_out", d), ("q", q), ("k", kv), ("v", kv), ("attn_out", q)]
    if norm == "engine":
        taps += [("xnorm", d)]
    if cfg.qk_norm:
        taps += [("q_pre", q), ("k_pre", kv)]
    if cfg.post_norms and norm == "engine":
        taps += [("o_pre", d)]
    return Layout.of(taps, cfg.seq_len)


def sdpa_fwd(
    cfg: ModelConfig, weights: Weights = None, *, kind: str = "full", norm: str = "engine", rope: str = "conv"
) -> KernelSpec:
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

    ``norm`` "host": x is the normalised input (no rms_att; the module docstring), ``rope`` "slice": RoPE
    written with slices and a concat, "matmul": by the rotate-half permutation (``KernelBuilder.rope_heads``).
    """
    inputs = Layout.of([("x", cfg.dim)], cfg.seq_len)
    kb = KernelBuilder("sdpa_fwd", cfg, inputs, weights, kind, norm=norm, rope=rope)
    return sdpa_forward(cfg, Baked(kb))


def sdpa_forward(cfg: ModelConfig, src: WeightSource) -> KernelSpec:
    """The SDPA forward kernel: the family's attention block (``anekit.models``) lowered to MIL by
    ``MilBlocks``, its weights from ``src`` (baked: ``sdpa_fwd``; packed: ``dynamic.sdpa_fwd_dynamic``),
    the layer kind's plan (mask, RoPE, score scale) that of ``src.kb.kind``."""
    blocks = MilBlocks(src)
    model = model_for(cfg)
    out = model.attention(blocks, src.act("x"), kind_plan(model, cfg, src.kb.kind))  # (1, dim, 1, S)
    layout = sdpa_fwd_layout(cfg, src.kb.norm_at)
    return src.finish(layout, block_taps(blocks.taps, out, "o_out", "o_pre"))


def ffn_fwd_layout(cfg: ModelConfig, norm: str = "engine") -> Layout:
    """Taps of the FFN forward kernel, in order (with post-norms, ffn_pre (dim) last); ``norm`` "host":
    no x2norm and no ffn_pre."""
    d, h = cfg.dim, cfg.hidden_dim
    taps = [("ffn_out", d), ("h1", h), ("h3", h), ("silu_out", h)]
    if norm == "engine":
        taps += [("x2norm", d)]
    if cfg.post_norms and norm == "engine":
        taps += [("ffn_pre", d)]
    return Layout.of(taps, cfg.seq_len)


def ffn_fwd(cfg: ModelConfig, weights: Weights = None, *, norm: str = "engine") -> KernelSpec:
    """RMSNorm (rms_ffn), W1 and W3 projections, the gate (SwiGLU, or Gemma's GeGLU), W2, and the
    post-FFN RMSNorm (Gemma 3).

    Input x: [1, dim, 1, S], the residual stream after attention. Output taps: ffn_out (W2 output),
    h1 (W1 output), h3 (W3 output), silu_out (act(h1) * h3, the W2 input, whatever ``cfg.mlp_act``),
    x2norm (the normalised input). With ``cfg.post_norms`` ffn_out is the W2 output RMS-normalised by
    post_ffn_norm and the tap ffn_pre holds the W2 output itself.

    ``norm`` "host": x is the normalised input (no rms_ffn weight, no x2norm tap) and, with post-norms,
    ffn_out the W2 output, which the host normalises (the module docstring).
    """
    kb = KernelBuilder("ffn_fwd", cfg, Layout.of([("x", cfg.dim)], cfg.seq_len), weights, norm=norm)
    return ffn_forward(cfg, Baked(kb))


def ffn_forward(cfg: ModelConfig, src: WeightSource) -> KernelSpec:
    """The FFN forward kernel: the family's MLP block lowered to MIL by ``MilBlocks``, its weights from
    ``src`` (baked: ``ffn_fwd``; packed: ``dynamic.ffn_fwd_dynamic``)."""
    blocks = MilBlocks(src)
    model = model_for(cfg)
    out = model.mlp(blocks, src.act("x"), kind_plan(model, cfg, "full"))  # (1, dim, 1, S)
    layout = ffn_fwd_layout(cfg, src.kb.norm_at)
    return src.finish(layout, block_taps(blocks.taps, out, "ffn_out", "ffn_pre"))


def kind_plan(model: Any, cfg: ModelConfig, kind: str) -> LayerPlan:
    """The family's plan of the first layer of type ``kind``; a model without such a layer (a kernel of
    every kind is generated for ``kernels dump``) gets that kind's plan from the config."""
    for i in range(cfg.n_layers):
        if cfg.layer_type(i) == kind:
            return model.plan(i)
    theta, scaling = cfg.kind_rope(kind)
    return LayerPlan(0, kind, cfg.kind_window(kind), Rope(theta, scaling), cfg.scores_scale)


def block_taps(taps: Mapping[str, Var], out: Var, name: str, pre: str) -> dict[str, Var]:
    """A kernel's taps from a block's: the block's result is the tap ``name`` (what the residual adds);
    where the family tapped ``name`` on a value before it (Gemma 3's post-norm follows Wo / W2), that
    value is the tap ``pre``, which the norm's backward on the host reads."""
    out_taps = dict(taps)
    if out_taps.get(name, out) is not out:
        out_taps[pre] = out_taps[name]
    out_taps[name] = out
    return out_taps


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
