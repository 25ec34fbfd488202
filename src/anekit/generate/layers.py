"""The host side of the fused generation routes: layers kernels reading the KV cache from their own surface.

Routes ``baked-fused``, ``baked-fused-rope-matmul`` and the simulator's ``legacy`` run
``anekit.kernels.generation``'s layers kernels, one per layer group of the plan, and its head kernels, one
per vocabulary tile, at each width of the plan (decode 32, prefill). Per call of a chunk of n <= W tokens at
positions pos .. pos+n-1 the host writes the kernel's "x" input — the residual stream, RoPE's cos / sin at
the chunk's positions, the cache mask (slot j visible to query i iff j < pos, banded for sliding layers) —
runs the kernel, reads its one output (x after the group, then each layer's new k and v) and writes the
chunk's k / v columns pos .. pos+n-1 into the kernel's own "cache" input surface in place
(``Surface.view``): the cache is never copied per token, and no surface is bound to two kernels (rule
surface.shared-between-kernels). The next group reads the host's copy of x.

The two widths' kernels own separate cache surfaces. Each set knows how many positions its surfaces hold
(``filled``); a set asked to run at pos that holds fewer copies the missing columns, once, from the set
that has them (prefill -> decode: the prompt's keys and values), and running a chunk makes the other set's
columns from pos on stale. The embedding (Gemma's scale included) runs on the host, as the CPU forward's.
"""

from __future__ import annotations

import numpy as np

from anekit.errors import AnekitError
from anekit.generate.plan import GenerationPlan
from anekit.kernels.generation import (
    GenKernel,
    cache_mask,
    gen_weights,
    head_kernel,
    layers_kernel,
    rope_columns,
)
from anekit.kernels.route import KernelRoute
from anekit.llama.cpu_forward import CpuBlocks, KVCache
from anekit.llama.params import Params
from anekit.models import Blocks, model_for
from anekit.runtime.base import Backend, Kernel, Surface


class _Compiled:
    """One generation kernel compiled and loaded, with its "x", "cache" and output surfaces."""

    def __init__(self, gen: GenKernel, backend: Backend) -> None:
        self.gen = gen
        self.kernel: Kernel = gen.compile(backend).load()
        names = self.kernel.input_names
        self.x: Surface = self.kernel.inputs[names.index("x")]
        self.cache: Surface | None = self.kernel.inputs[names.index("cache")] if "cache" in names else None
        self.out: Surface = self.kernel.outputs[0]

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Run on the packed "x" (the cache surface as it is): the output parts (channels, W)."""
        self.x.write(x.reshape(1, *self.x.shape[1:]) if x.ndim == 2 else x)
        self.kernel.run()
        return self.gen.outputs.split(self.out.read())

    def close(self) -> None:
        self.kernel.close()


class LayersSet:
    """The layers and head kernels of one width, and how many positions their cache surfaces hold."""

    def __init__(
        self, params: Params, backend: Backend, plan: GenerationPlan, route: KernelRoute, width: int
    ):
        cfg, weights = params.cfg, gen_weights(params)
        self.width, self.capacity = width, plan.capacity_for(width)
        self.groups: list[_Compiled] = []
        self.tiles: list[_Compiled] = []
        self.filled = 0
        try:
            for first, last in plan.groups:
                gen = layers_kernel(
                    cfg, first, last, width=width, capacity=self.capacity, route=route, weights=weights
                )
                self.groups.append(_Compiled(gen, backend))
            for start, stop in plan.tiles:
                self.tiles.append(
                    _Compiled(
                        head_kernel(cfg, start, stop, width=width, route=route, weights=weights), backend
                    )
                )
        except BaseException:
            self.close()
            raise

    def copy_from(self, other: LayersSet, start: int, stop: int) -> None:
        """Positions start .. stop-1 of every layer's k / v from ``other``'s cache surfaces into ours."""
        for mine, theirs in zip(self.groups, other.groups):
            assert mine.cache is not None and theirs.cache is not None
            with theirs.cache.view() as src, mine.cache.view() as dst:
                dst[..., start:stop] = src[..., start:stop]

    def close(self) -> None:
        for k in (*self.groups, *self.tiles):
            k.close()
        self.groups, self.tiles = [], []


class LayersRunner:
    """A fused route for one model: a LayersSet per width of the plan (the module docstring)."""

    def __init__(self, params: Params, backend: Backend, plan: GenerationPlan, route: KernelRoute) -> None:
        if route.attention != "engine" or route.norm != "engine" or route.weights != "baked":
            raise AnekitError(
                "[generate] the fused layers kernels take baked weights and everything on the engine, not "
                + route.describe()
            )
        self.params, self.plan, self.cfg = params, plan, params.cfg
        self.model = model_for(self.cfg)
        self.sets: dict[int, LayersSet] = {}
        try:
            for w in plan.widths:
                self.sets[w] = LayersSet(params, backend, plan, route, w)
        except BaseException:
            self.close()
            raise
        self._local = "cos_local" in self.sets[plan.decode_width].groups[0].gen.act.names
        self._banded = "mask_local" in self.sets[plan.decode_width].groups[0].gen.act.names

    def _embed(self, tokens: np.ndarray) -> np.ndarray:
        blocks: Blocks[np.ndarray] = CpuBlocks(self.params, KVCache(self.cfg, [], 0), 0, tokens.shape[0])
        return self.model.embed(blocks, tokens)  # (dim, n)

    def _parts(self, s: LayersSet, pos: int, n: int) -> dict[str, np.ndarray]:
        """RoPE columns and masks of a chunk of n tokens at pos (the same for every group)."""
        positions = np.arange(pos, pos + s.width)
        parts: dict[str, np.ndarray] = {}
        if self.cfg.rope:
            parts["cos"], parts["sin"] = rope_columns(self.cfg, positions, "full")
            if self._local:
                parts["cos_local"], parts["sin_local"] = rope_columns(self.cfg, positions, "sliding")
        parts["mask"] = cache_mask(s.capacity, pos, n, s.width)
        if self._banded:
            parts["mask_local"] = cache_mask(s.capacity, pos, n, s.width, self.cfg.sliding_window)
        return parts

    def _catch_up(self, s: LayersSet, pos: int) -> None:
        if s.filled >= pos:
            return
        donor = next((o for o in self.sets.values() if o is not s and o.filled >= pos), None)
        if donor is None:
            raise AnekitError(f"[generate] positions {s.filled}..{pos - 1} are in no kernel's cache")
        s.copy_from(donor, s.filled, pos)  # once per switch of widths: only the columns it lacks
        s.filled = pos

    def run(self, tokens: np.ndarray, pos: int, width: int) -> np.ndarray:
        """Tokens (n,), n <= width, at positions pos .. pos+n-1: the last token's logits (vocab,)."""
        s, n = self.sets[width], tokens.shape[0]
        self._catch_up(s, pos)
        chunk = np.zeros((self.cfg.dim, width), np.float32)
        chunk[:, :n] = self._embed(tokens)  # (dim, W): the padding columns are zeros
        shared = self._parts(s, pos, n)
        for group, (first, last) in zip(s.groups, self.plan.groups):
            out = group.run(group.gen.pack_x({"x": chunk, **shared}))
            chunk = out["x"]  # (dim, W)
            assert group.cache is not None and group.gen.cache is not None
            with group.cache.view() as buf:  # the chunk's k / v into this kernel's own cache, in place
                rows = buf.reshape(group.gen.cache.channels, s.capacity)
                for i in range(first, last):
                    for t in ("k", "v"):
                        off, c = group.gen.cache.range(f"{t}{i}")
                        rows[off : off + c, pos : pos + n] = out[f"{t}{i}"][:, :n]
        s.filled = pos + n
        for other in self.sets.values():
            if other is not s:
                other.filled = min(other.filled, pos)
        x = chunk.copy()
        logits = [t.run(t.gen.pack_x({"x": x}))["logits"][:, n - 1] for t in s.tiles]
        return np.concatenate(logits)  # (vocab,)

    def reset(self) -> None:
        for s in self.sets.values():
            s.filled = 0

    def close(self) -> None:
        for s in self.sets.values():
            s.close()
        self.sets = {}


__all__ = ["LayersRunner", "LayersSet"]
