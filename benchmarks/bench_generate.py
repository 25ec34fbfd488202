"""Benchmark: generation speed, the CPU forward against the simulated engine decoder, per model shape.

Run: python benchmarks/bench_generate.py [--quick] [--threads 1] [--chips any m5] [--clock wall|cpu]

``--threads`` sets OPENBLAS_NUM_THREADS (and the other thread counts) before numpy loads; ``--quick``
measures stories15M only. Weights are random (``Params.init``: llama2.c's initialisation) with each
model's real shapes: stories15M (anekit's preset), SmolLM2-135M and Qwen3-0.6B (their config.json: the
fields of tests/hf_fixtures.py's SHAPES with the real models' layer counts), the context ``--context``.
Per shape it prints:

- CPU decode tokens/s: ``anekit.llama.cpu_forward.CpuDecoder.forward`` of one token after a
  ``--prompt``-token prompt, the median over ``--tokens`` tokens; CPU prefill tokens/s: the prompt in
  one call, the median over ``--repeat`` calls;
- per chip numerics profile of ``--chips`` (the simulator's default numerics, "engine"), the generation
  kernels in the simulator through ``anekit.generate.engine.make_engine_decoder(params, "sim", chip)``
  (the route the chip gets, its plan's layer groups and vocabulary tiles): decode tokens/s (one token
  after the prompt, the median over ``--sim-tokens`` tokens), how much of a step the kernels take, the
  ratio of the step to the CPU's time per token, and prefill tokens/s (the prompt in chunks of the
  plan's prefill width; a model whose float32 weights pass 1 GB prefills at the decode width, so the
  simulator holds one kernel set). Kernels whose caller reads only some of their columns compute only
  those, where that gives the same bits (``anekit.runtime.sim.columns``: every decode kernel is read for
  the real tokens' columns; the attention kernels, the legacy route's fused layers and a dynamic route's
  every kernel run their copies, ``anekit.runtime.sim.kernel.SimKernel.causal``;
  ``anekit.runtime.sim.ordered``: a decode kernel's sums are taken in an order that keeps a column's bits
  at any width and any number of masked keys); the first run that asks measures which narrow widths do,
  once per kernel, and a dynamic kernel's second run keeps its moves of the weight columns
  (``anekit.runtime.sim.kept``), so the prefill timed is the second of two and the decode steps timed
  follow two untimed steps. ``--full-columns`` also
  times every chip with every column computed (the simulator as it ran before column-lazy runs), for the
  ratio of the two in one run.

``--clock cpu`` times with the process's CPU time instead of the wall clock: on a machine shared with
other work it measures what the run itself costs (every thread count above is 1 by default, so the two
agree on an idle machine).
"""

from __future__ import annotations

import argparse
import os
import sys

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def _set_threads(argv: list[str]) -> str:
    """OPENBLAS_NUM_THREADS (and the others) from ``--threads`` before numpy is imported."""
    threads = "1"
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            threads = argv[i + 1]
        elif a.startswith("--threads="):
            threads = a.split("=", 1)[1]
    for var in THREAD_VARS:
        os.environ[var] = threads
    return threads


THREADS = _set_threads(sys.argv[1:])

import platform  # noqa: E402  (numpy must load after the thread counts are set)
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hf_fixtures import SHAPES  # noqa: E402

from anekit.errors import AnekitError  # noqa: E402
from anekit.generate.engine import make_engine_decoder  # noqa: E402
from anekit.hf.config import parse_config  # noqa: E402
from anekit.kernels.config import ModelConfig  # noqa: E402
from anekit.llama.cpu_forward import CpuDecoder  # noqa: E402
from anekit.llama.params import Params  # noqa: E402
from anekit.models.config import preset  # noqa: E402
from anekit.runtime.sim import SimKernel  # noqa: E402

LAYERS = {"smollm2": 30, "qwen3": 28}  # num_hidden_layers of SmolLM2-135M and Qwen3-0.6B
NAMES = {"stories15M": "stories15M", "smollm2": "SmolLM2-135M", "qwen3": "Qwen3-0.6B"}


def config(shape: str, seq_len: int) -> ModelConfig:
    """The model config of ``shape`` (a preset, or a Hugging Face config with its real layer count)."""
    if shape == "stories15M":
        return preset(shape)
    raw = dict(SHAPES[shape], num_hidden_layers=LAYERS[shape])
    return parse_config(raw, name=NAMES[shape], seq_len=seq_len).cfg


def median_time(run: Callable[[], Any], repeat: int, clock: Callable[[], float]) -> float:
    """The median time (s) of ``repeat`` calls, after one warm-up call."""
    run()
    times = []
    for _ in range(repeat):
        t0 = clock()
        run()
        times.append(clock() - t0)
    return statistics.median(times)


# -- the CPU forward --------------------------------------------------------------------------------------


def cpu_rates(
    params: Params, prompt: int, tokens: int, repeat: int, clock: Callable[[], float]
) -> tuple[float, float]:
    """(decode tokens/s, prefill tokens/s) of the float32 CPU forward."""
    cfg = params.cfg
    ids = np.arange(prompt) % cfg.vocab_size
    dec = CpuDecoder(params, max_len=prompt + tokens + 1)
    prefill = median_time(lambda: dec.forward(ids, 0), repeat, clock)
    times = []
    dec.forward(ids, 0)
    for i in range(tokens):
        t0 = clock()
        dec.forward([int(ids[i % prompt])], prompt + i)
        times.append(clock() - t0)
    return 1.0 / statistics.median(times), prompt / prefill


# -- the simulated engine decoder ------------------------------------------------------------------------

ONE_SET_BYTES = 1 << 30  # float32 weights past this: the simulator prefills at the decode width (one set)


class KernelClock:
    """Adds up the time spent in ``SimKernel.run`` while it is installed (the rest of a step is the
    host's: embedding, packing inputs, copying keys and values, reading logits)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock, self.total = clock, 0.0
        self._run = SimKernel.run

    def __enter__(self) -> KernelClock:
        run, me = self._run, self

        def timed(kernel: SimKernel, inputs: Any = None) -> None:
            t0 = me.clock()
            try:
                run(kernel, inputs)
            finally:
                me.total += me.clock() - t0

        SimKernel.run = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        SimKernel.run = self._run  # type: ignore[method-assign]


def sim_rates(
    params: Params, chip: str, prompt: int, tokens: int, clock: Callable[[], float], lazy: bool = True
) -> tuple[str, float, float, float]:
    """(what ran, decode tokens/s, the kernels' share of a decode step, prefill tokens/s) of the
    generation kernels in the simulator with ``chip``'s numerics (``lazy``: column-lazy runs)."""
    one_set = 4 * params.count() > ONE_SET_BYTES
    dec = make_engine_decoder(
        params, "sim", chip=chip, prefill_width=32 if one_set else None, lazy_columns=lazy
    )
    try:
        plan = dec.plan
        what = (
            f"route {dec.route.id}, {len(plan.groups)} layers kernel(s) {list(plan.groups)}, "
            f"{len(plan.tiles)} head tile(s), capacity {plan.capacity}, prefill width {plan.prefill_width}"
        )
        ids = np.arange(prompt) % params.cfg.vocab_size
        dec.forward(ids, 0)  # untimed: the first run of each kernel (mirrors, narrow widths measured)
        dec.forward([int(ids[0])], prompt)
        dec.forward([int(ids[1])], prompt + 1)
        t0 = clock()
        dec.forward(ids, 0)
        prefill = prompt / (clock() - t0)
        steps, shares = [], []
        for i in range(tokens):
            with KernelClock(clock) as kernels:
                t0 = clock()
                dec.forward([int(ids[i % prompt])], prompt + i)
                step = clock() - t0
            steps.append(step)
            shares.append(kernels.total / step)
        return what, 1.0 / statistics.median(steps), statistics.median(shares), prefill
    finally:
        dec.close()


def machine() -> str:
    """The CPU model, cores, Python and numpy versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (
        f"{cpu}, {os.cpu_count()} cores{load}, Python {platform.python_version()}, numpy {np.__version__}, "
        f"OPENBLAS_NUM_THREADS={THREADS}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="stories15M only")
    ap.add_argument("--shapes", nargs="+", default=["stories15M", "smollm2", "qwen3"], choices=list(NAMES))
    ap.add_argument("--threads", default="1", help="OPENBLAS_NUM_THREADS (set before numpy loads)")
    ap.add_argument("--chips", nargs="+", default=["any"], help="chip numerics profiles of the simulator")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    ap.add_argument("--tokens", type=int, default=16, help="decode tokens timed on the CPU")
    ap.add_argument("--sim-tokens", type=int, default=5, help="decode tokens timed in the simulator")
    ap.add_argument("--context", type=int, default=512, help="seq_len of the Hugging Face shapes")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument(
        "--full-columns", action="store_true", help="also time each chip with every column computed"
    )
    args = ap.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    shapes = ["stories15M"] if args.quick else args.shapes
    print(f"machine: {machine()}; clock: {args.clock}")
    for shape in shapes:
        cfg = config(shape, seq_len=args.context)
        params = Params.init(cfg, seed=0)
        print(
            f"{NAMES[shape]}: dim {cfg.dim}, hidden {cfg.hidden_dim}, {cfg.n_layers} layers, heads "
            f"{cfg.n_heads}/{cfg.n_kv_heads} of {cfg.head_dim}, vocab {cfg.vocab_size}, context "
            f"{cfg.seq_len}, {params.count() / 1e6:.0f}M parameters"
        )
        cpu_decode, cpu_prefill = cpu_rates(params, args.prompt, args.tokens, args.repeat, clock)
        print(
            f"  cpu (float32 forward): decode {cpu_decode:7.1f} tokens/s, prefill {cpu_prefill:7.1f} tokens/s"
        )
        for chip in args.chips:
            for lazy in (True, False) if args.full_columns else (True,):
                label = f"sim {chip}" + ("" if lazy else " every column")
                try:
                    what, decode, share, prefill = sim_rates(
                        params, chip, args.prompt, args.sim_tokens, clock, lazy
                    )
                except (
                    AnekitError
                ) as e:  # a model the route's kernels cannot hold: the one line that says why
                    print(f"  {label}: not run: {e}")
                    continue
                print(
                    f"  {label} (engine numerics): decode {decode:7.1f} tokens/s ({1e3 / decode:.1f} ms a "
                    f"step, {100 * share:.0f}% in kernels), {cpu_decode / decode:.2f}x the cpu's time per "
                    f"token; prefill {prefill:7.1f} tokens/s; {what}"
                )


if __name__ == "__main__":
    main()
