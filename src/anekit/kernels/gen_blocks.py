"""The MIL lowering of a model family's blocks for generation: the layer over a KV cache in a surface.

``GenBlocks`` implements ``anekit.models.blocks.Blocks`` over MIL values [1, C, 1, W] fp16 (W the width
of a chunk of tokens), for the generation kernels of ``kernels.generation``. It is a sibling of
``mil_blocks.MilBlocks`` (the training kernels' lowering) that differs where generation differs:

- several layers go into one kernel, so every op and every weight is named after the block's name with
  a layer prefix ``l{i}_`` (``layer`` says which layer the family is lowering);
- ``rope`` reads cos / sin from the input's parts (the host writes them for the chunk's positions each
  call), in the route's form: "conv" (the pair swap as a constant 1x1 conv), "slice" or "matmul" (the
  heads-view forms of ``KernelBuilder.rope_heads``);
- ``cache_key`` / ``cache_value`` return concat(this layer's part of the cache input (capacity slots),
  the chunk's keys / values (W)) along the spatial axis (rule op.concat-axis: axes 1 and 3 only);
- ``attention`` adds the input mask (the cache part, written by the host: 0 where a query sees a slot)
  and a constant causal mask of the chunk (banded for a sliding layer), softmax over capacity + W.

Weights come from a ``source.WeightSource``: ``LayerBaked`` (BLOBFILE consts named ``l{i}_<key>``, 1x1
convs; several layers per kernel) or ``PartPacked`` (``source.Packed``: one block per kernel, weights in
the input's columns after the width columns, as ``kernels.dynamic`` packs them).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import numpy as np

from anekit.blob import build_blob_bytes
from anekit.kernels.blocks import KernelBuilder, pair_swap_matrix
from anekit.kernels.composable import SpatialLayout, dynamic_linear, dynamic_slice
from anekit.kernels.config import ModelConfig
from anekit.kernels.source import Baked, Packed, WeightSource, baked_product, matrix_shape
from anekit.kernels.spec import Layout, LayoutError
from anekit.mil import Var, tensor
from anekit.models.blocks import Rope

# The additive mask's "-inf": a masked score s + MASK_VALUE. A score is bounded by the MAC output port's
# saturation, |s| <= 2^15 (anekit.engine.numerics 'mac.output-ceiling'), so s + MASK_VALUE >= -62768:
# always finite in fp16 (whose largest magnitude is 65504), where -65504 (the training kernels' causal
# mask) overflows to -inf for any s < -16. After the softmax subtracts the row's maximum m (a visible
# score, |m| far under 30000 in a real model), exp(s + MASK_VALUE - m) <= exp(-2^14) is 0 in fp16 (exp(-17)
# is already under the smallest subnormal, 2^-24): a masked slot weighs exactly nothing.
MASK_VALUE = -30000.0


def chunk_mask(width: int, window: int = 0) -> np.ndarray:
    """[1, 1, W, W] float32: query i of the chunk sees its key j iff j <= i (and, ``window`` > 0, i - window
    < j): 0 there, ``MASK_VALUE`` elsewhere."""
    i = np.arange(width)[:, None]
    j = np.arange(width)[None, :]
    visible = (j <= i) & ((i - j < window) if window else True)
    return np.where(visible, 0.0, MASK_VALUE).astype(np.float32).reshape(1, 1, width, width)


@lru_cache(maxsize=16)
def chunk_mask_blob(width: int, window: int = 0) -> bytes:
    """``chunk_mask`` as an fp16 MILBlob (one blob, metadata at 64)."""
    return build_blob_bytes([(chunk_mask(width, window), "fp16")])[0]


def chunk_mask_file(width: int, window: int = 0) -> str:
    """The weight file of the chunk's causal mask: one per width and window, shared by every kernel."""
    tail = f"_window{window}" if window else ""
    return f"@model_path/weights/gen_mask_w{width}{tail}.bin"


class LayerBaked(Baked):
    """``source.Baked`` for a kernel of several layers: the weight ``key`` of layer ``layer`` is the const
    ``l{layer}_{key}``, looked up under that name in the builder's values."""

    def __init__(self, kb: KernelBuilder) -> None:
        super().__init__(kb)
        self.layer = 0

    def _key(self, key: str) -> str:
        return f"l{self.layer}_{key}"

    def scale(self, key: str, channels: int) -> Var:
        return self.kb.norm_scale(self._key(key), self._key(key), channels)  # (1, C, 1, 1)

    def head_scale(self, key: str, n_heads: int) -> Var:
        return self.kb.head_vector(self._key(key), self._key(key), n_heads)  # (1, n*hd, 1, 1)

    def bias(self, key: str, channels: int) -> Var:
        return self.kb.vector(self._key(key), self._key(key), channels)  # (1, C, 1, 1)

    def linear(self, x: Var, key: str, tag: str, rows: Var | None = None) -> Var:
        out, channels = matrix_shape(self.kb.cfg, key)
        name = self._key(key)
        return baked_product(self.kb, x, name, name, out, channels, tag)  # (1, out, 1, W)


class PartPacked(Packed):
    """``source.Packed`` whose activation parts are sliced out of the one activation segment when first
    read, each alone: a kernel that reads only some parts (a full layer of a model with sliding ones
    never reads mask_local) has no slice feeding nothing. A matrix may also share its columns with others,
    stacked along rows in one segment (``generation.mlp_columns`` for an MLP too wide for side-by-side
    segments): its rows are sliced out of that segment."""

    def __init__(
        self, kb: KernelBuilder, columns: SpatialLayout, activations: Layout, offsets: Mapping[str, float]
    ) -> None:
        super().__init__(kb, columns, activations, offsets)
        self._parts: dict[str, Var] = {}

    def linear(self, x: Var, key: str, tag: str, rows: Var | None = None) -> Var:
        found = self._row_source(key)
        if found is None:
            return super().linear(x, key, tag, rows)
        segment, first, count, transposed = found
        w = dynamic_slice(self.kb, self.columns, segment, (first, count), tag=key)  # (1, count, 1, cols)
        if rows is not None:
            return dynamic_linear(self.kb, None, w, tag, transposed, at=rows)  # (1, N, 1, W)
        return dynamic_linear(self.kb, x, w, tag, transposed)  # (1, N, 1, W)

    def _row_source(self, key: str) -> tuple[str, int, int, bool] | None:
        """(segment, first row, rows, holds the transpose) of matrix ``key`` stacked with others in one
        segment; None when a segment holds it alone."""
        for s in self.columns.segments:
            if len(s.sources) < 2:
                continue
            first = 0
            for k, rows, transposed in s.sources:
                if k == key:
                    return s.name, first, rows, transposed
                first += rows
        return None

    def act(self, name: str) -> Var:
        if name not in self._parts:
            segment = self.columns.activation.name
            self._parts[name] = dynamic_slice(
                self.kb, self.columns, segment, self.activations.range(name), tag=name
            )
        return self._parts[name]


def layer_values(weights: Mapping[object, object] | None, layers: range) -> dict[str, np.ndarray] | None:
    """The flat values a ``LayerBaked`` kernel reads: ``l{i}_{key}`` for each layer ``i`` of ``layers``,
    from the mapping layer -> {key: array}."""
    if weights is None:
        return None
    out: dict[str, np.ndarray] = {}
    for i in layers:
        per = weights.get(i)
        if not isinstance(per, Mapping):
            raise LayoutError(f"[generation] no weights for layer {i} (a mapping layer -> {{wq: ...}})")
        for key, a in per.items():
            out[f"l{i}_{key}"] = np.asarray(a, dtype=np.float32)
    return out


class GenBlocks:
    """``Blocks`` over MIL values for one generation kernel (``src.kb``, its config's ``seq_len`` the
    chunk width W). ``cache`` is the kernel's "cache" input and ``cache_layout`` its parts (k{i}, v{i});
    None for a kernel without attention (an MLP block). ``taps[(layer, name)]`` collects what the family
    tapped."""

    def __init__(
        self,
        src: WeightSource,
        *,
        capacity: int,
        cache: Var | None = None,
        cache_layout: Layout | None = None,
    ) -> None:
        self.src = src
        self.kb: KernelBuilder = src.kb
        self.cfg = self.kb.cfg
        self.width = self.cfg.seq_len
        self.capacity = capacity
        self.cache = cache
        self.cache_layout = cache_layout
        self.layer = 0
        self.taps: dict[tuple[int, str], Var] = {}
        self._normed: set[int] = set()
        self._tables: dict[tuple[str, int], Var] = {}  # (input part, heads) -> a table tiled over them
        self._masks: dict[str, Var] = {}  # layer kind -> its [1, 1, W, capacity + W] mask

    def at(self, layer: int) -> GenBlocks:
        """Lower layer ``layer`` next (names and weights take its prefix)."""
        self.layer = layer
        if isinstance(self.src, LayerBaked):
            self.src.layer = layer
        return self

    def _n(self, name: str) -> str:
        return f"l{self.layer}_{name}"

    @property
    def kind(self) -> str:
        return self.cfg.layer_type(self.layer)

    # -- norms -------------------------------------------------------------------------------------

    def rms_norm(self, x: Var, weight: str, *, offset: float, name: str) -> Var:
        """The channel RMSNorm; ``x`` itself with the norm on the host (the kernel's input is the host's
        normalised value, or its output the value the host normalises: Gemma 3's post-norms)."""
        self._check_offset(offset, weight)
        if self.kb.norm_at == "host":
            self._normed.add(id(x))
            return x
        channels = x.type.shape[1]  # type: ignore[attr-defined]
        out = self.kb.rmsnorm(x, self.src.scale(weight, channels), self._n(name))  # (1, C, 1, W)
        self._normed.add(id(out))
        return out

    def head_rms_norm(self, x: Var, weight: str, *, heads: int, offset: float, name: str) -> Var:
        self._check_offset(offset, weight)
        return self.kb.head_rmsnorm(x, heads, self.src.head_scale(weight, heads), self._n(name))

    def _check_offset(self, offset: float, weight: str) -> None:
        if offset != self.cfg.norm_offset:
            raise LayoutError(
                f"[{self.kb.name}] norm '{weight}' has offset {offset}; the kernels of this config scale "
                f"every norm by {self.cfg.norm_offset} + w"
            )

    # -- projections -------------------------------------------------------------------------------

    def linear(self, x: Var, weight: str, *, name: str) -> Var:
        rows = self.src.shared_rows(x) if id(x) in self._normed else None
        return self.src.linear(x, weight, self._n(name), rows)

    def bias(self, x: Var, weight: str, *, name: str) -> Var:
        channels = x.type.shape[1]  # type: ignore[attr-defined]
        return self.kb.f.add(x=x, y=self.src.bias(weight, channels), name=self._n(name))

    # -- attention ---------------------------------------------------------------------------------

    def _table(self, part: str) -> Var:
        """The input part ``part`` (cos / sin ...), [1, hd, 1, W]."""
        return self.src.act(part)

    def _rope_parts(self, rope: Rope) -> tuple[str, str]:
        """The input parts holding this layer's cos / sin: the local ones for a sliding layer of a config
        whose sliding layers turn by their own base."""
        theta, scaling = self.cfg.kind_rope(self.kind)
        if (rope.theta, rope.scaling) != (theta, scaling):
            raise LayoutError(
                f"[{self.kb.name}] layer {self.layer}: RoPE {rope} is not the {self.kind} layers' (theta "
                f"{theta}, scaling {scaling}) whose tables the host writes"
            )
        return (
            ("cos_local", "sin_local") if self.kind == "sliding" and local_rope(self.cfg) else ("cos", "sin")
        )

    def _tiled(self, part: str, heads: int) -> Var:
        """Table ``part`` [1, hd, 1, W] tiled over ``heads`` heads: [1, heads*hd, 1, W], a channel concat
        made once per kernel."""
        key = (part, heads)
        if key not in self._tables:
            t = self._table(part)
            self._tables[key] = (
                t
                if heads == 1
                else self.kb.f.concat(values=(t,) * heads, axis=1, interleave=False, name=f"{part}_x{heads}")
            )
        return self._tables[key]

    def _head_table(self, part: str) -> Var:
        """Table ``part`` as the heads view reads it: [1, 1, W, hd], made once per kernel."""
        key = (part, 0)
        if key not in self._tables:
            hd, w = self.cfg.head_dim, self.width
            t4 = self.kb.f.reshape(x=self._table(part), shape=[1, 1, hd, w], name=f"{part}_4d")
            self._tables[key] = self.kb.f.transpose(x=t4, perm=[0, 1, 3, 2], name=f"{part}_h")  # (1,1,W,hd)
        return self._tables[key]

    def rope(self, q: Var, k: Var, *, rope: Rope, name: str) -> tuple[Var, Var]:
        cos, sin = self._rope_parts(rope)
        kb, cfg = self.kb, self.cfg
        out = []
        for x, n, tag in ((q, cfg.n_heads, self._n(f"q_{name}")), (k, cfg.n_kv_heads, self._n(f"k_{name}"))):
            if kb.rope_form == "conv":
                out.append(self._rope_conv(x, n, cos, sin, tag))
            elif kb.rope_form in ("slice", "matmul"):
                xh = kb.heads(x, n, tag)  # (1, n, W, hd)
                rot = (
                    kb._rotate_half_matmul(xh, tag)
                    if kb.rope_form == "matmul"
                    else kb._rotate_half_slices(xh, tag)
                )
                xc = kb.f.mul(x=xh, y=self._head_table(cos), name=f"{tag}_xc")  # (1, n, W, hd)
                rs = kb.f.mul(x=rot, y=self._head_table(sin), name=f"{tag}_rs")  # (1, n, W, hd)
                rotated = kb.f.add(x=xc, y=rs, name=f"{tag}_h_rot")  # (1, n, W, hd)
                # the queries stay in the heads view attention reads (merged, they would feed nothing);
                # the keys go back to [1, n*hd, 1, W]: the cache's layout and the output's
                out.append(rotated if x is q else kb.merge_heads(rotated, n, tag))
            else:
                raise LayoutError(
                    f"[{kb.name}] rope '{tag}': this route rotates on the host, not in a kernel"
                )
        return out[0], out[1]

    def _rope_conv(self, x: Var, n: int, cos: str, sin: str, tag: str) -> Var:
        """x * cos + (P x) * sin on [1, C, 1, W], P the constant pair swap as a 1x1 conv (``KernelBuilder
        .rope``'s legacy form), cos / sin the input's tables tiled over the heads."""
        kb = self.kb
        channels = x.type.shape[1]  # type: ignore[attr-defined]
        swap_name = f"rope_swap_{channels}"
        if ("swap", channels) not in self._tables:
            swap = pair_swap_matrix(channels).reshape(channels, channels, 1, 1)
            self._tables[("swap", channels)] = kb.weight(swap_name, (channels, channels, 1, 1), swap)
        swap_w = self._tables[("swap", channels)]
        xc = kb.f.mul(x=x, y=self._tiled(cos, n), name=f"{tag}_xc")  # (1, C, 1, W)
        px = kb.conv(x, swap_w, f"{tag}_swap")  # (1, C, 1, W): (-b, a) per pair
        ps = kb.f.mul(x=px, y=self._tiled(sin, n), name=f"{tag}_ps")  # (1, C, 1, W)
        return kb.f.add(x=xc, y=ps, name=tag)  # (1, C, 1, W)

    def _cached(self, x: Var, part: str, name: str) -> Var:
        """concat(the cache input's part ``part`` [1, kv, 1, capacity], x [1, kv, 1, W]) on the spatial
        axis: [1, kv, 1, capacity + W]."""
        if self.cache is None or self.cache_layout is None:
            raise LayoutError(f"[{self.kb.name}] '{name}': this kernel has no cache input")
        offset, channels = self.cache_layout.range(part)
        past = self.kb.f.slice_by_size(
            x=self.cache, begin=[0, offset, 0, 0], size=[1, channels, 1, self.capacity], name=f"in_{part}"
        )  # (1, kv, 1, capacity)
        return self.kb.f.concat(values=(past, x), axis=3, interleave=False, name=self._n(name))

    def cache_value(self, v: Var, *, name: str) -> Var:
        return self._cached(v, f"v{self.layer}", name)  # (1, kv, 1, capacity + W)

    def cache_key(self, k: Var, *, name: str) -> Var:
        return self._cached(k, f"k{self.layer}", name)  # (1, kv, 1, capacity + W)

    def _long_heads(self, x: Var, n: int, tag: str, *, rows: bool) -> Var:
        """[1, n*hd, 1, L] keys / values over L = capacity + W slots as heads: [1, n, hd, L] (a reshape:
        the keys, the right operand of q @ k with no transposed operand) or, ``rows``, [1, n, L, hd] (the
        values, the right operand of probs @ v)."""
        hd, length = self.cfg.head_dim, x.type.shape[3]  # type: ignore[attr-defined]
        x4 = self.kb.f.reshape(x=x, shape=[1, n, hd, length], name=f"{tag}_4d")  # (1, n, hd, L)
        if not rows:
            return x4
        return self.kb.f.transpose(x=x4, perm=[0, 1, 3, 2], name=f"{tag}_h")  # (1, n, L, hd)

    def _mask(self) -> Var:
        """This layer kind's mask [1, 1, W, capacity + W]: the input's (capacity, W) part transposed to
        query rows, then the chunk's constant causal (banded) mask, made once per kind per kernel."""
        kind = self.kind
        if kind not in self._masks:
            kb, w, cap = self.kb, self.width, self.capacity
            part = "mask_local" if kind == "sliding" else "mask"
            m4 = kb.f.reshape(x=self.src.act(part), shape=[1, 1, cap, w], name=f"{part}_4d")  # (1,1,cap,W)
            past = kb.f.transpose(x=m4, perm=[0, 1, 3, 2], name=f"{part}_rows")  # (1, 1, W, cap)
            window = self.cfg.kind_window(kind)
            path = chunk_mask_file(w, window)
            kb.shared_files[path] = chunk_mask_blob(w, window)
            chunk = kb.f.weight(tensor("fp16", [1, 1, w, w]), path, 64, name=f"{part}_chunk")  # (1, 1, W, W)
            self._masks[kind] = kb.f.concat(
                values=(past, chunk), axis=3, interleave=False, name=f"{part}_all"
            )
        return self._masks[kind]

    def attention(self, q: Var, k: Var, v: Var, *, window: int, score_scale: float, name: str) -> Var:
        kb, cfg = self.kb, self.cfg
        if window != cfg.layer_window(self.layer) or score_scale != cfg.scores_scale:
            raise LayoutError(
                f"[{kb.name}] layer {self.layer}: attention with window {window} and scale {score_scale}; "
                f"the kernel masks to {cfg.layer_window(self.layer)} and scales by {cfg.scores_scale}"
            )
        tag = self._n(name)
        # the queries as RoPE left them: heads (the slice / matmul forms) or [1, q_dim, 1, W]
        heads = (1, cfg.n_heads, self.width, cfg.head_dim)
        as_heads = tuple(q.type.shape) == heads  # type: ignore[attr-defined]
        qh = q if as_heads else kb.heads(q, cfg.n_heads, f"{tag}_qh")  # (1, H, W, hd)
        kh = self._long_heads(k, cfg.n_kv_heads, f"{tag}_kh", rows=False)  # (1, KVH, hd, cap + W)
        vh = self._long_heads(v, cfg.n_kv_heads, f"{tag}_vh", rows=True)  # (1, KVH, cap + W, hd)
        qg = kb.group_queries(qh, f"{tag}_qg")  # (1, KVH, G*W, hd)
        scores = kb.f.matmul(x=qg, y=kh, transpose_x=False, transpose_y=False, name=f"{tag}_qk")
        scores = kb.ungroup(scores, f"{tag}_scores")  # (1, H, W, cap + W)
        scaled = kb.f.mul(x=scores, y=score_scale, name=f"{tag}_scaled")
        masked = kb.f.add(x=scaled, y=self._mask(), name=f"{tag}_masked")
        probs = kb.f.softmax(x=masked, axis=-1, name=f"{tag}_probs")  # (1, H, W, cap + W)
        pg = kb.group_queries(probs, f"{tag}_pg")  # (1, KVH, G*W, cap + W)
        out = kb.f.matmul(x=pg, y=vh, transpose_x=False, transpose_y=False, name=f"{tag}_pv")
        return kb.merge_heads(kb.ungroup(out, f"{tag}_o"), cfg.n_heads, tag)  # (1, q_dim, 1, W)

    # -- MLP and the rest --------------------------------------------------------------------------

    def glu(self, gate: Var, up: Var, *, act: str, name: str) -> Var:
        """act(gate) * up as ``KernelBuilder.gate`` writes it (SwiGLU: h1 * sigmoid(h1); GeGLU: one gelu
        with its mode written), named after the layer."""
        f = self.kb.f
        if act != self.cfg.mlp_act:
            raise LayoutError(
                f"[{self.kb.name}] glu '{name}' with {act}; the config gates with {self.cfg.mlp_act}"
            )
        if act == "gelu_tanh":
            a = f.gelu(x=gate, mode="TANH_APPROXIMATION", name=self._n("h1_gelu"))  # (1, hidden, 1, W)
        else:
            sig = f.sigmoid(x=gate, name=self._n("h1_sigmoid"))  # (1, hidden, 1, W)
            a = f.mul(x=gate, y=sig, name=self._n("h1_silu"))  # (1, hidden, 1, W)
        return f.mul(x=a, y=up, name=self._n(name))  # (1, hidden, 1, W)

    def add(self, x: Var, y: Var, *, name: str) -> Var:
        return self.kb.f.add(x=x, y=y, name=self._n(name))

    def scale(self, x: Var, factor: float, *, name: str) -> Var:
        return self.kb.f.mul(x=x, y=factor, name=self._n(name))

    def embedding(self, tokens: Var, *, name: str) -> Var:
        raise LayoutError(f"[{self.kb.name}] the embedding lookup runs on the host, not in an engine kernel")

    def classifier(self, x: Var, *, name: str) -> Var:
        raise LayoutError(f"[{self.kb.name}] the classifier runs in the head kernels, not in a layer kernel")

    # -- hooks -------------------------------------------------------------------------------------

    def tap(self, name: str, x: Var) -> Var:
        self.taps[(self.layer, name)] = x
        return x


def local_rope(cfg: ModelConfig) -> bool:
    """Whether the sliding layers of ``cfg`` turn by their own RoPE (then the input carries cos_local /
    sin_local): a base set apart from the full layers', or full layers with a scaling the local ones lack."""
    return "sliding" in cfg.layer_kinds and cfg.kind_rope("sliding") != cfg.kind_rope("full")
