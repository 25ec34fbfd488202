"""``anekit demo``: one transformer layer's fused kernels — generated, printed, parsed, verified, simulated.

The SDPA and FFN forward kernels of a small llama2.c-style layer (grouped-query attention, RoPE) are
generated as MIL with their weights in MILBlob files, printed and parsed back (both round trips
checked), run in the simulator with ANE numerics (fp16 storage, fp32 accumulation), and compared with
the unfused float64 numpy references of the same layer.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from anekit import mil, runtime
from anekit.cli import flags
from anekit.kernels import ModelConfig, forward, reference

DEMO_FLAGS = (  # flag, default, largest value, what it sets
    ("--dim", 64, 1024, "model dimension (channels)"),
    ("--hidden", 172, 4096, "FFN hidden dimension"),
    ("--heads", 8, 64, "attention heads"),
    ("--kv-heads", 4, 64, "key / value heads (dividing --heads)"),
    ("--seq", 32, 1024, "sequence length"),
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
        "demo", help="generate, print, parse, verify and simulate one transformer layer's kernels"
    )
    # The bounds keep the demo a demo (seconds, not hours, and well under a GB); ModelConfig then checks
    # what the numbers must satisfy together (heads dividing dim, kv heads dividing heads, ...).
    for flag, default, hi, what in DEMO_FLAGS:
        p.add_argument(
            flag,
            type=flags.int_range(1, hi),
            default=default,
            metavar="N",
            help=f"{what}, 1 .. {hi} (default: %(default)s)",
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
        t4 = time.perf_counter()
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
            f"compile {1e3 * (t3 - t2):.1f} ms, run {1e3 * (t4 - t3):.1f} ms; "
            f"worst tap vs float64 reference: {worst} {errors[worst]:.1e} of its max |value|"
        )
        ok = ok and round_trips and errors[worst] < 1e-2
        x = (x + got[residual]).astype(np.float16).astype(np.float64)  # the host adds the residual
    print("\n".join(forward.sdpa_fwd(cfg, w).text().splitlines()[:5]) + "\n    ...")
    if not ok:
        print("demo FAILED: a round trip or a kernel did not match its reference", file=sys.stderr)
        return 1
    print("All kernels round-trip as MIL text and match their float64 references within fp16 tolerance.")
    return 0
