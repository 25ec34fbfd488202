"""The MIL lowering of a model family's blocks: the engine kernels' forward is the family's layer.

``MilBlocks`` implements ``anekit.models.blocks.Blocks`` over MIL values [1, C, 1, S] fp16, its weights
from a ``WeightSource`` (``source.Baked``: BLOBFILE consts and 1x1 convs; ``source.Packed``: column
segments of the input and token-row matmuls). ``forward.sdpa_forward`` / ``ffn_forward`` hand it to the
family's ``attention`` / ``mlp`` block (``anekit.models.model_for``) and turn what it kept under
``tap`` into the kernel's output taps.

Op names: a block's ``name`` becomes the name of the MIL values it emits, except where the kernels
named them before the family files existed (the names every recorded program hash holds): ``NAMES``
maps those, so the programs stay byte for byte what they were.

Products of a norm's output share one transposed copy of it (token rows ``xn``) when packed: q, k, v of
the attention's normalised input, W1 and W3 of the MLP's (maderix/ANE training/training_dynamic/
mil_dynamic.h sdpaFwd and ffnFused transpose it once); any other product transposes its own input.
"""

from __future__ import annotations

from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.source import WeightSource
from anekit.kernels.spec import LayoutError
from anekit.mil import Var

# block name -> the MIL name the kernels have always given it
NAMES = {"q_norm": "qn", "k_norm": "kn", "down": "ffn"}


class MilBlocks:
    """``Blocks`` over MIL values, for one kernel being built (``src.kb``); ``taps`` collects the values
    the family tapped, by tap name."""

    def __init__(self, src: WeightSource) -> None:
        self.src = src
        self.kb: KernelBuilder = src.kb
        self.cfg = self.kb.cfg
        self.taps: dict[str, Var] = {}
        self._normed: set[int] = set()  # ids of the norms' outputs (their products share token rows)
        self._heads: dict[int, Var] = {}  # id of a [1, C, 1, S] value -> its heads view, where one was made

    # -- norms -------------------------------------------------------------------------------------

    def rms_norm(self, x: Var, weight: str, *, offset: float, name: str) -> Var:
        """The channel RMSNorm; with the norm on the host (``KernelBuilder.norm_at`` "host") ``x`` itself:
        the kernel's input is the host's normalised value (the layer's input norms), or its output is the
        value the host normalises (Gemma 3's post-norms, which then follow the kernel)."""
        self._check_offset(offset, weight)
        if self.kb.norm_at == "host":
            self._normed.add(id(x))
            return x
        channels = x.type.shape[1]  # type: ignore[attr-defined]
        out = self.kb.rmsnorm(x, self.src.scale(weight, channels), NAMES.get(name, name))  # (1, C, 1, S)
        self._normed.add(id(out))
        return out

    def head_rms_norm(self, x: Var, weight: str, *, heads: int, offset: float, name: str) -> Var:
        self._check_offset(offset, weight)
        return self.kb.head_rmsnorm(x, heads, self.src.head_scale(weight, heads), NAMES.get(name, name))

    def _check_offset(self, offset: float, weight: str) -> None:
        """The kernels bake or pack every norm scale as ``cfg.norm_offset`` + w: the family's offset
        must be that one."""
        if offset != self.cfg.norm_offset:
            raise LayoutError(
                f"[{self.kb.name}] norm '{weight}' has offset {offset}; the kernels of this config scale "
                f"every norm by {self.cfg.norm_offset} + w"
            )

    # -- projections -------------------------------------------------------------------------------

    def linear(self, x: Var, weight: str, *, name: str) -> Var:
        rows = self.src.shared_rows(x) if id(x) in self._normed else None
        return self.src.linear(x, weight, NAMES.get(name, name), rows)

    def bias(self, x: Var, weight: str, *, name: str) -> Var:
        channels = x.type.shape[1]  # type: ignore[attr-defined]
        return self.kb.f.add(x=x, y=self.src.bias(weight, channels), name=NAMES.get(name, name))

    # -- attention ---------------------------------------------------------------------------------

    def rope(self, q: Var, k: Var, *, rope: object, name: str) -> tuple[Var, Var]:
        theta, scaling = self.cfg.kind_rope(self.kb.kind)
        if (getattr(rope, "theta", theta), getattr(rope, "scaling", scaling)) != (theta, scaling):
            raise LayoutError(
                f"[{self.kb.name}] RoPE {rope} is not the {self.kb.kind} layers' (theta {theta}, scaling "
                f"{scaling}) whose tables this kernel bakes"
            )
        kb, cfg = self.kb, self.cfg
        if not kb.rotates_heads:
            return kb.rope(q, cfg.q_dim, f"q_{name}"), kb.rope(k, cfg.kv_dim, f"k_{name}")
        # the slice and matmul forms rotate the heads view, which the attention then reads as it is
        rotated = []
        for x, n, tag in ((q, cfg.n_heads, f"q_{name}"), (k, cfg.n_kv_heads, f"k_{name}")):
            xh = kb.rope_heads(kb.heads(x, n, tag), tag)  # (1, n, S, hd)
            flat = kb.merge_heads(xh, n, tag)  # (1, n*hd, 1, S): the tap
            self._heads[id(flat)] = xh
            rotated.append(flat)
        return rotated[0], rotated[1]

    def attention(self, q: Var, k: Var, v: Var, *, window: int, score_scale: float, name: str) -> Var:
        kb, cfg = self.kb, self.cfg
        if window != cfg.kind_window(kb.kind) or score_scale != cfg.scores_scale:
            raise LayoutError(
                f"[{kb.name}] attention with window {window} and scale {score_scale}; this {kb.kind} "
                f"layer's kernel masks to {cfg.kind_window(kb.kind)} and scales by {cfg.scores_scale}"
            )
        probs = kb.attention_probs(
            self._heads_of(q, cfg.n_heads, "qh"), self._heads_of(k, cfg.n_kv_heads, "kh"), name
        )
        out = kb.attend(probs, kb.heads(v, cfg.n_kv_heads, "vh"), name)  # (1, H, S, hd)
        return kb.merge_heads(out, cfg.n_heads, name)  # (1, q_dim, 1, S)

    def _heads_of(self, x: Var, n_heads: int, tag: str) -> Var:
        """The heads view [1, n, S, hd] of ``x``: the one RoPE made, else a new one."""
        made = self._heads.get(id(x))
        return made if made is not None else self.kb.heads(x, n_heads, tag)

    # -- MLP and the rest --------------------------------------------------------------------------

    def glu(self, gate: Var, up: Var, *, act: str, name: str) -> Var:
        if act != self.cfg.mlp_act or name != "gate":
            raise LayoutError(
                f"[{self.kb.name}] glu '{name}' with {act}; the kernels gate with {self.cfg.mlp_act}"
            )
        return self.kb.gate(gate, up)  # (1, hidden, 1, S)

    def add(self, x: Var, y: Var, *, name: str) -> Var:
        return self.kb.f.add(x=x, y=y, name=name)

    def scale(self, x: Var, factor: float, *, name: str) -> Var:
        return self.kb.f.mul(x=x, y=factor, name=name)

    def embedding(self, tokens: Var, *, name: str) -> Var:
        raise LayoutError(f"[{self.kb.name}] the embedding lookup runs on the host, not in an engine kernel")

    def classifier(self, x: Var, *, name: str) -> Var:
        raise LayoutError(f"[{self.kb.name}] the classifier runs on the host, not in a layer kernel")

    # -- hooks -------------------------------------------------------------------------------------

    def tap(self, name: str, x: Var) -> Var:
        self.taps[name] = x
        return x

    def cache_value(self, v: Var, *, name: str) -> Var:
        return v  # a training kernel sees the whole window: no cache

    def cache_key(self, k: Var, *, name: str) -> Var:
        return k
