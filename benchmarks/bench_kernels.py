"""Benchmark: simulator time per kernel (compile and run) for stories15M and stories110M shapes.

Run: OPENBLAS_NUM_THREADS=2 python benchmarks/bench_kernels.py [--configs stories15M stories110M] [--repeat 3]
Weights are random (llama2.c-style init); inputs are N(0, 1). Prints the median run time of each kernel.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from anekit import runtime
from anekit.kernels import catalog, preset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["stories15M", "stories110M"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dynamic", action="store_true", help="also the dynamic-weight kernels")
    args = ap.parse_args()
    backend = runtime.open("sim", compile_budget=10**9)
    names = [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS] + (
        list(catalog.DYNAMIC_KERNELS) if args.dynamic else []
    )
    for cfg_name in args.configs:
        cfg = preset(cfg_name)
        weights = catalog.random_weights(cfg)
        sizes = f"dim {cfg.dim}, hidden {cfg.hidden_dim}, heads {cfg.n_heads}, seq {cfg.seq_len}"
        print(f"{cfg_name}: {sizes}, vocab {cfg.vocab_size}")
        total = 0.0
        for name in names:
            spec = catalog.build(name, cfg, weights)
            files = spec.weight_files()
            t0 = time.perf_counter()
            kernel = backend.compile(spec.program, files)
            compile_ms = 1e3 * (time.perf_counter() - t0)
            kernel.load()
            kernel.inputs[0].write(
                np.random.default_rng(0).standard_normal(kernel.inputs[0].shape).astype(np.float32)
            )
            times = []
            for _ in range(args.repeat):
                t1 = time.perf_counter()
                kernel.run()
                times.append(1e3 * (time.perf_counter() - t1))
            kernel.close()
            run_ms = statistics.median(times)
            total += run_ms
            print(
                f"  {name:>18}: compile {compile_ms:8.1f} ms   run {run_ms:8.1f} ms (median of {args.repeat})"
            )
        print(f"  {'all kernels':>18}: run {total:8.1f} ms")


if __name__ == "__main__":
    main()
