"""How many threads BLAS gets, chosen per task rather than once for the process.

The kernels' host-side matrices of a small model are small: BLAS thread hand-offs cost more than they
save there (a training step of the default model ran about 3x faster on one BLAS thread). A larger model
(stories15M: 256 x 288 activations against 32000 x 288 classifiers) runs its sgemms faster on every core.
So anekit leaves BLAS its default (every core) at start-up and limits it, through threadpoolctl, for the
span of each task: one thread for small work, the cores left over for worker threads otherwise
(``anekit.training.accumulate``). A limit can only lower the thread count BLAS started with, which is why the
process must not start with one thread.

A user who sets OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS, MKL_NUM_THREADS) decides: anekit then never
changes it.

``Background`` runs one job on a thread of its own (a checkpoint's write, a run's closing sample) and hands
its error to whoever waits for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

USER_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
USER_SET = any(v in os.environ for v in USER_VARIABLES)  # read once, before anything could set them


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """BLAS limited to ``n`` threads meanwhile; nothing when the user set the count or threadpoolctl is
    not installed."""
    if USER_SET:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=max(1, n), user_api="blas"):
        yield


SAMPLING_MIN_WEIGHTS = 50_000_000  # below it a decode step's matrix-vector products are too small to share
# ... unless one matrix is this large: stories15M's 32000 x 288 classifier (9.2M weights, 37 MB) takes 2.4 ms
# a token on one BLAS thread and 1.2 ms on two, and its whole decode step 6.0 -> 4.6 ms (2-core machine,
# benchmarks/bench_cli_vs_numpy.py); stories260K's largest matrix (512 x 64) gains nothing.
SAMPLING_MIN_MATRIX = 2_000_000


def for_sampling(params: Any) -> int:
    """BLAS threads for generating text from ``params`` (an ``anekit.llama.Params``; None: one thread).
    One decode step is a matrix-vector product per weight matrix: worth sharing out only for a large
    model, or for one whose largest matrix (the classifier, as a rule) is large."""
    if params is None:
        return 1
    sizes = [a.size for _, a in params.tensors()]
    large = sum(sizes) >= SAMPLING_MIN_WEIGHTS or max(sizes, default=0) >= SAMPLING_MIN_MATRIX
    return cores() if large else 1


class Background:
    """A job running on a thread of its own while the caller goes on (a checkpoint written while the next
    step computes, file writes and fsync releasing the GIL; a run's closing sample). ``wait`` joins it and
    raises what the job raised, so a failure is reported where the caller settles it, never lost. The caller
    must not change what the job reads before ``wait`` returns."""

    def __init__(self, job: Callable[[], None], name: str = "anekit-job") -> None:
        import threading

        self._error: BaseException | None = None

        def body() -> None:
            try:
                job()
            except BaseException as e:  # handed to wait(), in the caller's thread
                self._error = e

        self._thread = threading.Thread(target=body, name=name, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until the job is done; re-raise its error, once."""
        self._thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error
