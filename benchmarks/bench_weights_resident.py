"""Benchmark: the dynamic step, whose weights live in the kernels' surfaces, against the baked step.

Run: OPENBLAS_NUM_THREADS=2 python benchmarks/bench_weights_resident.py [--config stories15M] [--steps 6]
     [--pairs 3] [--accum 1]

For each mode, ``anekit.training.loop.train`` runs ``--steps`` optimizer steps of ``--accum`` sequences on the
simulator (the real loop: AdamW, and for dynamic weights the optimizer's writes into the surfaces), the modes
alternating ``--pairs`` times so that machine load hits both alike. A run's figure is the median of its steps'
own times, the first left out (it compiles, and stages the weights); the script prints each mode's medians,
their ratio (the goal: dynamic <= 1.0x baked), and the weight bytes the dynamic kernels wrote a step: after
the first staging, only the optimizer's write of each updated tensor, in fp16, into each surface that holds
it, against the bytes packing every weight into each kernel's float32 input on every run used to move.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from anekit import runtime
from anekit.kernels import preset
from anekit.llama import Params
from anekit.llama.step import DynamicKernels
from anekit.training import loop
from anekit.training.state import TrainConfig, TrainState


class Data:
    """Random windows of a fixed token stream (the benchmark times the step, not the data)."""

    def __init__(self, vocab: int) -> None:
        self.tokens = np.random.default_rng(7).integers(0, vocab, 200_000)

    def batch(self, rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        i = int(rng.integers(0, self.tokens.size - seq_len - 1))
        return self.tokens[i : i + seq_len], self.tokens[i + 1 : i + seq_len + 1]


def run(config: str, mode: str, steps: int, accum: int) -> tuple[float, int, int]:
    """(median step seconds, weight bytes staged at the start, weight bytes written per later step)."""
    cfg = preset(config)
    tc = TrainConfig(steps=steps, accum=accum, weights=mode, seed=1)
    state = TrainState.fresh(Params.init(cfg, seed=0), tc)
    seconds: list[float] = []
    made: list = []
    original = loop.make_kernels

    def keep(*args, **kwargs):  # type: ignore[no-untyped-def]
        k = original(*args, **kwargs)
        made.append(k)
        return k

    loop.make_kernels = keep  # type: ignore[assignment]
    try:
        backend = runtime.open("sim", compile_budget=10**6)
        after_first: list[int] = []

        def on_step(report) -> None:  # type: ignore[no-untyped-def]
            seconds.append(report.seconds)
            if not after_first and isinstance(made[0], DynamicKernels):
                after_first.append(made[0].staged_bytes)  # the staging and step 1's writes

        loop.train(backend, state, Data(cfg.vocab_size), tc, on_step=on_step)
    finally:
        loop.make_kernels = original  # type: ignore[assignment]
    staged = per_step = 0
    if after_first:
        per_step = (made[0].staged_bytes - after_first[0]) // max(1, steps - 1)
        staged = after_first[0] - per_step
    return statistics.median(seconds[1:]), staged, per_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="stories15M")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--accum", type=int, default=1)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"dynamic": [], "baked": []}
    written = staged_once = 0
    for _ in range(args.pairs):
        for mode in times:
            t, staged, per_step = run(args.config, mode, args.steps, args.accum)
            times[mode].append(t)
            written, staged_once = per_step or written, staged or staged_once
    d, b = statistics.median(times["dynamic"]), statistics.median(times["baked"])
    for mode, ts in times.items():
        print(f"{mode:8s} step ms: " + ", ".join(f"{1000 * t:.1f}" for t in ts))
    print(f"{args.config}, {args.accum} sequence(s) a step: dynamic / baked = {d / b:.3f} (medians)")
    packed = 2 * staged_once * args.accum  # the same elements in float32, once per sequence
    print(
        f"weight bytes written a step: {written / 1e6:.1f} MB (fp16, the optimizer's writes into the "
        f"surfaces), where packing moved {packed / 1e6:.1f} MB "
        "(float32, every weight into each kernel's input per run)"
    )


if __name__ == "__main__":
    main()
