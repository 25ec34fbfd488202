"""Benchmark: tokens/s of `anekit train` on 1 rank pinned to one core against 2 ranks on this machine, with
the weights of both runs checked identical.

Run: python benchmarks/bench_distributed.py --tokenizer TOKENIZER [--config stories15M] [--accum 4]
     [--steps 4] [--pairs 3] [--engine mpi]

Both runs train the same global batch (``--accum`` sequences a step) from the same seed and data, on the
simulator, one BLAS thread per sequence (OPENBLAS_NUM_THREADS=1) and one worker thread per process:

* 1 rank: ``taskset -c 0 anekit train --accum A`` (one core);
* 2 ranks: ``anekit launch -n 2 -- train --distributed ENGINE --accum A/2`` (``mpiexec -n 2 anekit train
  --distributed mpi`` where ``anekit launch`` is missing), each rank where the engine's launcher binds it.

Runs alternate (1, 2, 1, 2, ...; ``--pairs`` of each). A run's rate is the median of its steps' tokens/s as
`anekit train` prints them (the global batch's tokens over the step's wall time), the first step left out
(it loads the compiled kernels); the figure is the median over runs. Every pair's checkpoints must hold the
same weights and Adam moments, and the same losses, bit for bit: the benchmark stops on a difference.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

STEP_LINE = re.compile(r"^step\s+(\d+)/\d+\s.*?([\d.]+) tok/s", re.M)
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def tool(name: str) -> str | None:
    """An executable beside this Python first (the virtual environment's), then on PATH."""
    return shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)


def has_launch(anekit: str) -> bool:
    done = subprocess.run([anekit, "launch", "--help"], capture_output=True, timeout=60)
    return done.returncode == 0


def commands(args: argparse.Namespace, out1: Path, out2: Path) -> tuple[list[str], list[str]]:
    anekit = tool("anekit")
    if anekit is None:
        sys.exit("bench_distributed: the anekit command is not installed")
    train = ["--config", args.config, "--tokenizer", str(args.tokenizer), "--steps", str(args.steps),
             "--seed", "0", "--threads", "1", "--sample-steps", "0", "--force"]  # fmt: skip
    if args.data:
        train += ["--data", str(args.data)]
    taskset = tool("taskset")
    pin = [taskset, "-c", "0"] if taskset else []
    one = [*pin, anekit, "train", *train, "--accum", str(args.accum), "--out", str(out1)]
    dist = ["--distributed", args.engine, *train, "--accum", str(args.accum // 2), "--out", str(out2)]
    if has_launch(anekit):
        two = [anekit, "launch", "-n", "2", "--engine", args.engine, "--", "train", *dist]
    else:
        mpiexec = tool("mpiexec")
        if mpiexec is None:
            sys.exit("bench_distributed: neither `anekit launch` nor mpiexec is available")
        two = [mpiexec, "-n", "2", "--oversubscribe", anekit, "train", *dist]
    return one, two


def run(cmd: list[str], timeout: int) -> float:
    """The run's median tokens/s over its steps after the first."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", **(ROOT_ENV if os.geteuid() == 0 else {})}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"bench_distributed: {' '.join(cmd[:6])} ... did not finish within {timeout} s")
    if done.returncode != 0:
        sys.exit(
            f"bench_distributed: {' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-600:]}"
        )
    rates = [float(rate) for step, rate in STEP_LINE.findall(done.stdout) if int(step) > 1]
    if not rates:
        sys.exit(f"bench_distributed: no step lines in the output of {' '.join(cmd)}")
    return statistics.median(rates)


def same_run(a: Path, b: Path) -> str | None:
    """None when the two runs' checkpoints hold the same weights, moments and losses; else what differs."""
    from anekit.llama.checkpoint import load_checkpoint_file

    ca, cb = load_checkpoint_file(a / "ckpt.bin"), load_checkpoint_file(b / "ckpt.bin")
    for what, x, y in (("weights", ca.params, cb.params), ("Adam m", ca.adam_m, cb.adam_m),
                       ("Adam v", ca.adam_v, cb.adam_v)):  # fmt: skip
        for (name, u), (_, v) in zip(x.tensors(), y.tensors()):
            if not np.array_equal(u, v):
                return f"{what} {name}"
    if (a / "loss.csv").read_text() != (b / "loss.csv").read_text():
        return "the losses"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tokenizer", type=Path, required=True, help="the model's tokenizer (llama2.c's for stories)"
    )
    ap.add_argument("--data", type=Path, help="training data (default: anekit's built-in corpus)")
    ap.add_argument("--config", default="stories15M")
    ap.add_argument("--accum", type=int, default=4, help="the global batch: sequences per step (even)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=3, help="runs of each kind, alternating")
    ap.add_argument("--engine", choices=["mpi", "mlx"], default="mpi")
    ap.add_argument("--timeout", type=int, default=600, help="seconds one run may take")
    args = ap.parse_args()
    if args.accum % 2 or args.accum < 2:
        sys.exit("bench_distributed: --accum must be even (it is split over 2 ranks)")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-distributed-") as tmp:
        out1, out2 = Path(tmp, "one"), Path(tmp, "two")
        one, two = commands(args, out1, out2)
        rates1, rates2 = [], []
        for i in range(args.pairs):
            rates1.append(run(one, args.timeout))
            rates2.append(run(two, args.timeout))
            differs = same_run(out1, out2)
            if differs:
                sys.exit(f"bench_distributed: pair {i + 1}: {differs} differ between 1 and 2 ranks")
            print(
                f"pair {i + 1}: 1 rank {rates1[-1]:.0f} tok/s, 2 ranks {rates2[-1]:.0f} tok/s, "
                "identical weights"
            )
    r1, r2 = statistics.median(rates1), statistics.median(rates2)
    print(f"1 rank (one core): {' '.join(one)}")
    print(f"2 ranks: {' '.join(two)}")
    print(
        f"{args.config}, global batch {args.accum}, {args.steps} steps, {args.pairs} runs each: 1 rank "
        f"{r1:.0f} tok/s, 2 ranks {r2:.0f} tok/s (medians): {r2 / r1:.2f}x, weights, moments and losses "
        f"identical; load average {load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
