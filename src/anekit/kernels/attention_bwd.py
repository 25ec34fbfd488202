"""Backward kernels of the attention sublayer: the activation gradients of ``forward.sdpa_fwd``.

Three kernels carry the gradient of o_out back to the normalised input xnorm:

- ``sdpa_bwd1``: da = Wo^T do (q_dim = n_heads x head_dim channels), the attention probabilities
  recomputed from q and k, dV = P^T da and dP = da V^T;
- ``sdpa_bwd2``: the softmax backward dS = P * (dP - rowsum(P * dP)), then dQ = dS K / sqrt(hd) and
  dK = dS^T Q / sqrt(hd), rotated back through RoPE (when enabled) to the pre-RoPE values (the
  projections, or the outputs of Qwen 3's q / k norm, whose backward the host computes);
- ``qkv_bwd``: dx = Wq^T dq + Wk^T dk + Wv^T dv (three convs and two adds).

Under grouped-query attention the query heads of a group are stacked along rows (``group_queries``):
[1, KVH, G*S, X]. Then dV = P^T da and dK = dS^T Q contract over the stacked rows, which sums the
group's contributions to its kv head in the matmul's accumulator. Weight gradients (dW = dy x^T) stay
on the host, which holds the forward taps. ``weights=None`` generates the programs from shapes only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from anekit.kernels.blocks import OUTPUT, KernelBuilder
from anekit.kernels.config import ModelConfig
from anekit.kernels.source import Baked, WeightSource
from anekit.kernels.spec import KernelSpec, Layout
from anekit.mil import Var

Weights = Mapping[str, np.ndarray] | None


def sdpa_bwd1_layouts(cfg: ModelConfig, da_input: bool = False) -> tuple[Layout, Layout]:
    """Input and output layouts of the first SDPA backward kernel (``da_input``: its last input part is
    da (q_dim) rather than do (dim))."""
    q, kv, s = cfg.q_dim, cfg.kv_dim, cfg.seq_len
    scores = cfg.n_heads * s
    last = ("da", q) if da_input else ("do", cfg.dim)
    return (
        Layout.of([("q", q), ("k", kv), ("v", kv), last], s),
        Layout.of([("dv", kv), ("probs", scores), ("dp", scores)], s),
    )


def sdpa_bwd2_layouts(cfg: ModelConfig) -> tuple[Layout, Layout]:
    """Input and output layouts of the second SDPA backward kernel."""
    q, kv, s = cfg.q_dim, cfg.kv_dim, cfg.seq_len
    scores = cfg.n_heads * s
    return (
        Layout.of([("probs", scores), ("dp", scores), ("q", q), ("k", kv)], s),
        Layout.of([("dq", q), ("dk", kv)], s),
    )


def qkv_bwd_layouts(cfg: ModelConfig) -> tuple[Layout, Layout]:
    """Input and output layouts of the QKV backward kernel."""
    q, kv, s = cfg.q_dim, cfg.kv_dim, cfg.seq_len
    return Layout.of([("dq", q), ("dk", kv), ("dv", kv)], s), Layout.of([("dx", cfg.dim)], s)


def sdpa_bwd1(
    cfg: ModelConfig, weights: Weights = None, *, da_input: bool = False, kind: str = "full"
) -> KernelSpec:
    """Gradient of o_out back to v, and the two score-sized operands of the softmax backward.

    Input: concat(q (q_dim), k (kv_dim), v (kv_dim), do (dim)): q and k after RoPE (the forward taps),
    do the gradient of o_out. Baked: Wo^T (q_dim, dim) and the causal mask. ``da_input``: the last part
    is da = Wo^T do (q_dim) itself, computed elsewhere (the dynamic pipeline's matmul), and no Wo is
    baked. Output: concat(dv (kv_dim), probs (H*S), dp (H*S)); probs and dp are [1, H, S, S] score
    tensors flattened to [1, H*S, 1, S] (channel h*S + i holds query i of head h, spatial j is key j).
    ``kind`` "sliding" recomputes the probabilities under the banded mask of a sliding layer. With
    post-norms, do is the gradient of Wo's output before post_att_norm (the tap o_pre).
    """
    inputs, outputs = sdpa_bwd1_layouts(cfg, da_input)
    kb = KernelBuilder("sdpa_bwd1", cfg, inputs, weights, kind)
    h, kvh = cfg.n_heads, cfg.n_kv_heads
    qh = kb.heads(kb.part("q"), h, "qh")  # (1, H, S, hd)
    kh = kb.heads(kb.part("k"), kvh, "kh")  # (1, KVH, S, hd)
    vh = kb.heads(kb.part("v"), kvh, "vh")  # (1, KVH, S, hd)
    if da_input:
        da = kb.part("da")  # (1, q_dim, 1, S)
    else:
        da = Baked(kb).linear_t([("do", "wo", "o")], "da")  # (1, q_dim, 1, S): Wo^T do
    dag = kb.group_queries(kb.heads(da, h, "dah"), "dag")  # (1, KVH, G*S, hd)
    probs = kb.attention_probs(qh, kh, "att")  # (1, H, S, S)
    pg = kb.group_queries(probs, "pg")  # (1, KVH, G*S, S)
    dv = kb.f.matmul(x=pg, y=dag, transpose_x=True, transpose_y=False, name="dv_h")  # (1, KVH, S, hd)
    dp = kb.f.matmul(x=dag, y=vh, transpose_x=False, transpose_y=True, name="dp_g")  # (1, KVH, G*S, S)
    dp = kb.ungroup(dp, "dp_h")  # (1, H, S, S)
    return kb.finish(
        outputs,
        {
            "dv": kb.merge_heads(dv, kvh, "dv"),  # (1, kv_dim, 1, S)
            "probs": kb.flat_scores(probs, "probs_flat"),  # (1, H*S, 1, S)
            "dp": kb.flat_scores(dp, "dp_flat"),  # (1, H*S, 1, S)
        },
    )


def sdpa_bwd1_weightless(cfg: ModelConfig, *, kind: str = "full", identity_wo: bool = True) -> KernelSpec:
    """SDPA backward 1 without trained weights (the dynamic pipeline's, fed da = Wo^T do by a dynamic
    matmul): baked with Wo = I where Wo is square (llama2.c) and ``identity_wo`` (the legacy kernel), else
    taking da (q_dim) as its input. The training routes take da always: the identity conv computes
    nothing, and it was the one conv of their dynamic kernels (the M3's contested 512-channel rule,
    'conv.channels-512-m3', warns on every conv of more channels)."""
    if cfg.q_dim == cfg.dim and identity_wo:
        return sdpa_bwd1(cfg, {"wo": np.eye(cfg.dim, dtype=np.float32)}, kind=kind)
    return sdpa_bwd1(cfg, None, da_input=True, kind=kind)


def sdpa_bwd2(
    cfg: ModelConfig, weights: Weights = None, *, kind: str = "full", rope: str = "conv"
) -> KernelSpec:
    """Softmax backward and the gradients of the (pre-RoPE) Q and K projections.

    Input: concat(probs (H*S), dp (H*S), q (q_dim), k (kv_dim)): probs and dp as ``sdpa_bwd1`` writes
    them, q and k after RoPE. Output: concat(dq (q_dim), dk (kv_dim)), the gradients w.r.t. q and k
    before RoPE when it is enabled (the transposed rotation, baked cos / sin tables, is the kernel's only
    weight data): the projections Wq xnorm (+ bq) and Wk xnorm (+ bk), or, with a q / k norm, that
    norm's outputs (the host carries them back through the norm). ``weights`` is unused (the kernel bakes no
    model weight) and accepted for a uniform generator signature. The scores' scale is
    ``cfg.scores_scale``; ``kind`` "sliding" rotates back with the sliding layers' RoPE tables. ``rope``:
    how the rotation back is written, the route's choice (``KernelBuilder.rope``: "conv", the legacy swap
    conv, or "slice" / "matmul", slices and a concat or a matmul by the rotate-half permutation on the
    heads view, where dq and dk already are: x cos - (x @ P) sin, the transposed rotation).
    """
    inputs, outputs = sdpa_bwd2_layouts(cfg)
    kb = KernelBuilder("sdpa_bwd2", cfg, inputs, weights, kind, rope=rope)
    qd, kv, h, kvh = cfg.q_dim, cfg.kv_dim, cfg.n_heads, cfg.n_kv_heads
    probs = kb.score_heads(kb.part("probs"), "probs")  # (1, H, S, S)
    dp = kb.score_heads(kb.part("dp"), "dp")  # (1, H, S, S)
    qg = kb.group_queries(kb.heads(kb.part("q"), h, "qh"), "qg")  # (1, KVH, G*S, hd)
    kh = kb.heads(kb.part("k"), kvh, "kh")  # (1, KVH, S, hd)
    pdp = kb.f.mul(x=probs, y=dp, name="p_dp")  # (1, H, S, S)
    row = kb.f.reduce_sum(x=pdp, axes=[-1], keep_dims=True, name="p_dp_sum")  # (1, H, S, 1)
    centred = kb.f.sub(x=dp, y=row, name="dp_centred")  # (1, H, S, S)
    ds = kb.f.mul(x=probs, y=centred, name="ds_raw")  # (1, H, S, S): gradient of the softmax input
    ds = kb.f.mul(x=ds, y=cfg.scores_scale, name="ds")  # (1, H, S, S): of the raw q.k
    dsg = kb.group_queries(ds, "dsg")  # (1, KVH, G*S, S)
    dq = kb.f.matmul(x=dsg, y=kh, transpose_x=False, transpose_y=False, name="dq_g")  # (1, KVH, G*S, hd)
    if cfg.rope and kb.rotates_heads:  # rotated back on the heads views the products give
        dqh = kb.rope_heads(kb.ungroup(dq, "dq_h"), "dq_rope", inverse=True)  # (1, H, S, hd)
        dk = kb.f.matmul(x=dsg, y=qg, transpose_x=True, transpose_y=False, name="dk_h")  # (1, KVH, S, hd)
        dkh = kb.rope_heads(dk, "dk_rope", inverse=True)  # (1, KVH, S, hd)
        return kb.finish(outputs, {"dq": kb.merge_heads(dqh, h, "dq"), "dk": kb.merge_heads(dkh, kvh, "dk")})
    dq = kb.merge_heads(kb.ungroup(dq, "dq_h"), h, "dq")  # (1, q_dim, 1, S)
    dk = kb.f.matmul(x=dsg, y=qg, transpose_x=True, transpose_y=False, name="dk_h")  # (1, KVH, S, hd)
    dk = kb.merge_heads(dk, kvh, "dk")  # (1, kv_dim, 1, S)
    if cfg.rope:
        dq = kb.rope(dq, qd, "dq_rope", inverse=True)  # (1, q_dim, 1, S)
        dk = kb.rope(dk, kv, "dk_rope", inverse=True)  # (1, kv_dim, 1, S)
    return kb.finish(outputs, {"dq": dq, "dk": dk})


def qkv_bwd(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """Gradient w.r.t. xnorm through the three projections: dx = Wq^T dq + Wk^T dk + Wv^T dv.

    Input: concat(dq (q_dim), dk (kv_dim), dv (kv_dim)), the gradients of the projections (biases
    included, before any q / k norm). Output: dx (dim). Three 1x1 convs with the baked Wq^T (dim,
    q_dim), Wk^T and Wv^T (dim, kv_dim) on the three slices of the input, then two adds, as
    maderix/ANE training/stories_mil.h builds its QKV backward: one conv over the whole stack would
    read q_dim + 2 kv_dim channels (2304 for stories110M), more than any conv seen working on the
    engine (2048).
    """
    inputs, outputs = qkv_bwd_layouts(cfg)
    src = Baked(KernelBuilder("qkv_bwd", cfg, inputs, weights))
    return src.finish(outputs, qkv_backward(src))


def qkv_backward(src: WeightSource) -> dict[str, Var]:
    """dx = Wq^T dq + Wk^T dk + Wv^T dv over a weight source, as the tap dx: baked (``qkv_bwd``) three
    convs of the input's parts and two adds; packed (``dynamic.qkv_bwd_dynamic``) one product of the
    stacked input [dq; dk; dv] with the segment stacking [Wq; Wk; Wv]."""
    terms = [("dq", "wq", "q"), ("dk", "wk", "k"), ("dv", "wv", "v")]
    return {"dx": src.linear_t(terms, "dx", name=OUTPUT)}  # (1, dim, 1, S): the kernel's one output
