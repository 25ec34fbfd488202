"""The catalog of kernels: every kernel of one layer and of the head, by name, and random weights for them."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from anekit.kernels.config import LAYER_TYPES, ModelConfig
from anekit.kernels.spec import KernelSpec

# name -> (module, function). Per-layer kernels first, then the head (final norm and classifier).
LAYER_KERNELS = {
    "sdpa_fwd": ("anekit.kernels.forward", "sdpa_fwd"),
    "ffn_fwd": ("anekit.kernels.forward", "ffn_fwd"),
    "ffn_bwd": ("anekit.kernels.backward", "ffn_bwd"),
    "sdpa_bwd1": ("anekit.kernels.attention_bwd", "sdpa_bwd1"),
    "sdpa_bwd2": ("anekit.kernels.attention_bwd", "sdpa_bwd2"),
    "qkv_bwd": ("anekit.kernels.attention_bwd", "qkv_bwd"),
    "rmsnorm_att_bwd": ("anekit.kernels.backward", "rmsnorm_bwd"),
    "rmsnorm_ffn_bwd": ("anekit.kernels.backward", "rmsnorm_bwd"),
}
HEAD_KERNELS = {
    "final_rmsnorm": ("anekit.kernels.forward", "final_rmsnorm"),
    "classifier_fwd": ("anekit.kernels.forward", "classifier_fwd"),
    "softmax_vocab": ("anekit.kernels.forward", "softmax_vocab"),
    "rmsnorm_final_bwd": ("anekit.kernels.backward", "rmsnorm_bwd"),
}
DYNAMIC_KERNELS = {
    "sdpa_fwd_dynamic": ("anekit.kernels.dynamic", "sdpa_fwd_dynamic"),
    "ffn_fwd_dynamic": ("anekit.kernels.dynamic", "ffn_fwd_dynamic"),
    "ffn_bwd_w2t_dynamic": ("anekit.kernels.dynamic", "ffn_bwd_w2t_dynamic"),
    "ffn_bwd_w13t_dynamic": ("anekit.kernels.dynamic", "ffn_bwd_w13t_dynamic"),
    "qkv_bwd_dynamic": ("anekit.kernels.dynamic", "qkv_bwd_dynamic"),
}
# The dynamic step's two weightless helpers (anekit.llama.step.DynamicKernels): da = Wo^T do as a dynamic
# matmul, and SDPA backward 1 without Wo.
DYNAMIC_HELPERS = {
    "wo_t_dynamic": ("anekit.kernels.dynamic", "wo_t_dynamic"),
    "sdpa_bwd1_weightless": ("anekit.kernels.attention_bwd", "sdpa_bwd1_weightless"),
}
# The kernels whose program depends on the layer type (the attention mask, the RoPE tables): a model with
# sliding layers (ModelConfig.layer_types) has each of them once per kind, "<name>_<kind>" for kinds other
# than "full" (``with_kinds``).
BY_KIND = ("sdpa_fwd", "sdpa_bwd1", "sdpa_bwd2", "sdpa_fwd_dynamic", "sdpa_bwd1_weightless")
# Which RMSNorm scale each rmsnorm_bwd instance bakes.
RMSNORM_SCALE = {"rmsnorm_att_bwd": "rms_att", "rmsnorm_ffn_bwd": "rms_ffn", "rmsnorm_final_bwd": "rms_final"}


def generator(name: str) -> Callable[..., KernelSpec]:
    """The generator function of a cataloged kernel."""
    table = {**LAYER_KERNELS, **HEAD_KERNELS, **DYNAMIC_KERNELS, **DYNAMIC_HELPERS}
    if name not in table:
        raise KeyError(f"no kernel '{name}' (known: {', '.join(table)})")
    module, func = table[name]
    return getattr(importlib.import_module(module), func)


def with_kinds(cfg: ModelConfig, names: list[str]) -> list[str]:
    """``names`` and, after each kernel of ``BY_KIND`` among them, its variant for every other layer kind
    ``cfg`` has ("sdpa_fwd_sliding" for Gemma 3's sliding layers); ``names`` itself for one kind."""
    out = []
    for name in names:
        out.append(name)
        if name in BY_KIND:
            out += [f"{name}_{kind}" for kind in cfg.layer_kinds if kind != "full"]
    return out


def split_kind(name: str) -> tuple[str, str]:
    """(cataloged name, layer kind) of a kernel name: "sdpa_fwd_sliding" -> ("sdpa_fwd", "sliding")."""
    for kind in LAYER_TYPES:
        base = name.removesuffix(f"_{kind}")
        if base != name and base in BY_KIND:
            return base, kind
    return name, "full"


def build(name: str, cfg: ModelConfig, weights: dict[str, np.ndarray] | None) -> KernelSpec:
    """Generate a cataloged kernel for ``cfg`` (dynamic kernels take no baked weights); a name of
    ``with_kinds`` generates that kind's variant."""
    name, kind = split_kind(name)
    gen = generator(name)
    if name in BY_KIND and kind != "full":
        if name in DYNAMIC_KERNELS or name in DYNAMIC_HELPERS:
            return gen(cfg, kind=kind)
        return gen(cfg, weights, kind=kind)
    if name in DYNAMIC_KERNELS or name in DYNAMIC_HELPERS:
        return gen(cfg)
    if name in RMSNORM_SCALE:
        scale = None if weights is None else weights[RMSNORM_SCALE[name]]
        return gen(cfg, None if scale is None else {"w": scale}, name=name)
    return gen(cfg, weights)


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, Any]:
    """Weights of one layer and the head, initialised as llama2.c's model.py does (normal, std 0.02;
    output projections scaled by 1/sqrt(2 * n_layers)); RMSNorm scales are ones."""
    rng = np.random.default_rng(seed)
    d, kv, h = cfg.dim, cfg.kv_dim, cfg.hidden_dim
    out_std = 0.02 / math.sqrt(2 * cfg.n_layers)

    def normal(shape: tuple[int, ...], std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    return {
        "wq": normal((d, d)),
        "wk": normal((kv, d)),
        "wv": normal((kv, d)),
        "wo": normal((d, d), out_std),
        "w1": normal((h, d)),
        "w2": normal((d, h), out_std),
        "w3": normal((h, d)),
        "rms_att": np.ones(d, np.float32),
        "rms_ffn": np.ones(d, np.float32),
        "rms_final": np.ones(d, np.float32),
        "embed": normal((cfg.vocab_size, d)),
    }
