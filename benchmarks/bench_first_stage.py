"""Benchmark: what the exact MAC first stage costs the training kernels: numerics "engine" (the default:
the 4-lane first-stage model up to 2^14 products, float32 BLAS beyond) against numerics "exact" (the model
up to 2^26 products, every stories15M kernel).

Run: OPENBLAS_NUM_THREADS=2 python benchmarks/bench_first_stage.py [--configs stories15M] [--repeat 3]
Weights are random (llama2.c-style init); inputs are N(0, 1); chip m1. Prints the median run time of each
kernel under both, and the ratio (``--budget`` sets the exact model's budget of the second). The
compiled loops (numba, the `fast` extra) decide the exact figure: without them the numpy model runs, about
30 times slower again.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

from anekit import jit
from anekit.kernels import catalog, preset
from anekit.runtime.sim import SimBackend, mac


def run_ms(backend: SimBackend, spec: Any, repeat: int) -> float:
    kernel = backend.compile(spec.program, spec.weight_files())
    kernel.load()
    x = np.random.default_rng(0).standard_normal(kernel.inputs[0].shape).astype(np.float32)
    kernel.inputs[0].write(x)
    kernel.run()  # the first run builds the plan (and compiles the loops): not timed
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        kernel.run()
        times.append(1e3 * (time.perf_counter() - t))
    kernel.close()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["stories15M"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kernels", nargs="*", help="kernel names (default: every layer and head kernel)")
    ap.add_argument("--budget", type=int, help="the exact model's budget after (default: anekit's)")
    args = ap.parse_args()
    shipped = mac.EXACT_MAC_PRODUCTS
    after = args.budget or shipped
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    print(f"compiled loops: {jit.available()}; OPENBLAS_NUM_THREADS={threads}; exact budget {after} products")
    names = args.kernels or [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS]
    for cfg_name in args.configs:
        cfg = preset(cfg_name)
        weights = catalog.random_weights(cfg)
        print(f"{cfg_name}: dim {cfg.dim}, hidden {cfg.hidden_dim}, heads {cfg.n_heads}, seq {cfg.seq_len}")
        totals = [0.0, 0.0]
        for name in names:
            spec = catalog.build(name, cfg, weights)
            figures = []
            for numerics in ("engine", "exact"):
                backend = SimBackend(chip="m1", compile_budget=10**9, numerics=numerics)
                if numerics == "exact" and after != shipped:
                    import anekit.runtime.sim.backend as sim_backend

                    sim_backend.EXACT_MAC_PRODUCTS = after  # read when the backend builds a plan
                figures.append(run_ms(backend, spec, args.repeat))
            totals[0] += figures[0]
            totals[1] += figures[1]
            ratio = figures[1] / figures[0] if figures[0] else float("nan")
            print(f"  {name:>18}: engine {figures[0]:8.1f} ms   exact {figures[1]:8.1f} ms   x{ratio:6.1f}")
        print(f"  {'all kernels':>18}: engine {totals[0]:8.1f} ms   exact {totals[1]:8.1f} ms")


if __name__ == "__main__":
    main()
