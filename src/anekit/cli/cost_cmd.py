"""``anekit cost [--chip CHIP] [--route ROUTE] [--config NAME | FILE.mil | DUMP_DIR] [--weights W] [--json]
[--calibration]``: predicted Neural Engine time per kernel and per training step (a model, not a
measurement)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from anekit.cli import flags
from anekit.cost import (
    CONTEXT,
    DEVICES,
    NOT_USED,
    Params,
    Performance,
    chip,
    error_table,
    fitted,
    predict,
    summary,
)
from anekit.cost.calibration import FIGURE, FIT, HELD_OUT
from anekit.cost.model import MODELLED_ROUTES
from anekit.cost.step import WEIGHT_MODES, StepKernel, host_flops, step_kernels
from anekit.cost.work import count
from anekit.errors import AnekitError
from anekit.inputs import InputError
from anekit.kernels.config import preset
from anekit.tools.loader import locate, read_mil, read_package
from anekit.tools.models import model_config

SPLIT = (
    f"{FIT}: the M1 generation on the e5rt route (the guide's M1 convolutions, conv ramp and channel-group "
    "step; ANEForge's M1 / M1 Max workload map, saturation sweep and surface streams)",
    f"{FIGURE}: a timing that sets a device figure (a peak rate, a dispatch floor): shown, not an error",
    f"{HELD_OUT}: other generations on the same route (M2 Pro, M5), the direct route (maderix/ANE, Orion: "
    "M1 Pro to M5) and whole pipelines (stories110M per step)",
)


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


# --chip any: the conservative choice, as lint's `any` is (an error only where every chip refuses). The
# cost model predicts time, so `any` is, kernel by kernel, the slowest prediction over the chip table.
ANY = "any"


def _chip_flag(text: str) -> str:
    """--chip: any, or a device of the chip table."""
    return ANY if text == ANY else flags.device(text)


def _chips(name: str) -> list[Performance]:
    """The figures --chip names: one device's, or for ``any`` every device's."""
    return [chip(d) for d in DEVICES] if name == ANY else [chip(name)]


def _program_works(path: Path) -> list[StepKernel]:
    """The work of every program ``path`` holds (a MIL file, a kernels dump, a CoreML package), one
    evaluation each; a file that is not a MIL program is refused, naming it."""
    out = []
    for kind, file in locate(path, "[cost]", "dump", expected="a MIL text file"):
        try:
            loaded = read_package(file) if kind == "package" else read_mil(file, "[cost] cannot read")
            work = count(loaded.program, loaded.name)  # an ill-formed (e.g. cyclic) program is not timed
        except InputError:
            raise
        except (AnekitError, KeyError) as e:  # a syntax error's caret lines stay out of the one-line message
            first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
            raise AnekitError(f"[cost] {file}: not a MIL program: {first}") from None
        out.append(StepKernel(work, 1, 1, "program", "-"))
    return out


def _kernel_rows(
    kernels: list[StepKernel], perfs: list[Performance], params: Params, route: str
) -> list[dict[str, Any]]:
    """One row per kernel: its work and predicted time on the slowest of ``perfs``, named in ``chip``."""
    rows = []
    for k in kernels:
        t, slowest = max(((predict(k.work, p, params, route), p) for p in perfs), key=lambda tp: tp[0].ms)
        w = k.work
        rows.append(
            {
                "name": w.name,
                "chip": slowest.name,
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
                "surface_ms": t.surface_ms,
                "overhead_ms": t.overhead_ms,
                "spills": t.spills,
            }
        )
    return rows


def _params_doc(params: Params) -> dict[str, float]:
    return {
        "compute_efficiency": params.compute_efficiency,
        "dram_efficiency": params.dram_efficiency,
        "surface_efficiency": params.surface_efficiency,
    }


def _calibration_doc(params: Params) -> dict[str, Any]:
    rows = error_table(params)
    s = summary(rows)
    return {
        "fitted": _params_doc(params),
        "split": list(SPLIT),
        "held_out": {
            "count": s.held_out,
            "median_abs_error": s.median_error,
            "within_30_percent": s.within_30,
            "worst": {
                "id": s.worst.measurement.id,
                "chip": s.worst.measurement.device,
                "error": s.worst.error,
                "explanation": s.worst.measurement.explanation,
            },
        },
        "fit_median_abs_error": s.fit_median_error,
        "measurements": [
            {
                "id": r.measurement.id,
                "kernel": r.measurement.what,
                "chip": r.measurement.device,
                "route": r.measurement.route,
                "measured_ms": r.measurement.ms,
                "predicted_ms": r.predicted_ms,
                "error": r.error,
                "role": r.measurement.role,
                "held_out": r.measurement.role == HELD_OUT,
                "source": r.measurement.source,
                "quote": r.measurement.quote,
                "explanation": r.measurement.explanation,
            }
            for r in rows
        ],
        "context_whole_step": [
            {"what": what, "chip": dev, "weights": mode, "published_ms_per_step": ms, "source": src}
            for what, dev, mode, ms, src in CONTEXT
        ],
        "not_used": list(NOT_USED),
    }


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


def _figures_doc(perf: Performance) -> dict[str, Any]:
    return {
        name: {
            "value": f.value,
            "unit": f.unit,
            "status": f.status,
            "source": f.source,
            "observed": f.evidence.observed,
        }
        for name, f in perf.figures().items()
    }


def run_cost(args: argparse.Namespace) -> int:
    perfs = _chips(args.chip)
    perf = perfs[0]
    params = fitted()
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
        cfg = model_config(args.config)
        kernels, what = step_kernels(cfg, args.weights), f"{cfg.name} training step, {args.weights} weights"
    else:
        kernels, what = _program_works(args.target), str(args.target)
    rows = _kernel_rows(kernels, perfs, params, args.route)
    total = sum(r["total_ms"] for r in rows)
    share: dict[str, float] = defaultdict(float)
    for r in rows:
        share[r["kind"]] += r["total_ms"]
    parts = {
        "dispatch": sum(r["calls"] * r["overhead_ms"] for r in rows),
        "surfaces": sum(r["calls"] * r["surface_ms"] for r in rows),
        "compute": 0.0,
        "memory": 0.0,
    }
    for r in rows:
        larger = "compute" if r["compute_ms"] >= r["memory_ms"] else "memory"
        parts[larger] += r["calls"] * r[f"{larger}_ms"]
    doc: dict[str, Any] = {
        "what": what,
        "chip": ANY if args.chip == ANY else perf.name,
        "chip_label": "any chip (per kernel, the slowest device)" if args.chip == ANY else perf.label,
        "route": args.route,
        "kernels": rows,
        "engine_ms": total,
        "share_by_kind": {k: v / total for k, v in share.items()},
        "share_by_part": {k: v / total for k, v in parts.items()},
        "fitted": _params_doc(params),
        "chip_figures": {p.name: _figures_doc(p) for p in perfs} if args.chip == ANY else _figures_doc(perf),
    }
    if args.config is not None:
        doc["host_gflop"] = host_flops(cfg) / 1e9
    if args.calibration:
        doc["calibration"] = _calibration_doc(params)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    on = "any chip (per kernel, the slowest device" if args.chip == ANY else f"{perf.label} ({perf.name}"
    print(f"{what} on {on}, {args.route} route) — predicted engine time (a model, not a measurement)")
    print(
        f"{'kernel':<22} {'calls':>5} {'GFLOP':>7} {'MB moved':>9} {'weight MB':>9} {'ms/call':>8} "
        f"{'ms total':>9}  bound"
    )
    for r in rows:
        spill = " (spills)" if r["spills"] else ""
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
