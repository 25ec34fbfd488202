"""The cost model's report: predicted engine time of every kernel a training step or a program runs, per
chip, where the time goes, and the model's error against every published timing (``anekit cost``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

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
from anekit.cost.host_step import MADERIX_ACCUM, step_doc, steps, whole_step
from anekit.cost.step import StepKernel, host_flops, step_kernels
from anekit.cost.work import count
from anekit.errors import AnekitError
from anekit.inputs import InputError
from anekit.kernels.config import ModelConfig, preset
from anekit.tools.loader import locate, read_mil, read_package

SPLIT = (
    f"{FIT}: the M1 generation on the e5rt route (the guide's M1 convolutions, conv ramp and channel-group "
    "step; ANEForge's M1 / M1 Max workload map, saturation sweep and surface streams)",
    f"{FIGURE}: a timing that sets a device figure (a peak rate, a dispatch floor): shown, not an error",
    f"{HELD_OUT}: other generations on the same route (M2 Pro, M5), the direct route (maderix/ANE, Orion: "
    "M1 Pro to M5) and whole pipelines (stories110M per step)",
)


# --chip any: the conservative choice, as lint's `any` is (an error only where every chip refuses). The
# cost model predicts time, so `any` is, kernel by kernel, the slowest prediction over the chip table.
ANY = "any"


def chips(name: str) -> list[Performance]:
    """The figures --chip names: one device's, or for ``any`` every device's."""
    return [chip(d) for d in DEVICES] if name == ANY else [chip(name)]


def program_works(path: Path, where: str = "[cost]") -> list[StepKernel]:
    """The work of every program ``path`` holds (a MIL file, a kernels dump, a CoreML package), one
    evaluation each; a file that is not a MIL program is refused, naming it."""
    out = []
    for kind, file in locate(path, where, "dump", expected="a MIL text file"):
        try:
            loaded = read_package(file) if kind == "package" else read_mil(file, f"{where} cannot read")
            work = count(loaded.program, loaded.name)  # an ill-formed (e.g. cyclic) program is not timed
        except InputError:
            raise
        except (AnekitError, KeyError) as e:  # a syntax error's caret lines stay out of the one-line message
            first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
            raise AnekitError(f"{where} {file}: not a MIL program: {first}") from None
        out.append(StepKernel(work, 1, 1, "program", "-"))
    return out


def kernel_rows(
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


def params_doc(params: Params) -> dict[str, float]:
    return {
        "compute_efficiency": params.compute_efficiency,
        "dram_efficiency": params.dram_efficiency,
        "surface_efficiency": params.surface_efficiency,
    }


def calibration_doc(params: Params) -> dict[str, Any]:
    rows = error_table(params)
    s = summary(rows)
    return {
        "fitted": params_doc(params),
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
            {
                "what": what,
                "chip": dev,
                "weights": mode,
                "published_ms_per_step": ms,
                "source": src,
                "accumulated": MADERIX_ACCUM,
                "predicted_step_ms": whole_step(
                    preset("stories110M"), mode, [chip(dev)], params, accum=MADERIX_ACCUM
                )[1].step_ms,
            }
            for what, dev, mode, ms, src in CONTEXT
        ],
        "not_used": list(NOT_USED),
    }


def figures_doc(perf: Performance) -> dict[str, Any]:
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


def step(cfg: ModelConfig, weights: str = "baked") -> tuple[list[StepKernel], str]:
    """Every kernel one training step of ``cfg`` runs (``weights``: baked or dynamic), and its name."""
    return step_kernels(cfg, weights), f"{cfg.name} training step, {weights} weights"


def report(
    kernels: list[StepKernel],
    what: str,
    chip_name: str = ANY,
    route: str = "direct",
    params: Params | None = None,
    cfg: ModelConfig | None = None,
    weights: str | None = None,
    tied: bool = True,
) -> dict[str, Any]:
    """The predicted engine time of ``kernels`` (named ``what``) on ``chip_name`` (``any``: per kernel,
    the slowest device) and ``route``: one row per kernel, the total, the shares by kind and by part,
    the fitted efficiencies and the chip figures used; ``cfg``: the model of a training step (its host
    FLOPs are reported too) and, with ``weights`` (its weight mode; ``tied``: whether its classifier is
    the embedding), the whole step: engine, host, their overlap and the step time
    (``anekit.cost.host_step``; for ``any`` on the device whose step is slowest). A JSON-ready dict."""
    params = fitted() if params is None else params
    perfs = chips(chip_name)
    perf = perfs[0]
    rows = kernel_rows(kernels, perfs, params, route)
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
        "chip": ANY if chip_name == ANY else perf.name,
        "chip_label": "any chip (per kernel, the slowest device)" if chip_name == ANY else perf.label,
        "route": route,
        "kernels": rows,
        "engine_ms": total,
        "share_by_kind": {k: v / total for k, v in share.items()},
        "share_by_part": {k: v / total for k, v in parts.items()},
        "fitted": params_doc(params),
        "chip_figures": {p.name: figures_doc(p) for p in perfs} if chip_name == ANY else figures_doc(perf),
    }
    if cfg is not None:
        doc["host_gflop"] = host_flops(cfg) / 1e9
    if cfg is not None and weights is not None:
        every = steps(cfg, weights, perfs, params, tied, route=route)
        on, st = max(every, key=lambda ps: ps[1].step_ms)
        doc["host_ms"] = st.host_ms
        doc["overlapped_ms"] = st.overlapped_ms
        doc["step_ms"] = st.step_ms
        doc["step"] = step_doc(st, on, cfg, weights)
        if chip_name == ANY:
            doc["step_by_device"] = {
                p.name: {
                    "engine_ms": s.engine_ms,
                    "host_ms": s.host_ms,
                    "overlapped_ms": s.overlapped_ms,
                    "step_ms": s.step_ms,
                }
                for p, s in every
            }
    return doc
