"""Benchmark: what users run. ``anekit train`` (the default dynamic-weight path, the real loop, start-up
included) against a plain numpy float32 loop of the same steps, interleaved in one run; the dynamic step
next to the baked one; and the scaling of a batch's sequences over threads.

Run: env -u PYTHONDONTWRITEBYTECODE python benchmarks/bench_cli_vs_numpy.py [--config stories15M]
     [--steps 10] [--repeat 3] [--tokenizer TOK]

1. What a user types, each a whole process (import, start-up, exit included), timed from launch to exit,
   into a fresh --out directory each time, interleaved ``--repeat`` times after one warm-up round (which
   also fills numba's cache) so that load on the machine hits every command alike; medians and ratios:

   a. ``anekit train --config C --steps N --accum 1 --sample-steps 0 --tokenizer TOK --out DIR`` (as
      ``python -m anekit.cli.main``, the ``anekit`` script's code), BLAS threads chosen by anekit; its
      start-up is launch to the start of the first step (the "step 1" line's time less that step's own);
   b. the careful numpy loop: ``bench_step_vs_numpy.NumpyLlama`` (the model written directly in numpy:
      fused q|k|v and w1|w3 sgemms, batched heads, preallocated buffers, one fused AdamW pass) doing the
      same N steps of one sequence from the same initial weights, ``python -c`` with its imports and
      ``Params.init`` included, OPENBLAS_NUM_THREADS = the cores;
   c. two cores against one for the whole command: the same ``anekit train`` with 2 sequences a step
      (``--accum 2``) as in a., against it under ``taskset -c 0`` with OPENBLAS_NUM_THREADS=1 (one core,
      one BLAS thread; anekit then runs its sequences one after the other). The figure is
      wall(one core) / wall(two cores), each the median of its runs (``--cores`` names the two cores'
      list for taskset, default "0,1").

   Goals (issue 33): a. within 1.25x of b.; c. >= 1.7.
2. One training step (one sequence) with dynamic weights and with baked weights, alternately, in this
   process (2 x ``--repeat`` + 1 pairs): medians and the ratio.
3. ``trainer.train`` with 4 sequences a step, in this process, alternately ``--repeat`` times: tokens/s
   (median of the steps' own times, the first left out) of the whole run on one thread (BLAS pinned to one
   thread and anekit told the user set it, as OPENBLAS_NUM_THREADS=1 does), of two worker threads with one
   BLAS thread each, and of two workers with BLAS's threads left to anekit; whether the runs end with the
   same weights and Adam moments.

BLAS's threads are left to anekit in 1a, 1c (two cores) and 2.
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
import shutil
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
    args: list[str], out: Path, env: dict[str, str | None] | None = None, cpus: str | None = None
) -> tuple[float, float, list[float]]:
    """(wall s, start-up s, the steps' ms) of one ``anekit train`` process into ``out`` (a fresh
    directory); ``env``: variables to add (a None value removes one), ``cpus``: taskset's core list."""
    cmd = [sys.executable, "-m", "anekit.cli.main", "train", "--out", str(out), *args]
    if cpus is not None:
        cmd = ["taskset", "-c", cpus, *cmd]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(env))
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


def _env(changes: dict[str, str | None] | None) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in (changes or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def numpy_loop(config: str, steps: int, threads: int) -> float:
    """Wall s of the careful numpy loop's N steps as one ``python -c`` process (imports included)."""
    code = NUMPY_LOOP.format(bench=str(ROOT / "benchmarks"), config=config, steps=steps)
    t0 = time.perf_counter()
    blas = str(threads)
    env = {"OPENBLAS_NUM_THREADS": blas, "OMP_NUM_THREADS": blas, "NUMBA_NUM_THREADS": blas}
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(env))
    return time.perf_counter() - t0


def whole_commands(tok: list[str], config: str, steps: int, repeat: int, cores: str) -> None:
    """Section 1: the commands interleaved, one warm-up round, then ``repeat`` rounds; prints the ratios."""
    n_cores = len(cores.split(","))
    cli = [*tok, "--config", config, "--steps", str(steps), "--sample-steps", "0"]
    two = {"OPENBLAS_NUM_THREADS": None}  # anekit chooses
    one = {"OPENBLAS_NUM_THREADS": "1"}
    walls: dict[str, list[float]] = {"a": [], "b": [], "c2": [], "c1": []}
    startups: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat + 1):  # round 0 warms the caches (bytecode, numba's) and is left out
            runs = {
                "a": lambda d: anekit_train([*cli, "--accum", "1"], d, two, cores),
                "b": lambda d: (numpy_loop(config, steps, n_cores), 0.0, []),
                "c2": lambda d: anekit_train([*cli, "--accum", "2"], d, two, cores),
                "c1": lambda d: anekit_train([*cli, "--accum", "2"], d, one, cores.split(",")[0]),
            }
            for key, fn in runs.items():
                out = Path(tmp) / f"run{i}{key}"  # fresh: never there before
                wall, startup, _ = fn(out)
                if i:
                    walls[key].append(wall)
                    if key == "a":
                        startups.append(startup)
                shutil.rmtree(out, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    load = os.getloadavg()[0]

    def runs(key: str) -> str:
        return str([round(x, 2) for x in walls[key]])

    tokflag = " ".join(tok)
    print(f"1. whole processes, medians of {repeat} interleaved rounds (load {load:.1f} at the end):")
    command = f"anekit train --config {config} --steps {steps} --accum 1 --sample-steps 0 {tokflag} --out DIR"
    start = statistics.median(startups)
    print(f"   a. {command}: {med['a']:.2f} s (start-up {start:.2f} s) {runs('a')}")
    blas = f"OPENBLAS_NUM_THREADS={n_cores}"
    print(f"   b. careful numpy loop, {steps} steps, {blas}: {med['b']:.2f} s {runs('b')}")
    print(f"      ratio a / b = {med['a'] / med['b']:.2f} (goal <= 1.25)")
    print(f"   c. the same with --accum 2: taskset -c {cores}: {med['c2']:.2f} s {runs('c2')}; taskset -c "
          f"{cores.split(',')[0]} OPENBLAS_NUM_THREADS=1: {med['c1']:.2f} s {runs('c1')}")  # fmt: skip
    print(f"      {n_cores} cores / 1 core = {med['c1'] / med['c2']:.2f}x (goal >= 1.7)")


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
    ap.add_argument("--tokenizer", type=Path, default=None)
    ap.add_argument("--cores", default="0,1", help="taskset's core list for the whole commands")
    ap.add_argument("--sections", default="123", help="which sections to run (default 123)")
    args = ap.parse_args()
    if args.tokenizer is None and CORPUS_TOKENIZER.is_file() and args.config in ("stories15M", "stories110M"):
        args.tokenizer = CORPUS_TOKENIZER  # llama2.c's 32000 tokens, which those presets need
    tok = ["--tokenizer", str(args.tokenizer)] if args.tokenizer is not None else []
    if "1" in args.sections:
        whole_commands(tok, args.config, args.steps, args.repeat, args.cores)
    if "2" in args.sections:
        times = step_times(args.config, 2 * args.repeat + 1)
        dyn, baked = statistics.median(times["dynamic"]), statistics.median(times["baked"])
        pairs = statistics.median(d / b for d, b in zip(times["dynamic"], times["baked"]))
        print(
            f"2. one {args.config} step, dynamic and baked alternately: dynamic {dyn:.0f} ms, baked "
            f"{baked:.0f} ms, ratio {dyn / baked:.2f} (median of the {len(times['baked'])} pairs' ratios "
            f"{pairs:.2f})"
        )
    if "3" in args.sections:
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
