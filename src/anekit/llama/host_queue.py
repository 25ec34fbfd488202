"""The host's share of a training step run beside the engine's: one serial worker thread per step.

A step's weight gradients (dW = dY @ X^T, one sgemm each) and the classifier's gradient need nothing the
next kernel needs, so they can run on the CPU while the engine runs the next kernels, as maderix/ANE's
dynamic pipeline does (training/training_dynamic/train.m: every dW sgemm goes onto one serial dispatch
queue, ``dw_q``, waited for before the embedding's backward and before Adam).

Same bits as the sequential step: the jobs run one at a time, in the order they were submitted, on the
operands they were submitted with, so every product and every add into a gradient happens as it would
inline. The BLAS thread count a product runs on is the process's (threadpoolctl's limit is process-wide,
so a job sees the limit its caller set), and OpenBLAS gives the same bits for a product made while
another thread runs one (measured: OpenBLAS 0.3.31, pthreads, 2 cores, 1 and 2 BLAS threads). That a
Mac's BLAS (Accelerate) does too is an assumption until measured there: tests/test_host_overlap.py
compares the bits both ways with the BLAS of the machine it runs on.

Nothing is copied for a job: the caller must not change an array it handed to one before ``drain``
returns, and the step does not (its reused buffers, the logits / dlogits and the classifier's product,
are reused only by the next step, after the drain; every kernel call returns fresh arrays,
``KernelSpec.run``, so the next kernel's run cannot overwrite a job's operand).

When it pays (``overlap_pays``): on the engine the host is free while a kernel runs, so the jobs fill
time the host would spend waiting. On the simulator the "engine" is this CPU: the jobs compete with the
kernels for the same cores. Measured with benchmarks/bench_host_overlap.py (stories15M, dynamic weights,
2 cores shared with other work, load 3-4.7): the schedule leaves 0.2-3.4 ms of the step's 60-140 ms of
jobs on the step's path, but with no free core the jobs take 1.1-2x as long on their thread; the
simulator's step overlapped was 0.88-1.00x as fast as inline (medians), so a step there runs inline
unless asked; the fake engine's, whose kernels compute on the same cores, 0.88-1.06x (medians) and
0.94-1.10x (the least of each way).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from anekit.errors import AnekitError


class HostJobFailed(AnekitError, RuntimeError):
    """A host job of a training step raised an exception that is not anekit's own (it is the cause)."""


class HostJobs(Protocol):
    """Where a step's host jobs go: ``submit`` a job, ``drain`` before reading what the jobs wrote."""

    def submit(self, what: str, fn: Callable[..., None], *args: Any) -> None: ...

    def drain(self) -> None: ...


class Inline:
    """Each job runs at once on the caller's thread: the sequential step."""

    def submit(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        fn(*args)

    def drain(self) -> None:
        return None


_STOP = object()  # the last item of a queue: the worker returns


class HostQueue:
    """One worker thread running the submitted jobs one at a time, in submission order.

    A job's error stops the jobs after it (they would build on a gradient left half-formed) and is raised
    in the caller by the next ``submit`` or ``drain``: an anekit error as it is, any other wrapped in
    ``HostJobFailed`` naming the job."""

    def __init__(self, name: str = "anekit-host") -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: tuple[str, BaseException] | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):  # a drain's marker: every job before it has run
                item.set()
                continue
            what, fn, args = item
            if self._error is not None or self._cancelled:
                continue
            try:
                fn(*args)
            except BaseException as e:  # handed to the caller, who decides (``_raise``)
                self._error = (what, e)

    def submit(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        """Queue ``fn(*args)``; ``what`` names it in an error. Raises a failed earlier job's error."""
        self._raise()
        self._jobs.put((what, fn, args))

    def drain(self) -> None:
        """Wait until every job submitted so far has run; raise the first failed job's error."""
        done = threading.Event()
        self._jobs.put(done)
        done.wait()
        self._raise()

    def _raise(self) -> None:
        if self._error is None:
            return
        what, e = self._error
        if isinstance(e, AnekitError):
            raise e
        raise HostJobFailed(f"[step] host job '{what}' failed: {type(e).__name__}: {e}") from e

    def close(self, cancel: bool = False) -> None:
        """Stop the worker after the jobs queued (``cancel``: skip those not started) and join it."""
        self._cancelled = cancel
        self._jobs.put(_STOP)
        self._thread.join()

    def alive(self) -> bool:
        return self._thread.is_alive()


@contextmanager
def host_jobs(overlap: bool, name: str = "anekit-host") -> Iterator[HostJobs]:
    """The jobs of one step: on a worker thread of their own (``overlap``) or inline. On leaving, the
    worker has finished and is gone, whatever happened: a normal exit drains it (raising a job's error),
    an exception of the caller's cancels the jobs not started and propagates."""
    if not overlap:
        yield Inline()
        return
    jobs = HostQueue(name)
    try:
        yield jobs
    except BaseException:
        jobs.close(cancel=True)
        raise
    try:
        jobs.drain()
    finally:
        jobs.close()


def overlap_pays(backend_name: str) -> bool:
    """Whether a step on backend ``backend_name`` runs its host jobs beside the kernels by default: on the
    engine ("ane") yes, on the simulator no (its kernels use the cores the jobs would; measured by
    benchmarks/bench_host_overlap.py)."""
    return backend_name != "sim"
