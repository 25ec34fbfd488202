"""``anekit cost [--chip CHIP] [--route ROUTE] [--config NAME | FILE.mil | DUMP_DIR] [--weights W] [--json]
[--calibration]``: predicted Neural Engine time per kernel and per training step, and with --config the
host's part of the step and the whole step (``anekit.cost.host_step``) (a model, not a measurement);
``--generate [--prompt N]``: the prefill time of a prompt and the decode rate of text generation
(``anekit.cost.generation``); ``--distributed N[,N...] [--link L] [--lora R] [--accum K]
[--sequence-ms T]``: what more Macs buy a training run (``anekit.cost.distributed``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from anekit.cli import flags
from anekit.cost import CONTEXT, DEVICES, NOT_USED, Params, chip, error_table, fitted, predict, summary
from anekit.cost import distributed as dist
from anekit.cost.calibration import GEN_NOT_USED, HELD_OUT, TOLERANCE, generation_rows, generation_summary
from anekit.cost.generation import generation_doc, predict_generation, slowest
from anekit.cost.host_step import MADERIX_ACCUM, whole_step
from anekit.cost.links import LINKS
from anekit.cost.model import MODELLED_ROUTES
from anekit.cost.step import WEIGHT_MODES, step_kernels
from anekit.errors import AnekitError
from anekit.generate.plan import PREFILL_WIDTH
from anekit.hf.config import check_model_dir, read_config
from anekit.kernels.config import preset
from anekit.tools.config import HF_SEQ, is_preset, model_config
from anekit.tools.cost_report import ANY, SPLIT, calibration_doc, chips, program_works, report, step


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cost",
        help="predicted Neural Engine time per kernel and per training step",
        description="Predict the engine time of every kernel of a training step (--config), of a .mil file "
        "or of a kernels dump directory, from each kernel's work and sourced per-device figures, with three "
        "efficiencies fitted to published timings; with --config also the host's part of the step (its "
        "FLOPs at the CPU's sgemm rate, its bytes at its stream rate) and the whole step, engine and host "
        "overlapped. A model, not a measurement: --calibration prints its error against every published "
        "timing, fitted and held out.",
    )
    p.add_argument("target", nargs="?", type=Path, metavar="FILE.mil|DUMP_DIR", help="a program or a dump")
    p.add_argument(
        "--config",
        type=_config_flag,
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
    p.add_argument(
        "--generate",
        action="store_true",
        help="with --config: predict text generation instead of a training step: the prefill time of a "
        "--prompt N token prompt (ms) and the decode rate after it (tokens/s)",
    )
    p.add_argument(
        "--prompt",
        type=flags.int_range(1, 2**31 - 1),
        metavar="N",
        help=f"with --generate: the prompt's tokens, >= 1 (default: {PREFILL_WIDTH}, at most half the "
        "context)",
    )
    p.add_argument(
        "--distributed",
        type=_ranks_flag,
        metavar="N[,N...]",
        help="with --config and --chip: the data-parallel speed-up over N Macs (e.g. 2,4,8): the fixed-order "
        "gradient exchange over --link, the accumulation per rank that hides it (<= 10%% of a step)",
    )
    p.add_argument(
        "--link",
        choices=list(LINKS),
        help="with --distributed: one link (default: every link, with its source)",
    )
    p.add_argument("--lora", type=flags.int_range(1, 4096), metavar="RANK", help="with --distributed: LoRA's "
                   "gradients (rank RANK on q and v, 1 .. 4096) instead of every weight's (default: every "
                   "weight's)")  # fmt: skip
    p.add_argument("--accum", type=flags.int_range(1, 1 << 20), metavar="K",
                   help="with --distributed: also the speed-up at K sequences per rank, 1 .. 1048576 "
                   "(default: only at the accumulation that hides the exchange)")  # fmt: skip
    p.add_argument(
        "--bucket-mb",
        type=flags.float_range(0.0, 1e6, lo_open=True),
        metavar="MB",
        help="with --distributed: buckets of about MB megabytes, > 0 (large tensors cut, small ones grouped; "
        "default: one bucket per gradient tensor, as the chain sends them)",
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="with --distributed: price a chain whose ranks receive the next bucket while adding this one "
        "(default: the blocking loop, receive, add, send)",
    )
    p.add_argument(
        "--sequence-ms",
        type=flags.float_range(0.0, 1e9, lo_open=True),
        metavar="MS",
        help="with --distributed: a measured time of one sequence's forward and backward, > 0 ms (default: "
        "the predicted engine time on --chip, which leaves out the CPU's share)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--calibration", action="store_true", help="print the fit and the error table")
    p.set_defaults(run=run_cost)


def _ranks_flag(text: str) -> list[int]:
    """--distributed: numbers of Macs, 1 .. 1024, comma-separated."""
    parse = flags.int_range(1, 1024)
    return [parse(part.strip()) for part in text.split(",")]


def _config_flag(text: str) -> str:
    """--config: a preset, or a Hugging Face model directory (a directory without a readable config.json
    refused in one line naming it)."""
    check_model_dir(text, "[cost] --config")
    return flags.model(text)


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
    print(
        f"whole-step figures (engine + CPU; context, not errors: the host's part is not fitted; both "
        f"pipelines accumulate {MADERIX_ACCUM} sequences an update, priced so):"
    )
    for what, dev, mode, ms, src in CONTEXT:
        perf = chip(dev)
        cfg = preset("stories110M")
        engine = sum(k.calls * predict(k.work, perf, params).ms for k in step_kernels(cfg, mode))
        _, st = whole_step(cfg, mode, [perf], params, accum=MADERIX_ACCUM)
        print(
            f"  {what} on {dev}: {ms:.1f} ms published, engine part predicted {engine:.1f} ms, whole step "
            f"{st.step_ms:.1f} ms  [{src}]"
        )
    print("not used:")
    for line in NOT_USED:
        print(f"  {line}")
    print("generation figures (decode and prefill): `anekit cost --generate --calibration`")


def run_generate(args: argparse.Namespace, params: Params) -> int:
    """``--generate``: the prefill and decode prediction of --config on --chip (any: the slowest device)."""
    if args.calibration and args.config is None and args.target is None:
        if args.json:
            rows = generation_rows(params)
            cal = {"summary": generation_summary(rows), "figures": [row.doc() for row in rows]}
            json.dump(cal, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print_generation_calibration(params)
        return 0
    if args.config is None or args.target is not None:
        raise AnekitError(
            "[cost] --generate needs --config NAME (a preset or a Hugging Face model directory)"
        )
    if args.route != "direct":
        raise AnekitError(
            "[cost] --generate prices the direct route the generation kernels run on, not --route "
            f"{args.route}"
        )
    hf = not is_preset(args.config)
    cfg = model_config(args.config, max(HF_SEQ, (args.prompt or 0) + 1) if hf else None)
    prompt = args.prompt or min(PREFILL_WIDTH, cfg.seq_len // 2)
    no_route: tuple[str, ...] = ()
    if args.chip == ANY:
        cost, no_route = slowest(cfg, params, prompt)
    else:
        cost = predict_generation(cfg, args.chip, params, prompt)
    doc = generation_doc(cost)
    if args.chip == ANY:
        doc["no_generation_route"] = list(no_route)
    if args.calibration:
        rows = generation_rows(params)
        doc["calibration"] = {"summary": generation_summary(rows), "figures": [row.doc() for row in rows]}
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    on = f"{doc['chip_label']} ({cost.chip})"
    if args.chip == ANY:
        on += ", the slowest device" + (f"; no generation route on {', '.join(no_route)}" if no_route else "")
    print(
        f"{cfg.name} text generation on {on}, route {cost.route.id} — predicted (a model, not a measurement)"
    )
    plan = cost.plan
    print(
        f"prefill_ms: {cost.prefill_ms:.2f} for a {prompt}-token prompt ({cost.chunks} chunk"
        f"{'' if cost.chunks == 1 else 's'} of {plan.prefill_width} columns, cache capacity "
        f"{plan.prefill_capacity}, {cost.prefill_chunk.dispatches} dispatches a chunk)"
    )
    d = cost.decode
    print(
        f"decode_tokens_per_s: {cost.decode_tokens_per_s:.1f} ({cost.decode_ms:.3f} ms a token: engine "
        f"{d.engine_ms:.3f} ms over {d.dispatches} dispatches, host {d.host_ms:.3f} ms; width "
        f"{plan.decode_width}, capacity {plan.capacity}, at position {prompt}; {plan.kernel_count} kernels "
        "loaded)"
    )
    width = max(24, *(len(k["name"]) for k in doc["decode"]["kernels"]))
    print(f"{'decode kernel':<{width}} {'runs':>4} {'weight MB':>9} {'io MB':>8} {'ms/call':>8}  bound")
    for k in doc["decode"]["kernels"]:
        print(
            f"{k['name']:<{width}} {k['runs']:>4} {k['weight_mb']:>9.2f} {k['io_mb']:>8.3f} {k['ms']:>8.3f}  "
            f"{k['bound']}"
        )
    for k in doc["decode"]["kernels"]:
        if k["counted_from"] != "program":
            print(f"  {k['name']}: counted from its {k['counted_from']}")
    for h in doc["decode"]["host"]:
        print(f"{'host: ' + h['name']:<{width}} {'':>4} {'':>9} {h['mb']:>8.3f} {h['ms']:>8.3f}  host")
    hs = doc["host_figures"]["stream"]
    print(
        f"model: per kernel {params_line(params)}; host max(bytes / {hs['value']:.0f} GB/s, FLOPs / "
        f"{doc['host_figures']['matmul']['value']} TFLOP/s) ({hs['status']}); Python's per-call overhead not "
        "modelled; `anekit cost --generate --calibration` for its error against published generation figures"
    )
    if args.calibration:
        print_generation_calibration(params)
    return 0


def print_generation_calibration(params: Params) -> None:
    """Every published generation figure, the model's prediction beside it and their ratio."""
    rows = generation_rows(params)
    print(
        f"generation figures (none fitted; the efficiencies are the training fit's; tolerance "
        f"{TOLERANCE:.0%}):"
    )
    print(f"{'figure':<36} {'chip':<8} {'measured':>12} {'predicted':>10} {'ratio':>6}  set")
    for r in rows:
        m = r.measurement
        measured = f"{m.low:g}" if m.low == m.high else f"{m.low:g}-{m.high:g}"
        role = m.role.upper() if m.role == HELD_OUT else m.role
        flag = "" if r.within or m.role != HELD_OUT else "  (disagrees)"
        print(
            f"{m.id:<36} {m.device:<8} {measured + ' ' + m.unit:>12} {r.predicted:>10.3g} {r.ratio:>6.2f}  "
            f"{role}{flag}"
        )
    s = generation_summary(rows)
    print(
        f"held out: {s['within_tolerance']} of {s['held_out']} within {TOLERANCE:.0%}; median predicted / "
        f"measured time {s['median_time_ratio']:.2f} (the model prices decode slower than the pipelines ran: "
        "its DRAM efficiency, fitted on the M1's e5rt convolutions, is below what one-column decode kernels "
        "reach on the direct route; not tuned to these figures)"
    )
    print("sources:")
    for r in rows:
        m = r.measurement
        print(f"  {m.id}: {m.what}; chip {m.chip}; {m.source}: {m.quote}")
        if m.explanation:
            print(f"    {m.explanation}")
    print("not used:")
    for line in GEN_NOT_USED:
        print(f"  {line}")


def params_line(params: Params) -> str:
    return (
        f"dispatch floor + surfaces + max(work / ({params.compute_efficiency:.2f} x fp16 peak), bytes / "
        f"({params.dram_efficiency:.2f} x weight stream))"
    )


def run_distributed(args: argparse.Namespace) -> int:
    """``--distributed``: the speed-up of N Macs training --config on --chip over each link."""
    if args.config is None or args.chip == ANY or args.generate or args.target is not None:
        raise AnekitError("[cost] --distributed needs --config NAME and --chip CHIP (not --generate)")
    cfg = model_config(args.config)
    tied = True if is_preset(args.config) else read_config(args.config).tied
    if args.lora is not None:
        buckets, what = dist.lora_buckets(cfg, args.lora), f"LoRA rank {args.lora} on q, v"
    else:
        buckets, what = dist.full_buckets(cfg, tied), "every weight"
    if args.bucket_mb is not None:
        buckets = dist.rebucket(buckets, max(1, round(args.bucket_mb * 1e6)))
    predicted = args.sequence_ms is None
    seq_s = dist.sequence_s(cfg, args.chip, args.weights) if predicted else args.sequence_ms / 1e3
    memory = dist.memory_rate(args.chip)
    links = [LINKS[args.link]] if args.link else list(LINKS.values())
    rows = dist.plan(
        buckets, seq_s, args.distributed, links, memory=memory, accum=args.accum, overlap=args.overlap
    )
    if args.json:
        json.dump(dist.plan_doc(rows, buckets, seq_s, memory), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    source = "predicted engine time, the CPU's share left out" if predicted else "given"
    print(
        f"{cfg.name} data parallelism on {args.chip}: {what}, {sum(buckets) / 1e6:.1f} MB of fp32 "
        f"gradients in {len(buckets)} buckets; one sequence {seq_s * 1e3:.1f} ms ({source}); adds at "
        f"{memory / 1e9:.0f} GB/s; {'overlapped' if args.overlap else 'blocking'} chain — a model, not a "
        "measurement"
    )
    at = f" {'speed-up at k=' + str(args.accum):>16}" if args.accum else ""
    print(f"{'link':<9} {'Macs':>4} {'exchange ms':>11} {'k to hide':>9} {'speed-up there':>14}{at}")
    for r in rows:
        hide = f"{r.hide:>9}" if r.hide is not None else f"{'never':>9}"
        there = f"{r.at_hide.speedup:>13.2f}x" if r.at_hide else f"{'-':>14}"
        extra = f" {r.at_accum.speedup:>15.2f}x" if r.at_accum else ""
        print(f"{r.link.name:<9} {r.ranks:>4} {r.exchange.total_s * 1e3:>11.1f} {hide} {there}{extra}")
    print(
        "exchange: the chain sum rank 0 -> N-1 per bucket (each rank past 0 adding its k buffers), then the "
        "last rank's broadcast; hidden: at most 10% of a step; speed-up: one Mac running "
        "the same global batch over N Macs"
    )
    for ln in links:
        print(
            f"  {ln.name}: {ln.label}, {ln.rate.value:g} GB/s ({ln.rate.status}: {ln.rate.source}), "
            f"{ln.latency.value:g} us ({ln.latency.status}: {ln.latency.source})"
        )
    return 0


def _print_step(doc: dict, any_chip: bool) -> None:
    """The host's part of the step, by part, and the whole step: engine, host, overlapped, step."""
    st = doc["step"]
    fig = st["host_figures"]
    mm, stream = fig["matmul"], fig["stream"]
    on = f"{st['chip']}, the device whose step is slowest" if any_chip else st["chip"]
    parts = sorted(st["host_parts"].items(), key=lambda kv: -kv[1]["ms"])
    print(
        f"host part ({on}): {st['host_ms']:.2f} ms: {st['host_gflop']:.1f} GFLOP at {mm['value']:g} fp32 "
        f"TFLOP/s ({mm['status']}) + {st['host_mb'] / 1e3:.2f} GB at {stream['value']:.0f} GB/s "
        f"({stream['status']}): " + ", ".join(f"{name} {p['ms']:.2f}" for name, p in parts)
    )
    print(
        f"step: {st['step_ms']:.2f} ms = engine {st['engine_ms']:.2f} + host {st['host_ms']:.2f} - "
        f"overlapped {st['overlapped_ms']:.2f} (the weight gradients, the classifier's too, "
        f"{st['host_beside_engine_ms']:.2f} ms, "
        "queued beside the engine's backward; the head, the norms, the conversions and the optimizer on "
        "the step's path)"
    )
    if any_chip:
        print(f"{'device':<9} {'engine ms':>9} {'host ms':>8} {'overlapped':>10} {'step ms':>8}")
        for name, d in doc["step_by_device"].items():
            print(
                f"{name:<9} {d['engine_ms']:>9.2f} {d['host_ms']:>8.2f} {d['overlapped_ms']:>10.2f} "
                f"{d['step_ms']:>8.2f}"
            )
    if st["weights"] == "baked":
        per = st["compile_ms_per_kernel"]
        print(
            f"compile: {st['compile_ms_per_update'] / 1e3:.2f} s after each optimizer update (every "
            f"weight-bearing kernel, {per['value']:.0f} ms each, {per['status']}), once per accumulation "
            "batch: not in the step; --weights dynamic compiles once"
        )


def run_cost(args: argparse.Namespace) -> int:
    perf = chips(args.chip)[0]
    params = fitted()
    if args.distributed is not None:
        return run_distributed(args)
    extra = (args.link, args.overlap, args.lora, args.accum, args.sequence_ms, args.bucket_mb)
    if any(v not in (None, False) for v in extra):
        raise AnekitError(
            "[cost] --link, --overlap, --lora, --accum, --sequence-ms and --bucket-mb are --distributed flags"
        )
    if args.generate:
        return run_generate(args, params)
    if args.prompt is not None:
        raise AnekitError("[cost] --prompt is a --generate flag")
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
    tied = True
    if cfg is not None:
        kernels, what = step(cfg, args.weights)
        tied = True if is_preset(args.config) else read_config(args.config).tied
    else:
        kernels, what = program_works(args.target), str(args.target)
    weights = args.weights if cfg is not None else None
    doc = report(kernels, what, args.chip, args.route, params, cfg, weights, tied)
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
        _print_step(doc, args.chip == ANY)
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
