"""Dynamic-weight variants of the fused layer kernels: weights travel in the input, compiled once.

Every kernel here is a builder of the baked kernels given a ``source.Packed`` weight source over the
column layouts below: the forward ``forward.sdpa_forward`` / ``ffn_forward``, the backward
``backward.ffn_backward`` (its products split over two kernels, see below) and
``attention_bwd.qkv_backward``.

Each kernel's single input [1, C, 1, W] holds the activations (channel parts as the baked kernel's
input) and the trainable weights as named column segments (``composable.SpatialLayout``). A training
loop compiles each kernel once and writes new weights into the input after every optimizer step: no
recompiles, so no compile budget spent. What is not trained (the causal mask, the RoPE tables) stays
baked in the weight file.

Packing rule: every product y = M @ a (K input channels, N output channels) takes a segment holding
M^T, K rows x N columns, consumed as it is: the program transposes the ACTIVATIONS to token rows
[1, 1, S, K] and computes y^T = a^T @ M^T with no transposed matmul operand, as maderix/ANE
training/training_dynamic/mil_dynamic.h gen_dyn_matmul does on hardware. One exception, as in
maderix's ffnFused: W2 in ``ffn_fwd_dynamic`` is packed as M itself (dim rows x hidden columns; M^T
would need hidden rows, more than the dim channels) and a transpose op turns it into M^T inside the
kernel. For M = W^T (the backward products) M^T is llama2.c's (out, in) matrix W as stored. Weights
are given in llama2.c's layout ((out, in) matrices, (dim,) scales) and ``spec.pack(weights,
**activations)`` does any transposing on the host.

Widths: every segment starts at a multiple of ``COLUMN_ALIGN`` = 64 columns and the surface is a
multiple of 64 wide, the gaps being zeros (rustane: widths not a multiple of 16 corrupt silently;
maderix's dynamic pipeline only uses multiples of 256). Every input of a llama2.c model is dense:
every segment fills all C rows, so the only zeros are the alignment padding (where a model's widths are
not multiples of 64). Hugging Face attention leaves some rows empty in sdpa_fwd_dynamic: the kv_dim
rows of bk / bv / k_norm and, where q_dim > dim, the dim rows of x, Wq^T, Wk^T, Wv^T and rms_att.
Biases and the q / k norm scales travel as the RMSNorm scale does. An RMSNorm scale is carried as a
full segment, the vector repeated over the S positions, and multiplied elementwise: never a one-column
slice (the pattern an M3 Ultra refused to compile, ncdrone/rustane pull request #9), and its values
(about 1) are far under the 4094 a width-offset slice keeps on M1 / M2 (anekit.engine.numerics
'slice.width-offset-gain'). The other width-offset slices hold weights (biases included), and in
ffn_bwd_w13t_dynamic the forward pre-activations h1 / h3 (dgate, scaled by the loss scale, comes first,
at offset 0); the sanitizer reports any of them over 4094. Outputs are
[1, C, 1, S], S = seq_len: a multiple of 64 in every preset and in ``anekit train``'s default model,
not padded here. Every input width is checked against the engine's 15-bit spatial limit (ConfigError
naming the rule).

With the route's ``norm`` "host" (``anekit.kernels.route``) the forward kernels take the normalised
input, as maderix's sdpaFwd / ffnFused at c3c5094 and ncdrone/rustane's do: their inputs lose the
rms_att / rms_ffn segments (and Gemma 3's post_att_norm / post_ffn_norm), so no RMSNorm scale is
repeated over S columns any more (the construct ``rmsnorm.scale-repeated``) and none is computed in the
kernel (``rmsnorm.peak-normalised``) but Qwen 3's per-head q / k norm, whose scales stay segments.

Kernel                C         segments (rows x columns), each padded to a multiple of 64 columns
sdpa_fwd_dynamic      max(dim,  act dim x S, wq_t dim x q_dim, wk_t dim x kv, wv_t dim x kv,
                      q_dim)    wo_t q_dim x dim, rms_att dim x S; with biases bq q_dim x S,
                                bk / bv kv x S; with a q / k norm q_norm q_dim x S, k_norm kv x S;
                                with post-norms post_att_norm dim x S
ffn_fwd_dynamic       dim       act dim x S, w1_t dim x hidden, w3_t dim x hidden, w2 dim x hidden
                                (W2 itself), rms_ffn dim x S (+ post_ffn_norm dim x S)
ffn_bwd_w2t_dynamic   dim       act (dffn) dim x S, w2 dim x hidden (= (W2^T)^T)
ffn_bwd_w13t_dynamic  hidden    dgate, h1, h3 hidden x S each, w1 hidden x dim, w3 hidden x dim
qkv_bwd_dynamic       q_dim     act (dq; dk; dv) (q_dim + 2 kv) x S, wqkv (q_dim + 2 kv) x dim
                      + 2 kv    (Wq; Wk; Wv)

The FFN backward is two kernels, split as maderix's ffnBwdW2t / ffnBwdW13t (train.m): one fused
kernel would need dim + 2 hidden channels with the weight segments filling only some rows (16.6 MiB
for stories110M, a third of it zeros); split, each input is dense, the larger 9.0 MiB (the largest
surface of all is ffn_fwd_dynamic's input, 9.5 MiB).
"""

from __future__ import annotations

from anekit.kernels.attention_bwd import qkv_backward
from anekit.kernels.backward import ffn_backward
from anekit.kernels.composable import (
    COLUMN_ALIGN,
    DynamicKernelSpec,
    Segment,
    SpatialLayout,
    dynamic_builder,
    dynamic_matmul,
)
from anekit.kernels.config import ModelConfig
from anekit.kernels.forward import ffn_forward, sdpa_forward
from anekit.kernels.source import Packed
from anekit.kernels.spec import Layout

# -- SDPA forward ------------------------------------------------------------------------------------


def sdpa_fwd_dynamic_columns(cfg: ModelConfig, norm: str = "engine") -> SpatialLayout:
    """Columns of the dynamic SDPA forward input: x, then Wq^T, Wk^T, Wv^T, Wo^T and rms_att; with
    ``cfg.qkv_bias`` then bq, bk, bv and with ``cfg.qk_norm`` q_norm, k_norm, each vector repeated over
    S columns (the per-head norm scales tiled over the heads first). ``norm`` "host": no rms_att and no
    post_att_norm (x is the normalised input).

    The surface has max(dim, q_dim) channels: Wo^T has q_dim rows (= dim for llama2.c models, whose
    layout this leaves as it was)."""
    d, q, kv, s = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.seq_len
    segments = [
        Segment("act", d, s),
        Segment("wq_t", d, q, (("wq", d, True),)),
        Segment("wk_t", d, kv, (("wk", d, True),)),
        Segment("wv_t", d, kv, (("wv", d, True),)),
        Segment("wo_t", q, d, (("wo", q, True),)),
    ]
    if norm == "engine":
        segments.append(Segment("rms_att", d, s, (("rms_att", d, False),)))
    if cfg.qkv_bias:
        segments += [Segment(b, n, s, ((b, n, False),)) for b, n in (("bq", q), ("bk", kv), ("bv", kv))]
    if cfg.qk_norm:
        segments += [Segment(w, n, s, ((w, n, False),)) for w, n in (("q_norm", q), ("k_norm", kv))]
    if cfg.post_norms and norm == "engine":
        segments.append(Segment("post_att_norm", d, s, (("post_att_norm", d, False),)))
    return SpatialLayout.of(max(d, q), segments, align=COLUMN_ALIGN)


def norm_offsets(cfg: ModelConfig, keys: tuple[str, ...]) -> dict[str, float]:
    """The packing offsets of a kernel's RMSNorm scales ``keys``: each packed as ``cfg.norm_offset`` + w
    (none when the offset is 0, so a Llama kernel's input is packed as it always was)."""
    return {k: cfg.norm_offset for k in keys} if cfg.norm_offset else {}


def sdpa_fwd_dynamic(
    cfg: ModelConfig, *, kind: str = "full", norm: str = "engine", rope: str = "conv"
) -> DynamicKernelSpec:
    """``forward.sdpa_fwd`` with its weights in the input: [1, max(dim, q_dim), 1, W]
    (``sdpa_fwd_dynamic_columns``).

    Activation part x (dim, S). Output taps as sdpa_fwd (``forward.sdpa_fwd_layout``): o_out, q, k (after
    the q / k norm and RoPE), v, attn_out, xnorm, and with a q / k norm q_pre, k_pre (the projections
    before it). Q, K and V are three matmuls sharing one transposed xnorm, as maderix's sdpaFwd
    (mil_dynamic.h); the biases are added and the norm scales multiplied as full [1, C, 1, S] segments,
    as the RMSNorm scale is. Gemma 3: post_att_norm as a segment like rms_att (the o_pre tap as in
    ``forward.sdpa_fwd``), every norm scale packed as ``cfg.norm_offset`` + w, and ``kind`` choosing
    the mask and the RoPE tables of a sliding layer.

    ``norm`` "host": x is the normalised input (``sdpa_fwd_dynamic_columns``, ``forward.sdpa_fwd``);
    ``rope`` "slice": RoPE with slices and a concat, "matmul": by the rotate-half permutation
    (``KernelBuilder.rope_heads``).
    """
    columns = sdpa_fwd_dynamic_columns(cfg, norm)
    kb = dynamic_builder("sdpa_fwd_dynamic", cfg, columns, kind, norm=norm, rope=rope)
    activations = Layout.of([("x", cfg.dim)], cfg.seq_len)
    scales = ("rms_att", "q_norm", "k_norm", "post_att_norm") if norm == "engine" else ("q_norm", "k_norm")
    offsets = norm_offsets(cfg, scales)
    return sdpa_forward(cfg, Packed(kb, columns, activations, offsets))  # type: ignore[return-value]


# -- FFN forward -------------------------------------------------------------------------------------


def ffn_fwd_dynamic_columns(cfg: ModelConfig, norm: str = "engine") -> SpatialLayout:
    """Columns of the dynamic FFN forward input: x, then W1^T, W3^T, W2 (untransposed) and rms_ffn (with
    post-norms then post_ffn_norm); ``norm`` "host": no norm scale (x is the normalised input)."""
    d, h = cfg.dim, cfg.hidden_dim
    segments = [
        Segment("act", d, cfg.seq_len),
        Segment("w1_t", d, h, (("w1", d, True),)),
        Segment("w3_t", d, h, (("w3", d, True),)),
        Segment("w2", d, h, (("w2", d, False),)),
    ]
    if norm == "engine":
        segments.append(Segment("rms_ffn", d, cfg.seq_len, (("rms_ffn", d, False),)))
    if cfg.post_norms and norm == "engine":
        segments.append(Segment("post_ffn_norm", d, cfg.seq_len, (("post_ffn_norm", d, False),)))
    return SpatialLayout.of(d, segments, align=COLUMN_ALIGN)


def ffn_fwd_dynamic(cfg: ModelConfig, *, norm: str = "engine") -> DynamicKernelSpec:
    """``forward.ffn_fwd`` with its weights in the input: [1, dim, 1, W] (``ffn_fwd_dynamic_columns``).

    Activation part x (dim, S), the residual stream after attention. Output taps as ffn_fwd: ffn_out,
    h1, h3, silu_out, x2norm (with post-norms also ffn_pre; the gate is ``KernelBuilder.gate``). h1 and
    h3 are two matmuls sharing one transposed x2norm. W2^T would need hidden rows, more than the dim
    channels, so W2 (dim, hidden) is packed as is and turned into W2^T by a transpose op in the kernel,
    as maderix's ffnFused does (mil_dynamic.h). ``norm`` "host": x is the normalised input, as maderix's
    ffnFused reads x2norm from the CPU (``ffn_fwd_dynamic_columns``, ``forward.ffn_fwd``).
    """
    columns = ffn_fwd_dynamic_columns(cfg, norm)
    kb = dynamic_builder("ffn_fwd_dynamic", cfg, columns, norm=norm)
    activations = Layout.of([("x", cfg.dim)], cfg.seq_len)
    offsets = norm_offsets(cfg, ("rms_ffn", "post_ffn_norm") if norm == "engine" else ())
    return ffn_forward(cfg, Packed(kb, columns, activations, offsets))  # type: ignore[return-value]


# -- FFN backward, part 1: dgate = W2^T dffn ----------------------------------------------------------


def ffn_bwd_w2t_dynamic_columns(cfg: ModelConfig) -> SpatialLayout:
    """Columns of the first FFN backward kernel's input: dffn, then W2 as stored (= (W2^T)^T)."""
    d, h = cfg.dim, cfg.hidden_dim
    return SpatialLayout.of(
        d,
        [Segment("act", d, cfg.seq_len), Segment("w2", d, h, (("w2", d, False),))],
        align=COLUMN_ALIGN,
    )


def ffn_bwd_w2t_dynamic(cfg: ModelConfig) -> DynamicKernelSpec:
    """dgate = W2^T dffn with W2 in the input: [1, dim, 1, W] (``ffn_bwd_w2t_dynamic_columns``).

    maderix's ffnBwdW2t (train.m, mil_dynamic.h gen_ffn_bwd_w2t_dynamic): a plain dynamic matmul whose
    K = dim rows hold W2 (dim, hidden) as stored, which is M^T for M = W2^T. Activation part dffn (dim,
    S); output dgate (hidden, S), the gradient of the SwiGLU gate, for ``ffn_bwd_w13t_dynamic``.
    """
    columns = ffn_bwd_w2t_dynamic_columns(cfg)
    kb = dynamic_builder("ffn_bwd_w2t_dynamic", cfg, columns)
    src = Packed(kb, columns, Layout.of([("dffn", cfg.dim)], cfg.seq_len))
    outputs = Layout.of([("dgate", cfg.hidden_dim)], cfg.seq_len)
    return src.finish(outputs, ffn_backward(src, up=False))


# -- FFN backward, part 2: SwiGLU backward and dx = W1^T dh1 + W3^T dh3 ---------------------------------


def ffn_bwd_w13t_dynamic_layouts(cfg: ModelConfig) -> tuple[Layout, Layout]:
    """Activation parts and output taps of the second FFN backward kernel."""
    d, h, s = cfg.dim, cfg.hidden_dim, cfg.seq_len
    return (
        Layout.of([("dgate", h), ("h1", h), ("h3", h)], s),
        Layout.of([("dx", d), ("dh1", h), ("dh3", h)], s),
    )


def ffn_bwd_w13t_dynamic_columns(cfg: ModelConfig) -> SpatialLayout:
    """Columns of the second FFN backward kernel's input: dgate, h1, h3 side by side, then W1 and W3 as
    stored (hidden, dim) each."""
    h, s = cfg.hidden_dim, cfg.seq_len
    return SpatialLayout.of(
        h,
        [
            Segment("dgate", h, s),
            Segment("h1", h, s),
            Segment("h3", h, s),
            Segment("w1", h, cfg.dim, (("w1", h, False),)),
            Segment("w3", h, cfg.dim, (("w3", h, False),)),
        ],
        align=COLUMN_ALIGN,
    )


def ffn_bwd_w13t_dynamic(cfg: ModelConfig) -> DynamicKernelSpec:
    """The SwiGLU backward and dx = W1^T dh1 + W3^T dh3, W1 and W3 in the input: [1, hidden, 1, W].

    maderix's ffnBwdW13t (mil_dynamic.h gen_ffn_bwd_w13t_dynamic): hidden channels, the activations
    side by side along columns, two products of the transposed dh1 / dh3 with W1 / W3 as stored
    (hidden, dim) = M^T for M = W1^T / W3^T, summed in the token-row layout and transposed back once.
    maderix computes the SwiGLU derivative on the CPU between its two kernels; here it stays on the
    engine, as in the baked ``backward.ffn_bwd`` (``KernelBuilder.swiglu_grads``).

    Activation parts dgate (from ``ffn_bwd_w2t_dynamic``), h1, h3 (hidden, S each). Output taps: dx
    (dim, the gradient w.r.t. x2norm), dh1, dh3 (hidden), as ``backward.ffn_bwd``.
    """
    columns = ffn_bwd_w13t_dynamic_columns(cfg)
    kb = dynamic_builder("ffn_bwd_w13t_dynamic", cfg, columns)
    activations, outputs = ffn_bwd_w13t_dynamic_layouts(cfg)
    src = Packed(kb, columns, activations)
    return src.finish(outputs, ffn_backward(src, down=False))


# -- QKV backward ------------------------------------------------------------------------------------


def qkv_bwd_dynamic_layouts(cfg: ModelConfig) -> tuple[Layout, Layout]:
    """Activation parts and output of the dynamic QKV backward kernel."""
    q, kv, s = cfg.q_dim, cfg.kv_dim, cfg.seq_len
    return Layout.of([("dq", q), ("dk", kv), ("dv", kv)], s), Layout.of([("dx", cfg.dim)], s)


def qkv_bwd_dynamic_columns(cfg: ModelConfig) -> SpatialLayout:
    """Columns of the dynamic QKV backward input: concat(dq, dk, dv), then Wq over Wk over Wv."""
    d, q, kv = cfg.dim, cfg.q_dim, cfg.kv_dim
    c = q + 2 * kv
    return SpatialLayout.of(
        c,
        [
            Segment("act", c, cfg.seq_len),
            Segment("wqkv", c, d, (("wq", q, False), ("wk", kv, False), ("wv", kv, False))),
        ],
        align=COLUMN_ALIGN,
    )


def qkv_bwd_dynamic(cfg: ModelConfig) -> DynamicKernelSpec:
    """dx = Wq^T dq + Wk^T dk + Wv^T dv with the weights in the input: [1, q_dim + 2 kv, 1, W].

    Activation parts dq (q_dim), dk, dv (kv_dim): the gradients of the projections (biases included,
    before any q / k norm). Output: dx (dim). The activations already are the stack [dq; dk; dv], whose
    rows line up with the segment ``wqkv`` = [Wq; Wk; Wv] ((q_dim + 2 kv) x dim, = M^T for
    M = [Wq; Wk; Wv]^T): dx is ONE matmul of the
    transposed stack with wqkv, all rows used. (maderix's Qwen3 pipeline runs it as two kernels, qBwd
    and kvBwd; one kernel here has a dense input too, so it stays one.)
    """
    columns = qkv_bwd_dynamic_columns(cfg)
    kb = dynamic_builder("qkv_bwd_dynamic", cfg, columns)
    activations, outputs = qkv_bwd_dynamic_layouts(cfg)
    src = Packed(kb, columns, activations)
    return src.finish(outputs, qkv_backward(src))


def wo_t_dynamic(cfg: ModelConfig) -> DynamicKernelSpec:
    """da = Wo^T do (q_dim, S) of the dynamic pipeline's attention backward: a dynamic matmul whose
    weight input is Wo^T (dim -> q_dim)."""
    return dynamic_matmul(cfg.dim, cfg.q_dim, cfg.seq_len)
