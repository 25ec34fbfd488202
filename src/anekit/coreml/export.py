"""The llama2.c-style model as a CoreML ML Program: ``prefill`` and ``decode`` sharing KV-cache states.

What the program follows (the empirical-laws reference, ../shared/reference/ane-empirical-laws.md):

* Law 1, layout: every activation is rank 4, batch 1, channels second, the sequence in *height*:
  ``[1, C, T, 1]``. The reference states this shape for the CoreML route, where it was validated with
  MLComputePlan placement checks; anekit's direct kernels put the sequence in width (``[1, C, 1, S]``)
  because the private API's IOSurface rules (``surface.spatial-multiple-16``, ``surface.min-row-bytes``)
  are about the last axis. A CoreML package allocates its own buffers, so those rules hold only for the
  direct route (the rule book's ``routes``); they would fire on any decode step anyway (T = 1).
* Law 2, ops: every projection (wq, wk, wv, wo, w1, w2, w3, the classifier, the RoPE pair swap) is a
  1x1 ``conv`` with a constant weight ``[C_out, C_in, 1, 1]``; the functions are ``<ios18>``.
* Hugging Face variants (``ModelConfig``'s fields after ``rope_theta``): queries and the attention output
  have ``q_dim`` = n_heads x head_dim channels (dim in llama2.c, not in Qwen 3); q / k / v biases are added
  after the projections (Qwen 2); each head of q and k is RMS-normalised before RoPE (Qwen 3); the RoPE
  tables are ``llama.sample.rope_tables``', so rope_theta and Llama 3's rope scaling are in them. Biases and
  norm scales are vectors, stored fp16 as the RMSNorm scales are, under any ``quant``.
* Law 3, int8: ``quantize="int8"`` stores each projection as int8 with one fp16 scale
  (``constexpr_blockwise_shift_scale``, see ``anekit.coreml.quantize``).
* Law 8, KV cache: keys and values live in states ``k_cache_<i>`` / ``v_cache_<i>``
  (``state<tensor<fp16, [1, kv_dim, seq_len, 1]>>``, one pair per layer so shards own their layers'
  caches). ``prefill`` writes a whole cache; ``decode`` reads it, puts the new position in with a
  one-hot ``select`` and writes it back (``read_state`` / ``coreml_update_state``); the cache never
  travels through the function's inputs or outputs.

The functions (T = seq_len for prefill, 1 for decode)::

    prefill(tokens [1,1,T,1] int32, last [1,1,1,1] int32, states) -> logits [1, vocab, 1, 1] of tokens[last]
    decode(token [1,1,1,1] int32, pos [1,1,1,1] int32, states)     -> logits [1, vocab, 1, 1]

A prompt shorter than seq_len is padded (any id): causal attention never lets a position see a later
one, and each padded position's cache entry is overwritten by the decode step that reaches it before
any query may read it. A stage of a sharded export holds a part: the embedding (tokens -> hidden
``y [1, dim, T, 1]``), layers (``x`` -> ``y``, with ``pos`` in decode) or the head (``x`` -> logits,
with ``last`` in prefill); ``anekit.coreml.shards`` chains them.

Weights stream into one MILBlob file through ``anekit.blob.BlobWriter``: each array is converted in
chunks as it is written and referred to as ``BLOBFILE(@model_path/weights/weight.bin, offset)``; both
functions refer to the same blobs, and a tied classifier and the embedding lookup read one weight,
stored once in every format (quantized with the projections under ``quant``); equal values under
two names are written once too. Where the time goes: converting float32 weights to fp16 (or int8) and
writing them; the program itself is small.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anekit.coreml.quantize import INT4_BLOCK, Quantized, quantize
from anekit.kernels.blocks import MASK_VALUE, pair_swap_matrix
from anekit.kernels.config import ModelConfig
from anekit.llama.cpu_forward import rope_table
from anekit.llama.params import Params
from anekit.mil import types as T
from anekit.mil.builder import Builder, FunctionBuilder
from anekit.mil.ir import Program, Var
from anekit.mil.values import blob_literal
from anekit.models import Blocks, Rope, layer_plan, model_for

WEIGHT_PATH = "@model_path/weights/weight.bin"  # the weight file of a CoreML package
FUNCTIONS = ("prefill", "decode")
PROJECTIONS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


@dataclass(frozen=True)
class Stage:
    """What one package computes: the embedding, layers [first, stop), the head (final norm + logits)."""

    embed: bool
    layers: tuple[int, ...]
    head: bool

    @staticmethod
    def whole(cfg: ModelConfig) -> Stage:
        return Stage(True, tuple(range(cfg.n_layers)), True)

    @property
    def label(self) -> str:
        parts = (["embed"] if self.embed else []) + (
            [f"layers{self.layers[0]}-{self.layers[-1]}"] if self.layers else []
        )
        return "-".join(parts + (["head"] if self.head else [])) or "empty"


class WeightSink:
    """Appends constant arrays to a MILBlob writer once each (by key) and hands out BLOBFILE literals.

    ``quant`` ("none", "int8", "int4-block") applies to the projections; ``on_quantized`` is called with
    each quantized weight (the error report). ``append`` is the writer's ``append(data, dtype) -> offset``.
    """

    def __init__(
        self,
        append: Callable[[Any, str], int],
        quant: str = "none",
        on_quantized: Callable[[Quantized], None] | None = None,
    ) -> None:
        self._append = append
        self.quant = quant
        self.on_quantized = on_quantized
        self._offsets: dict[str, int] = {}
        self._stored: dict[tuple[str, str, tuple[int, ...], bytes], int] = {}  # by content
        self._scales: dict[str, np.ndarray] = {}
        self.nbytes = 0

    def blob(
        self, f: FunctionBuilder, key: str, dtype: str, shape: tuple[int, ...], make: Callable[[], Any]
    ) -> Var:
        """A const of ``shape`` whose data is the blob ``key``, written from ``make()`` the first time
        unless a blob of the same values (e.g. two layers' norms at initialization) is there already."""
        if key not in self._offsets:
            data = np.ascontiguousarray(make())
            content = (dtype, data.dtype.str, data.shape, _digest(data))
            if content not in self._stored:
                self._stored[content] = self._append(data, dtype)
                self.nbytes += int(data.size * T.dtype(dtype).bits // 8)
            self._offsets[key] = self._stored[content]
        lit = blob_literal(T.tensor(dtype, shape), WEIGHT_PATH, self._offsets[key])
        return f.const(lit, name=_name(key, shape))

    def projection(self, f: FunctionBuilder, key: str, w: np.ndarray) -> Var:
        """The conv weight [out, in, 1, 1] of ``w`` (out, in): fp16, or dequantized from int8 / int4."""
        shape = (int(w.shape[0]), int(w.shape[1]), 1, 1)
        if self.quant == "none":
            return self.blob(f, key, "fp16", shape, lambda: np.asarray(w).reshape(shape))
        if key not in self._scales:
            q = quantize(self.quant, key, np.asarray(w).reshape(shape))
            self._scales[key] = q.scale
            if self.on_quantized is not None:
                self.on_quantized(q)
            data = self.blob(f, key, q.dtype, shape, lambda: q.data)
        else:
            data = self.blob(f, key, "int4" if self.quant == "int4-block" else "int8", shape, _never)
        scale = self._scales[key]
        if scale.size == 1:  # int8 per tensor: one value, inline (coremltools' form)
            scale_var = f.const(scale.astype(np.float16), name=f"{_name(key, shape)}_scale")
        else:  # int4 per block: a table both functions read from the one blob
            scale_var = self.blob(f, f"{key}.scale", "fp16", scale.shape, lambda: scale)
        return f.constexpr_blockwise_shift_scale(data=data, scale=scale_var, name=f"{_name(key, shape)}_dq")


def _digest(data: np.ndarray) -> bytes:
    return hashlib.blake2b(data.data.cast("B"), digest_size=16).digest()


def _never() -> Any:
    raise AssertionError("a blob was asked for twice without being written")


def _name(key: str, shape: tuple[int, ...]) -> str:
    return key.replace(".", "_") + ("" if len(shape) == 4 else f"_r{len(shape)}")


@dataclass
class _Graph:
    """Builds one function (prefill or decode) of a stage: the model family's layer (``anekit.models``)
    lowered to MIL, each ``Blocks`` method one block over [1, C, T, 1] values.

    An op is named ``l{i}_{role}`` in layer i (``role`` the name the family gives the block: "att_norm",
    "q", "q_rope", "res1", ...) and by its role alone in the embedding and the head; ``renames`` gives a
    stage's output its name ("y") on the op that computes it."""

    f: FunctionBuilder
    cfg: ModelConfig
    params: Params
    sink: WeightSink
    mode: str
    pos4: Var | None = None  # decode: the position [1, 1, 1, 1]
    pos: Var | None = None  # decode: the position (1,), the index of gathers
    last: Var | None = None  # prefill with the head: the position whose logits are returned (1,)
    t: int = field(init=False)  # positions per call: seq_len in prefill, 1 in decode
    layer: int | None = field(init=False, default=None)  # the layer being lowered; None: embedding / head
    renames: dict[str, str] = field(init=False, default_factory=dict)  # role -> the op's name
    _memo: dict[str, Any] = field(init=False, default_factory=dict)
    _states: tuple[Var, Var] | None = field(init=False, default=None)  # this layer's k / v cache states
    _new_v: Var | None = field(init=False, default=None)  # decode: this layer's value, cached with its key
    _cached_v: Var | None = field(init=False, default=None)  # decode: the value cache cache_key wrote

    def __post_init__(self) -> None:
        self.t = self.cfg.seq_len if self.mode == "prefill" else 1
        self.model = model_for(self.cfg)

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()`` the first time ``key`` is asked for in this function, the same value afterwards."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def _tag(self, role: str) -> str:
        """The name of the op that computes ``role``."""
        if role in self.renames:
            return self.renames[role]
        return role if self.layer is None else f"l{self.layer}_{role}"

    def _key(self, weight: str) -> str:
        return weight if self.layer is None else f"layers.{self.layer}.{weight}"

    def _array(self, weight: str) -> np.ndarray:
        p = self.params
        if self.layer is None:
            return p.classifier if weight == "wcls" else getattr(p, weight)
        return getattr(p.layers[self.layer], weight)

    def _scale(self, weight: str, offset: float) -> np.ndarray:
        g = self._array(weight)
        return g if not offset else np.float32(offset) + np.asarray(g, np.float32)  # (offset + w)

    # -- pieces ------------------------------------------------------------------------------------

    def conv(self, x: Var, w: Var, name: str) -> Var:
        """A 1x1 conv: [1, in, T, 1] -> [1, out, T, 1] (law 2)."""
        return self.f.conv1x1(x, w, name)

    def fp16(self, key: str, a: Callable[[], np.ndarray], shape: tuple[int, ...]) -> Var:
        return self.once(f"{key}{shape}", lambda: self.sink.blob(self.f, key, "fp16", shape, a))

    def rope_tables(self, channels: int, rope: Rope) -> tuple[Var, Var]:
        """cos / sin [1, channels, T, 1] at this call's positions: the whole table in prefill (positions
        0 .. T-1), the row at ``pos`` in decode. Angles in float32 as run.c (``cpu_forward.rope_table``);
        a layer whose RoPE is not the model's own (a sliding layer's local base) has tables of its own."""
        cfg, s, pos = self.cfg, self.cfg.seq_len, self.pos
        own = "" if rope == Rope(cfg.rope_theta, cfg.rope_scaling) else "_sliding"

        def table(which: int) -> np.ndarray:
            half = rope_table(rope, cfg.head_dim, s)[which]  # (hd/2, S)
            pair = (np.arange(channels) % cfg.head_dim) // 2  # (C,): the pair of each channel in its head
            return half[pair].reshape(1, channels, s, 1)  # (1, C, S, 1)

        def at_pos(which: int, tag: str) -> Var:
            full = self.fp16(
                f"rope_{tag}_{channels}{own}", lambda: table(which), (1, channels, s, 1)
            )  # (1, C, S, 1)
            if pos is None:
                return full
            return self.f.gather(
                x=full, indices=pos, axis=2, name=f"rope_{tag}_{channels}{own}_at"
            )  # (1, C, 1, 1)

        return (
            self.once(f"cos{channels}{own}", lambda: at_pos(0, "cos")),
            self.once(f"sin{channels}{own}", lambda: at_pos(1, "sin")),
        )

    def _rope(self, x: Var, channels: int, cos: Var, sin: Var, tag: str) -> Var:
        """Rotate channel pairs (2i, 2i+1): x cos + (P x) sin, P the pair swap (a, b) -> (-b, a) as a conv."""
        swap = self.fp16(
            f"rope_swap_{channels}",
            lambda: pair_swap_matrix(channels).reshape(channels, channels, 1, 1),
            (channels, channels, 1, 1),
        )
        xc = self.f.mul(x=x, y=cos, name=f"{tag}_xc")  # (1, C, T, 1)
        ps = self.f.mul(x=self.conv(x, swap, f"{tag}_swap"), y=sin, name=f"{tag}_ps")  # (1, C, T, 1)
        return self.f.add(x=xc, y=ps, name=tag)  # (1, C, T, 1)

    def embedding_table(self) -> Var:
        """The embedding table as a conv weight [vocab, dim, 1, 1], stored once and read by both the lookup
        and, when tied, the classifier: fp16, or under ``quant`` the classifier's quantized form when the
        two share it (an untied table is a lookup, not a projection, and stays fp16)."""
        p, shape = self.params, (self.cfg.vocab_size, self.cfg.dim, 1, 1)
        if p.wcls is None and self.sink.quant != "none":
            return self.once("embedding", lambda: self.sink.projection(self.f, "embed", p.embed))
        return self.fp16("embed", lambda: p.embed.reshape(shape), shape)

    def decode_masks(self) -> tuple[Var, Var]:
        """Decode: where ``pos`` (1,) is in the cache (bool [1, 1, S, 1]) and the attention mask [1, 1, 1, S].

        The mask is row ``pos`` of prefill's causal mask (the same blob), gathered: no ``select`` whose
        condition is larger than its values, a form coremltools' type inference sizes by the values
        alone (``select.type_inference`` broadcasts ``a`` with ``b`` only)."""
        f, s = self.f, self.cfg.seq_len
        # Through the weight sink like every other large const, so the package's weight.bin is the sink's
        # file as written (no const left to append).
        ramp = self.once(
            f"ramp{s}",
            lambda: self.sink.blob(f, "ramp", "int32", (1, 1, s, 1), lambda: np.arange(s, dtype=np.int32)),
        )  # (1, 1, S, 1)
        here = f.equal(x=ramp, y=self.pos4, name="here")  # (1, 1, S, 1) bool
        causal = self.fp16("causal_mask", lambda: _causal_mask(s), (1, 1, s, s))  # (1, 1, S, S)
        return here, f.gather(x=causal, indices=self.pos, axis=2, name="mask")  # (1, 1, 1, S)

    def mask(self, window: int) -> Var:
        """The additive attention mask of this call: causal ([1, 1, T, S] in prefill, row ``pos`` in
        decode), or banded for a sliding layer (key j visible to query i iff i - window < j <= i)."""
        s = self.cfg.seq_len
        if not window:
            if self.pos is None:
                return self.fp16("causal_mask", lambda: _causal_mask(s), (1, 1, s, s))  # (1, 1, T, S)
            return self.once("decode_masks", self.decode_masks)[1]  # (1, 1, 1, S)
        band = self.fp16(f"sliding_mask_{window}", lambda: _banded_mask(s, window), (1, 1, s, s))
        if self.pos is None:
            return band  # (1, 1, T, S)
        return self.once(
            f"sliding_mask_{window}_at",
            lambda: self.f.gather(x=band, indices=self.pos, axis=2, name=f"sliding_mask_{window}_at"),
        )  # (1, 1, 1, S)

    # -- Blocks ---------------------------------------------------------------------------------------

    def rms_norm(self, x: Var, weight: str, *, offset: float, name: str) -> Var:
        """x * (mean over channels of x^2 + eps)^-1/2 * (offset + g); x scaled by 1/sqrt(C) before squaring
        so the fp16 sum cannot overflow (rule numerics.fp16-sum-of-squares), pow(-0.5) not rsqrt
        (op.rane-rejected)."""
        f, c, tag = self.f, self.cfg.dim, self._tag(name)
        g = self._scale(weight, offset)
        xs = f.mul(x=x, y=1.0 / math.sqrt(c), name=f"{tag}_xs")  # (1, C, T, 1)
        sq = f.mul(x=xs, y=xs, name=f"{tag}_sq")  # (1, C, T, 1): x^2 / C
        ms = f.reduce_sum(x=sq, axes=[1], keep_dims=True, name=f"{tag}_ms")  # (1, 1, T, 1)
        r = f.pow(
            x=f.add(x=ms, y=self.cfg.norm_eps, name=f"{tag}_eps"), y=-0.5, name=f"{tag}_r"
        )  # (1, 1, T, 1)
        gv = self.fp16(self._key(weight), lambda: g.reshape(1, c, 1, 1), (1, c, 1, 1))  # (1, C, 1, 1)
        return f.mul(x=f.mul(x=x, y=r, name=f"{tag}_xr"), y=gv, name=f"{tag}_out")  # (1, C, T, 1)

    def head_rms_norm(self, x: Var, weight: str, *, heads: int, offset: float, name: str) -> Var:
        """Each head's head_dim channels of x [1, C, T, 1] RMS-normalised on their own, scaled by
        (offset + g), g (head_dim,): ``cpu_forward.head_rmsnorm``. The same engine-safe form as
        ``rms_norm`` (x scaled by 1/sqrt(head_dim) before squaring, pow(-0.5)), over heads laid out as
        [1, heads, head_dim, T]."""
        f, hd, t, tag = self.f, self.cfg.head_dim, self.t, self._tag(name)
        channels, g = heads * hd, self._scale(weight, offset)
        heads_x = f.reshape(x=x, shape=[1, heads, hd, t], name=f"{tag}_heads")  # (1, H, hd, T)
        xs = f.mul(x=heads_x, y=1.0 / math.sqrt(hd), name=f"{tag}_xs")  # (1, H, hd, T)
        sq = f.mul(x=xs, y=xs, name=f"{tag}_sq")  # (1, H, hd, T): x^2 / hd
        ms = f.reduce_sum(x=sq, axes=[2], keep_dims=True, name=f"{tag}_ms")  # (1, H, 1, T)
        r = f.pow(
            x=f.add(x=ms, y=self.cfg.norm_eps, name=f"{tag}_eps"), y=-0.5, name=f"{tag}_r"
        )  # (1, H, 1, T)
        gv = self.fp16(self._key(weight), lambda: g.reshape(1, 1, hd, 1), (1, 1, hd, 1))  # (1, 1, hd, 1)
        out = f.mul(x=f.mul(x=heads_x, y=r, name=f"{tag}_xr"), y=gv, name=f"{tag}_scaled")  # (1, H, hd, T)
        return f.reshape(x=out, shape=[1, channels, t, 1], name=tag)  # (1, C, T, 1)

    def linear(self, x: Var, weight: str, *, name: str) -> Var:
        w = self.sink.projection(self.f, self._key(weight), self._array(weight))  # (out, in, 1, 1)
        return self.conv(x, w, self._tag(name))  # (1, out, T, 1)

    def bias(self, x: Var, weight: str, *, name: str) -> Var:
        """x + b, b (C,) a const [1, C, 1, 1] in fp16 (a vector, like the RMSNorm scales: never quantized)."""
        b = self._array(weight)
        c = int(b.shape[0])
        bv = self.fp16(self._key(weight), lambda: b.reshape(1, c, 1, 1), (1, c, 1, 1))  # (1, C, 1, 1)
        return self.f.add(x=x, y=bv, name=self._tag(name))  # (1, C, T, 1)

    def rope(self, q: Var, k: Var, *, rope: Rope, name: str) -> tuple[Var, Var]:
        qd, kvd = self.cfg.q_dim, self.cfg.kv_dim  # q_dim = n_heads x head_dim: dim in llama2.c only
        cos_q, sin_q = self.rope_tables(qd, rope)
        cos_k, sin_k = self.rope_tables(kvd, rope) if kvd != qd else (cos_q, sin_q)
        q = self._rope(q, qd, cos_q, sin_q, self._tag(f"q_{name}"))  # (1, q_dim, T, 1)
        k = self._rope(k, kvd, cos_k, sin_k, self._tag(f"k_{name}"))  # (1, kv, T, 1)
        return q, k

    # Each coreml_update_state directly follows the op that makes its value, the order coremltools writes
    # (its canonicalize_inplace_pattern pass inserts before the op after the producer).

    def cache_value(self, v: Var, *, name: str) -> Var:
        """Prefill: this call's values are the whole cache, written as soon as they are made. Decode: kept
        to be put in the cache with this token's key (``cache_key``)."""
        assert self._states is not None
        if self.pos is None:
            return self.f.coreml_update_state(state=self._states[1], value=v, name=self._tag(name))
        self._new_v = v
        return v  # stands for the cache until cache_key writes it

    def cache_key(self, k: Var, *, name: str) -> Var:
        """Prefill: this call's keys are the whole cache (positions 0 .. S-1). Decode: the cache with
        position pos replaced by this token's key (then the value), a one-hot ``select`` each."""
        assert self._states is not None
        f, (k_state, v_state) = self.f, self._states
        if self.pos is None:
            return f.coreml_update_state(state=k_state, value=k, name=self._tag(name))  # (1, kv, S, 1)
        # here: (1, 1, S, 1) bool, true at pos; mask: (1, 1, 1, S). Made once, read by every layer.
        here, _ = self.once("decode_masks", self.decode_masks)
        old_k = f.read_state(input=k_state, name=self._tag("k_old"))  # (1, kv, S, 1)
        new_k = f.select(cond=here, a=k, b=old_k, name=self._tag("k_new"))  # (1, kv, S, 1)
        keys = f.coreml_update_state(state=k_state, value=new_k, name=self._tag(name))  # (1, kv, S, 1)
        old_v = f.read_state(input=v_state, name=self._tag("v_old"))  # (1, kv, S, 1)
        new_v = f.select(cond=here, a=self._new_v, b=old_v, name=self._tag("v_new"))  # (1, kv, S, 1)
        self._cached_v = f.coreml_update_state(state=v_state, value=new_v, name=self._tag("v_cache"))
        return keys

    def attention(self, q: Var, k: Var, v: Var, *, window: int, score_scale: float, name: str) -> Var:
        f, cfg, t, s = self.f, self.cfg, self.t, self.cfg.seq_len
        hd, g, m, tag = cfg.head_dim, cfg.n_kv_heads, cfg.kv_group, self._tag(name)
        values = v if self.pos is None else self._cached_v  # decode: the cache cache_key wrote
        mask = self.mask(window)  # (1, 1, T, S)
        qh = f.reshape(x=q, shape=[g, m, hd, t], name=self._tag("qh"))  # (kv heads, group, hd, T)
        kh = f.reshape(x=k, shape=[g, 1, hd, s], name=self._tag("kh"))  # (kv heads, 1, hd, S)
        vh = f.reshape(x=values, shape=[g, 1, hd, s], name=self._tag("vh"))  # (kv heads, 1, hd, S)
        scores = f.matmul(x=qh, y=kh, transpose_x=True, name=self._tag("scores"))  # (kv heads, group, T, S)
        scaled = f.mul(x=scores, y=score_scale, name=self._tag("scaled"))  # (kv heads, group, T, S)
        masked = f.add(x=scaled, y=mask, name=self._tag("masked"))  # (kv heads, group, T, S)
        probs = f.softmax(x=masked, axis=-1, name=self._tag("probs"))  # (kv heads, group, T, S)
        att = f.matmul(x=vh, y=probs, transpose_y=True, name=tag)  # (kv heads, group, hd, T)
        return f.reshape(x=att, shape=[1, cfg.q_dim, t, 1], name=f"{tag}_x")  # (1, q_dim, T, 1)

    def glu(self, gate: Var, up: Var, *, act: str, name: str) -> Var:
        f = self.f
        if act == "silu":
            a = f.silu(x=gate, name=self._tag("silu"))  # (1, hidden, T, 1)
        else:  # gelu_tanh: the engine's gelu with its mode named (rule op.gelu-mode)
            a = f.gelu(x=gate, mode="TANH_APPROXIMATION", name=self._tag("gelu"))  # (1, hidden, T, 1)
        return f.mul(x=a, y=up, name=self._tag(name))  # (1, hidden, T, 1)

    def add(self, x: Var, y: Var, *, name: str) -> Var:
        return self.f.add(x=x, y=y, name=self._tag(name))  # (1, C, T, 1)

    def scale(self, x: Var, factor: float, *, name: str) -> Var:
        return self.f.mul(x=x, y=factor, name=self._tag(name))  # (1, C, T, 1)

    def embedding(self, tokens: Var, *, name: str) -> Var:
        """tokens [1, 1, T, 1] -> x [1, dim, T, 1]: rows of the embedding table."""
        f, cfg, t = self.f, self.cfg, self.t
        ids = f.reshape(x=tokens, shape=[t], name="ids")  # (T,)
        rows = f.gather(x=self.embedding_table(), indices=ids, axis=0, name="embed_rows")  # (T, dim, 1, 1)
        cols = f.transpose(x=rows, perm=[1, 0, 2, 3], name="embed_cols")  # (dim, T, 1, 1)
        out = self.renames.get(name, f"{name}_x")
        return f.reshape(x=cols, shape=[1, cfg.dim, t, 1], name=out)  # (1, dim, T, 1)

    def classifier(self, x: Var, *, name: str) -> Var:
        """The logits of one position (``last`` in prefill) -> [1, vocab, 1, 1]."""
        f, p = self.f, self.params
        if self.last is not None:
            x = f.gather(x=x, indices=self.last, axis=2, name="final_last")  # (1, dim, 1, 1)
        tied = p.wcls is None  # w: (vocab, dim, 1, 1)
        w = self.embedding_table() if tied else self.sink.projection(f, "wcls", p.classifier)
        return self.conv(x, w, self._tag(name))  # (1, vocab, 1, 1)

    def tap(self, name: str, x: Var) -> Var:
        return x

    # -- the stage's parts ------------------------------------------------------------------------------

    def embed(self, tokens: Var, out: str | None = None) -> Var:
        """The family's embedding; ``out`` names its last op (a stage that ends there)."""
        self.layer = None
        last = "embed_scaled" if self.cfg.embed_scale != 1.0 else "embed"  # Gemma scales what it looks up
        self.renames = {last: out} if out else {}
        x = self.model.embed(self, tokens)  # (1, dim, T, 1)
        self.renames = {}
        return x

    def layer_fn(self, x: Var, i: int, k_state: Var, v_state: Var, out: str | None = None) -> Var:
        """Layer ``i`` of the family over the cached keys / values; ``out`` names its last op."""
        self.layer, self._states = i, (k_state, v_state)
        self.renames = {"res2": out} if out else {}
        blocks: Blocks[Var] = self  # the type checker holds _Graph to the protocol here
        x = self.model.layer(blocks, x, self.model.plan(i))  # (1, dim, T, 1)
        self.layer, self._states, self.renames = None, None, {}
        return x

    def head(self, x: Var) -> Var:
        """The family's head of one position -> logits [1, vocab, 1, 1]."""
        self.layer = None
        return self.model.head(self, x)


def _causal_mask(s: int) -> np.ndarray:
    """[1, 1, S, S]: 0 where key position <= query position, the fp16 minimum elsewhere."""
    return np.triu(np.full((s, s), MASK_VALUE, dtype=np.float32), k=1).reshape(1, 1, s, s)


def _banded_mask(s: int, window: int) -> np.ndarray:
    """[1, 1, S, S]: 0 where query - window < key <= query, the fp16 minimum elsewhere."""
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    visible = (j <= i) & (j > i - window)
    return np.where(visible, np.float32(0), np.float32(MASK_VALUE)).reshape(1, 1, s, s)


def stage_function(b: Builder, params: Params, stage: Stage, sink: WeightSink, mode: str) -> None:
    """Add ``prefill`` or ``decode`` of ``stage`` to the program being built."""
    cfg = params.cfg
    f = b.function(mode, opset="ios18")
    g = _Graph(f, cfg, params, sink, mode)
    t = g.t
    one: list[int | str] = [1, 1, 1, 1]
    shape: list[int | str] = [1, 1, t, 1]
    # A stage without the head returns the hidden state as "y", named on the op that computes it.
    out_name = None if stage.head else "y"
    if stage.embed:
        tokens = f.input("tokens" if mode == "prefill" else "token", T.tensor("int32", shape))
        x = g.embed(tokens, out_name if not stage.layers else None)
    else:
        x = f.input("x", T.tensor("fp16", [1, cfg.dim, t, 1]))
    if mode == "decode" and stage.layers:
        g.pos4 = f.input("pos", T.tensor("int32", one))
        g.pos = f.reshape(x=g.pos4, shape=[1], name="pos_index")  # (1,)
    if mode == "prefill" and stage.head:
        g.last = f.reshape(x=f.input("last", T.tensor("int32", one)), shape=[1], name="last_index")  # (1,)
    cache = T.StateType(T.tensor("fp16", [1, cfg.kv_dim, cfg.seq_len, 1]))
    for n, i in enumerate(stage.layers):
        k_state, v_state = f.input(f"k_cache_{i}", cache), f.input(f"v_cache_{i}", cache)
        x = g.layer_fn(x, i, k_state, v_state, out_name if n == len(stage.layers) - 1 else None)
    f.output(g.head(x) if stage.head else x)


def build_program(params: Params, stage: Stage, sink: WeightSink) -> Program:
    """The two-function program (``prefill``, ``decode``) of one stage, its weights written to ``sink``."""
    b = Builder()
    for mode in FUNCTIONS:
        stage_function(b, params, stage, sink, mode)
    return b.build()


def stage_weight_bytes(cfg: ModelConfig, stage: Stage, quant: str = "none", tied: bool = True) -> int:
    """Bytes of weights one stage writes (projection element size 2, int8 1, int4 0.5; vectors and tables
    fp16): wq / wo sized by q_dim, the biases and q / k norm scales of a Hugging Face model included.

    A tied embedding is the classifier's weight (quantized with it); a stage holding both stores it once."""
    proj = {"none": 2.0, "int8": 1.0, "int4-block": 0.5 + 2 / INT4_BLOCK}[quant]  # int4: + its scales
    d, kv, h, s, v = cfg.dim, cfg.kv_dim, cfg.hidden_dim, cfg.seq_len, cfg.vocab_size
    q = cfg.q_dim
    total = 0.0
    if stage.embed:
        total += (proj if tied else 2) * v * d
    if stage.layers:
        per_layer = proj * (2 * q * d + 2 * kv * d + 3 * h * d) + 2 * 2 * d  # projections, RMSNorm scales
        if cfg.qkv_bias:
            per_layer += 2 * (q + 2 * kv)  # bq, bk, bv in fp16
        if cfg.qk_norm:
            per_layer += 2 * 2 * cfg.head_dim  # q_norm, k_norm in fp16
        if cfg.post_norms:
            per_layer += 2 * 2 * d  # post_att_norm, post_ffn_norm in fp16
        total += len(stage.layers) * per_layer
        # RoPE swap, one pair of tables per RoPE the stage's layers use (a sliding layer's local base has
        # its own), the causal mask, a banded one per sliding window, the decode ramp
        plans = [layer_plan(cfg, i) for i in stage.layers]
        ropes, windows = len({p.rope for p in plans}), len({p.window for p in plans} - {0})
        tables = 2 * (q * q + ropes * 2 * q * s) + (1 + windows) * 2 * s * s + 4 * s
        if kv != q:
            tables += 2 * (kv * kv + ropes * 2 * kv * s)
        total += tables
    if stage.head:
        total += 2 * d + (0 if tied and stage.embed else proj * v * d)
    return int(total)
