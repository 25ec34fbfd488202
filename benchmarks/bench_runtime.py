"""Benchmark the simulator runtime: tiny-kernel run overhead and compile time of an SDPA-sized program.

Run: OPENBLAS_NUM_THREADS=1 python benchmarks/bench_runtime.py [--repeat 30]
Targets on a 2-core machine: tiny kernel run overhead under 20 us; compiling the 768x256 SDPA forward
kernel of stories110M (RMSNorm, QKV, RoPE, causal attention over 12 heads, Wo; weights in a MILBlob
file) under 5 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from anekit import mil, runtime
from anekit.kernels import catalog, forward, preset
from anekit.mil import tensor


def _times(fn: Callable[[], object], repeat: int, number: int = 1) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        out.append((time.perf_counter() - t0) / number)
    return out


def _report(name: str, times: list[float], unit: float, label: str) -> None:
    med, best = statistics.median(times) * unit, min(times) * unit
    print(f"{name:>34}: median {med:9.3f} {label}   best {best:9.3f} {label}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    # Not strict: the tiny [1, 4, 1, 4] kernel breaks the engine's surface rules, on purpose (pure overhead).
    backend = runtime.open("sim", compile_budget=10**9, strict=False)

    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, 4])})
    def tiny(f, x):
        return f.relu(x=x)

    k = backend.compile(tiny)
    k.load()
    _report("tiny kernel run (relu [1,4,1,4])", _times(k.run, args.repeat, 2000), 1e6, "us")
    x = np.ones((1, 4, 1, 4), np.float32)
    _report("tiny kernel call with numpy in/out", _times(lambda: k(x=x), args.repeat, 500), 1e6, "us")

    cfg = preset("stories110M")  # its SDPA forward kernel: 768 channels x 256 positions
    spec = forward.sdpa_fwd(cfg, catalog.random_weights(cfg))
    prog, files = spec.program, spec.weight_files()
    text = mil.to_text(prog)
    mb = sum(len(b) for b in files.values()) / 1e6
    print(f"SDPA program: {prog.op_count()} ops, {len(text)} characters, {mb:.1f} MB of fp16 weights")
    _report(
        "compile SDPA 768x256 (Program)", _times(lambda: backend.compile(prog, files), args.repeat), 1e3, "ms"
    )
    _report(
        "compile SDPA 768x256 (MIL text)",
        _times(lambda: backend.compile(text, files), args.repeat),
        1e3,
        "ms",
    )
    sdpa = backend.compile(prog, files)
    sdpa.load()
    sdpa.inputs[0].write(np.random.default_rng(0).standard_normal((cfg.dim, cfg.seq_len)))
    _report("run SDPA 768x256", _times(sdpa.run, max(3, args.repeat // 3)), 1e3, "ms")


if __name__ == "__main__":
    main()
