"""A kernels dump: every kernel of one layer and the head of a model, each as ``NAME/model.mil`` and
``NAME/weights/``, with an index (``kernels.json``) of their ops and surface shapes.

A preset dumps every kernel with random llama2.c-style weights (and, asked, the dynamic-weight
variants); a Hugging Face model dumps what its training runs (dynamic weights, the head being the
CPU's) with its own weights of layer 0. A model with sliding layers (Gemma 3) has its attention kernels
once per layer kind ("sdpa_fwd_dynamic_sliding" beside "sdpa_fwd_dynamic").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from anekit.kernels import ModelConfig, catalog
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
    names = dump_names(config, cfg, dynamic)
    if is_preset(config):
        return names, catalog.random_weights(cfg, seed)
    from anekit.hf.model import load_model

    return names, load_model(config, seq_len=cfg.seq_len).params.kernel_weights(0)


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


def write_kernels(folder: Path, names: list[str], cfg: ModelConfig, weights: dict) -> list[DumpedKernel]:
    """Each kernel's model.mil and weights/ under ``folder`` (which exists), and the index."""
    dumped = []
    for name in names:
        spec = catalog.build(name, cfg, weights)
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
    (folder / INDEX).write_text(json.dumps({"config": cfg.name, "kernels": index}, indent=2) + "\n")
    return dumped
