"""Benchmark: a training step's host work beside its kernels (``train_step``'s ``overlap``), on the engine
backend's fake with a simulated engine latency, and on the simulator.

Run: python benchmarks/bench_host_overlap.py [--config stories15M] [--chip m4] [--repeats 5] [--blas 2]
     [--latency-ms MS ...]

What it does, in order:

1. makes the dynamic kernels of ``--config`` on the fake engine backend (tests/fake_objc.py through
   ``AneBackend``) and on the simulator, and warms each with a step;
2. times the step's host jobs (every weight gradient and the classifier's gradient, inline) and counts the
   fake's evaluations a step;
3. gives each evaluation of the fake a latency, slept for real with the GIL released (the engine computing
   while the host is free): by default the cost model's engine time of the step on ``--chip``
   (``anekit.cost``) shared over the step's evaluations, and the latency at which the engine's time equals
   the host jobs' time measured in 2 (where the overlap can hide the most); ``--latency-ms`` names others;
4. times steps with the overlap off and on, alternating, on the fake at each latency and on the simulator,
   and prints the median and the least step of each way, their ratios, the jobs' own time inline and on
   their thread, the time the step's thread waited for them (``HostQueue.drain``: the jobs the schedule
   left on the step's path), and the load average before and after.

On the fake an evaluation also computes its plan on this CPU (the simulator's, about as long as a
simulated kernel), so the jobs compete with it for the cores: where no core is free (2 cores shared with
other work) the jobs slow down by as much as they are hidden, and the wait shows what the schedule itself
does. On the engine the kernels leave the CPU free.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the tests' fake

from anekit import runtime
from anekit.cost.distributed import sequence_s
from anekit.kernels.config import preset
from anekit.llama.host_queue import HostQueue
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.params import Params
from anekit.llama.step import Gradients, Kernels, Timer, train_step
from anekit.runtime.ane import AneBackend
from anekit.threads import cores
from anekit.training.accumulate import fixed_blas
from tests.fake_objc import FakeObjC


class TimedGradients(Gradients):
    """``Gradients`` that add up the seconds its products take (the step's host jobs, on whichever
    thread runs them)."""

    seconds = 0.0

    def matrix(self, layer: int, key: str, dy: np.ndarray, x: np.ndarray) -> None:
        t0 = time.perf_counter()
        super().matrix(layer, key, dy, x)
        TimedGradients.seconds += time.perf_counter() - t0

    def classifier(self, params: Params, dlogits: np.ndarray, xf: np.ndarray) -> None:
        t0 = time.perf_counter()
        super().classifier(params, dlogits, xf)
        TimedGradients.seconds += time.perf_counter() - t0


WAITED = [0.0]  # seconds the step's thread waited in ``HostQueue.drain`` (the jobs left on its path)
_drain = HostQueue.drain


def _timed_drain(self: HostQueue) -> None:
    t0 = time.perf_counter()
    _drain(self)
    WAITED[0] += time.perf_counter() - t0


HostQueue.drain = _timed_drain  # type: ignore[method-assign]


def step_s(kernels: Kernels, params: Params, grads: Params, window: np.ndarray, overlap: bool) -> tuple:
    """(wall seconds, the jobs' own seconds, the seconds waited for them) of one step."""
    TimedGradients.seconds, WAITED[0] = 0.0, 0.0
    sink = TimedGradients(grads, kernels)
    t0 = time.perf_counter()
    train_step(kernels, params, sink, window[:-1], window[1:], Timer(), loss_scale=64.0, overlap=overlap)
    return time.perf_counter() - t0, TimedGradients.seconds, WAITED[0]


def both_ways(kernels: Kernels, params: Params, grads: Params, window: np.ndarray, repeats: int) -> str:
    """The steps with the overlap off and on, alternating: their medians, minima (the least disturbed by
    other work on the machine) and ratios; the jobs' own time each way and, overlapped, the wait."""
    off, on = [], []
    for _ in range(repeats):
        off.append(step_s(kernels, params, grads, window, False))
        on.append(step_s(kernels, params, grads, window, True))
    med = [[statistics.median(r[i] for r in runs) * 1e3 for i in range(3)] for runs in (off, on)]
    low = [min(r[0] for r in runs) * 1e3 for runs in (off, on)]
    return (
        f"inline {med[0][0]:.1f} ms, overlapped {med[1][0]:.1f} ms: {med[0][0] / med[1][0]:.3f}x (medians); "
        f"{low[0]:.1f} / {low[1]:.1f} ms: {low[0] / low[1]:.3f}x (minima); the jobs took {med[0][1]:.1f} ms "
        f"inline, {med[1][1]:.1f} ms on their thread, {med[1][2]:.1f} ms of it waited for"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="stories15M")
    ap.add_argument("--chip", default="m4", help="the chip whose predicted kernel times set the latency")
    ap.add_argument("--repeats", type=int, default=5, help="steps each way at each setting")
    ap.add_argument("--blas", type=int, default=cores(), help="BLAS threads of every product")
    ap.add_argument("--latency-ms", type=float, nargs="*", default=None, help="latencies of an evaluation")
    args = ap.parse_args()

    cfg = preset(args.config)
    params = Params.init(cfg, seed=0, tied=True)
    grads = params.zeros_like()
    window = np.random.default_rng(1).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    print(f"{cfg.name}: dynamic weights, BLAS on {args.blas} thread(s), {cores()} cores; "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip

    with fixed_blas(args.blas), tempfile.TemporaryDirectory() as tmp:
        fake = FakeObjC(tmp, chip=args.chip)
        sets = {
            "fake": make_kernels(AneBackend(runtime=fake.runtime()), cfg, "dynamic"),
            "sim": make_kernels(runtime.open("sim", chip=args.chip), cfg, "dynamic"),
        }
        for kernels in sets.values():
            kernels.compile(params, Timer())
            step_s(kernels, params, grads, window, False)  # warm: first-run work off the clock

        # the host jobs' time inline, and the fake's evaluations a step
        before = fake.evaluations
        host_s = statistics.median(step_s(sets["fake"], params, grads, window, False)[1] for _ in range(3))
        evals = (fake.evaluations - before) // 3
        engine_s = sequence_s(cfg, args.chip, "dynamic")
        print(f"host jobs inline: {host_s * 1e3:.1f} ms a step; {evals} evaluations a step; the cost model's "
              f"engine time on the {args.chip}: {engine_s * 1e3:.1f} ms a step")  # fmt: skip

        latencies = args.latency_ms
        if latencies is None:
            latencies = [engine_s / evals * 1e3, host_s / evals * 1e3]
        for ms in latencies:
            fake.eval_latency = ms / 1e3
            figures = both_ways(sets["fake"], params, grads, window, args.repeats)
            print(f"fake, {ms:.3f} ms an evaluation ({ms * evals:.1f} ms a step): step {figures}")
        fake.eval_latency = 0.0
        print(f"simulator: step {both_ways(sets['sim'], params, grads, window, args.repeats)}")
        for kernels in sets.values():
            kernels.close()
    print(f"load {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
