"""Benchmark: the simulated training step against this machine's bound, measured in the same run.

Run: OPENBLAS_NUM_THREADS=2 python benchmarks/bench_step_bound.py [--config stories110M] [--repeat 3]
     [--kernels]

The bound of one training step (forward + backward + AdamW, one sequence of seq_len tokens) is

    step FLOPs / sgemm rate  +  optimizer bytes / memory bandwidth

with both rates measured here, in this process, in every round just before that round's steps:

* sgemm rate: the best float32 ``a @ b`` rate over the step's own product shapes (weight x activations,
  a weight gradient), best of several tries each;
* memory bandwidth: the best of a large ``np.copyto`` (reads and writes 4 bytes an element) and a
  read-read-write pass (``np.add(a, b, out=c)``, 12 bytes an element), arrays far larger than any cache;
* step FLOPs: the matmul FLOPs of the step (``bench_step_vs_numpy.step_flops``: 2 per multiply-add
  forward, 4 backward, attention included);
* optimizer bytes: what AdamW reads and writes per parameter (weight, gradient, m, v read; weight, m, v
  written: 28 bytes of float32) plus the fp16 copies of each updated weight written into the input
  surfaces of the dynamic kernels that hold it (2 bytes an element, counted from the kernels' column
  layouts: an RMSNorm scale repeated over S columns counts S times).

It then times, interleaved (machine load hits every variant alike), the simulated step with dynamic
weights as ``anekit train`` takes one (``anekit.llama.step.train_step`` into fresh ``Gradients``, the
loss scale taken off, ``apply_adamw`` on ``--adam-threads`` threads, by default as many as
``anekit train`` gives it, writing each updated weight into the kernels' surfaces) and the plain
numpy float32 step (``bench_step_vs_numpy.NumpyLlama``), ``--repeat`` rounds after a warm-up, and prints
each step's median and its ratio to the bound and to the numpy step (medians of the rounds' own
ratios). ``--kernels`` adds, for the simulated step, the time of each
kernel of the dynamic set (all its runs in one step, the whole call and its plan's run; median over
``--repeat`` more steps) beside the time its matmul FLOPs take at the measured sgemm rate.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_step_vs_numpy import NumpyLlama, step_flops

from anekit import runtime
from anekit.kernels import ModelConfig, preset
from anekit.kernels.composable import DynamicKernelSpec
from anekit.llama import Params
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import Gradients, Kernels, Timer, train_step, unscale
from anekit.runtime.sim.kernel import SimKernel
from anekit.runtime.sim.plan import Plan
from anekit.training.loop import TrainConfig, TrainState, apply_adamw
from anekit.training.optimizer import update_threads

F32 = np.float32
ADAMW_BYTES = 28  # float32 weight, grad, m, v read (16) and weight, m, v written (12), per parameter
FP16_BYTES = 2  # one element of an input surface


def _best(fn: Callable[[], object], tries: int) -> float:
    fn()
    best = math.inf
    for _ in range(tries):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def sgemm_rate(cfg: ModelConfig, tries: int = 7) -> tuple[float, str]:
    """(the best float32 matmul rate in FLOP/s over the step's product shapes, the shape that gave it)."""
    t, d, h, v = cfg.seq_len, cfg.dim, cfg.hidden_dim, cfg.vocab_size
    rng = np.random.default_rng(0)
    best, where = 0.0, ""
    # (M, K) @ (K, N): tokens x weight (forward), a weight gradient (K = tokens), the classifier
    for m, k, n in ((t, d, h), (t, h, d), (t, d, d), (h, t, d), (d, t, d), (t, d, v)):
        a, b = rng.standard_normal((m, k)).astype(F32), rng.standard_normal((k, n)).astype(F32)
        rate = 2 * m * k * n / _best(lambda a=a, b=b: a @ b, tries)
        if rate > best:
            best, where = rate, f"({m}x{k}) @ ({k}x{n})"
    return best, where


def bandwidth(mib: int = 128, tries: int = 4) -> tuple[float, float]:
    """(copy bandwidth, read-read-write bandwidth) in bytes/s over float32 arrays of ``mib`` MiB each."""
    n = mib * (1 << 20) // 4
    a = np.ones(n, F32)
    b = np.full(n, 2.0, F32)
    c = np.empty(n, F32)
    copy = 2 * 4 * n / _best(lambda: np.copyto(c, a), tries)
    triad = 3 * 4 * n / _best(lambda: np.add(a, b, out=c), tries)
    return copy, triad


def surface_weight_elements(kernels: Kernels) -> int:
    """Input-surface elements holding weights, over every layer: the fp16 writes the optimizer makes
    into the dynamic kernels' inputs per step (one surface set per layer)."""
    cfg = kernels.cfg
    total = 0
    for spec, _ in getattr(kernels, "dynamic", {}).values():
        if not isinstance(spec, DynamicKernelSpec) or spec.columns is None:
            continue
        per_layer = sum(s.rows * s.columns for s in spec.columns.segments if s.is_weight)
        total += per_layer * cfg.n_layers
    return total


@contextmanager
def kernel_clock(kernels: Kernels) -> Iterator[dict[str, list[float]]]:
    """While open, the seconds of every simulated kernel call of ``kernels``' dynamic set, by kernel name
    (the whole call, and the plan's run within it) and the matmul FLOPs the plans ran."""
    names = {id(kernel): name for name, (_, kernel) in getattr(kernels, "dynamic", {}).items()}
    seen: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])  # call s, plan s, FLOPs, n
    current: list[str | None] = [None]
    call, evaluate, run = SimKernel.__call__, SimKernel.evaluate, Plan.run
    flops_of: dict[int, float] = {}

    def clocked(self: SimKernel, fn: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        name = names.get(id(self), "other (baked)")
        outer, current[0] = current[0], name
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            seen[name][0] += time.perf_counter() - t0
            seen[name][3] += 1
            current[0] = outer

    def timed_call(self: SimKernel, **arrays: Any) -> dict[str, np.ndarray]:
        return clocked(self, lambda: call(self, **arrays))

    def timed_evaluate(self: SimKernel, inputs: Any = None) -> dict[str, np.ndarray]:
        # a dynamic kernel run on its layer's input set (weights in the surfaces): the run's own call
        return clocked(self, lambda: evaluate(self, inputs))

    def timed_run(self: Plan, *args: Any, **kw: Any) -> list[np.ndarray]:
        t0 = time.perf_counter()
        try:
            return run(self, *args, **kw)
        finally:
            if current[0] is not None:
                entry = seen[current[0]]
                entry[1] += time.perf_counter() - t0
                if id(self) not in flops_of:
                    flops_of[id(self)] = plan_flops(self)
                entry[2] += flops_of[id(self)]

    SimKernel.__call__ = timed_call  # type: ignore[method-assign]
    SimKernel.evaluate = timed_evaluate  # type: ignore[method-assign]
    Plan.run = timed_run  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        SimKernel.__call__ = call  # type: ignore[method-assign]
        SimKernel.evaluate = evaluate  # type: ignore[method-assign]
        Plan.run = run  # type: ignore[method-assign]


def plan_flops(plan: Plan) -> float:
    """The matmul and conv FLOPs (2 per multiply-add) of one run of ``plan``, from its static types."""
    total = 0.0
    for step in plan.steps:
        op = step.op
        out = step.out_types[0]
        shape = getattr(out, "shape", None)
        if shape is None or not all(isinstance(d, int) for d in shape):
            continue
        if op.op_type == "matmul":
            x = op.inputs["x"].type.shape
            tx = dict(step.args).get("transpose_x")
            flipped = isinstance(tx, int) and tx in plan.constants and bool(np.asarray(plan.constants[tx]))
            k = x[-2] if flipped else x[-1]
            total += 2.0 * math.prod(shape) * int(k)
        elif op.op_type == "conv":
            w = op.inputs["weight"].type.shape
            total += 2.0 * math.prod(shape) * math.prod(int(d) for d in w[1:])
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="stories110M")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kernels", action="store_true", help="time each kernel of the dynamic set")
    ap.add_argument("--no-numpy", action="store_true", help="skip the plain numpy step")
    ap.add_argument(
        "--adam-threads", type=int, default=None,
        help="AdamW's threads (apply_adamw; default: as anekit train takes them, optimizer.update_threads)",
    )  # fmt: skip
    args = ap.parse_args()
    cfg = preset(args.config)
    params = Params.init(cfg, seed=0)
    tc = TrainConfig(steps=10**6, lr=1e-4)
    if args.adam_threads is None:
        args.adam_threads = update_threads(1, sum(a.size for _, a in params.tensors()))

    backend = runtime.open("sim", compile_budget=10**9)
    kernels = make_kernels(backend, cfg, "dynamic")
    state = TrainState.fresh(params.copy(), tc)
    kernels.compile(state.params, Timer())
    grads = state.params.zeros_like()

    def anekit_step(window: np.ndarray) -> None:
        # as ``anekit train`` takes a step of one sequence: its gradients written over the last step's
        # (``Gradients`` fresh: no zeroing pass), the loss scale taken off, AdamW
        kernels.compile(state.params, Timer())  # stages nothing: the last update wrote its weights through
        sink = Gradients(grads, kernels, fresh=True)
        train_step(kernels, state.params, sink, window[:-1], window[1:], Timer(), 1024.0)
        unscale(grads, 1024.0)
        apply_adamw(state, grads, tc, args.adam_threads, kernels.write_weight)
        kernels.weights_written(state.params)

    variants: dict[str, Callable[[np.ndarray], object]] = {"anekit ane (dynamic)": anekit_step}
    if not args.no_numpy:
        ref = NumpyLlama(cfg, params)
        variants["numpy"] = lambda window: ref.step(window[:-1], window[1:])

    flops = step_flops(cfg)
    n_params = sum(a.size for _, a in params.tensors())
    surface = surface_weight_elements(kernels)
    opt_bytes = ADAMW_BYTES * n_params + FP16_BYTES * surface

    # Each round measures the machine (sgemm rate, bandwidth: the bound) and then takes every variant's
    # step, so a change of load between rounds moves the bound and the steps alike; every ratio below
    # is the median over rounds of that round's ratio.
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {k: [] for k in variants}
    ratios: dict[str, list[float]] = {k: [] for k in variants}
    rounds: dict[str, list[float]] = defaultdict(list)
    where = ""
    for i in range(args.repeat + 1):  # the first round warms up (compiled loops, caches, allocator)
        rate, where = sgemm_rate(cfg)
        copy_bw, triad_bw = bandwidth()
        bound = flops / rate + opt_bytes / max(copy_bw, triad_bw)
        window = rng.integers(0, cfg.vocab_size, cfg.seq_len + 1)
        step: dict[str, float] = {}
        for key, fn in variants.items():
            t0 = time.perf_counter()
            fn(window)
            step[key] = time.perf_counter() - t0
        if not i:
            continue
        for name, value in (("rate", rate), ("copy", copy_bw), ("triad", triad_bw), ("bound", bound)):
            rounds[name].append(value)
        for key, t in step.items():
            times[key].append(t)
            ratios[key].append(t / bound)
        if "numpy" in step:
            for key, t in step.items():
                rounds[f"{key} / numpy"].append(t / step["numpy"])

    per_kernel: dict[str, list[float]] = {}
    if args.kernels:  # ``--repeat`` more steps, each kernel's time the median of its per-step totals
        clocked: list[dict[str, list[float]]] = []
        for _ in range(args.repeat):
            window = rng.integers(0, cfg.vocab_size, cfg.seq_len + 1)
            with kernel_clock(kernels) as seen:
                anekit_step(window)
            clocked.append(dict(seen))
        for name in clocked[0]:
            per_kernel[name] = [statistics.median(r[name][i] for r in clocked) for i in range(4)]

    mid = {k: statistics.median(v) for k, v in rounds.items()}
    rate, copy_bw, triad_bw, bound = mid["rate"], mid["copy"], mid["triad"], mid["bound"]
    t_flops, t_bytes = flops / rate, opt_bytes / max(copy_bw, triad_bw)
    med = {k: statistics.median(v) for k, v in times.items()}

    blas = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    print(
        f"{args.config}: seq {cfg.seq_len}, {n_params / 1e6:.1f} M parameters, median of {args.repeat}, "
        f"OPENBLAS_NUM_THREADS={blas}, AdamW threads {args.adam_threads}, load {os.getloadavg()[0]:.2f}"
    )
    print(f"  sgemm rate     {rate / 1e9:7.1f} GFLOP/s (best shape of the last round {where})")
    print(f"  bandwidth      {copy_bw / 1e9:7.1f} GB/s copy, {triad_bw / 1e9:.1f} GB/s read-read-write")
    print(f"  step FLOPs     {flops / 1e9:7.1f} GFLOP  -> {1e3 * t_flops:7.1f} ms at the sgemm rate")
    print(
        f"  optimizer      {opt_bytes / 1e9:7.2f} GB ({ADAMW_BYTES} B x {n_params / 1e6:.1f} M params + "
        f"{FP16_BYTES} B x {surface / 1e6:.1f} M surface elements) -> {1e3 * t_bytes:7.1f} ms"
    )
    print(f"  bound          {1e3 * bound:7.1f} ms/step (median over rounds)")
    for key, t in med.items():
        ratio = statistics.median(ratios[key])
        extra = f"  {mid[f'{key} / numpy']:5.2f}x numpy" if key != "numpy" and f"{key} / numpy" in mid else ""
        print(f"  {key:22s} {1e3 * t:8.1f} ms/step  {ratio:5.2f}x bound{extra}")
    if per_kernel:
        print(f"  per kernel of the dynamic set (one step, all layers; median of {args.repeat} steps):")
        print(
            f"    {'kernel':16s} {'runs':>4s} {'call ms':>8s} {'plan ms':>8s} {'GFLOP':>7s} "
            f"{'sgemm ms':>8s} {'ratio':>6s}"
        )
        for name, (call_s, plan_s, kflops, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0]):
            ideal = kflops / rate
            ratio = f"{call_s / ideal:6.2f}" if ideal else "     -"
            print(
                f"    {name:16s} {int(n):4d} {1e3 * call_s:8.1f} {1e3 * plan_s:8.1f} {kflops / 1e9:7.2f} "
                f"{1e3 * ideal:8.1f} {ratio}"
            )


if __name__ == "__main__":
    main()
