"""The work of a generation kernel counted from its shapes alone, op by op as ``anekit.cost.work.count``
counts a program: for a kernel the builders refuse to emit (a conv wider than any with a hardware
precedent, which the route would have to split) and for the kernels of other pipelines the published
generation figures measured (``anekit.cost.gen_pipelines``).

Per op: a 1x1 conv (or a dynamic-weight matmul) costs 2 x out x in x width FLOPs and, baked, out x in
fp16 weight bytes; attention's two matmuls 2 x heads x width x keys x head_dim each over keys = cache
slots + the chunk's own; the softmax ``ELEMENT_OPS``' 5 element ops per score, an RMSNorm 5 per element,
RoPE 3, the gate 3, an add 1. Every op's output is an intermediate (its bytes decide a spill).
"""

from __future__ import annotations

from collections.abc import Sequence

from anekit.cost.work import ELEMENT_OPS, Layer, Work
from anekit.models.config import ModelConfig

FP16, FP32 = 2, 4
NORM_OPS = 5  # an RMSNorm: square, mean, rsqrt, scale, weight (as work.py's layer_norm)
ROPE_OPS = 3  # x cos + rotate(x) sin
GATE_OPS = 3  # act(h1) * h3


def conv(out: int, inp: int, width: int, baked: bool = True) -> Layer:
    """A 1x1 conv (``baked`` False: a matmul reading its weights from the input) inp -> out over width."""
    weights = out * inp * FP16 if baked else 0.0
    return Layer("conv", 2.0 * out * inp * width, 0.0, weights, out, (1, 1), False, (out * width * FP16,))


def elementwise(op: str, elements: float, per: float = 1.0) -> Layer:
    return Layer(op, 0.0, per * elements, 0.0, 0, (), False, (elements * FP16,))


def matmul(flops: float, out_elements: float) -> Layer:
    return Layer("matmul", flops, 0.0, 0.0, 0, (), False, (out_elements * FP16,))


def work(name: str, layers: Sequence[Layer], io_bytes: float) -> Work:
    """A Work from its ops: the totals summed, the largest single output as the live bytes."""
    return Work(
        name,
        flops=sum(x.flops for x in layers),
        element_ops=sum(x.element_ops for x in layers),
        io_bytes=io_bytes,
        weight_bytes=sum(x.weight_bytes for x in layers),
        intermediate_bytes=sum(b for x in layers for b in x.intermediates),
        live_bytes=max((b for x in layers for b in x.intermediates), default=0.0),
        ops=len(layers),
        layers=tuple(layers),
    )


def attention_ops(cfg: ModelConfig, width: int, capacity: int, baked: bool = True) -> list[Layer]:
    """q, k, v (biases, q / k norms), RoPE, scores over cache + chunk, mask, softmax, probs @ v, Wo."""
    d, q, kv, hd, heads = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.head_dim, cfg.n_heads
    scores = heads * width * (capacity + width)
    out = [conv(q, d, width, baked), conv(kv, d, width, baked), conv(kv, d, width, baked)]
    if cfg.qkv_bias:
        out.append(elementwise("add", (q + 2 * kv) * width))
    if cfg.qk_norm:
        out.append(elementwise("rms_norm", (q + kv) * width, NORM_OPS))
    out += [
        elementwise("rope", (q + kv) * width, ROPE_OPS),
        matmul(2.0 * scores * hd, scores),  # (heads, width, keys)
        elementwise("add", scores),  # the mask
        elementwise("softmax", scores, ELEMENT_OPS["softmax"]),
        matmul(2.0 * scores * hd, q * width),  # (q_dim, width)
        conv(d, q, width, baked),
    ]
    if cfg.post_norms:
        out.append(elementwise("rms_norm", d * width, NORM_OPS))
    return out


def mlp_ops(cfg: ModelConfig, width: int, baked: bool = True) -> list[Layer]:
    """W1 and W3, the gate, W2 (and Gemma 3's post-norm)."""
    d, h = cfg.dim, cfg.hidden_dim
    out = [conv(h, d, width, baked), conv(h, d, width, baked), elementwise("gate", h * width, GATE_OPS)]
    out.append(conv(d, h, width, baked))
    if cfg.post_norms:
        out.append(elementwise("rms_norm", d * width, NORM_OPS))
    return out


def conv_route_works(cfg: ModelConfig, width: int) -> tuple[Work, Work, Work]:
    """conv-host-attention's qkv_fwd / wo_fwd / ffn_fwd at ``width`` (``anekit.kernels.conv_only``'s
    surfaces: ffn_fwd's output holds ffn_out, h1, h3 and the gate's output)."""
    d, q, kv, h = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim
    qkv = [conv(q, d, width), conv(kv, d, width), conv(kv, d, width)]
    return (
        work(f"gen_qkv_w{width}", qkv, (d + q + 2 * kv) * width * FP16),
        work(f"gen_wo_w{width}", [conv(d, q, width)], (q + d) * width * FP16),
        work(f"gen_ffn_w{width}", mlp_ops(cfg, width), (2 * d + 3 * h) * width * FP16),
    )


def head_tile_work(cfg: ModelConfig, start: int, stop: int, width: int, norm: bool) -> Work:
    """A head tile: the final RMSNorm (``norm``) and the classifier rows [start, stop)."""
    d, v = cfg.dim, stop - start
    ops = ([elementwise("rms_norm", d * width, NORM_OPS)] if norm else []) + [conv(v, d, width)]
    return work(f"gen_head_{start}_{stop}_w{width}", ops, (d + v) * width * FP16)


def act_channels(cfg: ModelConfig, capacity: int) -> int:
    """Channels of a layers kernel's "x" input: the residual stream, cos / sin (and the local ones), the
    mask (and the local one)."""
    sliding = "sliding" in cfg.layer_types
    tables = 2 * cfg.head_dim * (2 if sliding and cfg.rope_local_theta else 1)
    return cfg.dim + tables + capacity * (2 if sliding else 1)


def fused_layers_work(cfg: ModelConfig, first: int, last: int, width: int, capacity: int) -> Work:
    """The layers kernel over layers [first, last): per layer RMSNorm, attention over the cache and the
    chunk, the residual, RMSNorm, the MLP, the residual; inputs x and the cache, one output."""
    d, kv, n = cfg.dim, cfg.kv_dim, last - first
    ops: list[Layer] = []
    for _ in range(n):
        ops += [elementwise("rms_norm", d * width, NORM_OPS), *attention_ops(cfg, width, capacity)]
        ops += [elementwise("add", d * width), elementwise("rms_norm", d * width, NORM_OPS)]
        ops += [*mlp_ops(cfg, width), elementwise("add", d * width)]
    io = (act_channels(cfg, capacity) * width + 2 * n * kv * capacity + (d + 2 * n * kv) * width) * FP16
    return work(f"gen_layers_{first}_{last}_w{width}", ops, io)


def attention_block_work(cfg: ModelConfig, layer: int, width: int, capacity: int) -> Work:
    """The dynamic route's attention kernel of one layer: its weights in the input surface."""
    d, q, kv = cfg.dim, cfg.q_dim, cfg.kv_dim
    weights = (q * d + 2 * kv * d + d * q) * FP16
    io = (act_channels(cfg, capacity) * width + 2 * kv * capacity + (d + 2 * kv) * width) * FP16 + weights
    return work(f"gen_attn_{layer}_w{width}", attention_ops(cfg, width, capacity, baked=False), io)


def mlp_block_work(cfg: ModelConfig, layer: int, width: int) -> Work:
    """The dynamic route's MLP kernel of one layer: its weights in the input surface."""
    d, h = cfg.dim, cfg.hidden_dim
    io = 2 * d * width * FP16 + 3 * h * d * FP16
    return work(f"gen_mlp_{layer}_w{width}", mlp_ops(cfg, width, baked=False), io)


__all__ = [
    "FP16",
    "FP32",
    "act_channels",
    "attention_block_work",
    "attention_ops",
    "conv",
    "conv_route_works",
    "elementwise",
    "fused_layers_work",
    "head_tile_work",
    "matmul",
    "mlp_block_work",
    "mlp_ops",
    "work",
]
