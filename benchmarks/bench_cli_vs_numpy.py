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
2. One training step (one sequence) with dynamic weights and with baked weights, in this process: medians.
3. ``anekit train --config C --accum 4``: tokens/s (median of the steps' own times, the first left out)
   of the whole run on one thread (``--threads 1``, OPENBLAS_NUM_THREADS=1) against two worker threads
   (``--threads 2``, one BLAS thread each), and two workers with BLAS's threads left to anekit; whether the
   checkpoints hold the same weights and Adam moments (their run records differ: they hold timings).

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
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def step_ms(config: str, weights: str, repeat: int) -> float:
    import numpy as np

    from anekit import runtime
    from anekit.kernels import preset
    from anekit.llama import Params
    from anekit.llama.step import Timer, make_kernels, train_step

    cfg = preset(config)
    params = Params.init(cfg, seed=0)
    kernels = make_kernels(runtime.open("sim", compile_budget=10**9), cfg, weights)
    kernels.compile(params, Timer())
    grads = params.zeros_like()
    w = np.random.default_rng(0).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    times = []
    for _ in range(repeat + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        train_step(kernels, params, grads, w[:-1], w[1:], Timer(), 1024.0)
        times.append(1e3 * (time.perf_counter() - t0))
    kernels.close()
    return statistics.median(times[1:])


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
        dyn, baked = step_ms(args.config, "dynamic", args.repeat), step_ms(args.config, "baked", args.repeat)
        print(
            f"2. one {args.config} step: dynamic {dyn:.0f} ms, baked {baked:.0f} ms, ratio {dyn / baked:.2f}"
        )
        import numpy as np

        from anekit.kernels import preset
        from anekit.llama.checkpoint import load_checkpoint_file

        seq = preset(args.config).seq_len
        rates, files = {}, {}
        # "1 thread": the whole run on one thread (BLAS pinned to 1 by the variable, which anekit then leaves
        # alone), against 2 worker threads of one BLAS thread each; then 2 workers with BLAS left to anekit.
        for label, threads, env in (("1", 1, {"OPENBLAS_NUM_THREADS": "1"}),
                                    ("2", 2, {"OPENBLAS_NUM_THREADS": "1"}),
                                    ("auto", 2, {})):  # fmt: skip
            run_out = Path(tmp) / f"threads{label}"
            flags = [*tok, "--config", args.config, "--steps", "4", "--accum", "4", "--sample-steps", "0"]
            _, _, steps = anekit_train([*flags, "--threads", str(threads)], run_out, env)
            rates[label] = 4 * seq / (statistics.median(steps[1:]) / 1e3)  # the first step: warm-up
            files[label] = load_checkpoint_file(run_out / "ckpt.bin")
        same = {}
        for label in ("2", "auto"):
            a, b = files["1"], files[label]
            pairs = [*zip(a.params.tensors(), b.params.tensors())]
            pairs += [*zip(a.adam_v.tensors(), b.adam_v.tensors())]
            equal = all(np.array_equal(x, y) for (_, x), (_, y) in pairs)
            same[label] = "the same" if equal else "DIFFERENT"  # the run records differ: they hold timings
        print(
            f"3. {args.config}, 4 sequences a step: 1 thread {rates['1']:.0f} tokens/s, 2 threads "
            f"{rates['2']:.0f} tokens/s: {rates['2'] / rates['1']:.2f}x (weights and moments {same['2']}); "
            f"2 workers with BLAS threads chosen by anekit {rates['auto']:.0f} tokens/s: "
            f"{rates['auto'] / rates['1']:.2f}x ({same['auto']})"
        )


if __name__ == "__main__":
    main()
