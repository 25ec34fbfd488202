"""How the training step's kernels are cut: the construct choices of one training route.

The engine layer decides which route a chip and macOS version get, from the hardware runs of each
construct (``anekit.engine.training_routes``); this module is the kernels' side of it, the four choices the
lowerings and the step act on:

- ``weights``: "baked" (BLOBFILE consts in 1x1 convs; recompiled when the weights change) or "dynamic"
  (weights travel in the input and a matmul consumes them; compiled once);
- ``attention``: "engine" (scores, softmax and probs @ V in the SDPA kernels, as matmuls) or "host" (the
  engine runs only the projections as 1x1 convs; the attention core and its backward run on the host);
- ``norm``: "engine" (the RMSNorm fused into the kernel that reads it) or "host" (the host normalises and
  the kernel reads the normalised input);
- ``rope``: "conv" (the pair swap as a constant 1x1 conv), "slice" (the pair swap written as hardware-run
  code writes it: reshape, slice, negate, concat), "matmul" (the pair swap as a matmul of the heads by a
  constant hd x hd permutation, as rustane wrote it for the M3 Ultra: pull request #9) or "host" (RoPE on
  the host, with host attention).

``LEGACY`` is the kernel set anekit built before routes existed (and still builds when no chip is named
off a Mac): dynamic or baked weights, everything on the engine, the swap conv.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.errors import AnekitError

WEIGHTS = ("baked", "dynamic")
ATTENTION = ("engine", "host")
NORM = ("engine", "host")
ROPE = ("conv", "slice", "matmul", "host")


class BadKernelRoute(AnekitError, ValueError):
    """A training-route choice the kernels cannot build (not the engine layer's direct / e5rt / coreml
    routes: those are how a program reaches the engine)."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class KernelRoute:
    """The four construct choices of a training route (see the module docstring)."""

    weights: str = "dynamic"
    attention: str = "engine"
    norm: str = "engine"
    rope: str = "conv"

    def __post_init__(self) -> None:
        for field, value, choices in (
            ("weights", self.weights, WEIGHTS),
            ("attention", self.attention, ATTENTION),
            ("norm", self.norm, NORM),
            ("rope", self.rope, ROPE),
        ):
            if value not in choices:
                named = ", ".join(choices)
                raise BadKernelRoute(f"[kernels] route {field} '{value}' (choose one of: {named})")
        if self.attention == "host" and self.weights != "baked":
            raise BadKernelRoute("[kernels] host attention runs with baked weights only (conv kernels)")
        if (self.attention == "host") != (self.rope == "host"):
            raise BadKernelRoute("[kernels] RoPE runs on the host exactly when attention does")
        if self.attention == "host" and self.norm != "host":
            raise BadKernelRoute("[kernels] host attention normalises on the host")

    def describe(self) -> str:
        """``weights baked, attention host, norm host, rope host`` style."""
        return f"weights {self.weights}, attention {self.attention}, norm {self.norm}, rope {self.rope}"


LEGACY = KernelRoute()

# The training routes the engine layer chooses from (``anekit.engine.training_routes``, which names them by
# the same ids with the same four strings: a test holds the two tables together), by id.
ROUTES = {
    "dynamic-engine-attention": KernelRoute("dynamic", "engine", "host", "slice"),
    "dynamic-engine-attention-rope-matmul": KernelRoute("dynamic", "engine", "host", "matmul"),
    "baked-engine-attention": KernelRoute("baked", "engine", "host", "slice"),
    "conv-host-attention": KernelRoute("baked", "host", "host", "host"),
}


def kernel_route(route_id: str) -> KernelRoute:
    """The kernels of the training route ``route_id`` ("" : the legacy kernels); one line naming the known
    ids otherwise."""
    if not route_id:
        return LEGACY
    if route_id not in ROUTES:
        raise BadKernelRoute(f"[kernels] unknown training route '{route_id}' (known: {', '.join(ROUTES)})")
    return ROUTES[route_id]


__all__ = [
    "ATTENTION",
    "LEGACY",
    "NORM",
    "ROPE",
    "ROUTES",
    "WEIGHTS",
    "BadKernelRoute",
    "KernelRoute",
    "kernel_route",
]
