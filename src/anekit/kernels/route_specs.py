"""Every kernel a training route's step compiles, by the name ``anekit kernels dump`` writes it under.

The training step (``anekit.llama.step``) compiles, per route (``anekit.kernels.route.KernelRoute``):

- dynamic weights: ``sdpa_fwd_dynamic``, ``ffn_fwd_dynamic``, ``ffn_bwd_w2t_dynamic``,
  ``ffn_bwd_w13t_dynamic``, ``qkv_bwd_dynamic``, the dynamic matmul ``wo_t_dynamic`` (da = Wo^T do) and
  ``sdpa_bwd1_weightless`` (fed da; the legacy one bakes Wo = I where Wo is square), and ``sdpa_bwd2``;
- baked weights: ``sdpa_fwd``, ``ffn_fwd``, ``ffn_bwd``, ``sdpa_bwd1``, ``sdpa_bwd2``, ``qkv_bwd`` (each
  layer's own weights; ``weights`` are one layer's, as ``catalog.build`` takes them);
- host attention: the conv kernels of ``anekit.kernels.conv_only.conv_route_specs``.

A kernel that depends on the layer kind (``catalog.BY_KIND``) comes once per kind the config has
("sdpa_fwd_sliding" beside "sdpa_fwd"). The head (final norm, classifier, loss) and every RMSNorm
backward run on the host in every route, so none of them is here. For dumping and linting a route's
kernels: ``route_specs(cfg, LEGACY)`` are the legacy dynamic kernels, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from anekit.kernels import attention_bwd, backward, dynamic, forward
from anekit.kernels.catalog import split_kind, with_kinds
from anekit.kernels.config import ModelConfig
from anekit.kernels.conv_only import conv_route_specs
from anekit.kernels.route import LEGACY, KernelRoute
from anekit.kernels.spec import KernelSpec

Weights = Mapping[str, np.ndarray] | None

# The kernels of each weight mode's step, in the order ``anekit kernels dump`` lists them.
DYNAMIC_NAMES = (
    "sdpa_fwd_dynamic",
    "ffn_fwd_dynamic",
    "ffn_bwd_w2t_dynamic",
    "ffn_bwd_w13t_dynamic",
    "qkv_bwd_dynamic",
    "wo_t_dynamic",
    "sdpa_bwd1_weightless",
    "sdpa_bwd2",
)
BAKED_NAMES = ("sdpa_fwd", "ffn_fwd", "ffn_bwd", "sdpa_bwd1", "sdpa_bwd2", "qkv_bwd")


def route_names(cfg: ModelConfig, route: KernelRoute) -> list[str]:
    """The names of the kernels ``route_specs`` gives for an engine-attention route."""
    return with_kinds(cfg, list(DYNAMIC_NAMES if route.weights == "dynamic" else BAKED_NAMES))


def route_specs(cfg: ModelConfig, route: KernelRoute, weights: Weights = None) -> dict[str, KernelSpec]:
    """Every kernel ``route``'s training step compiles, by name (the module docstring); ``weights`` (one
    layer's, llama2.c's layout) go into the baked kernels, None generates them from shapes only."""
    if route.attention == "host":
        return conv_route_specs(cfg, weights)
    out = {}
    for name in route_names(cfg, route):
        base, kind = split_kind(name)
        out[name] = _generator(base, route, weights)(cfg, kind)
    return out


def _generator(name: str, route: KernelRoute, weights: Weights) -> Callable[[ModelConfig, str], KernelSpec]:
    """The kernel ``name`` of the route's step as a function of (cfg, layer kind)."""
    norm, rope, legacy = route.norm, route.rope, route == LEGACY
    table: dict[str, Callable[[ModelConfig, str], KernelSpec]] = {
        "sdpa_fwd_dynamic": lambda c, k: dynamic.sdpa_fwd_dynamic(c, kind=k, norm=norm, rope=rope),
        "ffn_fwd_dynamic": lambda c, k: dynamic.ffn_fwd_dynamic(c, norm=norm),
        "ffn_bwd_w2t_dynamic": lambda c, k: dynamic.ffn_bwd_w2t_dynamic(c),
        "ffn_bwd_w13t_dynamic": lambda c, k: dynamic.ffn_bwd_w13t_dynamic(c),
        "qkv_bwd_dynamic": lambda c, k: dynamic.qkv_bwd_dynamic(c),
        "wo_t_dynamic": lambda c, k: dynamic.wo_t_dynamic(c),
        "sdpa_bwd1_weightless": lambda c, k: attention_bwd.sdpa_bwd1_weightless(
            c, kind=k, identity_wo=legacy
        ),
        "sdpa_bwd2": lambda c, k: attention_bwd.sdpa_bwd2(c, kind=k, rope=rope),
        "sdpa_fwd": lambda c, k: forward.sdpa_fwd(c, weights, kind=k, norm=norm, rope=rope),
        "ffn_fwd": lambda c, k: forward.ffn_fwd(c, weights, norm=norm),
        "ffn_bwd": lambda c, k: backward.ffn_bwd(c, weights),
        "sdpa_bwd1": lambda c, k: attention_bwd.sdpa_bwd1(c, weights, kind=k),
        "qkv_bwd": lambda c, k: attention_bwd.qkv_bwd(c, weights),
    }
    return table[name]


__all__ = ["BAKED_NAMES", "DYNAMIC_NAMES", "route_names", "route_specs"]
