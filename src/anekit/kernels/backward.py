"""Backward kernels: the input gradients of the FFN and of RMSNorm.

Weights are given as for the forward kernels (llama2.c's layout: w1 / w3 (hidden, dim), w2 (dim, hidden),
rms vectors (dim,)); the kernels bake the transposes they need. Weight gradients (dW = dy @ x^T, the
RMSNorm scale's dw) are left to the host, which holds the forward taps. The tied classifier's input
gradient (embed^T @ dlogits, a vocab-deep product) is a float32 sgemm on the host too, as in
maderix/ANE training/train_large.m: no hardware-run kernel contracts over the vocabulary.
``weights=None`` generates the program from shapes only.

The FFN backward is written once, ``ffn_backward`` over a weight source (``anekit.kernels.source``):
baked here, packed into the two dynamic kernels of ``anekit.kernels.dynamic``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from anekit.kernels.blocks import OUTPUT, KernelBuilder
from anekit.kernels.config import ModelConfig
from anekit.kernels.source import Baked, WeightSource
from anekit.kernels.spec import KernelSpec, Layout
from anekit.mil import Var

Weights = Mapping[str, np.ndarray] | None


def ffn_bwd_layouts(cfg: ModelConfig) -> tuple[Layout, Layout]:
    """Input and output layouts of the FFN backward kernel."""
    d, h, s = cfg.dim, cfg.hidden_dim, cfg.seq_len
    return (
        Layout.of([("dffn", d), ("h1", h), ("h3", h)], s),
        Layout.of([("dx", d), ("dh1", h), ("dh3", h)], s),
    )


def ffn_bwd(cfg: ModelConfig, weights: Weights = None) -> KernelSpec:
    """Gradients of ffn_out = W2 (silu(h1) * h3) with h1 = W1 xn, h3 = W3 xn, the weights baked
    (``ffn_backward`` over ``source.Baked``; packed, the same products are the two kernels
    ``dynamic.ffn_bwd_w2t_dynamic`` and ``ffn_bwd_w13t_dynamic``).

    Input: concat(dffn (dim), h1 (hidden), h3 (hidden)), dffn the gradient of ffn_out and h1 / h3 the
    forward taps. Output: concat(dx (dim), dh1 (hidden), dh3 (hidden)), dx the gradient w.r.t. the
    normalised input x2norm (W1^T dh1 + W3^T dh3), dh1 / dh3 the gradients of the W1 / W3 outputs.
    With sig = sigmoid(h1) and g = W2^T dffn: dh1 = g * h3 * sig * (1 + h1 (1 - sig)),
    dh3 = g * h1 * sig; with Gemma's GeGLU (``cfg.mlp_act`` "gelu_tanh") dh1 = g * h3 * gelu'(h1),
    dh3 = g * gelu(h1) (``KernelBuilder.geglu_grads``). With post-norms dffn is the gradient of the W2
    output (the tap ffn_pre), which the host carries back through post_ffn_norm.
    """
    inputs, outputs = ffn_bwd_layouts(cfg)
    src = Baked(KernelBuilder("ffn_bwd", cfg, inputs, weights))
    return src.finish(outputs, ffn_backward(src))


def ffn_backward(src: WeightSource, *, down: bool = True, up: bool = True) -> dict[str, Var]:
    """The FFN backward's products over a weight source, as taps: ``down`` dgate = W2^T dffn (input
    part dffn), ``up`` the gate's backward and dx = W1^T dh1 + W3^T dh3 (input parts h1, h3, and dgate
    when ``down`` is not in the same kernel). Both: dx, dh1, dh3 (``ffn_bwd``); ``down`` alone: dgate
    (``dynamic.ffn_bwd_w2t_dynamic``); ``up`` alone: dx, dh1, dh3 (``dynamic.ffn_bwd_w13t_dynamic``).
    Every input part is read before the first product."""
    parts = ("dffn",) if down else ("dgate",)
    acts = {n: src.act(n) for n in parts + (("h1", "h3") if up else ())}  # (1, dim | hidden, 1, S) each
    if down:  # without ``up``, dgate is the kernel's one output, its op named so
        dgate = src.linear_t([(acts["dffn"], "w2", "w2")], "dgate", name=None if up else OUTPUT)
    else:
        dgate = acts["dgate"]  # (1, hidden, 1, S)
    if not up:
        return {"dgate": dgate}
    dh1, dh3 = src.kb.gate_grads(dgate, acts["h1"], acts["h3"])  # (1, hidden, 1, S) each: SwiGLU or GeGLU
    dx = src.linear_t([(dh1, "w1", "w1"), (dh3, "w3", "w3")], "dx")  # (1, dim, 1, S)
    return {"dx": dx, "dh1": dh1, "dh3": dh3}


def rmsnorm_bwd_layouts(cfg: ModelConfig) -> tuple[Layout, Layout]:
    """Input and output layouts of the RMSNorm backward kernel."""
    d, s = cfg.dim, cfg.seq_len
    return Layout.of([("dy", d), ("x", d)], s), Layout.of([("dx", d)], s)


def rmsnorm_bwd(cfg: ModelConfig, weights: Weights = None, *, name: str = "rmsnorm_bwd") -> KernelSpec:
    """Input gradient of y = rmsnorm(x) * w, the scale w (dim,) baked from ``weights["w"]``.

    One generator serves every RMSNorm (rms_att, rms_ffn, rms_final: pass that vector as "w" and a
    ``name`` telling the kernels apart); the kernel bakes ``cfg.norm_offset`` + w as the scale. Input:
    concat(dy (dim), x (dim)). Output: dx (dim). With r = (mean(x^2) + eps)^-1/2, xhat = x r and
    g = dy * w: dx = r (g - xhat * mean(g * xhat)). The
    scale's gradient dw = sum over positions of dy * xhat stays on the host (``reference.rmsnorm_bwd``
    returns both).

    Computing through xhat keeps every intermediate at the scale of x r (about 1) or of g; the
    textbook form's r^3 overflows fp16 once the rms of x drops below about 0.025. The sum over
    channels adds g * xhat / sqrt(dim): at most sqrt(dim) rms(g) (Cauchy-Schwarz, rms(xhat) <= 1), so
    it stays finite where the plain sum of g * xhat (up to dim rms(g)) would overflow; r itself comes
    from ``KernelBuilder.rms_inverse``, which pre-scales x the same way.
    """
    inputs, outputs = rmsnorm_bwd_layouts(cfg)
    kb = KernelBuilder(name, cfg, inputs, weights)
    d = cfg.dim
    root = 1.0 / math.sqrt(d)
    dy = kb.part("dy")  # (1, dim, 1, S)
    x = kb.part("x")  # (1, dim, 1, S)
    r = kb.rms_inverse(x, "norm")  # (1, 1, 1, S)
    xhat = kb.f.mul(x=x, y=r, name="xhat")  # (1, dim, 1, S)
    g = kb.f.mul(x=dy, y=kb.norm_scale("w", "w", d), name="g")  # (1, dim, 1, S)
    xhat_s = kb.f.mul(x=xhat, y=root, name="xhat_s")  # (1, dim, 1, S): xhat / sqrt(dim)
    gx = kb.f.mul(x=g, y=xhat_s, name="g_xhat_s")  # (1, dim, 1, S)
    total = kb.f.reduce_sum(x=gx, axes=[1], keep_dims=True, name="g_xhat_sum")  # (1, 1, 1, S)
    mean = kb.f.mul(x=total, y=root, name="g_xhat_mean")  # (1, 1, 1, S)
    proj = kb.f.mul(x=xhat, y=mean, name="proj")  # (1, dim, 1, S)
    dx = kb.f.mul(x=kb.f.sub(x=g, y=proj, name="g_orth"), y=r, name="dx")  # (1, dim, 1, S)
    return kb.finish(outputs, {"dx": dx})
