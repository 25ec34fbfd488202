"""Shards of a model export (laws 4 and 5): the plan, and ``shards.json`` that chains the packages.

Law 4 of the empirical-laws reference (rule ``package.shard-size``): a package over ~250 MB of weights
fails to compile for the engine. Law 5 (rule ``package.layers-per-shard``): large models go 1-3
transformer layers per shard, with the embedding and the classifier on their own. The planner puts the
embedding alone, then packs layers greedily, at most ``MAX_LAYERS_PER_SHARD`` per shard and under the
size limit, then the head (final norm + classifier) alone. A part that does not fit even alone is an
error naming it.

``shards.json`` (beside the packages)::

    {"format": "anekit-shards", "version": 1,
     "model": {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len, ...},
     "quantize": "none" | "int8" | "int4-block", "shard_mb": N,
     "functions": ["prefill", "decode"],
     "shards": [{"package": "00-embed.mlpackage", "embed": true, "layers": [], "head": false,
                 "weight_bytes": n, "states": ["k_cache_0", ...],
                 "inputs": {"tokens": "caller", "token": "caller"}, "outputs": ["y"]}, ...]}

Each input names where its value comes from: ``"caller"`` (tokens / token, pos, last: what the caller
of the whole model passes) or ``"<package>:<output>"``, the output of an earlier shard (every shard's
``x`` is the previous shard's ``y``). Shards run in list order, prefill through every shard, then
decode through every shard per token; each shard keeps its own layers' cache states.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from anekit import jsonio
from anekit.coreml.export import Stage, stage_weight_bytes
from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig, RopeScaling

SHARDS_FILE = "shards.json"
FORMAT = "anekit-shards"
VERSION = 1
DEFAULT_SHARD_MB = 250  # law 4: the ~250 MB ceiling of one engine-resident package
MAX_LAYERS_PER_SHARD = 3  # law 5: 1-3 layers per shard
MB = 1_000_000
CALLER = "caller"


def plan_shards(cfg: ModelConfig, shard_mb: float, quant: str = "none", tied: bool = True) -> list[Stage]:
    """Stages each under ``shard_mb`` MB of weights: embedding, 1-3 layers at a time, head."""
    if not shard_mb > 0:
        raise AnekitError(f"[export] --shard-mb must be a positive number of MB, got {shard_mb}")
    limit = shard_mb * MB

    def fits(stage: Stage, what: str) -> bool:
        size = stage_weight_bytes(cfg, stage, quant, tied)
        if size >= limit and len(stage.layers) <= 1:
            raise AnekitError(
                f"[export] {what} alone holds {size / MB:.1f} MB of weights, more than --shard-mb "
                f"{shard_mb:g}: the model cannot be sharded that small (law 4: one layer per shard is the "
                "smallest shard)"
            )
        return size < limit

    embed, head = Stage(True, (), False), Stage(False, (), True)
    fits(embed, "the embedding")
    stages = [embed]
    group: list[int] = []
    for i in range(cfg.n_layers):
        fits(Stage(False, (i,), False), f"layer {i}")
        trial = Stage(False, (*group, i), False)
        if group and (len(group) == MAX_LAYERS_PER_SHARD or not fits(trial, f"layers {group[0]}-{i}")):
            stages.append(Stage(False, tuple(group), False))
            group = []
        group.append(i)
    if group:
        stages.append(Stage(False, tuple(group), False))
    fits(head, "the classifier")
    stages.append(head)
    return stages


def package_name(index: int, stage: Stage) -> str:
    return f"{index:02d}-{stage.label}.mlpackage"


def stage_io(stage: Stage, previous: str | None) -> tuple[dict[str, str], list[str]]:
    """The inputs of a stage (by function, merged) with their sources, and its outputs."""
    inputs: dict[str, str] = {}
    if stage.embed:
        inputs.update(tokens=CALLER, token=CALLER)
    else:
        if previous is None:
            raise AnekitError("[export] a stage without the embedding needs a previous shard")
        inputs["x"] = f"{previous}:y"
    if stage.layers:
        inputs["pos"] = CALLER
    if stage.head:
        inputs["last"] = CALLER
    return inputs, ["logits" if stage.head else "y"]


def shards_manifest(
    cfg: ModelConfig, stages: list[Stage], sizes: list[int], quant: str, shard_mb: float
) -> dict[str, Any]:
    shards = []
    previous = None
    for i, (stage, size) in enumerate(zip(stages, sizes)):
        name = package_name(i, stage)
        inputs, outputs = stage_io(stage, previous)
        states = [f"{kv}_cache_{layer}" for layer in stage.layers for kv in ("k", "v")]
        shards.append(
            {
                "package": name,
                "embed": stage.embed,
                "layers": list(stage.layers),
                "head": stage.head,
                "weight_bytes": size,
                "states": states,
                "inputs": inputs,
                "outputs": outputs,
            }
        )
        previous = name
    model = {k: v for k, v in asdict(cfg).items() if k != "name"}
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model,
        "quantize": quant,
        "shard_mb": shard_mb,
        "functions": ["prefill", "decode"],
        "shards": shards,
    }


def read_manifest(path: Path) -> dict[str, Any]:
    """shards.json, checked: format, version, and one package per shard."""
    try:
        data = jsonio.loads(path.read_bytes(), f"[{FORMAT}] {path}")  # size and depth limits
    except OSError as e:
        raise AnekitError(f"[{FORMAT}] cannot read {path}: {e.strerror or e}") from e
    if not isinstance(data, dict):
        raise AnekitError(f"[{FORMAT}] {path}: must be a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise AnekitError(f"[{FORMAT}] {path}: field 'format' must be {FORMAT!r}, got {data.get('format')!r}")
    if data.get("version") != VERSION:
        raise AnekitError(f"[{FORMAT}] {path}: unknown version {data.get('version')!r} (expected {VERSION})")
    shards = data.get("shards")
    if not isinstance(shards, list) or not shards:
        raise AnekitError(f"[{FORMAT}] {path}: field 'shards' must be a non-empty list")
    for i, s in enumerate(shards):
        name = s.get("package") if isinstance(s, dict) else None
        if not isinstance(name, str) or "/" in name or name.startswith("."):
            raise AnekitError(f"[{FORMAT}] {path}: shards[{i}].package {name!r} is not a file name")
    return data


def model_config(manifest: dict[str, Any]) -> ModelConfig:
    try:
        model = dict(manifest["model"])
        if isinstance(model.get("rope_scaling"), dict):  # Llama 3's rope scaling, written by asdict
            model["rope_scaling"] = RopeScaling(**model["rope_scaling"])
        if isinstance(model.get("layer_types"), list):  # Gemma 3: a JSON list, a tuple in the config
            model["layer_types"] = tuple(model["layer_types"])
        return ModelConfig(**model, name="shards")
    except (KeyError, TypeError) as e:
        raise AnekitError(f"[{FORMAT}] field 'model' is not a model configuration: {e}") from e
