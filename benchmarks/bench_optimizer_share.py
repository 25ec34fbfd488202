"""Benchmark: the optimizer update's share of a data-parallel step (what ZeRO-1 sharding could save).

Run: OPENBLAS_NUM_THREADS=1 python benchmarks/bench_optimizer_share.py [--configs stories15M stories110M]

Every rank of a data-parallel run applies the same AdamW update to the whole model; ZeRO-1 would have each
of N ranks update 1/N of it and then gather the updated weights. Per config this measures, on the
simulator with the kernels compiled: one sequence's forward + backward, the AdamW update of every weight
(``apply_adamw``, one and two threads), and a later rank's addition of one sequence's buffer to the total
(the chain's work per local sequence); then prints the update's share of a 2-rank step of k sequences a
rank, k = 1, 2, 4 (the step: k sequences + k buffer adds + the update; the exchange left out: it is the
same with or without sharding, and sharding adds an all-gather of the weights to it). Medians of repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from anekit import runtime
from anekit.llama import Params
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import Gradients, Timer, train_step
from anekit.models.config import preset
from anekit.training.optimizer import apply_adamw
from anekit.training.state import TrainConfig, TrainState


def _median(fn, repeats: int) -> float:
    """The median seconds of ``fn`` after one call not counted (it faults in fresh arrays' pages)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, repeats: int) -> dict[str, float]:
    """Seconds of one sequence, one buffer add and the update (1 and 2 threads) for preset ``name``."""
    cfg = preset(name)
    params = Params.init(cfg, seed=0)
    kernels = make_kernels(runtime.open("sim", compile_budget=10**9), cfg, "dynamic")
    kernels.compile(params, Timer())
    window = np.random.default_rng(0).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    buffer = Gradients(params.zeros_like(), kernels, accumulate=False)

    def sequence() -> None:
        train_step(kernels, params, buffer, window[:-1], window[1:], Timer(), loss_scale=1024.0)

    out = {"weights": float(params.count()), "sequence": _median(sequence, repeats)}
    total = params.zeros_like()
    out["add"] = _median(lambda: buffer.add_to(total), repeats)
    state = TrainState.fresh(params, TrainConfig())
    grads = params.zeros_like()
    for (_, g), (_, b) in zip(grads.tensors(), buffer.grads.tensors()):
        g[...] = b * np.float32(1e-3)
    for threads in (1, 2):
        out[f"update{threads}"] = _median(
            lambda t=threads: apply_adamw(state, grads, TrainConfig(), t), repeats
        )
    kernels.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["stories15M", "stories110M"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    for name in args.configs:
        m = measure(name, args.repeats)
        print(
            f"{name}: {m['weights'] / 1e6:.1f}M weights, sequence {m['sequence'] * 1e3:.0f} ms, buffer add "
            f"{m['add'] * 1e3:.0f} ms, AdamW update {m['update1'] * 1e3:.0f} ms (1 thread) / "
            f"{m['update2'] * 1e3:.0f} ms (2 threads)"
        )
        for k in (1, 2, 4):
            step = k * m["sequence"] + k * m["add"] + m["update1"]
            share = m["update1"] / step
            print(
                f"  2 ranks x {k} sequences: step {step * 1e3:.0f} ms, update {100 * share:.1f}%; "
                f"ZeRO-1 would save at most {50 * share:.1f}% before its all-gather"
            )


if __name__ == "__main__":
    main()
