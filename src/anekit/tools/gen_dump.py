"""A generation dump (``anekit kernels dump --config MODEL --generate``): the decode and prefill kernels of a
model's generation plan, each as ``NAME/model.mil`` and ``NAME/weights/``, with an index (``kernels.json``)
naming the route, the widths, the cache capacities, the layer groups and vocabulary tiles, and for every
kernel its phase, what it holds (layers [first, last), one layer's block, or a vocabulary tile), its op
count and the parts of each input and output surface.

The route is the engine layer's choice for the chip and macOS (``anekit.engine.generation_routes``; chip
"any": the legacy kernels), the plan ``anekit.generate.plan``'s for that route; the kernels are those of
``plan_kernels``, the same the driver compiles (``anekit.generate.engine``). A preset is dumped with
random llama2.c-style weights (``Params.init``, ``--seed``), a Hugging Face model with its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from anekit.engine.generation_routes import GenerationRoute, generation_route
from anekit.generate.plan import GenerationPlan, generation_plan
from anekit.kernels.config import ModelConfig
from anekit.kernels.generation import GenKernel, gen_weights, kernel_set
from anekit.kernels.route import KernelRoute
from anekit.kernels.spec import KernelSpec, Layout
from anekit.llama.params import Params
from anekit.tools.config import is_preset
from anekit.tools.dump import INDEX, Surface
from anekit.tools.weights import MODEL_PATH

PHASES = ("decode", "prefill")
Weights = Mapping[Any, Any] | None


@dataclass(frozen=True)
class PlannedKernel:
    """One kernel of a plan's set of one width: its name, what it holds (``{"layers": [first, last]}``,
    ``{"layer": i, "block": "attn"}``, ``{"vocab": [start, stop]}``), its spec (program and weight
    files) and the parts of each input surface by MIL input name (a dynamic kernel's "x": the activation
    parts of its first columns; the weights follow them)."""

    name: str
    holds: dict[str, Any]
    spec: KernelSpec
    parts: dict[str, Layout]

    @staticmethod
    def of(holds: dict[str, Any], g: GenKernel) -> PlannedKernel:
        parts = {"x": g.act} if g.cache is None else {"cache": g.cache, "x": g.act}
        return PlannedKernel(g.name, holds, g.spec, parts)


@dataclass(frozen=True)
class DumpedGenKernel:
    """One kernel as the index records it."""

    name: str
    phases: tuple[str, ...]  # "decode", "prefill": the sets it belongs to (both when the widths agree)
    width: int
    holds: dict[str, Any]
    ops: int
    inputs: dict[str, Surface]  # by MIL input name, in binding (alphabetical) order
    output: Surface


def kernel_route(route: GenerationRoute) -> KernelRoute:
    """The kernels' four construct choices of a generation route."""
    return KernelRoute(*route.kernel_route)


def _holds(g: GenKernel) -> dict[str, Any]:
    """What a kernel holds: a vocabulary tile, fused layers [first, last), or one layer's block (the name's
    second word: "attn", "mlp"; the conv route's "qkv", "wo", "ffn")."""
    if g.vocab:
        return {"vocab": list(g.vocab)}
    if g.name.startswith("gen_layers_"):
        return {"layers": [g.layers[0], g.layers[-1] + 1]}
    (layer,) = g.layers
    return {"layer": layer, "block": g.name.split("_")[1]}


def plan_kernels(
    cfg: ModelConfig, route: GenerationRoute, plan: GenerationPlan, width: int, weights: Weights = None
) -> list[PlannedKernel]:
    """The kernels of ``plan``'s set of ``width`` (one of ``plan.widths``), in the order a step runs them
    (``kernels.generation.kernel_set``: each layer group's fused kernel, or each layer's blocks, then a head
    kernel per vocabulary tile); ``weights`` as ``kernels.generation.gen_weights`` gives them (None: shapes
    only)."""
    kernels = kernel_set(
        cfg,
        kernel_route(route),
        width=width,
        capacity=plan.capacity_for(width),
        groups=plan.groups,
        tiles=plan.tiles,
        weights=weights,
    )
    return [PlannedKernel.of(_holds(g), g) for g in kernels.values()]


def model_params(config: str, cfg: ModelConfig, seed: int = 0) -> Params:
    """The weights a generation dump of ``config`` is built with: a preset's random llama2.c-style ones
    (``seed``), a Hugging Face directory's own."""
    if is_preset(config):
        return Params.init(cfg, seed)
    from anekit.hf.model import load_model

    return load_model(config, seq_len=cfg.seq_len).params


@dataclass(frozen=True)
class GenerationDump:
    """What a generation dump holds: the route, the plan and each width's kernels."""

    cfg: ModelConfig
    route: GenerationRoute
    plan: GenerationPlan
    sets: dict[int, list[PlannedKernel]]  # by width, decode's first

    @property
    def names(self) -> list[str]:
        return [k.name for kernels in self.sets.values() for k in kernels]


def generation_kernels(
    config: str, cfg: ModelConfig, chip: str = "any", macos: str = "", seed: int = 0
) -> GenerationDump:
    """The generation route of ``chip`` under ``macos``, its plan for ``cfg`` and every kernel of the plan's
    decode and prefill sets, built with ``model_params``' weights."""
    route = generation_route(chip, macos)
    plan = generation_plan(cfg, route)
    weights = gen_weights(model_params(config, cfg, seed))
    sets = {w: plan_kernels(cfg, route, plan, w, weights) for w in plan.widths}
    return GenerationDump(cfg, route, plan, sets)


def _dumped(k: PlannedKernel, width: int, plan: GenerationPlan) -> DumpedGenKernel:
    phases = tuple(p for p, w in zip(PHASES, (plan.decode_width, plan.prefill_width)) if w == width)
    inputs = {}
    for v in sorted(k.spec.program.main.inputs, key=lambda v: v.name):
        shape = [int(d) for d in v.type.shape]  # type: ignore[attr-defined]
        layout = k.parts.get(v.name, k.spec.inputs if v.name == "x" else None)
        inputs[v.name] = Surface(shape[1], shape[-1], () if layout is None else layout.parts)
    outs = k.spec.outputs
    output = Surface(outs.channels, outs.spatial, outs.parts)
    return DumpedGenKernel(k.name, phases, width, k.holds, k.spec.program.op_count(), inputs, output)


def write_generation(folder: Path, dump: GenerationDump) -> list[DumpedGenKernel]:
    """Each kernel's model.mil and weights/ under ``folder`` (which exists), and the index."""
    dumped = []
    for width, kernels in dump.sets.items():
        for k in kernels:
            (folder / k.name / "weights").mkdir(parents=True)
            (folder / k.name / "model.mil").write_text(k.spec.text(), encoding="utf-8")
            for path, data in k.spec.weight_files().items():
                (folder / k.name / path.removeprefix(MODEL_PATH)).write_bytes(data)
            dumped.append(_dumped(k, width, dump.plan))
    route, plan = dump.route, dump.plan
    record: dict[str, Any] = {
        "config": dump.cfg.name,
        "generate": True,
        "route": {
            "id": route.id,
            "chip": route.chip,
            "macos": route.macos,
            "why": route.why,
            "choices": route.describe(),
        },
        "decode_width": plan.decode_width,
        "prefill_width": plan.prefill_width,
        "capacity": plan.capacity,
        "prefill_capacity": plan.prefill_capacity,
        "groups": [list(g) for g in plan.groups],
        "tiles": [list(t) for t in plan.tiles],
        "kernels": {d.name: _record(d) for d in dumped},
    }
    (folder / INDEX).write_text(json.dumps(record, indent=2) + "\n")
    return dumped


def _record(d: DumpedGenKernel) -> dict[str, Any]:
    out = asdict(replace(d, inputs={}))
    del out["name"]
    out["phases"] = list(d.phases)
    out["inputs"] = {name: asdict(s) for name, s in d.inputs.items()}
    return out
