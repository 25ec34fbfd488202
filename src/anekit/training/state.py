"""What the training loop carries: its config (``TrainConfig``), its state (``TrainState``), its reports."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from anekit.errors import AnekitError
from anekit.llama.params import Params


class TrainingDiverged(AnekitError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200  # optimizer steps; each is one accumulation batch of `accum` sequences
    accum: int = 4  # sequences per optimizer step (ACCUM_STEPS: one compile of the kernels serves them all)
    lr: float = 3e-3  # peak learning rate, reached after `warmup` steps
    min_lr: float = 3e-4  # the cosine decays to this at the last step
    warmup: int = 10
    weight_decay: float = 0.1  # AdamW decay of the 2-D weights (not of RMSNorm scales), as llama2.c
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # global gradient-norm clip
    loss_scale: float = 1024.0  # activation gradients are scaled by this inside the fp16 kernels
    seed: int = 0
    weights: str = "baked"  # "baked" (recompile per batch, fastest per step) or "dynamic" (compile once)
    route: str = ""  # the training route's id (anekit.kernels.route.ROUTES); "": the legacy kernels

    def lr_at(self, step: int) -> float:
        """Warmup (linear) then cosine decay to min_lr."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


@dataclass
class TrainState:
    """Everything a resumed run needs: weights, Adam moments, counters, the loss history. (A LoRA run's
    moments are its adapters', kept by its ``LoraTrainable``: ``adam_m`` / ``adam_v`` are then None.)"""

    params: Params
    adam_m: Params | None
    adam_v: Params | None
    step: int = 0  # optimizer steps done
    adam_t: int = 0  # Adam's timestep (steps actually applied)
    loss_scale: float = 1024.0
    losses: list[float] = field(default_factory=list)  # mean loss of each optimizer step
    seconds: dict[str, float] = field(default_factory=dict)  # cumulative per phase
    val_losses: dict[int, float] = field(default_factory=dict)  # step -> validation loss, where evaluated

    @staticmethod
    def fresh(params: Params, tc: TrainConfig) -> TrainState:
        return TrainState(params, params.zeros_like(), params.zeros_like(), loss_scale=tc.loss_scale)


@dataclass(frozen=True)
class StepReport:
    step: int
    loss: float
    lr: float
    tokens: int
    seconds: float
    skipped: bool  # a gradient overflowed: no update, the loss scale was halved
    val_loss: float | None = None  # the validation loss after this step, when it was evaluated


StopReason = str  # "done", "budget" (checkpoint, then re-execute to continue) or "stopped" (should_stop)
