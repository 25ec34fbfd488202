"""Generation kernels: layers of a model over a chunk of tokens with the KV cache in a surface, and the head.

A "layers kernel" runs layers [first, last) of the model over a chunk of W tokens at positions
pos .. pos + W - 1 (the first n <= W real, the rest padding whose outputs are ignored). It is the family's
``layer()`` (or, with the norm on the host, its ``attention()`` / ``mlp()`` block alone) lowered by
``gen_blocks.GenBlocks``: no second writing of the layer. Its two inputs (each kernel owns its surfaces;
the host copies between kernels' surfaces, rule surface.shared-between-kernels)::

    x      [1, C_act, 1, W]   parts: x (dim), cos, sin (head_dim; RoPE at the chunk's positions, each
                              pair's angle on both its channels), cos_local, sin_local (when sliding
                              layers turn by their own base), mask (capacity), mask_local (capacity, when
                              the config has sliding layers): additive, channel j / column i is 0 where
                              query i sees cache slot j, ``MASK_VALUE`` elsewhere. With dynamic weights
                              the weight columns follow the W columns (``kernels.dynamic``'s packing)
    cache  [1, 2 L kv, 1, cap] parts k{l}, v{l} for each layer l of the kernel; slot j = position j

and ONE output (at most two per kernel on M5, rule surface.max-outputs) ``out`` [1, dim + 2 L kv, 1, W]:
x (the residual stream after the last layer; a one-block kernel: the block's output), then k{l}, v{l}
(the chunk's keys after the q / k norm and RoPE, and its values), which the host writes into the
kernels' cache surfaces in place. No state ops: in-graph KV updates were refused by the compiler
(ANECCompile -14, the issue; sbryngelson/ane-guide chapter 14).

Attention keys are concat(cache slots, the chunk's own keys): the softmax runs over capacity + W, a power
of two (rule op.softmax-axis-size) by ``capacity_for``. A "head kernel" is the final RMSNorm (norm on the
engine) and the classifier of a vocabulary tile [start, stop) (``head_tile_limit``).

Per route (``anekit.kernels.route.KernelRoute``; the engine layer chooses it per chip):

- norm on the engine, baked weights (legacy, baked-fused, baked-fused-rope-matmul): ``layers_kernel``,
  "gen_layers_{first}_{last}_w{W}", as many layers as the plan groups, RoPE in the route's form;
- norm on the host (dynamic-engine-attention): ``attention_kernel`` "gen_attn_{l}_w{W}" and
  ``mlp_kernel`` "gen_mlp_{l}_w{W}", one block each, the host normalising between them, the weights
  packed into "x" once (``pack_weights``);
- attention on the host (conv-host-attention): ``host_attention_kernels``, the conv route's own kernels
  at seq_len = W;
- every route: ``head_kernel`` "gen_head_{start}_{stop}_w{W}"; ``kernel_set`` builds all of one width.

The host writes "x" with ``rope_columns`` and ``cache_mask``; ``gen_weights`` turns a model's Params into
the ``weights`` these take (layer -> {wq: ...}, embed, rms_final, wcls; None: shapes only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anekit.engine.extents import SPATIAL
from anekit.kernels import conv_only, forward
from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.composable import COLUMN_ALIGN, DynamicKernelSpec, Segment, SpatialLayout, dynamic_builder
from anekit.kernels.config import ModelConfig
from anekit.kernels.dynamic import ffn_fwd_dynamic_columns, norm_offsets, sdpa_fwd_dynamic_columns
from anekit.kernels.gen_blocks import MASK_VALUE, GenBlocks, LayerBaked, PartPacked, layer_values, local_rope
from anekit.kernels.route import KernelRoute
from anekit.kernels.source import WeightSource, baked_product
from anekit.kernels.spec import KernelSpec, Layout, LayoutError
from anekit.mil import tensor
from anekit.mil.ir import Program
from anekit.models import model_for
from anekit.runtime.base import Backend, Kernel

# The chunk width of decode: every input / output row >= 64 bytes and spatial a multiple of 16 (rules
# surface.min-row-bytes, surface.spatial-multiple-16) make 32 fp16 columns the narrowest surface.
DECODE_WIDTH = 32
CHANNEL_LIMIT = 65536  # engine.extents CHANNELS: the widest vocabulary tile

Weights = Mapping[Any, Any] | None


class GenerationError(LayoutError):
    """A generation kernel that cannot be built as asked (names the argument and what was expected)."""


@dataclass(frozen=True)
class GenKernel:
    """One generation kernel: its program, the layouts of its inputs "x" (``act``) and "cache" (None: no
    cache input) and of its output ``out``. A dynamic kernel also has ``columns``: the layout of the
    whole "x" surface (activations in the first W columns of segment "act", weights after)."""

    name: str
    program: Program
    act: Layout
    cache: Layout | None
    outputs: Layout
    spec: KernelSpec = field(repr=False, compare=False)
    columns: SpatialLayout | None = None
    layers: tuple[int, ...] = ()  # the model layers the kernel computes
    vocab: tuple[int, ...] = ()  # a head kernel's vocabulary tile (start, stop)

    def weight_files(self) -> dict[str, bytes]:
        """Every BLOBFILE the program refers to, by path."""
        return self.spec.weight_files()

    def compile(self, backend: Backend) -> Kernel:
        return backend.compile(self.program, self.weight_files())

    @property
    def weight_bytes(self) -> int:
        """fp16 bytes of the model's weights the kernel holds (known from shapes alone): its baked
        BLOBFILE consts (the RoPE swap and the masks included), or with dynamic weights the weight
        segments of its "x" surface."""
        if self.columns is not None:
            return 2 * sum(s.rows * s.columns for s in self.columns.segments if s.is_weight)
        shared = sum(len(b) for b in self.spec.shared_files.values())
        return 2 * sum(math.prod(shape) for _, shape, _ in self.spec.weights.entries) + shared

    @property
    def x_shape(self) -> tuple[int, int]:
        """(channels, columns) of the "x" surface."""
        if self.columns is not None:
            return self.columns.channels, self.columns.columns
        return self.act.channels, self.act.spatial

    def pack_x(self, parts: Mapping[str, Any], into: np.ndarray | None = None) -> np.ndarray:
        """The "x" input (C, columns) float32 with the activation ``parts`` written; ``into`` (a buffer
        holding the packed weights, ``pack_weights``) is written in place and returned."""
        c, cols = self.x_shape
        out = np.zeros((c, cols), np.float32) if into is None else into.reshape(c, cols)
        start = 0 if self.columns is None else self.columns.range("act")[0]
        for _, row, n, rows in self.act.part_rows(parts):
            out[row : row + n, start : start + self.act.spatial] = rows
        return out

    def run(
        self, kernel: Kernel | Backend, x: np.ndarray, cache: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Run on a packed "x" (``pack_x``) and a "cache" (channels, capacity); the output parts."""
        k = kernel if isinstance(kernel, Kernel) else self.compile(kernel)
        c, cols = self.x_shape
        arrays: dict[str, Any] = {"x": np.asarray(x).reshape(1, c, 1, cols)}
        if self.cache is not None:
            if cache is None:
                raise GenerationError(f"[{self.name}] needs its cache input ({self.cache.channels} channels)")
            arrays["cache"] = np.asarray(cache).reshape(1, self.cache.channels, 1, self.cache.spatial)
        return self.outputs.split(k(**arrays)["out"])


# -- host-side helpers -------------------------------------------------------------------------------


def capacity_for(seq_len: int, width: int) -> int:
    """Cache slots for a context of ``seq_len`` with chunks of ``width``: (the smallest power of two >=
    seq_len + width) - width, so the softmax over capacity + width keys is a power of two (rule
    op.softmax-axis-size)."""
    if seq_len <= 0 or width <= 0:
        raise GenerationError(f"[generation] seq_len {seq_len} and width {width} must be positive")
    total = 1 << (seq_len + width - 1).bit_length()
    return total - width


def rope_columns(cfg: ModelConfig, positions: Any, kind: str = "full") -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (head_dim, len(positions)) float32: channel c of column i holds the angle positions[i] *
    freq_{c // 2} of a ``kind`` layer (its base and scaling, ``ModelConfig.kind_rope``), each pair's angle on
    both its channels (llama2.c's interleaved pairs)."""
    hd = cfg.head_dim
    theta, scaling = cfg.kind_rope(kind)
    freq = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # (hd / 2,)
    if scaling is not None:
        freq = scaling.apply(freq)
    angle = np.repeat(freq, 2)[:, None] * np.asarray(positions, dtype=np.float64)[None, :]  # (hd, W)
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def cache_mask(capacity: int, pos: int, n: int, width: int, window: int = 0) -> np.ndarray:
    """The additive mask of the cache slots (capacity, width) float32 for a chunk at ``pos`` (n real
    tokens): 0 where query i (position pos + i) sees slot j (j < pos, and pos + i - window < j for a sliding
    layer's ``window`` > 0), ``gen_blocks.MASK_VALUE`` (-30000) elsewhere. Not -inf and not -65504: a
    score plus -30000 stays finite in fp16 for every score the MAC port can give (|s| <= 2^15), and
    exp of it after the softmax's max subtraction is 0 (``gen_blocks.MASK_VALUE``)."""
    if not 0 < n <= width:
        raise GenerationError(f"[generation] chunk of {n} tokens; expected 1..{width}")
    if not 0 <= pos <= capacity:
        raise GenerationError(f"[generation] position {pos} is outside the cache's {capacity} slots")
    j = np.arange(capacity)[:, None]
    i = np.arange(width)[None, :]
    visible = np.broadcast_to(j < pos, (capacity, width))
    if window:
        visible = visible & (j > pos + i - window)
    return np.where(visible, 0.0, MASK_VALUE).astype(np.float32)


def act_layout(cfg: ModelConfig, width: int, capacity: int, *, attention: bool = True) -> Layout:
    """The activation parts of a generation kernel's "x" (module docstring); ``attention`` False: x only
    (an MLP block's kernel)."""
    parts: list[tuple[str, int]] = [("x", cfg.dim)]
    if attention:
        hd = cfg.head_dim
        if cfg.rope:
            parts += [("cos", hd), ("sin", hd)]
            if local_rope(cfg):
                parts += [("cos_local", hd), ("sin_local", hd)]
        parts += [("mask", capacity)]
        if "sliding" in cfg.layer_kinds:
            parts += [("mask_local", capacity)]
    return Layout.of(parts, width)


def cache_layout(cfg: ModelConfig, layers: range, capacity: int) -> Layout:
    """The "cache" input's parts: k{l}, v{l} (kv_dim each) for each layer l."""
    return Layout.of([(f"{t}{i}", cfg.kv_dim) for i in layers for t in ("k", "v")], capacity)


def out_layout(cfg: ModelConfig, layers: range, width: int) -> Layout:
    """The output's parts: x (dim), then k{l}, v{l} (kv_dim each)."""
    return Layout.of([("x", cfg.dim)] + [(f"{t}{i}", cfg.kv_dim) for i in layers for t in ("k", "v")], width)


def gen_weights(params: Any) -> dict[Any, Any]:
    """The ``weights`` mapping of a model's ``anekit.llama.params.Params``: layer -> {wq: ...}, plus embed,
    rms_final and wcls (the classifier: the embedding when tied)."""
    out: dict[Any, Any] = {i: layer.as_dict() for i, layer in enumerate(params.layers)}
    out.update(embed=params.embed, rms_final=params.rms_final, wcls=params.classifier)
    return out


# -- the kernels -------------------------------------------------------------------------------------


def _check(
    cfg: ModelConfig, first: int, last: int, width: int, capacity: int | None, columns: int | None = None
) -> ModelConfig:
    """``cfg`` at the chunk width (its ``seq_len`` the kernels' spatial size), the arguments checked
    (``capacity`` None: a kernel without a cache); ``columns``: a causal copy's chunk (``causal_copy``),
    whose kernel is built at that width."""
    if not 0 <= first < last <= cfg.n_layers:
        raise GenerationError(f"[generation] layers [{first}, {last}) of a {cfg.n_layers}-layer model")
    if width <= 0 or width % 16:
        raise GenerationError(f"[generation] width {width}: expected a positive multiple of 16")
    if columns is not None:
        if not 0 < columns < width:
            raise GenerationError(f"[generation] a causal copy of {columns} columns of width {width}")
        return cfg.with_(seq_len=columns)
    if capacity is not None and (capacity <= 0 or (capacity + width) & (capacity + width - 1)):
        raise GenerationError(
            f"[generation] capacity {capacity}: capacity + width must be a power of two (capacity_for)"
        )
    return cfg.with_(seq_len=width)


def layers_kernel(
    cfg: ModelConfig,
    first: int,
    last: int,
    *,
    width: int,
    capacity: int,
    route: KernelRoute,
    weights: Weights = None,
    columns: int | None = None,
) -> GenKernel:
    """Layers [first, last) of ``cfg`` fused in one kernel "gen_layers_{first}_{last}_w{width}" (baked
    weights, norm on the engine); with the norm on the host, the one-block kernels ``attention_kernel``
    / ``mlp_kernel`` instead (GenerationError here).

    ``columns`` (< width): the kernel's causal copy for the simulator, "gen_layers_{first}_{last}_w{width}
    _c{columns}": the same layers built for a chunk of ``columns`` tokens (the cache as it is, the softmax
    over the cache and ``columns`` keys), whose outputs are the first ``columns`` columns of the kernel's
    wherever the padding columns it drops are masked (``runtime.sim.kernel.SimKernel.causal``). Not an
    engine program: it is narrower than the engine's narrowest surface and its softmax axis is no power
    of two."""
    kcfg = _check(cfg, first, last, width, capacity, columns)
    name = f"gen_layers_{first}_{last}_w{width}" + ("" if columns is None else f"_c{columns}")
    width = kcfg.seq_len  # the chunk the program is built for: ``columns`` in a causal copy
    if route.attention != "engine" or route.norm != "engine" or route.weights != "baked":
        raise GenerationError(
            f"[generation] a fused layers kernel takes baked weights, attention and norm on the engine; "
            f"route is {route.describe()} (use attention_kernel / mlp_kernel, or host_attention_kernels)"
        )
    if last - first > max_fused_layers(cfg):
        raise GenerationError(
            f"[generation] layers [{first}, {last}): the output x + 2 x {last - first} x kv_dim = "
            f"{cfg.dim + 2 * (last - first) * cfg.kv_dim} channels exceeds {CHANNEL_LIMIT} (engine.extents "
            f"CHANNELS); at most {max_fused_layers(cfg)} layers per kernel (max_fused_layers)"
        )
    layers = range(first, last)
    act = act_layout(cfg, width, capacity)
    cache = cache_layout(cfg, layers, capacity)
    kb = KernelBuilder(name, kcfg, act, layer_values(weights, layers), norm="engine", rope=route.rope)
    cache_var = kb.f.input("cache", tensor("fp16", [1, cache.channels, 1, capacity]))
    src = LayerBaked(kb)
    blocks = GenBlocks(src, capacity=capacity, cache=cache_var, cache_layout=cache)
    model = model_for(kcfg)
    x = src.act("x")  # (1, dim, 1, W)
    for i in layers:
        x = model.layer(blocks.at(i), x, model.plan(i))  # (1, dim, 1, W)
    outputs = out_layout(cfg, layers, width)
    parts = {"x": x, **_kv_taps(blocks, layers)}
    spec = kb.finish(outputs, parts)
    return GenKernel(name, spec.program, act, cache, outputs, spec, None, tuple(layers))


def max_fused_layers(cfg: ModelConfig) -> int:
    """The most layers one layers kernel takes: its output (dim + 2 kv_dim per layer) and its cache
    input (2 kv_dim per layer) within 65536 channels (engine.extents CHANNELS)."""
    return (CHANNEL_LIMIT - cfg.dim) // (2 * cfg.kv_dim)


def attention_kernel(
    cfg: ModelConfig,
    layer: int,
    *,
    width: int,
    capacity: int,
    route: KernelRoute,
    weights: Weights = None,
    columns: int | None = None,
) -> GenKernel:
    """The attention block of layer ``layer`` alone, "gen_attn_{layer}_w{width}", for a route with the
    norm on the host: its "x" part is the host's normalised input (rms_att applied) and its output x
    the block's result before the residual add (Gemma 3: before post_att_norm, which the host applies),
    then k{layer}, v{layer}. Weights "dynamic": packed into "x" after the W activation columns
    (``kernels.dynamic``'s sdpa_fwd_dynamic columns, the activation segment widened to every part:
    ``attention_columns``), written once by the host (``pack_weights``); "baked": BLOBFILE consts.
    ``columns``: the simulator's causal copy for a chunk of that many tokens, as ``layers_kernel``'s; a
    dynamic copy's "x" is the kernel's own, its weights in the same columns (``same_weight_columns``),
    the activations in its first ``columns`` columns."""
    kcfg = _check(cfg, layer, layer + 1, width, capacity, columns)
    _check_block_route(route)
    if columns is not None and route.weights == "dynamic":
        full = attention_columns(cfg, width, capacity)
        same_weight_columns(full, attention_columns(cfg, columns, capacity))
    layers = range(layer, layer + 1)
    name = f"gen_attn_{layer}_w{width}" + ("" if columns is None else f"_c{columns}")
    width = kcfg.seq_len  # the chunk the program is built for: ``columns`` in a causal copy
    act = act_layout(cfg, width, capacity)
    cache = cache_layout(cfg, layers, capacity)
    spatial = attention_columns(cfg, width, capacity)
    kb, src, packed = _block_source(name, kcfg, act, route, weights, layers, spatial)
    cache_var = kb.f.input("cache", tensor("fp16", [1, cache.channels, 1, capacity]))
    blocks = GenBlocks(src, capacity=capacity, cache=cache_var, cache_layout=cache).at(layer)
    model = model_for(kcfg)
    out = model.attention(blocks, src.act("x"), model.plan(layer))  # (1, dim, 1, W)
    outputs = out_layout(cfg, layers, width)
    spec = src.finish(outputs, {"x": out, **_kv_taps(blocks, layers)})
    return GenKernel(name, spec.program, act, cache, outputs, spec, packed, (layer,))


def mlp_kernel(
    cfg: ModelConfig,
    layer: int,
    *,
    width: int,
    route: KernelRoute,
    weights: Weights = None,
    columns: int | None = None,
) -> GenKernel:
    """The MLP block of layer ``layer`` alone, "gen_mlp_{layer}_w{width}", for a route with the norm on
    the host: input x (dim) the host's normalised residual stream (rms_ffn applied), output x the block's
    result before the residual add (Gemma 3: before post_ffn_norm). No cache. Weights as
    ``attention_kernel``'s (dynamic: ``mlp_columns``); ``columns``: the simulator's copy for a chunk of
    that many tokens, as ``attention_kernel``'s (a baked MLP kernel needs none: the simulator cuts its
    width itself, ``runtime.sim.columns.narrowed``)."""
    kcfg = _check(cfg, layer, layer + 1, width, None, columns)
    _check_block_route(route)
    layers = range(layer, layer + 1)
    name = f"gen_mlp_{layer}_w{width}" + ("" if columns is None else f"_c{columns}")
    if columns is not None and route.weights == "dynamic":
        same_weight_columns(mlp_columns(cfg, width), mlp_columns(cfg, columns))
    width = kcfg.seq_len  # the chunk the program is built for: ``columns`` in a copy
    act = act_layout(cfg, width, 0, attention=False)
    spatial = mlp_columns(cfg, width)
    _, src, packed = _block_source(name, kcfg, act, route, weights, layers, spatial)
    blocks = GenBlocks(src, capacity=0).at(layer)
    model = model_for(kcfg)
    out = model.mlp(blocks, src.act("x"), model.plan(layer))  # (1, dim, 1, W)
    outputs = Layout.of([("x", cfg.dim)], width)
    spec = src.finish(outputs, {"x": out})
    return GenKernel(name, spec.program, act, None, outputs, spec, packed, (layer,))


def mlp_columns(cfg: ModelConfig, width: int) -> SpatialLayout:
    """The columns of a dynamic MLP kernel's "x": ``kernels.dynamic``'s ffn_fwd_dynamic columns with norm
    "host" (x, W1^T, W3^T, W2 side by side, as maderix's ffnFused packs them) at width W, where they fit
    the 16384 columns of the M1 to M3 (engine.extents SPATIAL). A wider MLP (hidden > ~5400: Gemma 3 1B's
    6912) stacks the three along rows in ONE segment of hidden columns instead, W1^T over W3^T over W2
    (3 dim channels): the same values, a third of the width."""
    base = ffn_fwd_dynamic_columns(cfg.with_(seq_len=width), "host")
    if base.columns <= SPATIAL.limit("any"):
        return base
    d, h = cfg.dim, cfg.hidden_dim
    stacked = Segment("w132", 3 * d, h, (("w1", d, True), ("w3", d, True), ("w2", d, False)))
    return SpatialLayout.of(3 * d, [Segment("act", d, width), stacked], align=COLUMN_ALIGN)


def attention_columns(cfg: ModelConfig, width: int, capacity: int) -> SpatialLayout:
    """The columns of a dynamic attention kernel's "x": ``kernels.dynamic``'s sdpa_fwd_dynamic columns with
    norm "host" (x, Wq^T, Wk^T, Wv^T, Wo^T, the biases, the q / k norm scales) at width W, the activation
    segment holding every part of ``act_layout`` (x, cos, sin, ..., mask) in its W columns."""
    act = act_layout(cfg, width, capacity)
    base = sdpa_fwd_dynamic_columns(cfg.with_(seq_len=width), "host")
    segments = [Segment("act", act.channels, width)] + [s for s in base.segments if s.is_weight]
    return SpatialLayout.of(max(act.channels, base.channels), segments, align=COLUMN_ALIGN)


def _check_block_route(route: KernelRoute) -> None:
    if route.attention != "engine" or route.norm != "host":
        raise GenerationError(
            f"[generation] a one-block kernel is for attention on the engine with the norm on the host; "
            f"route is {route.describe()}"
        )


def _block_source(
    name: str,
    kcfg: ModelConfig,
    act: Layout,
    route: KernelRoute,
    weights: Weights,
    layers: range,
    columns: SpatialLayout,
) -> tuple[KernelBuilder, WeightSource, SpatialLayout | None]:
    """The builder and weight source of a one-block kernel: packed into "x" over ``columns`` (dynamic) or
    baked (``weights`` None: shapes only)."""
    if route.weights == "dynamic":
        kb = dynamic_builder(name, kcfg, columns, norm="host", rope=route.rope)
        offsets = norm_offsets(kcfg, ("q_norm", "k_norm"))
        return kb, PartPacked(kb, columns, act, offsets), columns
    kb = KernelBuilder(name, kcfg, act, layer_values(weights, layers), norm="host", rope=route.rope)
    src = LayerBaked(kb)
    src.layer = layers.start
    return kb, src, None


def pack_weights(kernel: GenKernel, weights: Mapping[Any, Any]) -> np.ndarray:
    """The "x" surface (C, columns) float32 of a dynamic kernel (a one-block kernel, a head tile) with its
    weight columns written (the model's ``weights``: layer -> {wq: ...}, embed, rms_final, wcls) and
    zeros in the activation columns: the host writes it once and then only the W activation columns per
    call (``GenKernel.pack_x(parts, into=...)``)."""
    spec = kernel.spec
    if kernel.columns is None or not isinstance(spec, DynamicKernelSpec):
        raise GenerationError(f"[{kernel.name}] has baked weights: nothing to pack")
    per: Any
    if kernel.vocab:  # a head tile: its classifier rows (and rms_final with the norm on the engine)
        norm = "engine" if "rms_final" in kernel.columns.names else "host"
        per = _head_values(weights, kernel.vocab[0], kernel.vocab[1], norm)
    else:
        (layer,) = kernel.layers
        per = weights.get(layer)
        if not isinstance(per, Mapping):
            raise GenerationError(
                f"[{kernel.name}] no weights for layer {layer} (mapping layer -> {{wq: ...}})"
            )
    out = np.zeros(kernel.x_shape, np.float32)
    for s, start, row, block in kernel.columns.weight_sources(spec.offset(per)):
        out[row : row + block.shape[0], start : start + s.columns] = block
    return out


def _conv_route_kernels(cfg: ModelConfig, weights: Mapping[str, np.ndarray] | None) -> dict[str, KernelSpec]:
    """One layer's conv-route forward kernels at ``cfg.seq_len``, by the name part they take here."""
    return {
        "qkv": conv_only.qkv_fwd(cfg, weights),
        "wo": conv_only.wo_fwd(cfg, weights),
        "ffn": forward.ffn_fwd(cfg, weights, norm="host"),
    }


def host_attention_kernels(
    cfg: ModelConfig,
    width: int,
    weights: Weights = None,
    *,
    tiles: tuple[tuple[int, int], ...] | None = None,
) -> dict[str, GenKernel]:
    """The generation kernels of the "conv-host-attention" route (M1 / M2 under macOS 26: no matmul on
    the engine): per layer i the conv route's own kernels (``kernels.conv_only``) built at seq_len =
    ``width`` — "gen_qkv_{i}_w{W}" (xnorm -> q, k, v: the projections, Qwen 2's biases), "gen_wo_{i}_w{W}"
    (attn -> o), "gen_ffn_{i}_w{W}" (the normalised x -> ffn_out, h1, h3, silu_out: ``forward.ffn_fwd``
    with the norm on the host) — and the head tiles (norm on the host, baked; ``tiles`` (start, stop)
    pairs, default: the vocabulary in tiles of at most 65536). The host runs every norm, the q / k norm,
    RoPE and attention over its own cache between them. By name, in the order a step runs them."""
    if width <= 0 or width % 16:
        raise GenerationError(f"[generation] width {width}: expected a positive multiple of 16")
    kcfg = cfg.with_(seq_len=width)
    route = KernelRoute("baked", "host", "host", "host")
    out: dict[str, GenKernel] = {}
    for i in range(cfg.n_layers):
        per = None
        if weights is not None:
            per = weights.get(i)
            if not isinstance(per, Mapping):
                raise GenerationError(f"[generation] no weights for layer {i} (layer -> {{wq: ...}})")
        for part, spec in _conv_route_kernels(kcfg, per).items():
            name = f"gen_{part}_{i}_w{width}"
            out[name] = GenKernel(name, spec.program, spec.inputs, None, spec.outputs, spec, None, (i,))
    if tiles is None:
        v = cfg.vocab_size
        tiles = tuple((a, min(v, a + CHANNEL_LIMIT)) for a in range(0, v, CHANNEL_LIMIT))
    for start, stop in tiles:
        head = head_kernel(cfg, start, stop, width=width, route=route, weights=weights)
        out[head.name] = head
    return out


def kernel_set(
    cfg: ModelConfig,
    route: KernelRoute,
    *,
    width: int,
    capacity: int,
    groups: tuple[tuple[int, int], ...],
    tiles: tuple[tuple[int, int], ...],
    weights: Weights = None,
) -> dict[str, GenKernel]:
    """Every generation kernel of one width for ``route``, by name, in the order a step runs them: the
    layers (fused per [first, last) of ``groups`` with the norm on the engine; one attention and one MLP
    kernel per layer with it on the host; the conv route's kernels with attention on the host) and then
    the head tiles (start, stop) of ``tiles``."""
    if route.attention == "host":
        return host_attention_kernels(cfg, width, weights, tiles=tiles)
    out: dict[str, GenKernel] = {}
    if route.norm == "host":
        for i in range(cfg.n_layers):
            attn = attention_kernel(cfg, i, width=width, capacity=capacity, route=route, weights=weights)
            mlp = mlp_kernel(cfg, i, width=width, route=route, weights=weights)
            out[attn.name], out[mlp.name] = attn, mlp
    else:
        covered = [i for first, last in groups for i in range(first, last)]
        if covered != list(range(cfg.n_layers)):
            raise GenerationError(
                f"[generation] layer groups {list(groups)} do not cover 0..{cfg.n_layers} in order"
            )
        for first, last in groups:
            k = layers_kernel(cfg, first, last, width=width, capacity=capacity, route=route, weights=weights)
            out[k.name] = k
    for start, stop in tiles:
        head = head_kernel(cfg, start, stop, width=width, route=route, weights=weights)
        out[head.name] = head
    return out


def _kv_taps(blocks: GenBlocks, layers: range) -> dict[str, Any]:
    return {f"{t}{i}": blocks.taps[(i, t)] for i in layers for t in ("k", "v")}


def head_tile_limit(cfg: ModelConfig, width: int, route: KernelRoute) -> int:
    """The widest vocabulary tile a head kernel of ``route`` takes: 65536 channels (engine.extents
    CHANNELS) with baked weights; with dynamic ones the tile's Wq^T columns follow the W activation
    columns (aligned to 64) in a surface at most 16384 wide (engine.extents SPATIAL on the M1 to M3)."""
    if route.weights == "dynamic":
        return SPATIAL.limit("any") - -(-width // COLUMN_ALIGN) * COLUMN_ALIGN
    return CHANNEL_LIMIT


def head_kernel(
    cfg: ModelConfig,
    start: int,
    stop: int,
    *,
    width: int,
    route: KernelRoute,
    weights: Weights = None,
    columns: int | None = None,
) -> GenKernel:
    """The vocabulary tile [start, stop) "gen_head_{start}_{stop}_w{width}": the final RMSNorm (norm on
    the engine; with norm "host" the input is the normalised stream) and the classifier's rows
    start..stop. Input x (dim, W), output logits (stop - start, W). Baked: a 1x1 conv with the rows as
    its weight; dynamic: the rows packed transposed into "x" after the W columns (``pack_weights``) and
    a matmul of the token rows with them (``kernels.dynamic``'s packing rule), at most
    ``head_tile_limit`` wide. ``columns``: the simulator's copy of a dynamic tile for a chunk of that many
    tokens, as ``attention_kernel``'s."""
    limit = head_tile_limit(cfg, width, route)
    if not 0 <= start < stop <= cfg.vocab_size or stop - start > limit:
        raise GenerationError(
            f"[generation] vocabulary tile [{start}, {stop}) of {cfg.vocab_size}: at most {limit} "
            f"channels for {route.weights} weights (head_tile_limit)"
        )
    if width <= 0 or width % 16:
        raise GenerationError(f"[generation] width {width}: expected a positive multiple of 16")
    name = f"gen_head_{start}_{stop}_w{width}" + ("" if columns is None else f"_c{columns}")
    if columns is not None:
        if not 0 < columns < width:
            raise GenerationError(f"[generation] a copy of {columns} columns of width {width}")
        if route.weights == "dynamic":
            same_weight_columns(
                head_columns(cfg, width, start, stop, route.norm),
                head_columns(cfg, columns, start, stop, route.norm),
            )
        width = columns
    kcfg = cfg.with_(seq_len=width)
    act = Layout.of([("x", cfg.dim)], width)
    outputs = Layout.of([("logits", stop - start)], width)
    tile = (start, stop)
    if route.weights == "dynamic":
        spatial = head_columns(cfg, width, start, stop, route.norm)
        kb = dynamic_builder(name, kcfg, spatial, norm=route.norm)
        src = PartPacked(kb, spatial, act, norm_offsets(kcfg, ("rms_final",)))
        x = src.act("x")  # (1, dim, 1, W)
        if route.norm == "engine":
            x = kb.rmsnorm(x, src.scale("rms_final", cfg.dim), "final_norm")  # (1, dim, 1, W)
        logits = src.linear(x, "wcls", "logits")  # (1, tile, 1, W)
        spec: KernelSpec = src.finish(outputs, {"logits": logits})
        return GenKernel(name, spec.program, act, None, outputs, spec, spatial, (), tile)
    kb = KernelBuilder(name, kcfg, act, _head_values(weights, start, stop, route.norm), norm=route.norm)
    x = kb.part("x")  # (1, dim, 1, W)
    if route.norm == "engine":
        x = kb.rmsnorm(x, kb.norm_scale("rms_final", "rms_final", cfg.dim), "final_norm")  # (1, dim, 1, W)
    logits = baked_product(kb, x, "wcls", "wcls", stop - start, cfg.dim, "logits")  # (1, tile, 1, W)
    spec = kb.finish(outputs, {"logits": logits})
    return GenKernel(name, spec.program, act, None, outputs, spec, None, (), tile)


def same_weight_columns(full: SpatialLayout, copy: SpatialLayout) -> None:
    """A dynamic kernel's copy for fewer tokens (``columns``) must read the kernel's own "x": the same
    channels and columns, each weight segment where the kernel has it (a segment as wide as the
    activations, a norm scale repeated over the W columns, starting where the kernel's does: the copy
    reads its first columns, as its own columns read the kernel's), the activations first;
    GenerationError naming the first difference otherwise."""
    if (full.channels, full.columns) != (copy.channels, copy.columns):
        raise GenerationError(
            f"[generation] a dynamic copy's x is {copy.channels} x {copy.columns}, the kernel's "
            f"{full.channels} x {full.columns}: its weights would sit in other columns"
        )
    width, columns = full.range("act")[1], copy.range("act")[1]
    for seg in full.segments:
        if not seg.is_weight:
            continue
        (at, n), (copy_at, copy_n) = full.range(seg.name), copy.range(seg.name)
        if at != copy_at or (n, copy_n) not in ((n, n), (width, columns)):
            raise GenerationError(
                f"[generation] a dynamic copy's weight segment '{seg.name}' at columns "
                f"{copy.range(seg.name)}, the kernel's at {full.range(seg.name)}"
            )
    if full.range("act")[0] != 0 or copy.range("act")[0] != 0:
        raise GenerationError("[generation] a dynamic copy's activations must be its first columns")


def head_columns(cfg: ModelConfig, width: int, start: int, stop: int, norm: str) -> SpatialLayout:
    """The columns of a dynamic head kernel's "x": x (dim x W), the tile's classifier rows transposed
    (dim x tile), and with the norm on the engine rms_final repeated over W columns."""
    d = cfg.dim
    segments = [Segment("act", d, width), Segment("wcls_t", d, stop - start, (("wcls", d, True),))]
    if norm == "engine":
        segments.append(Segment("rms_final", d, width, (("rms_final", d, False),)))
    return SpatialLayout.of(d, segments, align=COLUMN_ALIGN)


def _head_values(weights: Weights, start: int, stop: int, norm: str) -> dict[str, np.ndarray] | None:
    """A head tile's weights: wcls (the classifier's rows start..stop; the embedding when tied) and, with
    the norm on the engine, rms_final."""
    if weights is None:
        return None
    cls = weights.get("wcls")
    cls = weights["embed"] if cls is None else cls
    values = {"wcls": np.asarray(cls, np.float32)[start:stop]}
    if norm == "engine":
        values["rms_final"] = np.asarray(weights["rms_final"], np.float32)
    return values


__all__ = [
    "DECODE_WIDTH",
    "GenKernel",
    "GenerationError",
    "act_layout",
    "attention_columns",
    "attention_kernel",
    "cache_layout",
    "cache_mask",
    "capacity_for",
    "gen_weights",
    "head_columns",
    "head_kernel",
    "head_tile_limit",
    "host_attention_kernels",
    "kernel_set",
    "layers_kernel",
    "max_fused_layers",
    "mlp_columns",
    "mlp_kernel",
    "pack_weights",
    "rope_columns",
]
