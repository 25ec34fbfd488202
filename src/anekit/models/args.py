"""Reading a Hugging Face ``config.json`` field by field: the checks every family's ``from_config`` shares.

Each family states its own fields and defaults (``llama.LlamaArgs`` ...); what is common lives here: a
typed field reader whose errors name the field, the RoPE fields of transformers 4 (top-level rope_theta /
rope_scaling) and 5 (``rope_parameters``), the refusal of quantized checkpoints, the dtype, the RMSNorm
epsilon and the working context (``max_position_embeddings`` capped at ``MAX_WORKING_SEQ`` unless asked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from anekit.errors import AnekitError
from anekit.models.config import ConfigError, RopeScaling

CONFIG_FILE = "config.json"
# The largest rope_theta taken: above every published config (Llama 3 5e5, Qwen 2.5 1e6, Gradient's
# 1M-context Llama 3 about 3.6e9) and small enough that theta and every power of it RoPE takes
# (theta^(2j / head_dim), j < head_dim / 2) are normal float32 numbers.
MAX_ROPE_THETA = 1e15
MAX_WORKING_SEQ = 4096  # the default cap on the working context (Llama 3.x names 131072)
DTYPES = ("float32", "float16", "bfloat16")


class HFConfigError(AnekitError, ValueError):
    """A config.json anekit cannot import; the message names the field."""


def fail(message: str) -> HFConfigError:
    """The error for ``message``, prefixed as every config.json error is."""
    return HFConfigError(f"[hf] {CONFIG_FILE}: {message}")


def field(raw: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """raw[key] checked to be of ``kind`` (ints for floats allowed; bools are not ints), else ``default``
    when absent (None default: required)."""
    if key not in raw or raw[key] is None:
        if default is None:
            raise fail(f"{key} is missing")
        return default
    value = raw[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and bool not in kinds:
        raise fail(f"{key} must be {_names(kinds)}, got {value!r}")
    if not isinstance(value, kinds):
        raise fail(f"{key} must be {_names(kinds)}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise fail(f"{key} must be finite, got {value!r}")
    return value


def _names(kinds: tuple[type, ...]) -> str:
    return " or ".join({int: "an integer", float: "a number", bool: "true or false", str: "a string",
                        dict: "an object", list: "a list"}[k] for k in kinds)  # fmt: skip


def architecture(raw: dict[str, Any], model_type: str, accepted: tuple[str, ...]) -> str:
    """The architecture (class name) the config names, one of ``accepted`` (the first when none)."""
    archs = raw.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise fail(f"architectures must be a list of names, got {archs!r}")
    arch = archs[0] if archs else accepted[0]
    if arch not in accepted:
        raise fail(
            f"architecture {arch} is not a causal language model of model_type {model_type} (expected "
            f"{', '.join(accepted)})"
        )
    return arch


def theta(value: Any, where: str = "rope_theta") -> float:
    """A RoPE base: a number > 1 and at most ``MAX_ROPE_THETA``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 1 < value <= MAX_ROPE_THETA
    ):
        raise fail(f"{where} must be a number > 1 and at most {MAX_ROPE_THETA:g}, got {value!r}")
    return float(value)


def rope_scaling(scaling: Any, where: str) -> RopeScaling | None:
    """The scaling an object of rope fields names: None for none or the ``default`` kind, Llama 3's
    kind read, any other kind (linear, dynamic, yarn, longrope) refused."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise fail(f"{where} must be an object, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise fail(f"rope scaling {kind!r} is not supported (anekit implements Llama 3's 'llama3' scaling)")
    values: dict[str, Any] = {}
    for key, kind_ in (("factor", float), ("low_freq_factor", float), ("high_freq_factor", float),
                       ("original_max_position_embeddings", int)):  # fmt: skip
        v = scaling.get(key)
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or (kind_ is int and not isinstance(v, int))
        ):
            raise fail(f"{where}.{key} must be a number, got {v!r}")
        values[key] = kind_(v)
    try:
        return RopeScaling(**values)
    except ConfigError as e:
        raise fail(f"{where}: {str(e).removeprefix('[config] ')}") from e


def rope(raw: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from transformers 4's top-level fields or transformers 5's rope_parameters;
    rope_theta defaults to 10000."""
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    base = raw.get("rope_theta")
    if params is not None:
        if not isinstance(params, dict):
            raise fail(f"rope_parameters must be an object, got {params!r}")
        base = params.get("rope_theta", base)
        scaling = params if scaling is None else scaling
    where = "rope_parameters" if params is not None and scaling is params else "rope_scaling"
    return theta(10000.0 if base is None else base), rope_scaling(scaling, where)


def refuse_quantized(raw: dict[str, Any]) -> None:
    """A checkpoint with a ``quantization_config`` (GPTQ, AWQ, bitsandbytes, ...) is refused."""
    if raw.get("quantization_config") is not None:
        method = raw["quantization_config"]
        method = method.get("quant_method", "?") if isinstance(method, dict) else method
        raise fail(
            f"quantized checkpoints ({method}) are not supported: use the model's float16 / bfloat16 / "
            "float32 weights"
        )


def dtype(raw: dict[str, Any]) -> str:
    """The checkpoint's torch dtype name (``torch_dtype``, or transformers 5's ``dtype``)."""
    value = raw.get("torch_dtype", raw.get("dtype", "float32"))
    if not isinstance(value, str) or value not in DTYPES:
        raise fail(f"torch_dtype {value!r} is not supported (float32, float16 or bfloat16)")
    return value


def norm_eps(raw: dict[str, Any], default: float = 1e-6) -> float:
    """rms_norm_eps, strictly between 0 and 1."""
    eps = field(raw, "rms_norm_eps", float, default)
    if not 0 < eps < 1:
        raise fail(
            "rms_norm_eps must lie strictly between 0 and 1 (it guards a division, far below a hidden "
            f"state's mean square: 1e-05, 1e-06), got {eps!r}"
        )
    return float(eps)


def positive(raw: dict[str, Any], key: str, default: Any = None) -> int:
    """An integer field that must be positive."""
    value = field(raw, key, int, default)
    if value <= 0:
        raise fail(f"{key} must be positive, got {value}")
    return int(value)


@dataclass(frozen=True)
class Context:
    """The working sequence length a model runs with, and the note saying it was capped."""

    seq_len: int
    notes: tuple[str, ...] = ()


def working_context(max_pos: int, seq_len: int | None) -> Context:
    """``seq_len`` when asked for (at most ``max_pos``), else ``max_pos`` capped at ``MAX_WORKING_SEQ``."""
    if seq_len is None:
        seq_len = min(max_pos, MAX_WORKING_SEQ)
        notes: tuple[str, ...] = ()
        if seq_len < max_pos:
            notes = (
                f"the working context is capped at {seq_len} tokens (the model's max_position_embeddings "
                f"is {max_pos})",
            )
        return Context(seq_len, notes)
    if seq_len > max_pos:
        raise HFConfigError(
            f"[hf] a context of {seq_len} tokens exceeds the model's max_position_embeddings {max_pos}"
        )
    return Context(seq_len)


def config_error(e: ConfigError) -> HFConfigError:
    """A ModelConfig's refusal as a config.json error."""
    return fail(str(e).split("] ", 1)[-1])
