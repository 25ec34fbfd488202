"""Benchmark: parse + verify time of a 200-op MIL program (target: under 5 ms).

Run: OPENBLAS_NUM_THREADS=1 python benchmarks/bench_mil_parse.py [--ops 200] [--repeat 50]
Prints the median and best of ``repeat`` runs for parse, verify, parse+verify, and print.
"""

from __future__ import annotations

import argparse
import statistics
import time

from anekit import mil
from anekit.mil import tensor


def program_with_ops(n_ops: int, dim: int = 768, seq: int = 256) -> mil.Program:
    """A kernel-shaped program of ``n_ops`` ops: RMSNorm / conv / SiLU blocks on [1, dim, 1, seq] fp16."""
    b = mil.Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, dim, 1, seq]))
    w = f.weight(tensor("fp16", [dim, dim, 1, 1]), "@model_path/weights/w.bin", 64, name="w")
    v = x
    while len(f.fn.ops) < n_ops - 1:
        sq = f.mul(x=v, y=v)
        ss = f.reduce_sum(x=sq, axes=[1], keep_dims=True)
        rr = f.pow(x=f.add(x=f.mul(x=ss, y=1.0 / dim), y=1e-5), y=-0.5)
        h = f.conv(
            x=f.mul(x=v, y=rr),
            weight=w,
            strides=[1, 1],
            pad_type="valid",
            pad=[0, 0, 0, 0],
            dilations=[1, 1],
            groups=1,
        )
        v = f.add(x=v, y=f.mul(x=h, y=f.sigmoid(x=h)))
    f.output(v)
    return b.build()


def _time(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    prog = program_with_ops(args.ops)
    text = mil.to_text(prog)
    parsed = mil.parse(text)
    print(f"program: {prog.op_count()} ops, {len(text)} characters")
    rows = {
        "parse": lambda: mil.parse(text),
        "verify": lambda: mil.verify(parsed),
        "parse+verify": lambda: mil.verify(mil.parse(text)),
        "print": lambda: mil.to_text(prog),
    }
    for name, fn in rows.items():
        fn()  # warm caches (type cache, registry import)
        times = _time(fn, args.repeat)
        med, best = 1e3 * statistics.median(times), 1e3 * min(times)
        print(f"{name:>13}: median {med:7.3f} ms   best {best:7.3f} ms")


if __name__ == "__main__":
    main()
