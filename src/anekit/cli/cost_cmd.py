"""``anekit cost [--chip CHIP] [--route ROUTE] [--config NAME | FILE.mil | DUMP_DIR] [--weights W] [--json]
[--calibration]``: predicted Neural Engine time per kernel and per training step (a model, not a
measurement)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from anekit.cli import flags
from anekit.cost import CONTEXT, DEVICES, NOT_USED, Params, chip, error_table, fitted, predict, summary
from anekit.cost.calibration import HELD_OUT
from anekit.cost.model import MODELLED_ROUTES
from anekit.cost.step import WEIGHT_MODES, step_kernels
from anekit.errors import AnekitError
from anekit.kernels.config import preset
from anekit.tools.config import model_config
from anekit.tools.cost_report import ANY, SPLIT, calibration_doc, chips, program_works, report, step


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cost",
        help="predicted Neural Engine time per kernel and per training step",
        description="Predict the engine time of every kernel of a training step (--config), of a .mil file "
        "or of a kernels dump directory, from each kernel's work and sourced per-device figures, with three "
        "efficiencies fitted to published timings. A model, not a measurement: --calibration prints its "
        "error against every published timing, fitted and held out.",
    )
    p.add_argument("target", nargs="?", type=Path, metavar="FILE.mil|DUMP_DIR", help="a program or a dump")
    p.add_argument(
        "--config",
        type=flags.model,
        metavar="NAME",
        help=flags.preset_help("every kernel one training step of this model runs", hf=True),
    )
    p.add_argument(
        "--chip",
        default=ANY,
        type=_chip_flag,
        metavar="CHIP",
        help=f"any, or one of {', '.join(DEVICES)} (default: any — per kernel, the slowest device's "
        "prediction: a time every chip is predicted to meet)",
    )
    p.add_argument(
        "--route",
        default="direct",
        choices=MODELLED_ROUTES,
        help="how the program reaches the engine: direct (anekit's backend, the default) or e5rt",
    )
    p.add_argument(
        "--weights", default="baked", choices=WEIGHT_MODES, help="weight mode of --config (default: baked)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--calibration", action="store_true", help="print the fit and the error table")
    p.set_defaults(run=run_cost)


def _chip_flag(text: str) -> str:
    """--chip: any, or a device of the chip table."""
    return ANY if text == ANY else flags.device(text)


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _print_calibration(params: Params) -> None:
    rows = error_table(params)
    s = summary(rows)
    print(
        "fitted (least squares on log time, fit rows only): "
        f"compute efficiency {params.compute_efficiency:.3f} of the fp16 peak, "
        f"DRAM efficiency {params.dram_efficiency:.3f} of the streaming rate, "
        f"e5rt surface efficiency {params.surface_efficiency:.3f} of the measured surface rate"
    )
    print("split:")
    for line in SPLIT:
        print(f"  {line}")
    print(
        f"{'measurement':<30} {'chip':<9} {'route':<6} {'measured':>9} {'predicted':>9} {'error':>6}  "
        "set       kernel"
    )
    for r in rows:
        m = r.measurement
        print(
            f"{m.id:<30} {m.device:<9} {m.route:<6} {_ms(m.ms):>9} {_ms(r.predicted_ms):>9} "
            f"{r.error:>+6.0%}  "
            f"{m.role.upper() if m.role == HELD_OUT else m.role:<8}  {m.what}"
        )
    within = round(s.within_30 * s.held_out)
    print(
        f"held out: {s.held_out} measurements, median |error| {s.median_error:.0%}, within 30%: {within} of "
        f"{s.held_out} ({s.within_30:.0%}); fit rows: median |error| {s.fit_median_error:.0%}"
    )
    w = s.worst.measurement
    print(
        f"worst held out: {w.id} ({w.device}, {s.worst.error:+.0%}): "
        f"{w.explanation or 'no explanation recorded'}"
    )
    print("sources:")
    for r in rows:
        print(f"  {r.measurement.id}: {r.measurement.source}: {r.measurement.quote}")
    print("whole-step figures (engine + CPU; context, not errors of this engine-only model):")
    for what, dev, mode, ms, src in CONTEXT:
        perf = chip(dev)
        engine = sum(
            k.calls * predict(k.work, perf, params).ms for k in step_kernels(preset("stories110M"), mode)
        )
        print(f"  {what} on {dev}: {ms:.1f} ms published, engine part predicted {engine:.1f} ms  [{src}]")
    print("not used:")
    for line in NOT_USED:
        print(f"  {line}")


def run_cost(args: argparse.Namespace) -> int:
    perf = chips(args.chip)[0]
    params = fitted()
    if args.calibration and args.target is None and args.config is None:
        if args.json:
            json.dump(calibration_doc(params), sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            _print_calibration(params)
        return 0
    if (args.target is None) == (args.config is None):
        raise AnekitError("[cost] name one of --config NAME or FILE.mil / DUMP_DIR (or --calibration)")
    cfg = None if args.config is None else model_config(args.config)
    if cfg is not None:
        kernels, what = step(cfg, args.weights)
    else:
        kernels, what = program_works(args.target), str(args.target)
    doc = report(kernels, what, args.chip, args.route, params, cfg)
    rows = doc["kernels"]
    total = doc["engine_ms"]
    if args.calibration:
        doc["calibration"] = calibration_doc(params)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    on = "any chip (per kernel, the slowest device" if args.chip == ANY else f"{perf.label} ({perf.name}"
    print(f"{what} on {on}, {args.route} route) — predicted engine time (a model, not a measurement)")
    width = max(22, *(len(r["name"]) for r in rows))  # a sliding kind's names are longer
    print(
        f"{'kernel':<{width}} {'calls':>5} {'GFLOP':>7} {'MB moved':>9} {'weight MB':>9} {'ms/call':>8} "
        f"{'ms total':>9}  bound"
    )
    for r in rows:
        spill = " (spills)" if r["spills"] else ""
        print(
            f"{r['name']:<{width}} {r['calls']:>5} {r['gflop']:>7.3f} {r['mb_moved']:>9.2f} "
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
    if args.chip == ANY:
        slowest = sorted({r["chip"] for r in rows})
        compute, dram = params.compute_efficiency, params.dram_efficiency
        print(
            f"slowest device per kernel: {', '.join(slowest)}; model per device: dispatch floor + "
            f"surfaces + max(work / ({compute:.2f} x fp16 peak), bytes / ({dram:.2f} x weight stream)) "
            "(--chip CHIP for one device's figures); `anekit cost --calibration` for its error"
        )
    else:
        print(
            f"model: {perf.dispatch_floor.value:g} ms + surfaces + max(work / "
            f"({params.compute_efficiency:.2f} x {perf.fp16_peak.value:g} TFLOP/s), bytes / "
            f"({params.dram_efficiency:.2f} x {perf.weight_stream.value:g} GB/s)); `anekit cost "
            "--calibration` for its error"
        )
    if args.calibration:
        _print_calibration(params)
    return 0
