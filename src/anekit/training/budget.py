"""The compile budget one optimizer step needs: a budget below it would restart forever."""

from __future__ import annotations

from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig
from anekit.kernels.route import kernel_route
from anekit.llama.kernel_sets import first_compiles
from anekit.training.options import opt


def first_step_compiles(cfg: ModelConfig, weights: str, route: str = "") -> int:
    """Programs a fresh process compiles before its first step completes (the shared SDPA backward, then
    the weight-bearing kernels: all per layer when baked, the seven dynamic ones once; a model with
    sliding layers beside full ones compiles each kind's attention kernels; a training route's own
    count: ``kernel_sets.first_compiles``)."""
    return first_compiles(cfg, weights, kernel_route(route) if route else None)


class BudgetTooSmall(AnekitError):
    """The compile budget cannot hold one optimizer step: restarting would never make progress."""


def check_budget(budget: int, cfg: ModelConfig, weights: str, route: str = "") -> None:
    """BudgetTooSmall unless a fresh process with ``budget`` compiles can complete one step."""
    need = first_step_compiles(cfg, weights, route)
    if budget < need:
        raise BudgetTooSmall(
            f"[train] the compile budget {budget} is smaller than one step's {need} compiles ({weights} "
            f"weights): pass {opt('compile_budget', need)} or more"
        )
