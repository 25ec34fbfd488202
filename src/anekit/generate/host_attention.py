"""The host side of generation route "conv-host-attention": projections and MLP on the engine, the rest here.

For chips where no kernel with a matmul or RoPE has a precedent (M1 / M2: ``anekit.engine.generation_routes``)
the engine runs the conv kernels of ``anekit.kernels.conv_only`` — qkv_fwd, wo_fwd, ffn_fwd, baked 1x1
convs and the gate — built for a config whose seq_len is the generation width W (32 to decode a token,
the prefill width for a prompt's chunk), and the classifier as the plan's vocabulary tiles
(``anekit.kernels.generation.host_attention_kernels``). The host
runs every RMSNorm, the q / k norms, RoPE and the attention over a float32 cache in host memory, as
maderix/ANE's first pipeline did (training/forward.h: conv kernels for the projections, the rest on the
CPU).

The layer is the family's (``anekit.models``), lowered by ``EngineBlocks``: the CPU forward's blocks
(``anekit.llama.cpu_forward.CpuBlocks``, its cache and RoPE tables) whose linears are answered by the
engine kernels. ``wq`` runs qkv_fwd on the normalised input and hands out q (``wk`` / ``wv`` its k and
v; Qwen 2's biases are the kernel's, so ``bias`` passes them through); ``wo`` runs wo_fwd; ``w1`` runs
ffn_fwd (``w3``, the gate and ``w2`` hand out h3, silu_out and ffn_out); the classifier runs the tiles. A
call's n <= W real tokens fill columns 0 .. n-1 of the kernel's input; the padding columns' outputs are
never read. Everything a kernel reads is rounded to fp16 by its input surface; the host's arithmetic
stays float32.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from anekit.errors import AnekitError
from anekit.generate.layers import read_columns
from anekit.generate.plan import GenerationPlan
from anekit.kernels.generation import gen_weights, host_attention_kernels
from anekit.kernels.spec import KernelSpec
from anekit.llama.cpu_forward import CpuBlocks, KVCache, check_norm_input
from anekit.llama.params import Params
from anekit.models import Blocks, LayerPlan, model_for
from anekit.runtime.base import Backend, Kernel

# the name part of host_attention_kernels' "gen_{part}_{i}_w{W}" -> the conv route's kernel it is
KERNEL_NAMES = {"qkv": "qkv_fwd", "wo": "wo_fwd", "ffn": "ffn_fwd"}


class KernelSet:
    """The compiled kernels of one width: three per layer and one per vocabulary tile."""

    def __init__(self, params: Params, backend: Backend, plan: GenerationPlan, width: int) -> None:
        self.width = width
        self.layers: list[dict[str, tuple[KernelSpec, Kernel]]] = [{} for _ in range(params.cfg.n_layers)]
        self.tiles: list[tuple[KernelSpec, Kernel]] = []
        kernels = host_attention_kernels(params.cfg, width, gen_weights(params), tiles=plan.tiles)
        try:
            for name, gen in kernels.items():
                compiled = (gen.spec, gen.compile(backend).load())
                if gen.vocab:
                    self.tiles.append(compiled)
                else:
                    (layer,) = gen.layers
                    self.layers[layer][KERNEL_NAMES[name.split("_")[1]]] = compiled
        except BaseException:
            self.close()
            raise

    def run(self, layer: int, name: str, n: int, **parts: np.ndarray) -> dict[str, np.ndarray]:
        """Kernel ``name`` of ``layer`` on the first ``n`` columns (padded to the width): its output parts'
        first n columns."""
        spec, kernel = self.layers[layer][name]
        read_columns(kernel, n)  # the host reads columns 0 .. n-1 alone and pads with zeros itself
        out = spec.run(kernel, **{k: self.pad(v) for k, v in parts.items()})
        return {k: v[:, :n] for k, v in out.items()}

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The tiles' logits of the normalised columns x (dim, n), concatenated: (vocab, n)."""
        n = x.shape[1]
        xp = self.pad(x)
        for _, k in self.tiles:
            read_columns(k, n)
        return np.concatenate([spec.run(k, x=xp)["logits"][:, :n] for spec, k in self.tiles], axis=0)

    def pad(self, x: np.ndarray) -> np.ndarray:
        if x.shape[1] == self.width:
            return x
        out = np.zeros((x.shape[0], self.width), np.float32)
        out[:, : x.shape[1]] = x
        return out

    def close(self) -> None:
        for kernels in self.layers:
            for _, k in kernels.values():
                k.close()
        for _, k in self.tiles:
            k.close()
        self.layers, self.tiles = [], []


class EngineBlocks(CpuBlocks):
    """The CPU forward's blocks with the projections, the MLP and the classifier on the engine kernels of
    ``kernels`` (the module docstring)."""

    def __init__(self, params: Params, cache: KVCache, pos: int, end: int, kernels: KernelSet) -> None:
        super().__init__(params, cache, pos, end)
        self.kernels = kernels
        self.n = end - pos
        self._qkv: Mapping[str, np.ndarray] = {}
        self._ffn: Mapping[str, np.ndarray] = {}

    def _run(self, name: str, **parts: np.ndarray) -> dict[str, np.ndarray]:
        assert self.layer is not None
        return self.kernels.run(self.layer, name, self.n, **parts)

    def linear(self, x: np.ndarray, weight: str, *, name: str) -> np.ndarray:
        if weight == "wq":
            self._qkv = self._run("qkv_fwd", xnorm=x)
            return self._qkv["q"]  # (q_dim, n)
        if weight in ("wk", "wv"):
            return self._qkv["k" if weight == "wk" else "v"]  # (kv_dim, n)
        if weight == "wo":
            return self._run("wo_fwd", attn=x)["o"]  # (dim, n)
        if weight == "w1":
            self._ffn = self._run("ffn_fwd", x=x)
            return self._ffn["h1"]  # (hidden, n)
        if weight == "w3":
            return self._ffn["h3"]  # (hidden, n)
        if weight == "w2":
            return self._ffn["ffn_out"]  # (dim, n)
        raise AnekitError(f"[generate] no engine kernel computes the product by '{weight}' on this route")

    def bias(self, x: np.ndarray, weight: str, *, name: str) -> np.ndarray:
        if weight in ("bq", "bk", "bv"):
            return x  # qkv_fwd adds Qwen 2's biases itself
        return super().bias(x, weight, name=name)

    def glu(self, gate: np.ndarray, up: np.ndarray, *, act: str, name: str) -> np.ndarray:
        return self._ffn["silu_out"]  # (hidden, n): the kernel's gate

    def classifier(self, x: np.ndarray, *, name: str) -> np.ndarray:
        return self.kernels.logits(x)  # (vocab, n)


class HostAttentionRunner:
    """The conv-host-attention route for one model: a kernel set per width of the plan, one host cache."""

    def __init__(self, params: Params, backend: Backend, plan: GenerationPlan) -> None:
        self.params, self.plan, self.cfg = params, plan, params.cfg
        self.model = model_for(self.cfg)
        self.plans: list[LayerPlan] = [self.model.plan(i) for i in range(self.cfg.n_layers)]
        self.cache = KVCache(self.cfg, [p.rope for p in self.plans], self.cfg.seq_len)
        self.sets: dict[int, KernelSet] = {}
        try:
            for w in plan.widths:
                self.sets[w] = KernelSet(params, backend, plan, w)
        except BaseException:
            self.close()
            raise

    def run(self, tokens: np.ndarray, pos: int, width: int) -> np.ndarray:
        """Tokens (n,), n <= width, at positions pos .. pos+n-1 through the kernels of ``width``: the
        last token's logits (vocab,). Keys and values of these positions land in the host cache."""
        end = pos + tokens.shape[0]
        self.cache.reserve(end)
        b = EngineBlocks(self.params, self.cache, pos, end, self.sets[width])
        blocks: Blocks[np.ndarray] = b
        x = self.model.embed(blocks, tokens)  # (dim, n)
        for plan in self.plans:
            b.layer = plan.index
            x = self.model.layer(blocks, x, plan)  # (dim, n)
        b.layer = None
        check_norm_input(x, f"layer {self.cfg.n_layers - 1}'s output", pos)
        return self.model.head(blocks, x[:, -1:])[:, 0]  # (vocab,)

    def reset(self) -> None:
        """Nothing to clear: positions past the one asked for are never read (they are rewritten first)."""

    def close(self) -> None:
        for s in self.sets.values():
            s.close()
        self.sets = {}


__all__ = ["KERNEL_NAMES", "EngineBlocks", "HostAttentionRunner", "KernelSet"]
