"""LoRA adapters in and out in PEFT's format: adapter_config.json + adapter_model.safetensors.

The adapters themselves (``LoraSpec``, ``Adapters``, ``fuse``) are ``anekit.training.lora``'s, which
knows no file format; this module reads and writes them. What LoRA adds to a Linear ``W`` (out, in) —
huggingface/peft ``src/peft/tuners/lora/layer.py``, ``LoraLayer.update_layer`` and
``Linear.get_delta_weight``::

    y = W x + scale * B (A x)          A = lora_A.weight (r, in), B = lora_B.weight (out, r)
    scale = lora_alpha / r             (use_rslora: lora_alpha / sqrt(r))
    init: A kaiming_uniform_(a=sqrt(5)), i.e. uniform(-1/sqrt(in), 1/sqrt(in)); B zeros

What PEFT saves (``src/peft/utils/save_and_load.py`` ``get_peft_model_state_dict``; names from
``src/peft/utils/constants.py``): ``adapter_model.safetensors`` (``SAFETENSORS_WEIGHTS_NAME``) holding
``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`` and the like, the adapter name
("default") removed from the keys (``lora_A.default.weight`` -> ``lora_A.weight``), metadata
``{"format": "pt"}``; ``adapter_config.json`` (``CONFIG_NAME``) is the LoraConfig's fields
(``src/peft/tuners/lora/config.py``, ``src/peft/config.py`` ``PeftConfig.save_pretrained``: json with
indent 2 and sorted keys; ``target_modules``, a set in memory, becomes a list).

Layout. anekit keeps q_proj / k_proj rows in interleaved RoPE order per head, Hugging Face in
rotate-half order (``anekit.hf.model``): ``W_anekit = P W_hf`` with P a row permutation within each
head. Then ``delta_hf = P^-1 (B A) = (P^-1 B) A``: lora_B of q_proj and k_proj has its rows permuted
(``to_rotate_half`` on write, ``to_interleaved`` on read) and lora_A, which acts on the input (the
residual stream, never permuted), is unchanged. o_proj needs no permutation: its input is the
attention output, per head ``softmax(q k^T) v``, whose channels within a head are v's channels, and
v_proj rows are not permuted between the layouts (only the q . k dot products see the RoPE order, and
a dot product does not depend on the order of the channels when both sides share it); its output is
the residual stream. v_proj and the MLP's gate / up / down are unpermuted too.

Reading refuses what anekit cannot apply exactly, each with one line naming the field: DoRA, biases,
modules_to_save, layers_to_transform, fan_in_fan_out, per-module rank / alpha patterns, trainable
tokens, layer replication, and initialisations that change the base model's weights (PiSSA, OLoRA,
CorDA, LoftQ, LoRA-GA: such an adapter only fits the modified base it was saved beside) or the forward
(MiCA).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import stat
from pathlib import Path
from typing import Any

import numpy as np

from anekit.fileio import remove_stale_temporaries, replace_path, temporary_dir
from anekit.hf.model import to_interleaved, to_rotate_half
from anekit.hf.safetensors_io import TensorRef, read_header, write_safetensors
from anekit.inputs import LIMITS, kind_of, read_bytes, shown, stat_input
from anekit.jsonio import loads
from anekit.kernels.config import ModelConfig
from anekit.training.lora import (
    FIELDS,
    AdapterError,
    Adapters,
    LoraSpec,
    factor_shapes,
    fuse,
    is_number,
    parse_targets,
)

__all__ = [
    "FIELDS",
    "AdapterError",
    "Adapters",
    "LoraSpec",
    "adapter_config",
    "fuse",
    "parse_targets",
    "peft_key",
    "read_adapters",
    "write_adapters",
]

WEIGHTS_NAME = "adapter_model.safetensors"  # peft utils/constants.py SAFETENSORS_WEIGHTS_NAME
CONFIG_NAME = "adapter_config.json"  # peft utils/constants.py CONFIG_NAME
PICKLE_NAME = "adapter_model.bin"  # peft's torch.save form, which anekit never unpickles
KEY_PREFIX = "base_model.model."  # what PeftModel's wrapping adds before the transformers model's names
TEMP_KIND = "adapter"  # temporary_dir's kind for a directory being written

# anekit's short name -> the Hugging Face module after "model.layers.{i}."
TARGETS = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
ROTATED_OUT = ("q", "k")  # lora_B rows in rotate-half order per head in PEFT's file (module docstring)
ALL_LINEAR = "all-linear"  # PEFT's target_modules wildcard: every Linear but the output layer
READ_DTYPES = ("F32", "F16", "BF16")

_BY_MODULE = {module.rsplit(".", 1)[1]: name for name, module in TARGETS.items()}  # "q_proj" -> "q"
_DEFAULT_NAME = re.compile(r"\.lora_([AB])\.default\.weight$")  # an adapter name left in a key


# -- PEFT's names and config ----------------------------------------------------------------------------


def peft_key(layer: int, target: str, which: str) -> str:
    """The name PEFT saves factor ``which`` ("A" or "B") of ``target`` in ``layer`` under."""
    return f"{KEY_PREFIX}model.layers.{layer}.{TARGETS[target]}.lora_{which}.weight"


def adapter_config(spec: LoraSpec, base_model: str = "") -> dict[str, Any]:
    """The adapter_config.json PEFT writes for ``spec``: LoraConfig's fields with their defaults
    (``src/peft/tuners/lora/config.py``, ``src/peft/config.py``) except those ``spec`` sets."""
    alpha: float | int = int(spec.alpha) if spec.alpha.is_integer() else spec.alpha
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model or None,
        "revision": None,
        "auto_mapping": None,
        "inference_mode": True,
        "r": spec.rank,
        "lora_alpha": alpha,
        "lora_dropout": spec.dropout,
        "target_modules": [TARGETS[t].rsplit(".", 1)[1] for t in spec.targets],
        "exclude_modules": None,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": spec.use_rslora,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "megatron_config": None,
        "megatron_core": "megatron.core",
        "loftq_config": {},
        "eva_config": None,
        "corda_config": None,
        "layer_replication": None,
        "lora_bias": False,
        "trainable_token_indices": None,
        "target_parameters": None,
    }


# Fields refused unless they hold PEFT's default: what anekit's fuse would otherwise get wrong.
_UNSUPPORTED: tuple[tuple[str, Any, str], ...] = (
    ("use_dora", (False, None), "DoRA rescales each column by a learned magnitude"),
    ("bias", ("none", None), "LoRA biases are not applied"),
    ("lora_bias", (False, None), "a bias on lora_B is not applied"),
    ("modules_to_save", (None, []), "fully trained extra modules are not applied"),
    ("layers_to_transform", (None, []), "adapting only some layers is not supported"),
    ("fan_in_fan_out", (False, None), "Conv1D-style transposed weights are not supported"),
    ("rank_pattern", (None, {}), "per-module ranks are not supported"),
    ("alpha_pattern", (None, {}), "per-module alphas are not supported"),
    ("exclude_modules", (None, []), "excluded modules are not supported"),
    ("trainable_token_indices", (None, [], {}), "trained token embeddings are not applied"),
    ("layer_replication", (None, []), "replicated layers are not supported"),
    ("target_parameters", (None, []), "adapted nn.Parameters are not supported"),
)
# init_lora_weights values whose adapter fits an unchanged base model and the plain LoRA forward: the
# others rewrite the base (pissa*, olora, corda*, loftq, lora_ga) or switch to a variant's forward (mica),
# per peft src/peft/tuners/lora/layer.py LoraLayer.update_layer and its *_init methods.
_PLAIN_INITS = (True, False, "gaussian", "eva", "orthogonal")


def _spec_from_config(config: Any, where: str) -> LoraSpec:
    """The LoraSpec of a parsed adapter_config.json; one error naming the field otherwise."""
    if not isinstance(config, dict):
        raise AdapterError(f"{where}: a JSON {type(config).__name__}, not an object")

    def bad(name: str, why: str) -> AdapterError:
        return AdapterError(f"{where}: {name}: {why}, got {config.get(name)!r}")

    for name in ("peft_type", "r", "lora_alpha", "target_modules"):
        if name not in config:
            raise AdapterError(f"{where}: {name}: missing")
    if config["peft_type"] != "LORA":
        raise bad("peft_type", 'anekit reads LoRA adapters only ("LORA")')
    for name, fine, why in _UNSUPPORTED:
        value = config.get(name)
        if not any(value == f and type(value) is type(f) for f in fine):
            raise bad(name, f"not supported ({why})")
    init = config.get("init_lora_weights", True)
    if not any(init == f and type(init) is type(f) for f in _PLAIN_INITS):
        raise bad("init_lora_weights", "not supported (this initialisation changes the base model's weights)")
    r = config["r"]
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise bad("r", "must be a positive integer")
    alpha = config["lora_alpha"]
    if not is_number(alpha) or not math.isfinite(alpha) or alpha <= 0:
        raise bad("lora_alpha", "must be a number > 0")
    dropout = config.get("lora_dropout", 0.0)
    if not is_number(dropout) or not 0 <= dropout < 1:
        raise bad("lora_dropout", "must be a number with 0 <= p < 1")
    rslora = config.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise bad("use_rslora", "must be true or false")
    return LoraSpec(r, alpha, _targets_from_config(config["target_modules"], where), dropout, rslora)


def _targets_from_config(value: Any, where: str) -> tuple[str, ...]:
    """The targets of target_modules: a list of module names (PEFT matches them as the last parts of a
    module's name: "q_proj", "self_attn.q_proj") or "all-linear"."""
    known = ", ".join(m.rsplit(".", 1)[1] for m in TARGETS.values())
    if value == ALL_LINEAR:
        return tuple(TARGETS)
    if not isinstance(value, list) or not value:
        raise AdapterError(
            f"{where}: target_modules: a non-empty list of module names or {ALL_LINEAR!r} is needed "
            f"(a regular expression is not supported), got {value!r}"
        )
    targets = []
    for name in value:
        target = _BY_MODULE.get(name.rsplit(".", 1)[-1]) if isinstance(name, str) else None
        if target is None or not f".{TARGETS[target]}".endswith(f".{name}"):
            raise AdapterError(
                f"{where}: target_modules: {name!r} is not a module anekit adapts; known: {known}"
            )
        targets.append(target)
    return tuple(t for t in TARGETS if t in targets)


# -- write ----------------------------------------------------------------------------------------------


def write_adapters(
    directory: str | Path, adapters: Adapters, cfg: ModelConfig, base_model: str = "", *, force: bool = False
) -> list[Path]:
    """Write ``adapters`` as a PEFT adapter directory: adapter_model.safetensors (F32, PEFT's names and
    layout) and adapter_config.json, built in a temporary sibling directory and renamed into place.

    ``directory`` must not exist, unless ``force`` and it is an adapter directory (holds
    adapter_config.json), which is then replaced whole. Returns the files written."""
    out = Path(directory)
    adapters.check(cfg)
    st = stat_input(out, "[lora] cannot write")
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise AdapterError(f"[lora] cannot write {shown(out)}: {kind_of(st.st_mode)}, not a directory")
        if not force:
            raise AdapterError(f"[lora] {shown(out)} exists; pass force to replace an adapter directory")
        if stat_input(out / CONFIG_NAME, "[lora] cannot write") is None:
            raise AdapterError(
                f"[lora] {shown(out)} holds no {CONFIG_NAME}: not an adapter directory, left as it is"
            )
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for layer in range(adapters.n_layers):
        for target in adapters.spec.targets:
            key = (layer, FIELDS[target])
            b = adapters.b[key]  # (out, r)
            if target in ROTATED_OUT:
                b = to_rotate_half(b, cfg.head_dim)
            tensors[peft_key(layer, target, "A")] = ("F32", np.ascontiguousarray(adapters.a[key]))
            tensors[peft_key(layer, target, "B")] = ("F32", np.ascontiguousarray(b))
    config = adapter_config(adapters.spec, base_model)
    remove_stale_temporaries(out.parent, TEMP_KIND)
    tmp = temporary_dir(out, TEMP_KIND)
    try:
        write_safetensors(tmp / WEIGHTS_NAME, tensors)
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        replace_path(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / CONFIG_NAME, out / WEIGHTS_NAME]


# -- read -----------------------------------------------------------------------------------------------


def read_adapters(directory: str | Path, cfg: ModelConfig) -> Adapters:
    """The adapters of the PEFT adapter directory ``directory`` for a model of ``cfg``, in anekit's
    layout. Every expected key must be there (keys with or without the "base_model.model." prefix, with
    or without the adapter name "default"), no other, each of the shape ``cfg`` and r give."""
    directory = Path(directory)
    st = stat_input(directory, "[lora] cannot read")
    if st is None or not stat.S_ISDIR(st.st_mode):
        what = "no such directory" if st is None else f"{kind_of(st.st_mode)}, not a directory"
        raise AdapterError(f"[lora] adapter directory {shown(directory)}: {what}")
    config_path = directory / CONFIG_NAME
    text = read_bytes(config_path, "[lora] cannot read", LIMITS["json"], "a JSON config file")
    where = f"[lora] {shown(config_path)}"
    spec = _spec_from_config(loads(text, where), where)
    weights = directory / WEIGHTS_NAME
    if (
        stat_input(weights, "[lora] cannot read") is None
        and stat_input(directory / PICKLE_NAME, "[lora] cannot read") is not None
    ):
        raise AdapterError(
            f"[lora] {shown(directory)} holds {PICKLE_NAME} (a pickle, which anekit never loads), not "
            f"{WEIGHTS_NAME}; save the adapter with safe_serialization=True"
        )
    refs = _by_plain_name(read_header(weights)[0], weights)
    adapters = Adapters(spec, cfg.n_layers)
    wanted = {}
    for layer in range(cfg.n_layers):
        for target in spec.targets:
            for which, shape in zip("AB", factor_shapes(spec, cfg, target)):
                plain = peft_key(layer, target, which).removeprefix(KEY_PREFIX)
                wanted[plain] = (layer, target, which, shape)
    extra = [name for name in refs if name not in wanted]
    if extra:
        raise AdapterError(
            f"[lora] {shown(weights)}: {refs[extra[0]].name} is not a LoRA factor of the targets "
            f"({', '.join(spec.targets)}) of a {cfg.n_layers}-layer model"
        )
    for name, (layer, target, which, shape) in wanted.items():
        if name not in refs:
            raise AdapterError(f"[lora] {shown(weights)}: {KEY_PREFIX}{name} is missing")
        array = _read_factor(refs[name], shape, weights)
        key = (layer, FIELDS[target])
        if which == "A":
            adapters.a[key] = array
        else:
            adapters.b[key] = to_interleaved(array, cfg.head_dim) if target in ROTATED_OUT else array
    return adapters


def _by_plain_name(refs: dict[str, TensorRef], path: Path) -> dict[str, TensorRef]:
    """``refs`` keyed by their names without the "base_model.model." prefix and the adapter name."""
    out: dict[str, TensorRef] = {}
    for name, ref in refs.items():
        plain = _DEFAULT_NAME.sub(r".lora_\1.weight", name.removeprefix(KEY_PREFIX))
        if plain in out:
            raise AdapterError(f"[lora] {shown(path)}: {name} and {out[plain].name} name the same factor")
        out[plain] = ref
    return out


def _read_factor(ref: TensorRef, shape: tuple[int, int], path: Path) -> np.ndarray:
    if ref.shape != shape:
        raise AdapterError(
            f"[lora] {shown(path)}: {ref.name}: shape {list(ref.shape)}, expected {list(shape)}"
        )
    if ref.dtype not in READ_DTYPES:
        raise AdapterError(
            f"[lora] {shown(path)}: {ref.name}: dtype {ref.dtype}, not a float anekit reads "
            f"({', '.join(READ_DTYPES)})"
        )
    return np.ascontiguousarray(ref.to_float32())
