"""The host side of the fused generation routes: layers kernels reading the KV cache from their own surface.

Routes ``baked-fused``, ``baked-fused-rope-matmul`` and the simulator's ``legacy`` run
``anekit.kernels.generation``'s layers kernels, one per layer group of the plan, and its head kernels, one
per vocabulary tile, at each width of the plan (decode 32, prefill). Per call of a chunk of n <= W tokens at
positions pos .. pos+n-1 the host writes the kernel's "x" input — the residual stream, RoPE's cos / sin at
the chunk's positions, the cache mask (slot j visible to query i iff j < pos, banded for sliding layers) —
runs the kernel, reads its one output's first n columns (x after the group, then each layer's new k and
v) and writes the chunk's k / v columns pos .. pos+n-1 into the kernel's own "cache" input surface in place
(``Surface.write_block``; in the simulator on an input set of its own: ``Compiled``): the cache is never
copied per token, and no surface is bound to two kernels (rule surface.shared-between-kernels). The next
group reads the host's copy of x, its padding columns zeros.

A layers kernel attends over the cache and its own chunk, query i seeing the chunk's keys 0 .. i, so the
padding columns feed no real one: each simulated layers kernel is handed its causal copies
(``causal_copies``: the same kernel built for a chunk of n tokens) and a decode step runs the copy of the
real tokens' columns with the full run's bits (``runtime.sim.kernel.SimKernel.causal``). An engine
kernel computes every column and is told nothing.

The two widths' kernels own separate cache surfaces. Each set knows how many positions its surfaces hold
(``filled``); a set asked to run at pos that holds fewer copies the missing columns, once, from the set
that has them (prefill -> decode: the prompt's keys and values), and running a chunk makes the other set's
columns from pos on stale. The embedding (Gemma's scale included) runs on the host, as the CPU forward's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

import numpy as np

from anekit.errors import AnekitError
from anekit.generate.plan import GenerationPlan
from anekit.kernels.config import ModelConfig
from anekit.kernels.generation import (
    GenKernel,
    cache_mask,
    gen_weights,
    head_kernel,
    layers_kernel,
    pack_weights,
    rope_columns,
)
from anekit.kernels.route import KernelRoute
from anekit.llama.cpu_forward import CpuBlocks, KVCache
from anekit.llama.params import Params
from anekit.mil.ir import Program
from anekit.models import Blocks, model_for
from anekit.runtime.base import Backend, Kernel, Surface
from anekit.runtime.sim import SimKernel


def causal_copies(kernel: Kernel, copy: Callable[[int], GenKernel]) -> None:
    """Hand a simulated kernel its causal copies: ``copy(n)``, the same kernel built for a chunk of n
    tokens (``SimKernel.causal``: a decode kernel told how many of its columns are read then runs the
    narrowest copy that gives those columns' bits); an engine kernel computes every column, so it is told
    nothing."""
    if isinstance(kernel, SimKernel):
        kernel.causal(lambda n: _program_of(copy(n)))


def _program_of(gen: GenKernel) -> tuple[Program, dict[str, bytes]]:
    return gen.program, gen.weight_files()


def copy_at(build: Callable[..., GenKernel], n: int, **kw: Any) -> GenKernel:
    """``build(columns=n, **kw)``: a kernel builder's causal copy for a chunk of n tokens."""
    return build(columns=n, **kw)


def read_columns(kernel: Kernel, n: int | None) -> None:
    """The caller reads only output columns 0 .. n-1 of ``kernel``'s next runs (None: every column): a
    simulated kernel may compute only those (``SimKernel.compute_columns``: the same bits, NaN in the
    others); an engine kernel computes every column whatever it is told, so it is told nothing."""
    if isinstance(kernel, SimKernel):
        kernel.compute_columns(n)


class Compiled:
    """One generation kernel compiled and loaded, with its "x", "cache" and output surfaces (in the
    simulator those of an input set of its own, ``Kernel.input_set``: held surfaces). Each call writes the
    activation columns of "x" as a block, and the chunk's keys and values into the cache as blocks
    (``Surface.write_block``): a held surface rounds and keeps just those, with no decode or comparison of
    the rest. A kernel with dynamic weights (``GenKernel.columns``) gets them
    written into its "x" once, here (the simulator's plan keeps its moves of those unchanged columns
    between runs, ``runtime.sim.kept``)."""

    def __init__(self, gen: GenKernel, backend: Backend, weights: Mapping[Any, Any] | None = None) -> None:
        self.gen = gen
        self.kernel: Kernel = gen.compile(backend).load()
        if gen.columns is not None and weights is None:
            self.kernel.close()
            raise AnekitError(f"[generate] {gen.name} takes its weights in its input: none were given")
        names = self.kernel.input_names
        # the simulator's own input set (held surfaces); an engine kernel runs on its own surfaces, so its
        # large "x" (a dynamic kernel's weights) is not allocated twice
        self.inputs: list[Surface] | None = (
            self.kernel.input_set() if isinstance(self.kernel, SimKernel) else None
        )
        surfaces = self.kernel.inputs if self.inputs is None else self.inputs
        self.x: Surface = surfaces[names.index("x")]
        self.cache: Surface | None = surfaces[names.index("cache")] if "cache" in names else None
        self.out: Surface = self.kernel.outputs[0]
        self.act_start = 0
        if gen.columns is not None:
            assert weights is not None
            self.x.write(pack_weights(gen, weights).reshape(self.x.shape))  # once: the weight columns
            self.act_start = gen.columns.range("act")[0]

    def run(self, parts: Mapping[str, np.ndarray], columns: int | None = None) -> dict[str, np.ndarray]:
        """Write the activation ``parts`` (each (channels, W)) into the "x" surface's activation columns
        and run (the cache surface as it is): the output parts (channels, W). ``columns``: the caller reads
        only output columns 0 .. columns-1 (``read_columns``), and the parts are those columns alone
        (channels, columns); None: every column."""
        act = self.gen.act
        rows = np.zeros((act.channels, act.spatial), np.float32)
        for _, row, n, r in act.part_rows(parts):
            rows[row : row + n] = r
        self.x.write_block(rows, 0, self.act_start)
        read_columns(self.kernel, columns)
        self.kernel.run(self.inputs)
        if columns is None:
            return self.gen.outputs.split(self.out.read())
        layout = self.gen.outputs
        with self.out.view() as buf:  # only the columns read are decoded
            out = buf.reshape(layout.channels, layout.spatial)[:, :columns].astype(np.float32)
        parts, offset = {}, 0
        for name, channels in layout.parts:
            parts[name] = out[offset : offset + channels]
            offset += channels
        return parts

    def write_cache(self, out: Mapping[str, np.ndarray], pos: int, n: int) -> None:
        """The chunk's k{l} / v{l} columns 0..n-1 of ``out`` into this kernel's own "cache" surface at
        positions pos .. pos+n-1, in place: no other column is touched."""
        layout = self.gen.cache
        assert self.cache is not None and layout is not None
        for name in layout.names:
            self.cache.write_block(out[name][:, :n], layout.range(name)[0], pos)

    def close(self) -> None:
        self.kernel.close()


def copy_cache(mine: Iterable[Compiled], theirs: Iterable[Compiled], start: int, stop: int) -> None:
    """Positions start .. stop-1 of the k / v in each of ``theirs``' cache surfaces into the matching one of
    ``mine`` (the same layers, another width's kernels): the one copy between two kernel sets."""
    for m, t in zip(mine, theirs):
        assert m.cache is not None and t.cache is not None
        with t.cache.view() as src, m.cache.view() as dst:
            dst[..., start:stop] = src[..., start:stop]


def catch_up(sets: Iterable[Any], s: Any, pos: int) -> None:
    """Make set ``s`` hold positions 0 .. pos-1: the columns it lacks copied once from a set that has
    them (every set has ``filled`` and ``copy_from``)."""
    if s.filled >= pos:
        return
    donor = next((o for o in sets if o is not s and o.filled >= pos), None)
    if donor is None:
        raise AnekitError(f"[generate] positions {s.filled}..{pos - 1} are in no kernel's cache")
    s.copy_from(donor, s.filled, pos)  # once per switch of widths: only the columns it lacks
    s.filled = pos


def ran(sets: Iterable[Any], s: Any, pos: int, n: int) -> None:
    """Set ``s`` ran positions pos .. pos+n-1: it holds them; every other set's columns from pos are stale."""
    s.filled = pos + n
    for other in sets:
        if other is not s:
            other.filled = min(other.filled, pos)


def host_parts(
    cfg: ModelConfig, capacity: int, width: int, pos: int, n: int, names: Iterable[str]
) -> dict[str, np.ndarray]:
    """RoPE columns and cache masks of a chunk of n tokens at pos, for a kernel whose "x" has parts
    ``names`` (the same for every attention kernel of one width)."""
    names = set(names)
    positions = np.arange(pos, pos + width)
    parts: dict[str, np.ndarray] = {}
    if "cos" in names:
        parts["cos"], parts["sin"] = rope_columns(cfg, positions, "full")
    if "cos_local" in names:
        parts["cos_local"], parts["sin_local"] = rope_columns(cfg, positions, "sliding")
    parts["mask"] = cache_mask(capacity, pos, n, width)
    if "mask_local" in names:
        parts["mask_local"] = cache_mask(capacity, pos, n, width, cfg.sliding_window)
    return parts


def embed(params: Params, tokens: np.ndarray, width: int) -> np.ndarray:
    """The family's embedding of tokens (n,) on the host (Gemma's scale included): (dim, width), the
    padding columns zero."""
    cfg = params.cfg
    blocks: Blocks[np.ndarray] = CpuBlocks(params, KVCache(cfg, [], 0), 0, tokens.shape[0])
    chunk = np.zeros((cfg.dim, width), np.float32)
    chunk[:, : tokens.shape[0]] = model_for(cfg).embed(blocks, tokens)  # (dim, n)
    return chunk


class LayersSet:
    """The layers and head kernels of one width, and how many positions their cache surfaces hold."""

    def __init__(
        self, params: Params, backend: Backend, plan: GenerationPlan, route: KernelRoute, width: int
    ):
        cfg, weights = params.cfg, gen_weights(params)
        self.width, self.capacity = width, plan.capacity_for(width)
        self.groups: list[Compiled] = []
        self.tiles: list[Compiled] = []
        self.filled = 0
        try:
            for first, last in plan.groups:
                gen = layers_kernel(
                    cfg, first, last, width=width, capacity=self.capacity, route=route, weights=weights
                )
                self.groups.append(Compiled(gen, backend, weights))
                # the kernel attends over its own chunk after the cache, the padding masked: causal
                copy = partial(layers_kernel, cfg, first, last, width=width, capacity=self.capacity)
                causal_copies(self.groups[-1].kernel, partial(copy_at, copy, route=route, weights=weights))
            for start, stop in plan.tiles:
                head = head_kernel(cfg, start, stop, width=width, route=route, weights=weights)
                self.tiles.append(Compiled(head, backend))
        except BaseException:
            self.close()
            raise

    def copy_from(self, other: LayersSet, start: int, stop: int) -> None:
        """Positions start .. stop-1 of every layer's k / v from ``other``'s cache surfaces into ours."""
        copy_cache(self.groups, other.groups, start, stop)

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
        self.sets: dict[int, LayersSet] = {}
        try:
            for w in plan.widths:
                self.sets[w] = LayersSet(params, backend, plan, route, w)
        except BaseException:
            self.close()
            raise

    def run(self, tokens: np.ndarray, pos: int, width: int) -> np.ndarray:
        """Tokens (n,), n <= width, at positions pos .. pos+n-1: the last token's logits (vocab,)."""
        s, n = self.sets[width], tokens.shape[0]
        catch_up(self.sets.values(), s, pos)
        x = embed(self.params, tokens, width)  # (dim, W): the padding columns are zeros
        shared = host_parts(self.cfg, s.capacity, width, pos, n, s.groups[0].gen.act.names)
        for group in s.groups:
            # only the real tokens' columns are read: a simulated kernel may run its causal copy
            out = group.run({"x": x, **shared}, columns=n)
            x = np.zeros((self.cfg.dim, width), np.float32)  # the next group's padding: zeros again
            x[:, :n] = out["x"]
            group.write_cache(out, pos, n)  # the chunk's k / v into this kernel's own cache, in place
        ran(self.sets.values(), s, pos, n)
        # the head reads column n-1 alone: a simulated tile computes no more columns than it must
        return np.concatenate([t.run({"x": x}, columns=n)["logits"][:, n - 1] for t in s.tiles])  # (vocab,)

    def reset(self) -> None:
        for s in self.sets.values():
            s.filled = 0

    def close(self) -> None:
        for s in self.sets.values():
            s.close()
        self.sets = {}


__all__ = [
    "Compiled",
    "LayersRunner",
    "LayersSet",
    "catch_up",
    "causal_copies",
    "copy_at",
    "embed",
    "host_parts",
    "ran",
    "read_columns",
]
