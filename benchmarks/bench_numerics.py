"""Benchmark: what the engine's numerics (a chip's profile) cost against the ideal machine, in one run.

Run: OPENBLAS_NUM_THREADS=2 python benchmarks/bench_numerics.py [--config default] [--chip any] [--rounds 7]
       [--train]

Prints the median ms of one training micro-step (one sequence forward + backward, dynamic weights, kernels
compiled, a warm-up step run) for numerics "ieee" and "engine", measured in interleaved rounds so that
both see the same machine load, and their ratio. With ``--train`` it also times the whole default command
(``anekit train --sample-steps 0``, start-up included) both ways, interleaved, and prints the median wall
seconds and the ratio (the target: engine within 1.25x of ieee). ``--before SRC`` adds, interleaved, the
same command run from another checkout's ``src`` (e.g. a ``git worktree`` of the commit before the
numeric profiles): the wall time the engine numerics are held to.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from anekit import runtime
from anekit.cli.train_cmd import _config
from anekit.llama import Params
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import Timer, train_step


def step_ms(config: str, numerics: str, chip: str, steps: int) -> float:
    cfg = _config(config)
    params = Params.init(cfg, seed=0)
    backend = runtime.open("sim", numerics=numerics, chip=chip, compile_budget=10**9)
    kernels = make_kernels(backend, cfg, "dynamic")
    kernels.compile(params, Timer())
    grads = params.zeros_like()
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    timer = Timer()
    train_step(kernels, params, grads, tokens[:-1], tokens[1:], timer, loss_scale=1024.0)  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step(kernels, params, grads, tokens[:-1], tokens[1:], timer, loss_scale=1024.0)
        times.append(time.perf_counter() - t0)
    kernels.close()
    return 1e3 * statistics.median(times)


def train_seconds(numerics: str | None, src: str | None = None) -> float:
    """Wall seconds of the default ``anekit train`` (``numerics`` None: no flag, as an older checkout at
    ``src`` takes it)."""
    flags = [] if numerics is None else ["--numerics", numerics]
    env = dict(os.environ, **({"PYTHONPATH": src} if src else {}))
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "anekit.cli.main", "train", "--out", out, "--sample-steps", "0", *flags],
            check=True,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default")
    ap.add_argument("--chip", default="any")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20, help="micro-steps timed per round")
    ap.add_argument("--train", action="store_true", help="also time the whole default `anekit train`")
    ap.add_argument("--before", metavar="SRC", help="with --train: also time it from this checkout's src")
    args = ap.parse_args()
    got: dict[str, list[float]] = {"ieee": [], "engine": []}
    for _ in range(args.rounds):
        for numerics in got:
            got[numerics].append(step_ms(args.config, numerics, args.chip, args.steps))
    ieee, engine = (statistics.median(got[n]) for n in ("ieee", "engine"))
    print(f"{args.config} micro-step, chip {args.chip}: ieee {ieee:.2f} ms, engine {engine:.2f} ms, "
          f"ratio {engine / ieee:.2f} (medians of {args.rounds} interleaved rounds)")  # fmt: skip
    if args.train:
        walls: dict[str, list[float]] = {"ieee": [], "engine": []}
        if args.before:
            walls["before"] = []
        for _ in range(max(1, args.rounds // 2)):
            for numerics in walls:
                walls[numerics].append(
                    train_seconds(None, args.before) if numerics == "before" else train_seconds(numerics)
                )
        wi, we = (statistics.median(walls[n]) for n in ("ieee", "engine"))
        print(f"anekit train (default, 400 steps): ieee {wi:.1f} s, engine {we:.1f} s, ratio {we / wi:.2f} "
              f"(medians of {len(walls['ieee'])} interleaved runs)")  # fmt: skip
        if args.before:
            wb = statistics.median(walls["before"])
            print(f"  before ({args.before}): {wb:.1f} s; engine / before {we / wb:.2f}")


if __name__ == "__main__":
    main()
