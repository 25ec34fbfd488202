"""``anekit demo``: one transformer layer's fused kernels — generated, printed, parsed, verified, simulated.

The SDPA and FFN forward kernels of a small llama2.c-style layer (grouped-query attention, RoPE) are
generated as MIL with their weights in MILBlob files, printed and parsed back (both round trips
checked), run in the simulator with ANE numerics (fp16 storage, fp32 accumulation), and compared with
the unfused float64 numpy references of the same layer. Each kernel's compile, first run and warm run
are timed apart: the first compile and run of a process also pay one-time work (numba compiling
anekit's loops, with the ``fast`` extra), which the warm runs do not.

The flags' ranges are what the strict simulator compiles: a spatial row of at least 64 bytes (seq >= 32,
rule ``surface.min-row-bytes``), convs of at most 2048 input channels (the FFN's down projection reads
``--hidden``), and RoPE's channel pairs (an even head dimension).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np

from anekit import mil, runtime
from anekit.cli import flags
from anekit.kernels import ModelConfig, forward, reference
from anekit.kernels.blocks import MAX_CONV_INPUT_CHANNELS
from anekit.rules.checks import MIN_ROW_BYTES

FP16_BYTES = 2
WARM_RUNS = 5  # the warm run time printed is the median of these
# The upper bounds keep the demo a demo (seconds, not hours, and well under a GB); the lower ones and
# --hidden's are what the engine's rules let the kernels compile (see the module docstring).
DEMO_FLAGS = (  # flag, default, smallest value, largest value, what it sets
    ("--dim", 64, 2, 1024, "model dimension (channels)"),
    ("--hidden", 172, 1, MAX_CONV_INPUT_CHANNELS, "FFN hidden dimension"),
    ("--heads", 8, 1, 64, "attention heads (dividing --dim into heads of an even size)"),
    ("--kv-heads", 4, 1, 64, "key / value heads (dividing --heads)"),
    ("--seq", 32, MIN_ROW_BYTES // FP16_BYTES, 1024, "sequence length"),
)


def demo_config(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(args.dim, args.hidden, 1, args.heads, args.kv_heads, 256, args.seq, name="demo")


def demo_weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Random layer weights scaled to keep activations O(1), held as the fp16 values a kernel bakes."""
    rng = np.random.default_rng(seed)

    def mat(out_ch: int, in_ch: int) -> np.ndarray:
        return rng.standard_normal((out_ch, in_ch)) / np.sqrt(in_ch)

    d, kv, h = cfg.dim, cfg.kv_dim, cfg.hidden_dim
    w = {
        "wq": mat(d, d), "wk": mat(kv, d), "wv": mat(kv, d), "wo": mat(d, d),
        "w1": mat(h, d), "w2": mat(d, h), "w3": mat(h, d),
        "rms_att": 1 + 0.1 * rng.standard_normal(d), "rms_ffn": 1 + 0.1 * rng.standard_normal(d),
    }  # fmt: skip
    return {k: v.astype(np.float16).astype(np.float64) for k, v in w.items()}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="generate, print, parse, verify and simulate one transformer layer's kernels",
        description="Generate one transformer layer's SDPA and FFN forward kernels as MIL, print and parse "
        "them back, run them in the simulator and compare them with float64 references; each kernel's "
        "compile, first run and warm run are timed apart.",
    )
    # ModelConfig then checks what the numbers must satisfy together (heads dividing dim, kv heads
    # dividing heads, an even head dimension): a combination that does not is one anekit error line.
    for flag, default, lo, hi, what in DEMO_FLAGS:
        p.add_argument(
            flag,
            type=flags.int_range(lo, hi),
            default=default,
            metavar="N",
            help=f"{what}, {lo} .. {hi} (default: %(default)s)",
        )
    p.add_argument(
        "--seed",
        type=flags.seed,
        default=0,
        help=f"seed of the weights and the input, 0 .. {flags.SEED_MAX} (default: %(default)s)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    cfg = demo_config(args)
    w = demo_weights(cfg, args.seed)
    backend = runtime.open("sim")
    print(
        f"One layer of a llama2.c-style model: dim {cfg.dim}, hidden {cfg.hidden_dim}, {cfg.n_heads} heads "
        f"({cfg.n_kv_heads} kv heads), seq {cfg.seq_len}, RoPE; backend '{backend.name}'."
    )
    x = np.random.default_rng(args.seed + 1).standard_normal((cfg.dim, cfg.seq_len)).astype(np.float16)
    x = x.astype(np.float64)
    ok = True
    # The residual stream: x2 = x + attention(x); out = x2 + ffn(x2), each kernel checked on its own input.
    stages = [("sdpa_fwd", forward.sdpa_fwd, reference.sdpa_fwd, "o_out"),
              ("ffn_fwd", forward.ffn_fwd, reference.ffn_fwd, "ffn_out")]  # fmt: skip
    for name, generate, ref, residual in stages:
        t0 = time.perf_counter()
        spec = generate(cfg, w)
        text = spec.text()
        t1 = time.perf_counter()
        parsed = mil.verify(mil.parse(text, f"<{name}>"))
        t2 = time.perf_counter()
        round_trips = parsed == spec.program and mil.to_text(parsed) == text
        kernel = spec.compile(backend)
        t3 = time.perf_counter()
        got = spec.run(kernel, x=x)
        first_run = time.perf_counter() - t3
        warm_run = float(np.median([_timed(spec.run, kernel, x=x) for _ in range(WARM_RUNS)]))
        want = ref(cfg, x, w)
        errors = {
            tap: float(np.max(np.abs(got[tap] - want[tap])) / np.max(np.abs(want[tap]))) for tap in want
        }
        worst = max(errors, key=errors.get)  # type: ignore[arg-type]
        print(
            f"  {name}: {spec.program.op_count()} ops, {len(text)} chars of MIL; round trip "
            f"{'ok' if round_trips else 'FAILED'}; taps {', '.join(spec.outputs.names)}"
        )
        print(
            f"    generate {1e3 * (t1 - t0):.1f} ms, parse+verify {1e3 * (t2 - t1):.1f} ms, "
            f"compile {1e3 * (t3 - t2):.1f} ms, first run {1e3 * first_run:.1f} ms, "
            f"warm run {1e3 * warm_run:.2f} ms (median of {WARM_RUNS})"
        )
        print(f"    worst tap vs float64 reference: {worst} {errors[worst]:.1e} of its max |value|")
        ok = ok and round_trips and errors[worst] < 1e-2
        x = (x + got[residual]).astype(np.float16).astype(np.float64)  # the host adds the residual
    print("\n".join(forward.sdpa_fwd(cfg, w).text().splitlines()[:5]) + "\n    ...")
    if not ok:
        print("demo FAILED: a round trip or a kernel did not match its reference", file=sys.stderr)
        return 1
    print("All kernels round-trip as MIL text and match their float64 references within fp16 tolerance.")
    print(
        "(The first kernel's compile and first run include the process's one-time setup; a warm run is "
        "the kernel alone.)"
    )
    return 0


def _timed(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    """Seconds one call of ``fn`` takes."""
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0
