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
from typing import Any, Protocol

import numpy as np

from anekit.errors import AnekitError
from anekit.kernels.route import kernel_route
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import Timer
from anekit.runtime.base import Backend
from anekit.training.accumulate import Accumulator
from anekit.training.budget import BudgetTooSmall, check_budget, first_step_compiles
from anekit.training.distributed.ranks import Ranks
from anekit.training.distributed.transport import Transport
from anekit.training.optimizer import ADAM_CHUNK, apply_adamw, update_threads
from anekit.training.state import StepReport, StopReason, TrainConfig, TrainingDiverged, TrainState
from anekit.training.trainable import FullTrainable, Trainable

__all__ = [
    "ADAM_CHUNK",
    "BudgetTooSmall",
    "Dataset",
    "StepReport",
    "StopReason",
    "TrainConfig",
    "TrainState",
    "TrainingDiverged",
    "apply_adamw",
    "check_budget",
    "first_step_compiles",
    "train",
]


class Dataset(Protocol):
    """Windows to train on: (tokens, targets), or (tokens, targets, weights) where a loss mask applies."""

    def batch(self, rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, ...]: ...


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
    transport: Transport | None = None,
    blas_threads: int | None = None,
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
    (``anekit.training.accumulate``: dynamic weights; the same result as one thread, bit for bit).
    ``before_update()`` is called before each optimizer update changes a weight (a checkpoint still being
    written from the weights finishes first).

    ``transport`` (size N > 1): this process is one rank of a data-parallel run (``tc.accum`` is the global
    batch, a multiple of N). It runs its block of the step's micro-batches (``local_micro``), the gradients
    are summed across ranks in the one-process order (``ordered_sum``), the losses and overflow flags of
    every micro-batch are exchanged, and the stop and compile-budget decisions are agreed, so every rank
    holds the same state after every step and returns the same reason. The callbacks are called on every
    rank that is given them (only rank 0 should write or print); ``validate`` runs on every rank given it
    (each computes the same loss: the ranks stay in step). The exchanges' time is the timer's "comm".

    ``blas_threads`` fixes the BLAS threads every sequence runs on (a product's bits may depend on them: a run
    stores the count, ``accumulate.sequence_blas``, so its ranks and resumes use it whatever their cores);
    None: each process's own share (``accumulate.blas_share``)."""
    if validate is not None and tc.weights != "dynamic":
        raise AnekitError(
            "[train] a run with validation uses dynamic weights (its kernels are not recompiled)"
        )
    cfg = state.params.cfg
    timer = Timer()
    timer.seconds.update(state.seconds)
    check_budget(backend.compile_budget - backend.compile_count, cfg, tc.weights, tc.route)
    route = kernel_route(tc.route) if tc.route else None  # None: the legacy kernels of tc.weights
    kernels = make_kernels(backend, cfg, tc.weights, route)
    # no more workers than the compile budget holds kernel sets for: a restart must still make progress
    budget_left = backend.compile_budget - backend.compile_count
    threads = max(1, min(threads, budget_left // first_step_compiles(cfg, tc.weights, tc.route)))
    workers = Accumulator(backend, cfg, tc.weights, kernels, threads, tc.route, blas_threads)
    trainable = FullTrainable(state) if trainable is None else trainable
    params = trainable.params
    ranks = Ranks(transport, tc.accum, trainable) if transport is not None else None
    # the optimizer's threads, from the parameters it may update (LoRA's step ignores its threads)
    size = sum(a.size for _, a in params.tensors()) if hasattr(params, "tensors") else 0
    optimizer = update_threads(workers.threads, size)
    last_save = time.monotonic()
    first = state.step
    try:
        while state.step < tc.steps:
            stop = should_stop is not None and should_stop()
            short = backend.compile_count + workers.compiles_needed() > backend.compile_budget
            if ranks is not None:
                with timer.phase("comm"):
                    stop, any_short = ranks.agree(stop, short, state.step + 1)
            else:
                any_short = False
            if stop:
                return "stopped"
            if short or any_short:
                if state.step == first:  # a restart would stop here again: never loop without progress
                    if not short:
                        raise BudgetTooSmall(
                            "[train] the compile budget of another rank cannot hold one step"
                        )
                    raise BudgetTooSmall(
                        f"[train] the compile budget {backend.compile_budget} cannot hold one step "
                        f"({backend.compile_count} compiled, {workers.compiles_needed()} more needed)"
                    )
                return "budget"
            t0 = time.perf_counter()
            workers.compile(params, timer)
            if validate is not None and state.step == 0 and 0 not in state.val_losses:
                state.val_losses[0] = validate(kernels, timer)  # where the curve starts
            step = state.step

            def batch(micro: int, step: int = step) -> tuple[np.ndarray, ...]:
                return data.batch(np.random.default_rng([tc.seed, step, micro]), cfg.seq_len)

            if ranks is None:
                trainable.zero()
                results = workers.run(trainable, batch, range(tc.accum), state.loss_scale, timer)
            else:
                results = ranks.step(workers, batch, state.loss_scale, timer, step + 1)
            losses = []
            headroom_left = True  # every micro-step's gradients stayed under the MAC port's headroom
            for index, result in enumerate(results):
                if not math.isfinite(result.loss):
                    raise TrainingDiverged(
                        f"[train] the loss is {result.loss} at step {state.step} (micro-step {index}, "
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
                elif hasattr(trainable, "apply_writing"):  # straight into the kernels' surfaces
                    trainable.apply_writing(state, tc, optimizer, workers.write_weight)
                    workers.weights_written(params)
                else:
                    trainable.apply(state, tc, optimizer)
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
