"""The kernels of the matmul-free training route ("conv-host-attention"): 1x1 convs and the gate only.

On M1 / M2 under macOS 26, matmul and scaled_dot_product_attention fail to compile while conv kernels
run (maderix/ANE commit 709b602, M1 Pro, macOS 26.3: "matmul and scaled_dot_product_attention ops still
fail on M1/M2 ... Conv-based kernels (training, QKV projections, FFN) work on all generations"). This
route gives the engine only what ran there: 1x1 convs with baked BLOBFILE weights, a bias add, the
elementwise gate and its backward, and the channel concat of the taps (maderix/ANE training/
stories_mil.h). The host does the rest (``anekit.llama.step_host``): every RMSNorm, RoPE, the attention
core (scores, mask, softmax, probs @ V) and its backward, as maderix/ANE's first training pipeline did
(training/forward.h at f213c8d: one baked conv kernel per projection, RMSNorm, RoPE and attention on
the CPU).

Per layer, in the order the step runs them (all weights baked, so all compiled again per batch):

    qkv_fwd   xnorm (dim)               -> q (q_dim), k, v (kv_dim): Wq / Wk / Wv xnorm (+ biases)
    wo_fwd    attn (q_dim)              -> o (dim): Wo attn
    ffn_fwd   x (dim), normalised       -> ffn_out (dim), h1, h3, silu_out (hidden): W2 act(W1 x) * W3 x
              (``forward.ffn_fwd`` with ``norm`` "host", the engine-attention routes' own)
    ffn_bwd   dffn (dim), h1, h3        -> dx (dim), dh1, dh3 (hidden): ``backward.ffn_bwd`` itself
    wo_bwd    do (dim)                  -> da (q_dim): Wo^T do
    qkv_bwd   dq (q_dim), dk, dv        -> dx (dim): ``attention_bwd.qkv_bwd`` itself

Each reads the normalised input the host wrote (no RMSNorm in a kernel, so nothing is reduced), and
ffn_out is the W2 output itself (with Gemma 3's post-norm the host normalises it). No kernel holds a
matmul, a softmax or a reduction.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from anekit.kernels import attention_bwd, backward, forward
from anekit.kernels.blocks import OUTPUT, KernelBuilder
from anekit.kernels.config import ModelConfig
from anekit.kernels.mil_blocks import MilBlocks
from anekit.kernels.source import Baked
from anekit.kernels.spec import KernelSpec, Layout
from anekit.models import model_for

Weights = Mapping[str, np.ndarray] | None

# The route's per-layer kernels, in the order a step runs them.
KERNELS = ("qkv_fwd", "wo_fwd", "ffn_fwd", "ffn_bwd", "wo_bwd", "qkv_bwd")


def qkv_fwd_layouts(cfg: ModelConfig) -> tuple[Layout, Layout]:
    """Input (xnorm) and output (q, k, v) layouts of the projections' kernel."""
    s = cfg.seq_len
    return (
        Layout.of([("xnorm", cfg.dim)], s),
        Layout.of([("q", cfg.q_dim), ("k", cfg.kv_dim), ("v", cfg.kv_dim)], s),
    )


def qkv_fwd(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """q, k, v of the normalised input: the family's projections (``models`` ``project``: three convs,
    and Qwen 2's biases added after them), before any q / k norm and RoPE (those run on the host).

    Weights: wq (q_dim, dim), wk / wv (kv_dim, dim); with ``cfg.qkv_bias`` bq (q_dim,), bk / bv (kv_dim,).
    """
    inputs, outputs = qkv_fwd_layouts(cfg)
    src = Baked(KernelBuilder("qkv_fwd", cfg, inputs, weights))
    q, k, v = model_for(cfg).project(MilBlocks(src), src.act("xnorm"))  # (1, q_dim | kv_dim, 1, S) each
    return src.finish(outputs, {"q": q, "k": k, "v": v})


def wo_fwd(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """The output projection o = Wo attn of the attention's result: one conv, named ``out``.

    Weights: wo (dim, q_dim). Input attn (q_dim). Output o (dim)."""
    s = cfg.seq_len
    src = Baked(KernelBuilder("wo_fwd", cfg, Layout.of([("attn", cfg.q_dim)], s), weights))
    o = src.linear(src.act("attn"), "wo", OUTPUT)  # (1, dim, 1, S)
    return src.finish(Layout.of([("o", cfg.dim)], s), {"o": o})


def wo_bwd(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """da = Wo^T do, the gradient of the attention's result: one conv with Wo^T (q_dim, dim) baked.

    Input do (dim), the gradient of Wo's output (before Gemma 3's post-norm). Output da (q_dim)."""
    s = cfg.seq_len
    src = Baked(KernelBuilder("wo_bwd", cfg, Layout.of([("do", cfg.dim)], s), weights))
    da = src.linear_t([("do", "wo", "o")], "da", name=OUTPUT)  # (1, q_dim, 1, S)
    return src.finish(Layout.of([("da", cfg.q_dim)], s), {"da": da})


def conv_route_specs(cfg: ModelConfig, weights: Weights = None) -> dict[str, KernelSpec]:
    """One layer's kernels of the route, by the names of ``KERNELS`` (``weights`` None: from shapes
    only). The FFN forward is the engine-attention routes' own with the norm on the host, the FFN and QKV
    backward the baked kernels every route uses: convs and elementwise ops."""
    return {
        "qkv_fwd": qkv_fwd(cfg, weights),
        "wo_fwd": wo_fwd(cfg, weights),
        "ffn_fwd": forward.ffn_fwd(cfg, weights, norm="host"),
        "ffn_bwd": backward.ffn_bwd(cfg, weights),
        "wo_bwd": wo_bwd(cfg, weights),
        "qkv_bwd": attention_bwd.qkv_bwd(cfg, weights),
    }


__all__ = ["KERNELS", "conv_route_specs", "qkv_fwd", "qkv_fwd_layouts", "wo_bwd", "wo_fwd"]
