"""Time anekit.fp16 bulk conversions against numpy's float16 cast on 16M float32 values."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from anekit import fp16


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    """Run ``fn`` once to warm up, then ``repeat`` times, and return the median wall time in seconds."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def numpy_f16_bits(x: np.ndarray) -> np.ndarray:
    """numpy's float32 -> float16 cast, as bit patterns."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).view(np.uint16)


def numpy_round_fp16(x: np.ndarray) -> np.ndarray:
    """numpy's float32 -> float16 -> float32 round trip."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).astype(np.float32)


def main() -> None:
    """Parse the arguments, build the inputs, time each pair and print a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1 << 24, help="number of float32 values (default 16M)")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per case (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    inputs = {
        "normal(0, 1)": rng.standard_normal(args.n, dtype=np.float32),
        "normal*1e-5": rng.standard_normal(args.n, dtype=np.float32) * np.float32(1e-5),
        "random bits": rng.integers(0, 2**32, size=args.n, dtype=np.uint32).view(np.float32),
    }
    out = np.empty(args.n, dtype=np.float32)
    cases: list[tuple[str, Callable[[np.ndarray], object], Callable[[np.ndarray], object]]] = [
        ("f32 -> f16 bits", fp16.f32_to_f16_bits, numpy_f16_bits),
        ("f16 bits -> f32", fp16.f16_bits_to_f32, lambda b: b.view(np.float16).astype(np.float32)),
        ("round_to_fp16", fp16.round_to_fp16, numpy_round_fp16),
        ("round_to_fp16 out=", lambda x: fp16.round_to_fp16(x, out=out), numpy_round_fp16),
        ("f16(f32->f16 bits)", lambda x: fp16.f16_bits_to_f32(fp16.f32_to_f16_bits(x)), numpy_round_fp16),
        ("round_to_bf16", fp16.round_to_bf16, None),
        ("f32 -> bf16 bits", fp16.f32_to_bf16_bits, None),
    ]

    print(f"n = {args.n:,} float32 values, median of {args.repeat} runs, numpy {np.__version__}")
    print(f"{'case':<24} {'input':<14} {'anekit ns/el':>13} {'numpy ns/el':>12} {'ratio':>7}")
    for label, data in inputs.items():
        bits = numpy_f16_bits(data)
        for name, ours, theirs in cases:
            arg = bits if name.startswith("f16 bits") else data
            t_ours = median_seconds(lambda f=ours, a=arg: f(a), args.repeat) / args.n * 1e9
            if theirs is None:
                print(f"{name:<24} {label:<14} {t_ours:>13.2f} {'-':>12} {'-':>7}")
                continue
            t_np = median_seconds(lambda f=theirs, a=arg: f(a), args.repeat) / args.n * 1e9
            print(f"{name:<24} {label:<14} {t_ours:>13.2f} {t_np:>12.2f} {t_ours / t_np:>7.2f}")


if __name__ == "__main__":
    main()
