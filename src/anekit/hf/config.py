"""A Hugging Face ``config.json`` read into anekit's ``ModelConfig``: the Llama family (LlamaForCausalLM,
MistralForCausalLM) and Qwen 2 / Qwen 3, everything else refused with one line naming the field.

What each field means follows transformers' configuration classes:

* head_dim is ``config["head_dim"]`` when given (Qwen 3 names it; heads x head_dim need not equal
  hidden_size), else hidden_size / num_attention_heads;
* num_key_value_heads defaults to num_attention_heads (no GQA);
* rope_theta sits at the top level (transformers 4) or under ``rope_parameters`` (transformers 5); the
  default is 10000. Rope scaling sits under ``rope_scaling`` with its kind as ``rope_type`` or ``type``,
  or under ``rope_parameters``; only Llama 3's kind (``llama3``) is implemented, a ``default`` kind is
  no scaling, any other kind (linear, dynamic, yarn, longrope) is refused;
* Qwen 2's q / k / v projections always have biases (its o_proj none); ``attention_bias`` true on the
  others (biases on q, k, v and o) and ``mlp_bias`` are refused;
* Qwen 3's head_dim defaults to 128 (Qwen3Config's default), the others' to hidden_size / heads;
* Qwen 3 RMS-normalises each head of q and k before RoPE (``q_norm`` / ``k_norm``);
* ``tie_word_embeddings`` defaults to false for these classes: a tied checkpoint has no
  ``lm_head.weight``;
* a checkpoint with a ``quantization_config`` (GPTQ, AWQ, bitsandbytes, ...) is refused.

The working sequence length (``seq_len``: the longest context sampling and training use) is
``max_position_embeddings`` capped at ``MAX_WORKING_SEQ`` unless asked for; the cap is reported in
``HFConfig.notes`` so the command line can say so.
"""

from __future__ import annotations

import math
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anekit.errors import AnekitError
from anekit.inputs import LIMITS, kind_of, read_text, shown, stat_input
from anekit.jsonio import loads
from anekit.kernels.config import ConfigError, ModelConfig, RopeScaling

# model_type -> the architectures (class names) accepted for it
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM",),
    "mistral": ("MistralForCausalLM",),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
}
# The largest rope_theta taken: above every published config (Llama 3 5e5, Qwen 2.5 1e6, Gradient's
# 1M-context Llama 3 about 3.6e9) and small enough that theta and every power of it RoPE takes
# (theta^(2j / head_dim), j < head_dim / 2) are normal float32 numbers.
MAX_ROPE_THETA = 1e15
MAX_WORKING_SEQ = 4096  # the default cap on the working context (Llama 3.x names 131072)
CONFIG_FILE = "config.json"


class HFConfigError(AnekitError, ValueError):
    """A config.json anekit cannot import; the message names the field."""


@dataclass(frozen=True)
class HFConfig:
    """What anekit takes from a model directory's config.json."""

    model_type: str  # llama, mistral, qwen2, qwen3
    architecture: str  # e.g. Qwen3ForCausalLM
    cfg: ModelConfig  # the shape anekit runs, seq_len the working context
    tied: bool  # the classifier is the embedding (no lm_head.weight)
    dtype: str  # the checkpoint's torch dtype name ("bfloat16", "float16", "float32")
    max_position_embeddings: int
    raw: dict[str, Any] = field(repr=False, compare=False)  # config.json as read, for export
    notes: tuple[str, ...] = ()  # what the reader chose that a user should hear (the context cap)


def _field(raw: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """raw[key] checked to be of ``kind`` (ints for floats allowed; bools are not ints), else ``default``
    when absent (None default: required)."""
    if key not in raw or raw[key] is None:
        if default is None:
            raise HFConfigError(f"[hf] {CONFIG_FILE}: {key} is missing")
        return default
    value = raw[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and bool not in kinds:
        raise HFConfigError(f"[hf] {CONFIG_FILE}: {key} must be {_names(kinds)}, got {value!r}")
    if not isinstance(value, kinds):
        raise HFConfigError(f"[hf] {CONFIG_FILE}: {key} must be {_names(kinds)}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise HFConfigError(f"[hf] {CONFIG_FILE}: {key} must be finite, got {value!r}")
    return value


def _names(kinds: tuple[type, ...]) -> str:
    return " or ".join({int: "an integer", float: "a number", bool: "true or false", str: "a string",
                        dict: "an object", list: "a list"}[k] for k in kinds)  # fmt: skip


def _model_type(raw: dict[str, Any]) -> tuple[str, str]:
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        got = "nothing" if model_type is None else repr(model_type)
        raise HFConfigError(f"[hf] {CONFIG_FILE}: model_type must be a string (e.g. 'llama'), got {got}")
    archs = raw.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise HFConfigError(f"[hf] {CONFIG_FILE}: architectures must be a list of names, got {archs!r}")
    if model_type not in ARCHITECTURES:
        known = ", ".join(f"{t} ({', '.join(a)})" for t, a in ARCHITECTURES.items())
        raise HFConfigError(
            f"[hf] {CONFIG_FILE}: model_type {model_type!r} ({', '.join(archs) or 'no architectures'}) is "
            f"not supported; anekit imports {known}"
        )
    arch = archs[0] if archs else ARCHITECTURES[model_type][0]
    if arch not in ARCHITECTURES[model_type]:
        raise HFConfigError(
            f"[hf] {CONFIG_FILE}: architecture {arch} is not a causal language model of model_type "
            f"{model_type} (expected {', '.join(ARCHITECTURES[model_type])})"
        )
    return model_type, arch


def _rope(raw: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from transformers 4's top-level fields or transformers 5's rope_parameters."""
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    theta = raw.get("rope_theta")
    if params is not None:
        if not isinstance(params, dict):
            raise HFConfigError(f"[hf] {CONFIG_FILE}: rope_parameters must be an object, got {params!r}")
        theta = params.get("rope_theta", theta)
        scaling = params if scaling is None else scaling
    theta = 10000.0 if theta is None else theta
    if (
        isinstance(theta, bool)
        or not isinstance(theta, (int, float))
        or not math.isfinite(theta)
        or not 1 < theta <= MAX_ROPE_THETA
    ):
        raise HFConfigError(
            f"[hf] {CONFIG_FILE}: rope_theta must be a number > 1 and at most {MAX_ROPE_THETA:g}, got "
            f"{theta!r}"
        )
    if scaling is None:
        return float(theta), None
    if not isinstance(scaling, dict):
        raise HFConfigError(f"[hf] {CONFIG_FILE}: rope_scaling must be an object, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise HFConfigError(
            f"[hf] {CONFIG_FILE}: rope scaling {kind!r} is not supported (anekit implements Llama 3's "
            "'llama3' scaling)"
        )
    where = "rope_parameters" if scaling is params else "rope_scaling"
    values = {}
    for key, kind_ in (("factor", float), ("low_freq_factor", float), ("high_freq_factor", float),
                       ("original_max_position_embeddings", int)):  # fmt: skip
        v = scaling.get(key)
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or (kind_ is int and not isinstance(v, int))
        ):
            raise HFConfigError(f"[hf] {CONFIG_FILE}: {where}.{key} must be a number, got {v!r}")
        values[key] = kind_(v)
    try:
        return float(theta), RopeScaling(**values)
    except ConfigError as e:
        raise HFConfigError(f"[hf] {CONFIG_FILE}: {where}: {str(e).removeprefix('[config] ')}") from e


def parse_config(raw: Any, *, name: str = "hf", seq_len: int | None = None) -> HFConfig:
    """The ``HFConfig`` of a config.json's contents; ``seq_len`` overrides the working context."""
    if not isinstance(raw, dict):
        raise HFConfigError(f"[hf] {CONFIG_FILE} must hold a JSON object, got {type(raw).__name__}")
    model_type, arch = _model_type(raw)
    if raw.get("quantization_config") is not None:
        method = raw["quantization_config"]
        method = method.get("quant_method", "?") if isinstance(method, dict) else method
        raise HFConfigError(
            f"[hf] {CONFIG_FILE}: quantized checkpoints ({method}) are not supported: use the model's "
            "float16 / bfloat16 / float32 weights"
        )
    act = _field(raw, "hidden_act", str, "silu")
    if act != "silu":
        raise HFConfigError(f"[hf] {CONFIG_FILE}: hidden_act {act!r} is not supported (expected 'silu')")
    if _field(raw, "mlp_bias", bool, False):
        raise HFConfigError(f"[hf] {CONFIG_FILE}: mlp_bias true is not supported (no MLP biases)")
    dim = _field(raw, "hidden_size", int)
    heads = _field(raw, "num_attention_heads", int)
    kv_heads = _field(raw, "num_key_value_heads", int, heads)
    head_dim = _field(raw, "head_dim", int, 128 if model_type == "qwen3" else 0)  # Qwen3Config's default
    if head_dim == 0 and heads > 0 and dim % heads:
        raise HFConfigError(
            f"[hf] {CONFIG_FILE}: hidden_size {dim} is not divisible by num_attention_heads {heads} and "
            "there is no head_dim"
        )
    max_pos = _field(raw, "max_position_embeddings", int, 2048)
    if max_pos <= 0:
        raise HFConfigError(f"[hf] {CONFIG_FILE}: max_position_embeddings must be positive, got {max_pos}")
    notes: list[str] = []
    if seq_len is None:
        seq_len = min(max_pos, MAX_WORKING_SEQ)
        if seq_len < max_pos:
            notes.append(
                f"the working context is capped at {seq_len} tokens (the model's max_position_embeddings "
                f"is {max_pos})"
            )
    elif seq_len > max_pos:
        raise HFConfigError(
            f"[hf] a context of {seq_len} tokens exceeds the model's max_position_embeddings {max_pos}"
        )
    use_window = _field(raw, "use_sliding_window", bool, model_type == "mistral")
    window = _field(raw, "sliding_window", int, 0) if use_window else None
    if isinstance(window, int) and not isinstance(window, bool) and 0 < window < seq_len:
        raise HFConfigError(
            f"[hf] {CONFIG_FILE}: sliding_window {window} is shorter than the working context {seq_len}; "
            "anekit's attention is full causal attention (use a context of at most the window)"
        )
    theta, scaling = _rope(raw)
    eps = _field(raw, "rms_norm_eps", float, 1e-6)
    if not 0 < eps < 1:
        raise HFConfigError(
            f"[hf] {CONFIG_FILE}: rms_norm_eps must lie strictly between 0 and 1 (it guards a division, far "
            f"below a hidden state's mean square: 1e-05, 1e-06), got {eps!r}"
        )
    if model_type != "qwen2" and _field(raw, "attention_bias", bool, False):
        raise HFConfigError(
            f"[hf] {CONFIG_FILE}: attention_bias true ({model_type} then has biases on q, k, v and o) is "
            "not supported; anekit implements Qwen 2's q / k / v biases"
        )
    bias = model_type == "qwen2"  # Qwen2Attention: q / k / v with bias, o without
    dtype = raw.get("torch_dtype", raw.get("dtype", "float32"))
    if not isinstance(dtype, str) or dtype not in ("float32", "float16", "bfloat16"):
        raise HFConfigError(
            f"[hf] {CONFIG_FILE}: torch_dtype {dtype!r} is not supported (float32, float16 or bfloat16)"
        )
    try:
        cfg = ModelConfig(
            dim=dim,
            hidden_dim=_field(raw, "intermediate_size", int),
            n_layers=_field(raw, "num_hidden_layers", int),
            n_heads=heads,
            n_kv_heads=kv_heads,
            vocab_size=_field(raw, "vocab_size", int),
            seq_len=seq_len,
            norm_eps=eps,
            rope_theta=theta,
            attn_head_dim=0 if head_dim == dim // max(heads, 1) and dim % max(heads, 1) == 0 else head_dim,
            qkv_bias=bias,
            qk_norm=model_type == "qwen3",
            rope_scaling=scaling,
            name=name,
        )
    except ConfigError as e:
        raise HFConfigError(f"[hf] {CONFIG_FILE}: {str(e).split('] ', 1)[-1]}") from e
    tied = _field(raw, "tie_word_embeddings", bool, False)
    return HFConfig(model_type, arch, cfg, tied, dtype, max_pos, raw, tuple(notes))


def read_config(directory: str | Path, *, seq_len: int | None = None) -> HFConfig:
    """The ``HFConfig`` of ``directory/config.json``."""
    directory = Path(directory)
    path = directory / CONFIG_FILE
    text = read_text(path, "[hf] config", LIMITS["json"], "a config.json file")
    return parse_config(loads(text, f"[hf] {path}"), name=directory.name or "hf", seq_len=seq_len)


def check_model_dir(path: str | Path, what: str) -> None:
    """Refuse, in words that say why, a directory that is not a Hugging Face model directory (no
    config.json, or a config.json that is a directory, a FIFO, a device or a symbolic link loop); a path
    that is not a directory is left to the caller. ``what`` starts the message ("[sample] cannot read")."""
    st = stat_input(path, what)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return
    config = Path(path) / CONFIG_FILE
    found = stat_input(config, what)  # a symbolic link loop: one line saying so
    if found is None:
        raise AnekitError(
            f"{what} {shown(path)}: a directory without {CONFIG_FILE}, so not a Hugging Face model directory"
        )
    if not stat.S_ISREG(found.st_mode):
        raise AnekitError(f"{what} {shown(config)}: {kind_of(found.st_mode)}, not a {CONFIG_FILE} file")


def is_model_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding a config.json (a Hugging Face model directory)."""
    try:
        return Path(path).is_dir() and (Path(path) / CONFIG_FILE).is_file()
    except OSError:
        return False
