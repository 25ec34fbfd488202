"""A kernels dump: every kernel of one layer and the head of a model, each as ``NAME/model.mil`` and
``NAME/weights/``, with an index (``kernels.json``) of their ops and surface shapes.

A preset dumps every kernel with random llama2.c-style weights (and, asked, the dynamic-weight
variants); a Hugging Face model dumps what its training runs (dynamic weights, the head being the
CPU's) with its own weights of layer 0. A model with sliding layers (Gemma 3) has its attention kernels
once per layer kind ("sdpa_fwd_dynamic_sliding" beside "sdpa_fwd_dynamic").

With a chip (``--chip C [--macos V]``) a dump holds the kernels of that chip's training route instead
(``anekit.engine.training_routes``: the route under macOS V, or the one that runs under every macOS the
engine layer knows for C), exactly the programs that route's training step compiles
(``anekit.kernels.route_specs``); the index names the route.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from anekit.engine.training_routes import TrainingRoute, training_route
from anekit.kernels import ModelConfig, catalog
from anekit.kernels.route import kernel_route
from anekit.kernels.route_specs import route_specs
from anekit.kernels.spec import KernelSpec
from anekit.tools.config import is_preset
from anekit.tools.weights import MODEL_PATH

INDEX = "kernels.json"  # the dump's index; a directory holding it is a previous dump


@dataclass(frozen=True)
class Surface:
    """A kernel's input or output surface: [1, channels, 1, spatial], concatenated from ``parts``."""

    channels: int
    spatial: int
    parts: tuple[tuple[str, int], ...]  # (name, channels) of each part, in order


@dataclass(frozen=True)
class DumpedKernel:
    """One kernel as the index records it."""

    name: str
    ops: int
    input: Surface
    output: Surface


def kernels_of(config: str, cfg: ModelConfig, seed: int = 0, dynamic: bool = False) -> tuple[list[str], dict]:
    """The kernels a dump of ``config`` (a preset's name or a model directory, ``cfg`` its config) holds
    and the weights they are built with (``seed``: of a preset's random weights)."""
    return dump_names(config, cfg, dynamic), layer_weights(config, cfg, seed)


def layer_weights(config: str, cfg: ModelConfig, seed: int = 0) -> dict:
    """The weights of one layer the kernels are built with: a preset's random ones (``seed``), a model
    directory's own of layer 0."""
    if is_preset(config):
        return catalog.random_weights(cfg, seed)
    from anekit.hf.model import load_model

    return load_model(config, seq_len=cfg.seq_len).params.kernel_weights(0)


def route_kernels(
    config: str, cfg: ModelConfig, chip: str, macos: str = "", seed: int = 0
) -> tuple[TrainingRoute, dict[str, KernelSpec]]:
    """The training route of ``chip`` under ``macos`` ("": every macOS the engine layer knows) and every
    kernel its step compiles for ``config``, by name, built with ``layer_weights``."""
    route = training_route(chip, macos)
    return route, route_specs(cfg, kernel_route(route.id), layer_weights(config, cfg, seed))


def dump_names(config: str, cfg: ModelConfig, dynamic: bool = False) -> list[str]:
    """The names of the kernels a dump of ``config`` holds: a preset's every kernel (``dynamic``: and the
    dynamic-weight ones), a model directory's what its training runs; each kernel that depends on the
    layer kind once per kind ``cfg`` has (``catalog.with_kinds``: Gemma 3's sliding layers' own)."""
    if is_preset(config):
        names = [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS]
        if dynamic:
            names += list(catalog.DYNAMIC_KERNELS)
    else:
        names = [*catalog.DYNAMIC_KERNELS, *catalog.DYNAMIC_HELPERS, "sdpa_bwd2"]
    return catalog.with_kinds(cfg, names)


def write_kernels(
    folder: Path,
    names: list[str],
    cfg: ModelConfig,
    weights: dict,
    specs: dict[str, KernelSpec] | None = None,
    route: TrainingRoute | None = None,
) -> list[DumpedKernel]:
    """Each kernel's model.mil and weights/ under ``folder`` (which exists), and the index. ``specs``: the
    kernels already built (a route's, ``route_kernels``), else each of ``names`` is built from the catalog
    with ``weights``."""
    dumped = []
    for name in names:
        spec = specs[name] if specs is not None else catalog.build(name, cfg, weights)
        (folder / name / "weights").mkdir(parents=True)
        (folder / name / "model.mil").write_text(spec.text(), encoding="utf-8")
        for path, data in spec.weight_files().items():
            (folder / name / path.removeprefix(MODEL_PATH)).write_bytes(data)
        ins, outs = spec.inputs, spec.outputs
        dumped.append(
            DumpedKernel(
                name,
                spec.program.op_count(),
                Surface(ins.channels, ins.spatial, ins.parts),
                Surface(outs.channels, outs.spatial, outs.parts),
            )
        )
    index = {k.name: {"ops": k.ops, "input": asdict(k.input), "output": asdict(k.output)} for k in dumped}
    record: dict = {"config": cfg.name, "kernels": index}
    if route is not None:
        record["route"] = {"id": route.id, "chip": route.chip, "macos": route.macos, "why": route.why}
    (folder / INDEX).write_text(json.dumps(record, indent=2) + "\n")
    return dumped
