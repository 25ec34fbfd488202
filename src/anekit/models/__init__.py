"""Model families, one file each (``llama``, ``qwen``, ``gemma3``), found by ``model_type``.

Each family writes its layer once over ``anekit.models.blocks``; the CPU forward, the engine kernels and
the CoreML export are lowerings of it, and its checkpoint name map and config reader live beside it.
"""

from __future__ import annotations

from typing import Any

from anekit.models import args
from anekit.models.args import CONFIG_FILE, HFConfigError
from anekit.models.blocks import Blocks, LayerPlan, Rope, layer_plan
from anekit.models.config import ModelConfig
from anekit.models.family import Args, Family
from anekit.models.gemma3 import FAMILY as GEMMA3
from anekit.models.llama import FAMILY as LLAMA
from anekit.models.llama import Llama
from anekit.models.qwen import FAMILY as QWEN

FAMILIES: tuple[Family, ...] = (LLAMA, QWEN, GEMMA3)
# model_type -> its family
REGISTRY: dict[str, Family] = {t: f for f in FAMILIES for t in f.architectures}


def family(model_type: str) -> Family:
    """The family of a config.json's ``model_type``; HFConfigError naming what anekit imports otherwise."""
    try:
        return REGISTRY[model_type]
    except KeyError:
        raise HFConfigError(f"[hf] {CONFIG_FILE}: model_type {model_type!r} is not supported") from None


def family_of(cfg: ModelConfig) -> Family:
    """The family a ModelConfig (read from any file format: llama2.c, BLZT, a Hugging Face directory)
    is of: Gemma 3's post-norms, Qwen's biases or q / k norm, else Llama."""
    for fam in (GEMMA3, QWEN):
        if fam.owns(cfg):
            return fam
    return LLAMA


def model_for(cfg: ModelConfig) -> Llama[Any]:
    """The layer of ``cfg``'s family, ready to be lowered (``model.layer(blocks, x, model.plan(i))``): a
    ``Llama`` or a family's subclass of it, generic in the lowering's value type."""
    model: Llama[Any] = family_of(cfg).model(cfg)
    return model


def read_args(raw: Any) -> Args:
    """A config.json's contents read by its family (``model_type`` and ``architectures`` checked first)."""
    if not isinstance(raw, dict):
        raise HFConfigError(f"[hf] {CONFIG_FILE} must hold a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        got = "nothing" if model_type is None else repr(model_type)
        raise args.fail(f"model_type must be a string (e.g. 'llama'), got {got}")
    archs = raw.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise args.fail(f"architectures must be a list of names, got {archs!r}")
    if model_type not in REGISTRY:
        known = ", ".join(f"{t} ({', '.join(a)})" for t, a in ARCHITECTURES.items())
        raise args.fail(
            f"model_type {model_type!r} ({', '.join(archs) or 'no architectures'}) is not supported; anekit "
            f"imports {known}"
        )
    return REGISTRY[model_type].from_config(raw)


# model_type -> the architectures (class names) accepted for it, every family's
ARCHITECTURES: dict[str, tuple[str, ...]] = {t: a for f in FAMILIES for t, a in f.architectures.items()}

__all__ = [
    "ARCHITECTURES",
    "FAMILIES",
    "GEMMA3",
    "LLAMA",
    "QWEN",
    "REGISTRY",
    "Args",
    "Blocks",
    "Family",
    "HFConfigError",
    "LayerPlan",
    "Llama",
    "Rope",
    "family",
    "family_of",
    "layer_plan",
    "model_for",
    "read_args",
]
