"""How a model's generation is cut into kernels: widths, cache capacity, layer groups, vocabulary tiles.

``generation_plan(cfg, route)`` applies the generation facts of the engine layer
(``anekit.engine.generation``), each by its id:

- ``decode_width`` is the fact ``decode-width`` (32: one token padded to 64-byte fp16 rows);
- ``prefill_width`` 128 by default (at most what the context needs, at least the decode width), a multiple
  of 16 (surface.spatial-multiple-16);
- ``capacity`` of a kernel of width W is (the smallest power of two >= seq_len + W) - W, so the attention's
  softmax axis (the cache's slots and the chunk's own keys) is a power of two (rule op.softmax-axis-size);
  refused past the fact ``spatial`` of the route's chip;
- ``groups``: the layer ranges [first, last) of the layers kernels. A fused route puts as many layers in a
  kernel as the fact ``weight-ceiling`` (2 GiB of weights a program) allows; the other routes run one layer
  a group, ``kernels_per_group`` kernels each (two blocks on the dynamic route, three convs on the
  host-attention route). A layer heavier than the ceiling on a baked route is refused: segmenting cannot
  split a layer;
- ``tiles``: equal vocabulary tiles [start, stop) of at most 65536 channels (the fact ``classifier-tile``)
  and at most the weight ceiling each (Qwen 3's 151936 tokens: 3 tiles); with dynamic weights at most
  ``kernels.generation.head_tile_limit`` (the rows travel in the input's columns: the spatial extent);
- ``kernel_count``: the decode set and the prefill set (one set when both widths are equal). Past the fact
  ``loaded-programs`` (120 loaded at once) the plan is refused, naming the limit; when the prefill width
  was not asked for and two sets are too many, prefill runs at the decode width on one set.

Weight bytes count fp16 values and each tensor's 64-byte blob record, the weight file's own layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from anekit.engine.generation import DECODE_WIDTH, SPATIAL_STEP, fact, spatial_limit
from anekit.engine.generation_routes import GenerationCandidate, GenerationRoute, candidate
from anekit.errors import AnekitError
from anekit.kernels.generation import head_tile_limit
from anekit.kernels.route import KernelRoute
from anekit.models.config import ModelConfig

PREFILL_WIDTH = 128  # the default prefill chunk: 4 decode widths, few calls for a prompt
BLOB_RECORD = 64  # a weight's metadata record in the weight file (DESIGN.md "One weight format")
KERNELS_PER_GROUP = {"dynamic-engine-attention": 2, "conv-host-attention": 3}  # unfused routes; fused: 1


class PlanRefused(AnekitError, ValueError):
    """A model the route cannot hold: a layer or tile past a limit, or more kernels than a process loads."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class GenerationPlan:
    """The kernels of one model's generation on one route (the module docstring)."""

    route: str  # a generation route id
    chip: str
    decode_width: int
    prefill_width: int
    capacity: int  # the decode kernels' cache slots
    prefill_capacity: int  # the prefill kernels' cache slots
    groups: tuple[tuple[int, int], ...]  # layer ranges [first, last), one layers kernel (or block set) each
    kernels_per_group: int
    tiles: tuple[tuple[int, int], ...]  # vocabulary tiles [start, stop), one head kernel each
    group_bytes: tuple[int, ...]  # the weight bytes of each group's kernels together
    tile_bytes: tuple[int, ...]

    @property
    def widths(self) -> tuple[int, ...]:
        """The widths kernel sets are built at: decode, then prefill when it differs."""
        return tuple(dict.fromkeys((self.decode_width, self.prefill_width)))

    @property
    def kernels_per_set(self) -> int:
        return len(self.groups) * self.kernels_per_group + len(self.tiles)

    @property
    def kernel_count(self) -> int:
        return self.kernels_per_set * len(self.widths)

    def capacity_for(self, width: int) -> int:
        """The cache slots of the kernels of ``width`` (one of ``widths``)."""
        return self.capacity if width == self.decode_width else self.prefill_capacity

    @property
    def weight_bytes(self) -> tuple[int, ...]:
        """Weight bytes per kernel of one set, in order: each group's (split evenly over its kernels when
        a group has several), then each tile's."""
        per = [b // self.kernels_per_group for b in self.group_bytes for _ in range(self.kernels_per_group)]
        return (*per, *self.tile_bytes)


def capacity(seq_len: int, width: int) -> int:
    """(smallest power of two >= seq_len + width) - width: the cache slots of a kernel of ``width``."""
    return (1 << math.ceil(math.log2(seq_len + width))) - width


def _tensor(*shape: int) -> int:
    return BLOB_RECORD + (2 * math.prod(shape) + 63) // 64 * 64


def layer_bytes(cfg: ModelConfig) -> int:
    """The fp16 weight bytes of one layer: projections, MLP, biases and norms, each with its blob record."""
    d, h, q, kv = cfg.dim, cfg.hidden_dim, cfg.q_dim, cfg.kv_dim
    total = _tensor(q, d) + 2 * _tensor(kv, d) + _tensor(d, q) + 2 * _tensor(h, d) + _tensor(d, h)
    total += 2 * _tensor(d)  # rms_att, rms_ffn
    if cfg.qkv_bias:
        total += _tensor(q) + 2 * _tensor(kv)
    if cfg.qk_norm:
        total += 2 * _tensor(cfg.head_dim)
    if cfg.post_norms:
        total += 2 * _tensor(d)
    return total


def _groups(cfg: ModelConfig, fused: bool, ceiling: int, baked: bool, route: str) -> list[tuple[int, int]]:
    per = layer_bytes(cfg)
    if baked and per > ceiling:
        raise PlanRefused(
            f"[generate] one layer of this model holds {per} bytes of weights, more than the {ceiling} a "
            f"program holds (rule program.weight-ceiling) on route {route}: a layer cannot be segmented"
        )
    if not fused:
        return [(i, i + 1) for i in range(cfg.n_layers)]
    size = max(1, ceiling // per)
    return [(i, min(i + size, cfg.n_layers)) for i in range(0, cfg.n_layers, size)]


def _tiles(cfg: ModelConfig, ceiling: int, cand: GenerationCandidate, widest: int) -> list[tuple[int, int]]:
    limit = int(fact("classifier-tile").value)
    if cand.weights == "dynamic":  # the tile's rows travel in the input's columns, after the W activations
        route = KernelRoute(cand.weights, cand.attention, cand.norm, cand.rope)
        limit = min(limit, head_tile_limit(cfg, widest, route))
    row = 2 * cfg.dim  # fp16 bytes of one vocabulary row of the classifier
    per_tile = min(limit, max(1, (ceiling - BLOB_RECORD) // row))
    n = math.ceil(cfg.vocab_size / per_tile)
    size = math.ceil(cfg.vocab_size / n)
    return [(s, min(s + size, cfg.vocab_size)) for s in range(0, cfg.vocab_size, size)]


def _check_width(width: int, what: str, chip: str) -> None:
    if width < DECODE_WIDTH or width % SPATIAL_STEP:
        raise PlanRefused(
            f"[generate] {what} {width}: a kernel's width is a multiple of {SPATIAL_STEP} and at least "
            f"{DECODE_WIDTH} (rules surface.spatial-multiple-16, surface.min-row-bytes)"
        )
    if width > spatial_limit(chip):
        raise PlanRefused(
            f"[generate] {what} {width} exceeds the spatial limit {spatial_limit(chip)} on {chip}"
        )


def generation_plan(
    cfg: ModelConfig,
    route: GenerationRoute | str,
    *,
    prefill_width: int | None = None,
    weight_ceiling: int | None = None,
) -> GenerationPlan:
    """The plan of ``cfg``'s generation on ``route`` (a GenerationRoute, or a route id: chip "any"); one
    line naming the limit when the route cannot hold the model (the module docstring)."""
    if isinstance(route, str):
        cand, chip = candidate(route), "any"
    else:
        cand, chip = candidate(route.id), route.chip
    ceiling = int(fact("weight-ceiling").value) if weight_ceiling is None else weight_ceiling
    if ceiling <= 0:
        raise PlanRefused(f"[generate] weight_ceiling {ceiling}: expected a positive number of bytes")
    seq = cfg.seq_len
    asked = prefill_width is not None
    if prefill_width is None:
        prefill_width = min(PREFILL_WIDTH, max(DECODE_WIDTH, -(-seq // SPATIAL_STEP) * SPATIAL_STEP))
    _check_width(prefill_width, "prefill_width", chip)
    caps = {w: capacity(seq, w) for w in (DECODE_WIDTH, prefill_width)}
    widest = caps[DECODE_WIDTH] + DECODE_WIDTH
    if widest > spatial_limit(chip):
        raise PlanRefused(
            f"[generate] a context of {seq} needs {widest} attention slots (cache and chunk), more than the "
            f"spatial limit {spatial_limit(chip)} on {chip} (rule extent.spatial): use a shorter context"
        )
    if prefill_width > caps[prefill_width]:
        raise PlanRefused(
            f"[generate] prefill_width {prefill_width} exceeds the cache capacity {caps[prefill_width]} of a "
            f"context of {seq}"
        )
    groups = _groups(cfg, cand.fused, ceiling, cand.weights == "baked", cand.id)
    tiles = _tiles(cfg, ceiling, cand, max(DECODE_WIDTH, prefill_width))
    per_layer = layer_bytes(cfg)
    plan = GenerationPlan(
        cand.id,
        chip,
        DECODE_WIDTH,
        prefill_width,
        caps[DECODE_WIDTH],
        caps[prefill_width],
        tuple(groups),
        KERNELS_PER_GROUP.get(cand.id, 1),
        tuple(tiles),
        tuple(per_layer * (b - a) for a, b in groups),
        tuple(_tensor(b - a, cfg.dim) for a, b in tiles),
    )
    limit = int(fact("loaded-programs").value)
    if plan.kernel_count > limit and not asked:
        plan = _one_set(plan, caps[DECODE_WIDTH])
    if plan.kernel_count > limit:
        raise PlanRefused(
            f"[generate] the plan needs {plan.kernel_count} kernels ({len(plan.widths)} set(s) of "
            f"{plan.kernels_per_set}), more than the {limit} programs a process keeps loaded (rule "
            f"process.loaded-program-ceiling) on route {cand.id}"
        )
    return plan


def _one_set(plan: GenerationPlan, cap: int) -> GenerationPlan:
    """``plan`` with prefill at the decode width: one kernel set serves both."""
    return replace(plan, prefill_width=plan.decode_width, prefill_capacity=cap)


__all__ = [
    "KERNELS_PER_GROUP",
    "PREFILL_WIDTH",
    "GenerationPlan",
    "PlanRefused",
    "capacity",
    "generation_plan",
    "layer_bytes",
]
