"""One accumulation batch: its sequences forward and backward, on one thread or on several at once.

The sequences of a batch are independent until their gradients are summed, so with ``threads`` > 1 each
worker thread runs its own kernel set (``make_kernels``: the simulator's kernels hold their surfaces, so
they are not shared) on sequences t, t + threads, ... of the batch. numpy's BLAS calls, the simulator's
array work and anekit's compiled loops (``nogil``) release the GIL, so the threads run on separate cores;
while they run, BLAS gets cores / threads threads of its own (``anekit.threads``), so the two kinds of
parallelism do not fight over the cores; a small model's sequences run on one BLAS thread.

A float32 product's bits depend on the number of BLAS threads it runs on, so a run may fix that number
(``blas``: every sequence on exactly that many, whatever this process's cores; ``sequence_blas`` is what a
process would choose) to get the same bits on every rank and every resume.

The result does not depend on the number of worker threads: each sequence's gradient goes into its worker's
buffer and is added to the batch's total in sequence order (``Gradients``: the one-thread path adds in
place, which gives the same bits), the losses and overflow flags are combined in sequence order, and
every sequence's window is drawn by a generator seeded with (seed, step, sequence). The phase times of the
workers are summed (CPU seconds, not wall seconds, when threads overlap).

A rank of a data-parallel run past the first runs its block of the batch with ``run_kept``: each sequence's
gradients stay in a buffer of their own, added after the partial total of the ranks before it arrives
(``anekit.training.distributed.order``), so the sum is still the one-process fold.

The engine runs one program at a time, so threads serve the simulator; dynamic weights only (baked
kernels would be compiled once per worker per step).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from anekit import threads as blas_env
from anekit.kernels.route import kernel_route
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.params import layer_shapes
from anekit.llama.step import Kernels, StepResult, Timer, train_step
from anekit.threads import blas_threads, cores
from anekit.training.budget import first_step_compiles

# A sequence's work below which threads cost more than they give: measured on 2 cores, the default
# model (about 0.1 GFLOP a sequence) ran 0.7x as fast on two threads, stories15M (about 20 GFLOP) 1.8x.
THREADS_MIN_FLOPS = 1e9


def sequence_flops(cfg: Any) -> float:
    """Roughly the FLOPs of one sequence's forward and backward: 6 per weight and token, the classifier
    included."""
    weights = sum(int(np.prod(s)) for s in layer_shapes(cfg).values()) * cfg.n_layers
    return 6.0 * cfg.seq_len * (weights + cfg.vocab_size * cfg.dim)


def default_threads(backend_name: str, weights: str, accum: int, cfg: Any) -> int:
    """Threads a run uses when not told: for the simulator's dynamic kernels, every core (at most one per
    sequence of the batch) when a sequence is enough work (``THREADS_MIN_FLOPS``); one otherwise."""
    if backend_name != "sim" or weights != "dynamic" or sequence_flops(cfg) < THREADS_MIN_FLOPS:
        return 1
    return max(1, min(cores(), accum))


def blas_share(cfg: Any, workers: int) -> int:
    """BLAS threads for each of ``workers`` threads: one for small work (hand-offs cost more than they
    save), else the cores divided among the workers (``anekit.threads``)."""
    return 1 if sequence_flops(cfg) < THREADS_MIN_FLOPS else max(1, cores() // workers)


def sequence_blas(cfg: Any, workers: int) -> int:
    """The BLAS threads a sequence of this process runs on when the run does not fix them: ``blas_share``,
    or what the user's OPENBLAS_NUM_THREADS (or the like) set, which anekit then leaves alone. A run
    stores it so every rank and every resume runs its sequences on the same count (``Accumulator``)."""
    if blas_env.USER_SET:
        from threadpoolctl import threadpool_info

        counts = [int(lib["num_threads"]) for lib in threadpool_info() if lib.get("user_api") == "blas"]
        return max(counts, default=1)
    return blas_share(cfg, workers)


def fixed_blas(n: int) -> AbstractContextManager[Any]:
    """BLAS on exactly ``n`` threads meanwhile, whatever the cores or the user's variables: a float32
    product's bits may depend on BLAS's thread count (some OpenBLAS builds split a product's sum differently
    on 1, 2 and 8 threads; others split only its rows and columns), so a run that fixes the count gets the
    same bits on every rank and every machine of the same BLAS build and CPU kind. (A limit above the
    count BLAS started with is honoured too.)"""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=n, user_api="blas")


class Accumulator:
    """Runs the sequences of one batch: ``kernels`` on this thread, or ``threads`` workers."""

    def __init__(
        self, backend: Any, cfg: Any, weights: str, kernels: Kernels, threads: int = 1, route: str = "",
        blas: int | None = None,
    ) -> None:  # fmt: skip
        self.backend, self.cfg, self.weights, self.route = backend, cfg, weights, route
        self.blas = blas  # BLAS threads of every sequence, fixed by the run; None: ``blas_share``
        self.threads = max(1, threads if weights == "dynamic" else 1)
        # Worker t > 0 makes and compiles its kernels in its own thread on its first sequence, while the
        # others compute: the start of a run does not wait for every worker's compiles.
        self.kernels: list[Kernels | None] = [kernels] + [None] * (self.threads - 1)
        self.timers = [Timer() for _ in self.kernels]
        self.sinks: list[Any] = []  # worker t's buffer, added to the total after each of its sequences
        self.kept: list[Any] = []  # one buffer per sequence of the batch (``run_kept``)
        self.params: Any = None
        self._compiling = threading.Lock()  # one compile at a time: the backend counts them

    def _blas(self, workers: int) -> AbstractContextManager[Any]:
        """BLAS's threads while ``workers`` threads run sequences: the run's fixed count, else a share."""
        return blas_threads(blas_share(self.cfg, workers)) if self.blas is None else fixed_blas(self.blas)

    def write_weight(self, name: str, value: np.ndarray) -> None:
        """An optimizer step updated tensor ``name``: every worker's dynamic kernels write it into their
        surfaces (``DynamicKernels.write_weight``; baked kernels are compiled again instead)."""
        for k in self.kernels:
            if k is not None and hasattr(k, "write_weight"):
                k.write_weight(name, value)

    def weights_written(self, params: Any) -> None:
        """Every tensor the step changed went through ``write_weight``: the next compile stages nothing."""
        for k in self.kernels:
            if k is not None and hasattr(k, "weights_written"):
                k.weights_written(params)

    def compiles_needed(self) -> int:
        """Programs the next batch compiles: the made kernels' next ones, a fresh set per worker to come."""
        made = [k for k in self.kernels if k is not None]
        fresh = first_step_compiles(self.cfg, self.weights, self.route) * (len(self.kernels) - len(made))
        return sum(k.compiles_needed() for k in made) + fresh

    def compile(self, params: Any, timer: Timer) -> None:
        self.params = params
        for k in self.kernels:
            if k is not None:
                k.compile(params, timer)

    def _kernels(self, t: int, timer: Timer) -> Kernels:
        """Worker t's kernels, made and compiled on its first use (in its own thread)."""
        kernels = self.kernels[t]
        if kernels is None:
            with self._compiling:
                route = kernel_route(self.route) if self.route else None
                kernels = make_kernels(self.backend, self.cfg, self.weights, route)
                kernels.compile(self.params, timer)
            self.kernels[t] = kernels
        return kernels

    def run(
        self,
        trainable: Any,
        batch: Callable[[int], tuple[np.ndarray, ...]],
        micro: range,
        loss_scale: float,
        timer: Timer,
    ) -> list[StepResult]:
        """Every sequence's result, in order; its gradients added to ``trainable``'s total in order.
        ``micro`` are the batch's (global) sequence indices this process runs; ``batch(i)`` gives sequence
        i's (tokens, targets[, weights])."""
        n = min(self.threads, len(micro))
        first = self.kernels[0]
        assert first is not None
        if n == 1:
            sink = trainable.sink(first)
            results = []
            with self._blas(1):
                for i in micro:
                    with timer.phase("io"):
                        tokens, targets, *weights = batch(i)
                    step = train_step(
                        first, trainable.params, sink, tokens, targets, timer, loss_scale, *weights
                    )
                    results.append(step)
            return results
        while len(self.sinks) < n:
            self.sinks.append(trainable.worker_sink(first))
        return self._threaded(trainable, batch, micro, loss_scale, timer, n, fold=True)

    def run_kept(
        self,
        trainable: Any,
        batch: Callable[[int], tuple[np.ndarray, ...]],
        micro: range,
        loss_scale: float,
        timer: Timer,
    ) -> tuple[list[StepResult], list[Any]]:
        """Every sequence's result, in order, and its gradients in a buffer of its own (one per sequence of
        ``micro``, in order), nothing added to the total: a rank past the first adds them after the
        partial total of the ranks before it arrives (``anekit.training.distributed.order``)."""
        n = min(self.threads, len(micro))
        first = self.kernels[0]
        assert first is not None
        while len(self.kept) < len(micro):
            self.kept.append(trainable.worker_sink(first))
        sinks = self.kept[: len(micro)]
        if n == 1:
            results = []
            with self._blas(1):
                for sink, i in zip(sinks, micro):
                    with timer.phase("io"):
                        tokens, targets, *weights = batch(i)
                    step = train_step(
                        first, trainable.params, sink, tokens, targets, timer, loss_scale, *weights
                    )
                    results.append(step)
            return results, sinks
        return self._threaded(trainable, batch, micro, loss_scale, timer, n, fold=False), sinks

    def _threaded(
        self, trainable: Any, batch: Callable[[int], tuple[np.ndarray, ...]], micro: range, loss_scale: float,
        timer: Timer, n: int, fold: bool,
    ) -> list[StepResult]:  # fmt: skip
        """Worker t runs the sequences t, t + n, ... of ``micro``; ``fold``: each into the worker's buffer,
        added to the total in sequence order; else each into its own buffer of ``kept``."""
        count = len(micro)
        results: list[StepResult | None] = [None] * count
        turn = threading.Condition()
        added = [0]  # sequences whose gradients are in the total
        errors: list[BaseException] = []

        def work(t: int) -> None:
            wtimer = self.timers[t]
            try:
                kernels = self._kernels(t, wtimer)
                for j in range(t, count, n):
                    sink = self.sinks[t] if fold else self.kept[j]
                    with wtimer.phase("io"):
                        tokens, targets, *weights = batch(micro[j])
                    result = train_step(kernels, trainable.params, sink, tokens, targets, wtimer, loss_scale,
                                        *weights)  # fmt: skip
                    with turn:
                        while fold and added[0] != j and not errors:
                            turn.wait()
                        if errors:
                            return
                        if fold:
                            with wtimer.phase("cpu"):
                                trainable.add(sink)  # in sequence order: the same sum as one thread's
                        results[j] = result
                        added[0] += 1
                        turn.notify_all()
            except BaseException as e:
                with turn:
                    errors.append(e)
                    turn.notify_all()

        workers = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(n)]
        with self._blas(n):
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        for wtimer in self.timers:
            for phase, seconds in wtimer.seconds.items():
                timer.seconds[phase] += seconds
            wtimer.seconds.clear()
        if errors:
            raise errors[0]
        return [r for r in results if r is not None]

    def close(self) -> None:
        for k in self.kernels:
            if k is not None:
                k.close()
