"""Benchmark: what users run. ``anekit train`` (the default dynamic-weight path, the real loop, start-up
included) against a plain numpy float32 loop of the same steps, interleaved in one run; the dynamic step
next to the baked one; and the scaling of a batch's sequences over threads.

Run: env -u PYTHONDONTWRITEBYTECODE python benchmarks/bench_cli_vs_numpy.py [--config stories15M]
     [--steps 10] [--repeat 3] [--tokenizer TOK]

1. ``anekit train --config C --steps N --accum 1`` as a subprocess, as a user types it (its closing sample
   of 120 tokens included) and with ``--sample-steps 0``: wall time from launch to exit, and start-up =
   launch to the start of the first step (the time of the "step 1" line less that step's own time:
   imports, the tokenizer, the data, the weights, the kernels' compile). The numpy loop is
   ``bench_step_vs_numpy.NumpyLlama`` (the model written directly in numpy) doing the same N steps of one
   sequence, also a subprocess, its import included. Interleaved, ``--repeat`` times; medians and ratios.
2. One training step (one sequence) with dynamic weights and with baked weights, alternately, in this
   process (2 x ``--repeat`` + 1 pairs): medians and the ratio.
3. ``trainer.train`` with 4 sequences a step, in this process, alternately ``--repeat`` times: tokens/s
   (median of the steps' own times, the first left out) of the whole run on one thread (BLAS pinned to one
   thread and anekit told the user set it, as OPENBLAS_NUM_THREADS=1 does), of two worker threads with one
   BLAS thread each, and of two workers with BLAS's threads left to anekit; whether the runs end with the
   same weights and Adam moments.

BLAS's threads are left to anekit in 1 and 2 (OPENBLAS_NUM_THREADS must not be set).
Python's bytecode cache matters to the start-up: with PYTHONDONTWRITEBYTECODE set, every ``anekit`` process
compiles anekit's modules from source again (about 0.3 s); an installed anekit has them compiled. Run it
without that variable (``env -u PYTHONDONTWRITEBYTECODE python benchmarks/bench_cli_vs_numpy.py``) to
measure what an installed anekit does.

stories15M needs llama2.c's 32000-token tokenizer: ``--tokenizer`` (default: the corpus copy beside the
project, ../shared/corpus/llama2c/tokenizer.model, when there is one).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS_TOKENIZER = ROOT.parent / "shared" / "corpus" / "llama2c" / "tokenizer.model"

NUMPY_LOOP = """
import sys, time
sys.path.insert(0, {bench!r})
import numpy as np
from bench_step_vs_numpy import NumpyLlama
from anekit.kernels import preset
from anekit.llama import Params
cfg = preset({config!r})
model = NumpyLlama(cfg, Params.init(cfg, seed=0))
rng = np.random.default_rng(0)
for _ in range({steps}):
    w = rng.integers(0, cfg.vocab_size, cfg.seq_len + 1)
    model.step(w[:-1], w[1:])
"""


def anekit_train(
    args: list[str], out: Path, env: dict[str, str] | None = None
) -> tuple[float, float, list[float]]:
    """(wall s, start-up s, the steps' ms) of one ``anekit train`` process (``env``: variables to add)."""
    cmd = [sys.executable, "-m", "anekit.cli.main", "train", "--out", str(out), "--force", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    assert proc.stdout is not None
    startup = None
    steps = []
    for line in proc.stdout:
        m = re.search(r"(\d+) ms/step", line)
        if m:
            steps.append(float(m.group(1)))
            if startup is None:  # the first step started its own time before its line
                startup = time.perf_counter() - t0 - steps[0] / 1e3
    code = proc.wait()
    wall = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"anekit train failed: {proc.stderr.read() if proc.stderr else ''}")
    return wall, startup or float("nan"), steps


def numpy_loop(config: str, steps: int) -> float:
    code = NUMPY_LOOP.format(bench=str(ROOT / "benchmarks"), config=config, steps=steps)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def step_times(config: str, repeat: int) -> dict[str, list[float]]:
    """One training step (one sequence) with dynamic and with baked weights, alternately (``repeat`` pairs
    after a warm-up pair, so load on the machine hits both alike): each mode's step times in ms."""
    import numpy as np

    from anekit import runtime
    from anekit.kernels import preset
    from anekit.llama import Params
    from anekit.llama.kernel_sets import make_kernels
    from anekit.llama.step import Timer, train_step

    cfg = preset(config)
    params = Params.init(cfg, seed=0)
    w = np.random.default_rng(0).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    modes = {}
    for weights in ("dynamic", "baked"):
        kernels = make_kernels(runtime.open("sim", compile_budget=10**9), cfg, weights)
        kernels.compile(params, Timer())
        modes[weights] = (kernels, params.zeros_like())
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(repeat + 1):  # the first pair is a warm-up
        for weights, (kernels, grads) in modes.items():
            t0 = time.perf_counter()
            train_step(kernels, params, grads, w[:-1], w[1:], Timer(), 1024.0)
            times[weights].append(1e3 * (time.perf_counter() - t0))
    for kernels, _ in modes.values():
        kernels.close()
    return {m: t[1:] for m, t in times.items()}


class RandomTokens:
    """A dataset of random token windows (the step's time does not depend on the tokens)."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def batch(self, rng: Any, seq_len: int) -> tuple[Any, Any]:
        w = rng.integers(0, self.vocab, seq_len + 1)
        return w[:-1], w[1:]


def thread_rates(config: str, repeat: int, steps: int = 4, accum: int = 4) -> dict[str, list[float]]:
    """Tokens/s of ``trainer.train`` with ``accum`` sequences a step, alternately: the whole run on one
    thread (BLAS pinned to 1, anekit told the user set it, as OPENBLAS_NUM_THREADS=1 does), two worker
    threads with one BLAS thread each, and two workers with BLAS's threads left to anekit; each rate is
    the median over the steps after the first (a warm-up). Also whether the runs' weights and moments are
    the same."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    import anekit.threads
    from anekit import runtime
    from anekit.kernels import preset
    from anekit.llama import Params
    from anekit.training.loop import TrainConfig, TrainState, train

    cfg = preset(config)
    tc = TrainConfig(steps=steps, accum=accum, weights="dynamic")
    rates: dict[str, list[float]] = {"1": [], "2": [], "auto": []}
    final: dict[str, Any] = {}
    for _ in range(repeat):
        for label, threads, pinned in (("1", 1, True), ("2", 2, True), ("auto", 2, False)):
            state = TrainState.fresh(Params.init(cfg, seed=0), tc)
            seconds: list[float] = []
            backend = runtime.open("sim", compile_budget=10**9)
            before = anekit.threads.USER_SET
            anekit.threads.USER_SET = pinned
            try:
                with threadpool_limits(1) if pinned else contextlib.nullcontext():
                    train(backend, state, RandomTokens(cfg.vocab_size), tc, threads=threads,
                          on_step=lambda r, into=seconds: into.append(r.seconds))  # fmt: skip
            finally:
                anekit.threads.USER_SET = before
            rates[label].append(accum * cfg.seq_len / statistics.median(seconds[1:]))
            final[label] = state
    same = {}
    for label in ("2", "auto"):
        a, b = final["1"], final[label]
        pairs = [*zip(a.params.tensors(), b.params.tensors()), *zip(a.adam_v.tensors(), b.adam_v.tensors())]
        same[label] = all(np.array_equal(x, y) for (_, x), (_, y) in pairs)
    return {**rates, "same": [float(same["2"]), float(same["auto"])]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="stories15M")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--tokenizer", type=Path, default=CORPUS_TOKENIZER if CORPUS_TOKENIZER.is_file() else None
    )
    args = ap.parse_args()
    tok = ["--tokenizer", str(args.tokenizer)] if args.tokenizer is not None else []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cli = [*tok, "--config", args.config, "--steps", str(args.steps), "--accum", "1"]
        quiet = [*cli, "--sample-steps", "0"]
        walls, startups, quiets, numpys = [], [], [], []
        for _ in range(args.repeat):  # interleaved: load on the machine hits all three alike
            wall, startup, _ = anekit_train(cli, out)
            walls.append(wall)
            startups.append(startup)
            quiets.append(anekit_train(quiet, out)[0])
            numpys.append(numpy_loop(args.config, args.steps))
        a, q, n = statistics.median(walls), statistics.median(quiets), statistics.median(numpys)
        print(
            f"1. anekit train --config {args.config} --steps {args.steps} --accum 1: {a:.2f} s (start-up "
            f"{statistics.median(startups):.2f} s), ratio {a / n:.2f}; without its closing sample "
            f"(--sample-steps 0) {q:.2f} s, ratio {q / n:.2f}; plain numpy loop {n:.2f} s (medians of "
            f"{args.repeat}: anekit {[round(x, 2) for x in walls]}, without the sample "
            f"{[round(x, 2) for x in quiets]}, numpy {[round(x, 2) for x in numpys]})"
        )
        times = step_times(args.config, 2 * args.repeat + 1)
        dyn, baked = statistics.median(times["dynamic"]), statistics.median(times["baked"])
        pairs = statistics.median(d / b for d, b in zip(times["dynamic"], times["baked"]))
        print(
            f"2. one {args.config} step, dynamic and baked alternately: dynamic {dyn:.0f} ms, baked "
            f"{baked:.0f} ms, ratio {dyn / baked:.2f} (median of the {len(times['baked'])} pairs' ratios "
            f"{pairs:.2f})"
        )
        rates = thread_rates(args.config, args.repeat)
        r1, r2, ra = (statistics.median(rates[k]) for k in ("1", "2", "auto"))
        same2, same_auto = ("the same" if x else "DIFFERENT" for x in rates["same"])
        print(
            f"3. {args.config}, 4 sequences a step (medians of {args.repeat} runs, alternately): 1 thread "
            f"{r1:.0f} tokens/s, 2 threads {r2:.0f} tokens/s: {r2 / r1:.2f}x (weights and moments {same2}); "
            f"2 workers with BLAS threads chosen by anekit {ra:.0f} tokens/s: {ra / r1:.2f}x ({same_auto})"
        )


if __name__ == "__main__":
    main()
