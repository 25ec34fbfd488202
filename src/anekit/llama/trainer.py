"""The training loop: accumulation batches of kernel steps, AdamW, the compile budget, resumable state.

One optimizer step = one accumulation batch: the weight-bearing kernels are compiled with the current
weights (baked mode), ``accum`` sequences run forward and backward, the summed gradients are unscaled,
clipped and applied with AdamW (bias-corrected), and the learning rate follows warmup + cosine decay.

Every random choice derives from (seed, step, micro-step), so a run that stops — because the compile
budget is exhausted, the process re-executes itself and resumes from its checkpoint — continues
exactly as if it had never stopped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from anekit.errors import AnekitError
from anekit.llama import cpu_ops
from anekit.llama.params import Params
from anekit.llama.step import Timer, make_kernels
from anekit.runtime.base import Backend


class Dataset(Protocol):
    """Windows to train on: (tokens, targets), or (tokens, targets, weights) where a loss mask applies."""

    def batch(self, rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, ...]: ...


class Trainable(Protocol):
    """What an optimizer step changes: ``params`` (what the kernels and the CPU head read), the step's
    gradient container (``sink``), and the update (``apply``). Full training
    (``anekit.llama.lora.FullTrainable``) trains every weight, LoRA (``LoraTrainable``) its adapters."""

    params: Params

    def zero(self) -> None: ...

    def sink(self, kernels: Any) -> Any: ...

    def unscale(self, factor: float) -> bool: ...

    def apply(self, state: TrainState, tc: TrainConfig, threads: int = 1) -> None: ...


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


def first_step_compiles(cfg: object, weights: str) -> int:
    """Programs a fresh process compiles before its first step completes (the shared SDPA backward, then
    the weight-bearing kernels: all per layer when baked, the seven dynamic ones once)."""
    from anekit.llama.step import Kernels

    return 1 + (7 if weights == "dynamic" else Kernels.compiles_per_batch(cfg))  # type: ignore[arg-type]


class BudgetTooSmall(AnekitError):
    """The compile budget cannot hold one optimizer step: restarting would never make progress."""


def check_budget(budget: int, cfg: object, weights: str) -> None:
    """BudgetTooSmall unless a fresh process with ``budget`` compiles can complete one step."""
    from anekit.llama.run import opt

    need = first_step_compiles(cfg, weights)
    if budget < need:
        raise BudgetTooSmall(
            f"[train] the compile budget {budget} is smaller than one step's {need} compiles ({weights} "
            f"weights): pass {opt('compile_budget', need)} or more"
        )


def train(
    backend: Backend,
    state: TrainState,
    data: Dataset,
    tc: TrainConfig,
    on_step: Callable[[StepReport], None] | None = None,
    on_checkpoint: Callable[[TrainState], None] | None = None,
    checkpoint_every: int = 50,
    checkpoint_seconds: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    trainable: Trainable | None = None,
    validate: Callable[[Any, Timer], float] | None = None,
    val_every: int = 0,
    threads: int = 1,
    before_update: Callable[[], None] | None = None,
) -> StopReason:
    """Train until ``tc.steps`` optimizer steps are done, until the next batch would exceed the
    backend's compile budget (then the caller checkpoints and restarts the process), or until
    ``should_stop()`` says so between two steps (a signal, a closed output: the caller checkpoints).

    ``on_checkpoint`` is called after every ``checkpoint_every``-th step, and also when
    ``checkpoint_seconds`` have passed since the last checkpoint (when given), never after the last
    step (the caller saves the finished run itself). A step is never interrupted half-applied: every
    stop happens between steps, so the state handed back is always a whole step's.

    ``trainable`` says what the steps train (default: every weight of ``state.params``). ``validate``
    (kernels, timer) -> loss is called before the first step, every ``val_every`` steps and after the
    last, into ``state.val_losses``; it reads the kernels as the last step left them, so a validated run
    uses dynamic weights. ``threads`` > 1 runs the sequences of a batch at once on worker threads
    (``anekit.llama.accumulate``: dynamic weights; the same result as one thread, bit for bit).
    ``before_update()`` is called before each optimizer update changes a weight (a checkpoint still being
    written from the weights finishes first)."""
    if validate is not None and tc.weights != "dynamic":
        raise AnekitError(
            "[train] a run with validation uses dynamic weights (its kernels are not recompiled)"
        )
    from anekit.llama.accumulate import Accumulator
    from anekit.llama.lora import FullTrainable

    cfg = state.params.cfg
    timer = Timer()
    timer.seconds.update(state.seconds)
    check_budget(backend.compile_budget - backend.compile_count, cfg, tc.weights)
    kernels = make_kernels(backend, cfg, tc.weights)
    # no more workers than the compile budget holds kernel sets for: a restart must still make progress
    budget_left = backend.compile_budget - backend.compile_count
    threads = max(1, min(threads, budget_left // first_step_compiles(cfg, tc.weights)))
    workers = Accumulator(backend, cfg, tc.weights, kernels, threads)
    trainable = FullTrainable(state) if trainable is None else trainable
    params = trainable.params
    last_save = time.monotonic()
    first = state.step
    try:
        while state.step < tc.steps:
            if should_stop is not None and should_stop():
                return "stopped"
            if backend.compile_count + workers.compiles_needed() > backend.compile_budget:
                if state.step == first:  # a restart would stop here again: never loop without progress
                    raise BudgetTooSmall(
                        f"[train] the compile budget {backend.compile_budget} cannot hold one step "
                        f"({backend.compile_count} compiled, {workers.compiles_needed()} more needed)"
                    )
                return "budget"
            t0 = time.perf_counter()
            workers.compile(params, timer)
            if validate is not None and state.step == 0 and 0 not in state.val_losses:
                state.val_losses[0] = validate(kernels, timer)  # where the curve starts
            trainable.zero()
            step = state.step

            def batch(micro: int, step: int = step) -> tuple[np.ndarray, ...]:
                return data.batch(np.random.default_rng([tc.seed, step, micro]), cfg.seq_len)

            results = workers.run(trainable, batch, tc.accum, state.loss_scale, timer)
            losses = []
            headroom_left = True  # every micro-step's gradients stayed under the MAC port's headroom
            for micro, result in enumerate(results):
                if not math.isfinite(result.loss):
                    raise TrainingDiverged(
                        f"[train] the loss is {result.loss} at step {state.step} (micro-step {micro}, "
                        "forward phase); stopping — the last good checkpoint is kept"
                    )
                losses.append(result.loss)
                headroom_left = headroom_left and not result.overflowed
            if before_update is not None:
                before_update()
            with timer.phase("cpu"):
                finite = trainable.unscale(1.0 / (state.loss_scale * tc.accum))
                skipped = not finite or not headroom_left
                if skipped:
                    state.loss_scale /= 2  # overflow, or about to: the next batch with a smaller scale
                else:
                    trainable.apply(state, tc, workers.threads)
            lr = tc.lr_at(state.step)
            state.losses.append(float(np.mean(losses)))
            state.step += 1
            seconds = time.perf_counter() - t0
            val = None
            if validate is not None and val_every and (state.step % val_every == 0 or state.step == tc.steps):
                # dynamic kernels read the updated weights as they are (validated runs are dynamic)
                val = state.val_losses[state.step] = validate(kernels, timer)
            state.seconds = dict(timer.seconds)
            if on_step is not None:
                tokens_done = tc.accum * cfg.seq_len
                on_step(StepReport(state.step, state.losses[-1], lr, tokens_done, seconds, skipped, val))
            due = state.step % checkpoint_every == 0 or (
                checkpoint_seconds is not None and time.monotonic() - last_save >= checkpoint_seconds
            )
            if on_checkpoint is not None and due and state.step < tc.steps:
                on_checkpoint(state)
                last_save = time.monotonic()
        return "done"
    finally:
        workers.close()
        state.seconds = dict(timer.seconds)


ADAM_CHUNK = 1 << 20  # elements an optimizer worker updates at a time


def apply_adamw(state: TrainState, grads: Params, tc: TrainConfig, threads: int = 1) -> None:
    """Clip the global gradient norm and take one AdamW step on every tensor.

    The clip's scale is applied by the AdamW pass itself (``grad_scale``: the same float32 product, one
    pass over the gradients less); the gradients are left clipped, as ``clip_grad_norm`` leaves them.
    With ``threads`` > 1 the tensors are updated in chunks of ``ADAM_CHUNK`` elements on that many
    threads (the update is elementwise, and the compiled pass releases the GIL: the same bits).
    """
    tensors = list(grads.tensors())
    scale = cpu_ops.clip_scale(cpu_ops.grad_norm([g for _, g in tensors]), tc.grad_clip)
    state.adam_t += 1
    lr = tc.lr_at(state.step)
    assert state.adam_m is not None and state.adam_v is not None
    weights = dict(state.params.tensors())
    ms, vs = dict(state.adam_m.tensors()), dict(state.adam_v.tensors())
    work = []
    for name, g in tensors:
        w = weights[name]
        decay = cpu_ops.takes_weight_decay(w)  # matrices only: never the RMSNorm scales (llama2.c's rule)
        parts = (w, g, ms[name], vs[name])
        if threads > 1 and w.size > ADAM_CHUNK and all(a.flags.c_contiguous for a in parts):
            flats = [a.reshape(-1) for a in parts]
            for i in range(0, w.size, ADAM_CHUNK):
                work.append(([f[i : i + ADAM_CHUNK] for f in flats], decay))
        else:
            work.append((list(parts), decay))

    def update(item: tuple[list[np.ndarray], bool]) -> None:
        (w, g, m, v), decay = item
        cpu_ops.adamw_update(
            w, g, m, v, state.adam_t, lr, tc.beta1, tc.beta2, 1e-8, tc.weight_decay,
            apply_decay=decay, grad_scale=scale,
        )  # fmt: skip

    if threads > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(update, work))
    else:
        for item in work:
            update(item)
