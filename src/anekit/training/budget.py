"""The compile budget one optimizer step needs: a budget below it would restart forever."""

from __future__ import annotations

from anekit.errors import AnekitError
from anekit.llama.step import Kernels
from anekit.training.options import opt


def first_step_compiles(cfg: object, weights: str) -> int:
    """Programs a fresh process compiles before its first step completes (the shared SDPA backward, then
    the weight-bearing kernels: all per layer when baked, the seven dynamic ones once)."""
    return 1 + (7 if weights == "dynamic" else Kernels.compiles_per_batch(cfg))  # type: ignore[arg-type]


class BudgetTooSmall(AnekitError):
    """The compile budget cannot hold one optimizer step: restarting would never make progress."""


def check_budget(budget: int, cfg: object, weights: str) -> None:
    """BudgetTooSmall unless a fresh process with ``budget`` compiles can complete one step."""
    need = first_step_compiles(cfg, weights)
    if budget < need:
        raise BudgetTooSmall(
            f"[train] the compile budget {budget} is smaller than one step's {need} compiles ({weights} "
            f"weights): pass {opt('compile_budget', need)} or more"
        )
