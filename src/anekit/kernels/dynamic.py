"""Dynamic-weight variants of the fused layer kernels: weights travel in the input, compiled once.

Each kernel's single input [1, C, 1, S + W] holds the activations in spatial columns 0..S (channel parts
as the baked kernel's input) and the trainable weights in the W columns after them, as named column
segments (``composable.SpatialLayout``). A training loop compiles each kernel once and writes new
weights into the input after every optimizer step: no recompiles, so no compile budget spent. What is
not trained (the causal mask, the RoPE tables) stays baked in the weight file.

Packing rule: a segment holds the matrix M^T of a product y = M @ a (rows: the product's input
channels K; columns: its output channels N), or M itself (N rows, K columns) where M^T would not fit
in the C channels (W2 in ``ffn_fwd_dynamic``: hidden rows > dim) or M is the narrower of the two
(W2^T in ``ffn_bwd_dynamic``: dim columns instead of hidden). A segment with fewer rows than C leaves
the rest zero. Weights are given in llama2.c's layout ((out, in) matrices, (dim,) scales)
and ``spec.pack(weights, **activations)`` does the transposing. Every input width is checked against
the engine's 15-bit spatial limit (ConfigError naming the rule).

Kernel            C               segments after the activations (rows x columns)
sdpa_fwd_dynamic  dim             wq_t dim x dim, wk_t dim x kv, wv_t dim x kv, wo_t dim x dim,
                                  rms_att dim x 1
ffn_fwd_dynamic   dim             w1_t dim x hidden, w3_t dim x hidden, w2 dim x hidden (W2 itself),
                                  rms_ffn dim x 1
ffn_bwd_dynamic   dim + 2 hidden  w2_t hidden x dim (W2^T itself), w13 2 hidden x dim (W1 over W3)
qkv_bwd_dynamic   dim + 2 kv      wqkv (dim + 2 kv) x dim (Wq over Wk over Wv)
"""

from __future__ import annotations

from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.composable import (
    DynamicKernelSpec,
    Segment,
    SpatialLayout,
    dynamic_builder,
    dynamic_linear,
    dynamic_slice,
    finish_dynamic,
)
from anekit.kernels.config import ModelConfig
from anekit.kernels.forward import ffn_fwd_layout, sdpa_fwd_layout
from anekit.kernels.spec import Layout
from anekit.mil import Var


def _span(kb: KernelBuilder, columns: SpatialLayout, first: str, last: str, tag: str) -> Var:
    """Adjacent segments ``first``..``last`` (same rows) as one block: [1, rows, 1, their columns]."""
    start, _ = columns.range(first)
    end = sum(columns.range(last))
    rows = columns.segment(first).rows
    return kb.f.slice_by_size(
        x=kb.x, begin=[0, 0, 0, start], size=[1, rows, 1, end - start], name=f"in_{tag}"
    )  # (1, rows, 1, columns)


def _channels(kb: KernelBuilder, x: Var, offset: int, count: int, name: str) -> Var:
    """Channels offset..offset + count of a [1, C, 1, S] value."""
    seq = x.type.shape[3]  # type: ignore[union-attr]
    return kb.f.slice_by_size(x=x, begin=[0, offset, 0, 0], size=[1, count, 1, seq], name=name)


def _act_parts(kb: KernelBuilder, columns: SpatialLayout, activations: Layout) -> dict[str, Var]:
    """Every channel part of the activation columns, by name."""
    act = columns.activation.name
    return {n: dynamic_slice(kb, columns, act, activations.range(n), tag=n) for n in activations.names}


# -- SDPA forward ------------------------------------------------------------------------------------


def sdpa_fwd_dynamic_columns(cfg: ModelConfig) -> SpatialLayout:
    """Columns of the dynamic SDPA forward input: x, then Wq^T, Wk^T, Wv^T, Wo^T and rms_att."""
    d, kv = cfg.dim, cfg.kv_dim
    return SpatialLayout.of(
        d,
        [
            Segment("act", d, cfg.seq_len),
            Segment("wq_t", d, d, (("wq", d, True),)),
            Segment("wk_t", d, kv, (("wk", d, True),)),
            Segment("wv_t", d, kv, (("wv", d, True),)),
            Segment("wo_t", d, d, (("wo", d, True),)),
            Segment("rms_att", d, 1, (("rms_att", d, False),)),
        ],
    )


def sdpa_fwd_dynamic(cfg: ModelConfig) -> DynamicKernelSpec:
    """``forward.sdpa_fwd`` with its weights in the input: [1, dim, 1, S + 2 dim + 2 kv_dim + 1].

    Activation part x (dim, S). Output taps as sdpa_fwd: o_out, q, k (after RoPE), v, attn_out, xnorm.
    Q, K and V come from ONE matmul against the adjacent segments [Wq^T | Wk^T | Wv^T].
    """
    columns = sdpa_fwd_dynamic_columns(cfg)
    kb = dynamic_builder("sdpa_fwd_dynamic", cfg, columns)
    d, kv = cfg.dim, cfg.kv_dim
    activations = Layout.of([("x", d)], cfg.seq_len)
    x = _act_parts(kb, columns, activations)["x"]  # (1, dim, 1, S)
    scale = dynamic_slice(kb, columns, "rms_att")  # (1, dim, 1, 1)
    xn = kb.rmsnorm(x, scale, "att_norm")  # (1, dim, 1, S)
    wqkv = _span(kb, columns, "wq_t", "wv_t", "wqkv_t")  # (1, dim, 1, dim + 2 kv)
    qkv = dynamic_linear(kb, xn, wqkv, "qkv")  # (1, dim + 2 kv, 1, S)
    q = _channels(kb, qkv, 0, d, "q")  # (1, dim, 1, S)
    k = _channels(kb, qkv, d, kv, "k")  # (1, kv_dim, 1, S)
    v = _channels(kb, qkv, d + kv, kv, "v")  # (1, kv_dim, 1, S)
    if cfg.rope:
        q = kb.rope(q, d, "q_rope")
        k = kb.rope(k, kv, "k_rope")
    probs = kb.attention_probs(kb.heads(q, cfg.n_heads, "qh"), kb.heads(k, cfg.n_kv_heads, "kh"), "att")
    att = kb.merge_heads(kb.attend(probs, kb.heads(v, cfg.n_kv_heads, "vh"), "att"), cfg.n_heads, "att")
    o = dynamic_linear(kb, att, dynamic_slice(kb, columns, "wo_t"), "o")  # (1, dim, 1, S)
    taps = {"o_out": o, "q": q, "k": k, "v": v, "attn_out": att, "xnorm": xn}
    return finish_dynamic(kb, activations, columns, sdpa_fwd_layout(cfg), taps)


# -- FFN forward -------------------------------------------------------------------------------------


def ffn_fwd_dynamic_columns(cfg: ModelConfig) -> SpatialLayout:
    """Columns of the dynamic FFN forward input: x, then W1^T, W3^T, W2 (untransposed) and rms_ffn."""
    d, h = cfg.dim, cfg.hidden_dim
    return SpatialLayout.of(
        d,
        [
            Segment("act", d, cfg.seq_len),
            Segment("w1_t", d, h, (("w1", d, True),)),
            Segment("w3_t", d, h, (("w3", d, True),)),
            Segment("w2", d, h, (("w2", d, False),)),
            Segment("rms_ffn", d, 1, (("rms_ffn", d, False),)),
        ],
    )


def ffn_fwd_dynamic(cfg: ModelConfig) -> DynamicKernelSpec:
    """``forward.ffn_fwd`` with its weights in the input: [1, dim, 1, S + 3 hidden + 1].

    Activation part x (dim, S), the residual stream after attention. Output taps as ffn_fwd: ffn_out,
    h1, h3, silu_out, x2norm. W2^T would need hidden rows, more than the dim channels, so W2 (dim,
    hidden) is packed as is and multiplied untransposed; h1 and h3 come from one matmul against the
    adjacent [W1^T | W3^T].
    """
    columns = ffn_fwd_dynamic_columns(cfg)
    kb = dynamic_builder("ffn_fwd_dynamic", cfg, columns)
    d, h = cfg.dim, cfg.hidden_dim
    activations = Layout.of([("x", d)], cfg.seq_len)
    x = _act_parts(kb, columns, activations)["x"]  # (1, dim, 1, S)
    xn = kb.rmsnorm(x, dynamic_slice(kb, columns, "rms_ffn"), "ffn_norm")  # (1, dim, 1, S)
    w13 = _span(kb, columns, "w1_t", "w3_t", "w13_t")  # (1, dim, 1, 2 hidden)
    h13 = dynamic_linear(kb, xn, w13, "h13")  # (1, 2 hidden, 1, S)
    h1 = _channels(kb, h13, 0, h, "h1")  # (1, hidden, 1, S)
    h3 = _channels(kb, h13, h, h, "h3")  # (1, hidden, 1, S)
    sig = kb.f.sigmoid(x=h1, name="h1_sigmoid")  # (1, hidden, 1, S)
    silu = kb.f.mul(x=h1, y=sig, name="h1_silu")  # (1, hidden, 1, S)
    gate = kb.f.mul(x=silu, y=h3, name="gate")  # (1, hidden, 1, S)
    w2 = dynamic_slice(kb, columns, "w2")  # (1, dim, 1, hidden)
    y = dynamic_linear(kb, gate, w2, "ffn", transposed=False)  # (1, dim, 1, S)
    taps = {"ffn_out": y, "h1": h1, "h3": h3, "silu_out": gate, "x2norm": xn}
    return finish_dynamic(kb, activations, columns, ffn_fwd_layout(cfg), taps)


# -- FFN backward ------------------------------------------------------------------------------------


def ffn_bwd_dynamic_layouts(cfg: ModelConfig) -> tuple[Layout, Layout]:
    """Activation parts and output taps of the dynamic FFN backward kernel (as ``backward.ffn_bwd``)."""
    d, h, s = cfg.dim, cfg.hidden_dim, cfg.seq_len
    return (
        Layout.of([("dffn", d), ("h1", h), ("h3", h)], s),
        Layout.of([("dx", d), ("dh1", h), ("dh3", h)], s),
    )


def ffn_bwd_dynamic_columns(cfg: ModelConfig) -> SpatialLayout:
    """Columns of the dynamic FFN backward input: concat(dffn, h1, h3), then W2^T and W1 stacked over W3."""
    d, h = cfg.dim, cfg.hidden_dim
    return SpatialLayout.of(
        d + 2 * h,
        [
            Segment("act", d + 2 * h, cfg.seq_len),
            Segment("w2_t", h, d, (("w2", h, True),)),
            Segment("w13", 2 * h, d, (("w1", h, False), ("w3", h, False))),
        ],
    )


def ffn_bwd_dynamic(cfg: ModelConfig) -> DynamicKernelSpec:
    """``backward.ffn_bwd`` with its weights in the input: [1, dim + 2 hidden, 1, S + 2 dim].

    Activation parts dffn (dim), h1, h3 (hidden). Output taps: dx (dim), dh1, dh3 (hidden).
    The surface has dim + 2 hidden channels; the weight segments use the first rows and leave the rest
    zero: ``w2_t`` (hidden x dim) is W2^T itself, multiplied untransposed for dgate = W2^T dffn (packing
    its transpose W2 would take hidden columns instead of dim); ``w13`` (2 hidden x dim) is W1 stacked
    over W3, so dx = W1^T dh1 + W3^T dh3 is ONE matmul of [W1; W3]^T with concat(dh1, dh3) (the two
    products summed in the fp32 accumulator, one fp16 rounding).
    """
    columns = ffn_bwd_dynamic_columns(cfg)
    kb = dynamic_builder("ffn_bwd_dynamic", cfg, columns)
    activations, outputs = ffn_bwd_dynamic_layouts(cfg)
    parts = _act_parts(kb, columns, activations)
    dffn, h1, h3 = parts["dffn"], parts["h1"], parts["h3"]  # (1, dim, 1, S), (1, hidden, 1, S) x 2
    w2t = dynamic_slice(kb, columns, "w2_t")  # (1, hidden, 1, dim)
    dgate = dynamic_linear(kb, dffn, w2t, "dgate", transposed=False)  # (1, hidden, 1, S)
    dh1, dh3 = kb.swiglu_grads(dgate, h1, h3)  # (1, hidden, 1, S) each
    dh = kb.f.concat(values=(dh1, dh3), axis=1, interleave=False, name="dh")  # (1, 2 hidden, 1, S)
    dx = dynamic_linear(kb, dh, dynamic_slice(kb, columns, "w13"), "dx")  # (1, dim, 1, S)
    return finish_dynamic(kb, activations, columns, outputs, {"dx": dx, "dh1": dh1, "dh3": dh3})


# -- QKV backward ------------------------------------------------------------------------------------


def qkv_bwd_dynamic_layouts(cfg: ModelConfig) -> tuple[Layout, Layout]:
    """Activation parts and output of the dynamic QKV backward kernel."""
    d, kv, s = cfg.dim, cfg.kv_dim, cfg.seq_len
    return Layout.of([("dq", d), ("dk", kv), ("dv", kv)], s), Layout.of([("dx", d)], s)


def qkv_bwd_dynamic_columns(cfg: ModelConfig) -> SpatialLayout:
    """Columns of the dynamic QKV backward input: concat(dq, dk, dv), then Wq over Wk over Wv."""
    d, kv = cfg.dim, cfg.kv_dim
    c = d + 2 * kv
    return SpatialLayout.of(
        c,
        [
            Segment("act", c, cfg.seq_len),
            Segment("wqkv", c, d, (("wq", d, False), ("wk", kv, False), ("wv", kv, False))),
        ],
    )


def qkv_bwd_dynamic(cfg: ModelConfig) -> DynamicKernelSpec:
    """dx = Wq^T dq + Wk^T dk + Wv^T dv with the weights in the input: [1, dim + 2 kv, 1, S + dim].

    Activation parts dq (dim), dk, dv (kv_dim): the gradients of the pre-RoPE projections. Output: dx
    (dim). The activations already are the stack [dq; dk; dv], whose rows line up with the segment
    ``wqkv`` = [Wq; Wk; Wv] ((dim + 2 kv) x dim): dx is ONE matmul, all rows used, no padding.
    """
    columns = qkv_bwd_dynamic_columns(cfg)
    kb = dynamic_builder("qkv_bwd_dynamic", cfg, columns)
    activations, outputs = qkv_bwd_dynamic_layouts(cfg)
    dqkv = dynamic_slice(kb, columns, "act")  # (1, dim + 2 kv, 1, S)
    dx = dynamic_linear(kb, dqkv, dynamic_slice(kb, columns, "wqkv"), "dx")  # (1, dim, 1, S)
    return finish_dynamic(kb, activations, columns, outputs, {"dx": dx})
