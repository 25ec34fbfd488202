"""``anekit cost [--chip CHIP] [--config NAME | FILE.mil | DUMP_DIR] [--weights W] [--json] [--calibration]``:
predicted Neural Engine time per kernel and per training step (a model, not a measurement)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from anekit.cli import flags
from anekit.cost import calibration
from anekit.cost.chips import CHIPS, Chip, chip
from anekit.cost.model import Params, predict
from anekit.cost.step import WEIGHT_MODES, StepKernel, host_flops, step_kernels
from anekit.cost.work import Work, count
from anekit.errors import AnekitError
from anekit.kernels.config import preset
from anekit.mil import parse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cost",
        help="predicted Neural Engine time per kernel and per training step",
        description="Predict the engine time of every kernel of a training step (--config), of a .mil file "
        "or of a kernels dump directory, from each kernel's work and sourced per-chip figures, with two "
        "parameters fitted to published timings. A model, not a measurement: --calibration prints its "
        "error against every published figure.",
    )
    p.add_argument("target", nargs="?", type=Path, metavar="FILE.mil|DUMP_DIR", help="a program or a dump")
    p.add_argument(
        "--config",
        metavar="NAME",
        help=flags.preset_help("every kernel one training step of this model runs"),
    )
    p.add_argument("--chip", default="m4", metavar="CHIP", help=f"one of {', '.join(CHIPS)} (default m4)")
    p.add_argument(
        "--weights", default="baked", choices=WEIGHT_MODES, help="weight mode of --config (default: baked)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--calibration", action="store_true", help="print the fit and the error table")
    p.set_defaults(run=run_cost)


def _program_works(path: Path) -> list[StepKernel]:
    if path.is_dir():
        files = sorted(path.glob("*/model.mil")) or sorted(path.glob("*.mil"))
        if not files:
            raise AnekitError(f"[cost] {path}: no model.mil or .mil files in this directory")
    elif path.is_file():
        files = [path]
    else:
        raise AnekitError(f"[cost] {path}: no such file or directory")
    out = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise AnekitError(f"[cost] {f}: not a MIL text file ({e.__class__.__name__})") from None
        name = f.parent.name if f.name == "model.mil" else f.stem
        try:
            program = parse(text, str(f))
            work = count(program, name)
        except (AnekitError, KeyError) as e:  # a syntax error's caret lines stay out of the one-line message
            first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
            raise AnekitError(f"[cost] {f}: not a MIL program: {first}") from None
        out.append(StepKernel(work, 1, 1, "program", "-"))
    return out


def _kernel_rows(kernels: list[StepKernel], c: Chip, params: Params) -> list[dict[str, Any]]:
    rows = []
    for k in kernels:
        t = predict(k.work, c, params)
        w: Work = k.work
        rows.append(
            {
                "name": w.name,
                "kind": k.kind,
                "direction": k.direction,
                "calls": k.calls,
                "gflop": (w.flops + w.element_ops) / 1e9,
                "mb_moved": w.bytes_moved / 1e6,
                "weight_mb": w.weight_bytes / 1e6,
                "ms": t.ms,
                "total_ms": t.ms * k.calls,
                "bound": t.bound,
                "compute_ms": t.compute_ms,
                "memory_ms": t.memory_ms,
                "overhead_ms": t.overhead_ms,
                "weights_spill": t.spills,
            }
        )
    return rows


def _calibration_doc(params: Params) -> dict[str, Any]:
    rows = calibration.error_table(params)
    return {
        "fitted": {"efficiency": params.efficiency, "overhead_ms": params.overhead_ms},
        "figures": [
            {
                "id": r.figure.id,
                "what": r.figure.what,
                "chip": r.figure.device,
                "published_ms": r.figure.ms,
                "range_ms": [r.figure.low, r.figure.high],
                "predicted_ms": r.predicted_ms,
                "error": r.error,
                "held_out": r.figure.held_out,
                "source": r.figure.source,
            }
            for r in rows
        ],
        "context_whole_step": [
            {"what": what, "chip": dev, "weights": mode, "published_ms_per_step": ms, "source": src}
            for what, dev, mode, ms, src in calibration.CONTEXT
        ],
        "not_used": list(calibration.NOT_USED),
    }


def _print_calibration(params: Params) -> None:
    print(
        f"fitted (least squares on log time): efficiency {params.efficiency:.3f} of peak, "
        f"overhead {params.overhead_ms:.3f} ms per evaluation"
    )
    print(f"{'figure':<20} {'chip':<9} {'published':>10} {'predicted':>10} {'error':>7}  set")
    for r in calibration.error_table(params):
        f = r.figure
        pub = f"{f.ms:.3f}" if f.ms < 1 else f"{f.ms:.1f}"
        pred = f"{r.predicted_ms:.3f}" if f.ms < 1 else f"{r.predicted_ms:.1f}"
        print(
            f"{f.id:<20} {f.device:<9} {pub:>10} {pred:>10} {r.error:>+7.0%}  "
            f"{'HELD OUT' if f.held_out else 'fit'}  {f.what}"
        )
    print("sources:")
    for r in calibration.error_table(params):
        print(f"  {r.figure.id}: {r.figure.source}")
    print("whole-step figures (engine + CPU; context, not errors of this engine-only model):")
    for what, dev, mode, ms, src in calibration.CONTEXT:
        engine = sum(
            k.calls * predict(k.work, chip(dev), params).ms for k in step_kernels(preset("stories110M"), mode)
        )
        print(f"  {what} on {dev}: {ms:.1f} ms published, engine part predicted {engine:.1f} ms  [{src}]")
    print("not used:")
    for line in calibration.NOT_USED:
        print(f"  {line}")


def run_cost(args: argparse.Namespace) -> int:
    c = chip(args.chip)
    params = calibration.fitted()
    if args.calibration and args.target is None and args.config is None:
        if args.json:
            json.dump(_calibration_doc(params), sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            _print_calibration(params)
        return 0
    if (args.target is None) == (args.config is None):
        raise AnekitError("[cost] name one of --config NAME or FILE.mil / DUMP_DIR (or --calibration)")
    if args.config is not None:
        cfg = preset(args.config)
        kernels, what = step_kernels(cfg, args.weights), f"{cfg.name} training step, {args.weights} weights"
    else:
        kernels, what = _program_works(args.target), str(args.target)
    rows = _kernel_rows(kernels, c, params)
    total = sum(r["total_ms"] for r in rows)
    share: dict[str, float] = defaultdict(float)
    for r in rows:
        share[r["kind"]] += r["total_ms"]
    parts = {"dispatch": sum(r["calls"] * r["overhead_ms"] for r in rows), "compute": 0.0, "memory": 0.0}
    for r in rows:
        larger = "compute" if r["compute_ms"] >= r["memory_ms"] else "memory"
        parts[larger] += r["calls"] * r[f"{larger}_ms"]
    doc: dict[str, Any] = {
        "what": what,
        "chip": c.name,
        "chip_label": c.label,
        "kernels": rows,
        "engine_ms": total,
        "share_by_kind": {k: v / total for k, v in share.items()},
        "share_by_part": {k: v / total for k, v in parts.items()},
        "fitted": {"efficiency": params.efficiency, "overhead_ms": params.overhead_ms},
        "chip_figures": {
            k: {"value": f.value, "unit": f.unit, "status": f.status, "source": f.source}
            for k, f in c.figures().items()
        },
    }
    if args.config is not None:
        doc["host_gflop"] = host_flops(cfg) / 1e9
    if args.calibration:
        doc["calibration"] = _calibration_doc(params)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{what} on {c.label} ({c.name}) — predicted engine time (a model, not a measurement)")
    print(
        f"{'kernel':<22} {'calls':>5} {'GFLOP':>7} {'MB moved':>9} {'weight MB':>9} {'ms/call':>8} "
        f"{'ms total':>9}  bound"
    )
    for r in rows:
        spill = " (weights spill)" if r["weights_spill"] else ""
        print(
            f"{r['name']:<22} {r['calls']:>5} {r['gflop']:>7.3f} {r['mb_moved']:>9.2f} "
            f"{r['weight_mb']:>9.2f} {r['ms']:>8.3f} {r['total_ms']:>9.2f}  {r['bound']}{spill}"
        )
    label = "step, engine part" if args.config is not None else "total"
    print(f"{label}: {total:.2f} ms over {sum(r['calls'] for r in rows)} evaluations")
    print(
        "where the time goes: "
        + ", ".join(f"{k} {v:.0%}" for k, v in doc["share_by_kind"].items())
        + " | "
        + ", ".join(f"{k} {v:.0%}" for k, v in doc["share_by_part"].items())
    )
    if args.config is not None:
        print(
            f"not timed: the CPU's {doc['host_gflop']:.1f} GFLOP per step (classifier, weight gradients) "
            "and the fp16 conversions"
        )
    print(
        f"model: {params.overhead_ms:.3f} ms + max(work / ({params.efficiency:.2f} x "
        f"{c.peak_tflops.value:g} TFLOPS), bytes / {c.bandwidth_gbs.value:g} GB/s); "
        "`anekit cost --calibration` for its error"
    )
    if args.calibration:
        _print_calibration(params)
    return 0
