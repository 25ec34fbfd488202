"""Benchmark: training step time on the simulator (ms/step, tokens/s, share of time per phase).

Run: OPENBLAS_NUM_THREADS=2 python benchmarks/bench_train.py [--configs default stories15M stories110M]
One "step" here is one sequence forward + backward (seq_len tokens) with the kernels already compiled and
one warm-up step run (not counted);
the compile of a batch is reported separately (it is paid once per accumulation batch).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from anekit import runtime
from anekit.cli.train_cmd import _config
from anekit.llama import Params
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import Timer, train_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["default", "stories15M", "stories110M"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--weights", choices=["baked", "dynamic"], default="dynamic")
    args = ap.parse_args()
    for name in args.configs:
        cfg = _config(name)
        params = Params.init(cfg, seed=0)
        backend = runtime.open("sim", compile_budget=10**9)
        kernels = make_kernels(backend, cfg, args.weights)
        compile_timer = Timer()
        kernels.compile(params, compile_timer)
        grads = params.zeros_like()
        rng = np.random.default_rng(0)
        warm = rng.integers(0, cfg.vocab_size, cfg.seq_len + 1)  # first calls load compiled loops, caches
        train_step(kernels, params, grads, warm[:-1], warm[1:], Timer(), loss_scale=1024.0)
        timer = Timer()
        times = []
        for _ in range(args.steps):
            window = rng.integers(0, cfg.vocab_size, cfg.seq_len + 1)
            t0 = time.perf_counter()
            train_step(kernels, params, grads, window[:-1], window[1:], timer, loss_scale=1024.0)
            times.append(time.perf_counter() - t0)
        kernels.close()
        ms = 1e3 * statistics.median(times)
        total = sum(timer.seconds.values())
        shares = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(timer.seconds.items()))
        print(
            f"{name:>12} ({args.weights}): {ms:8.1f} ms/step, {cfg.seq_len / ms * 1e3:8.0f} tokens/s "
            f"({shares}); "
            f"compile {1e3 * compile_timer.seconds['compile']:.0f} ms (baked: once per batch; dynamic: once)"
        )


if __name__ == "__main__":
    main()
