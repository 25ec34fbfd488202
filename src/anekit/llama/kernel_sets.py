"""The kernel set a training step runs, chosen by weight mode and training route.

``make_kernels`` gives the step (``anekit.llama.step.train_step``) the kernel set of a weight mode — the
legacy baked (``step.Kernels``) or dynamic (``step.DynamicKernels``) set — or of a training route
(``anekit.kernels.route.KernelRoute``): the engine-attention routes' sets (the same classes, their
RMSNorm on the host and their RoPE as slices) or the host-attention route's
(``anekit.llama.step_host.HostAttentionKernels``). ``first_compiles`` counts what a fresh set compiles
before its first step completes (the compile budget's unit). Both live here, above the sets they choose
from, so neither set's module imports the other's.
"""

from __future__ import annotations

from anekit.kernels.config import ModelConfig
from anekit.kernels.route import BadKernelRoute, KernelRoute
from anekit.llama.step import DynamicKernels, Kernels
from anekit.llama.step_host import HostAttentionKernels
from anekit.runtime.base import Backend


def first_compiles(cfg: ModelConfig, weights: str, route: KernelRoute | None = None) -> int:
    """Programs a fresh kernel set compiles before its first step completes: one SDPA backward 2 per layer
    kind, then the weight-bearing kernels (all per layer when baked; dynamic: five once, and the SDPA
    forward and backward 1 once per kind); a host-attention route's conv kernels, all per layer."""
    if route is not None and route.attention == "host":
        return HostAttentionKernels.compiles_per_batch(cfg)
    kinds = len(cfg.layer_kinds)
    if weights == "dynamic":
        return kinds + DynamicKernels.compiles_for(cfg)
    return kinds + Kernels.compiles_per_batch(cfg)


def make_kernels(
    backend: Backend, cfg: ModelConfig, weights: str | None, route: KernelRoute | None = None
) -> Kernels:
    """The kernel set of a weight mode: "baked" (recompiled per batch) or "dynamic" (compiled once).

    ``route`` None: the legacy kernels of that mode. A training route (``anekit.kernels.route``): its
    kernels, in its own weight mode (``weights`` must then be that mode, or None); host attention
    ("conv-host-attention") is ``HostAttentionKernels``."""
    if route is None:
        if weights == "dynamic":
            return DynamicKernels(backend, cfg)
        if weights == "baked":
            return Kernels(backend, cfg)
        raise ValueError(f"weights must be 'baked' or 'dynamic', not {weights!r}")
    if weights is not None and weights != route.weights:
        raise BadKernelRoute(
            f"[step] weights '{weights}' contradict the route's '{route.weights}' ({route.describe()}): "
            "name one weight mode"
        )
    if route.attention == "host":
        return HostAttentionKernels(backend, cfg)
    if route.weights == "dynamic":
        return DynamicKernels(backend, cfg, route)
    return Kernels(backend, cfg, route)


__all__ = ["first_compiles", "make_kernels"]
