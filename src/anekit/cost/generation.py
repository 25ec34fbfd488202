"""Predicted time of text generation on the engine: the prefill of an N-token prompt (ms) and the decode
rate (tokens/s), from the work of the generation kernels and the per-device figures
(``anekit cost --generate``).

What runs is what the driver runs (``anekit.generate``): the chip's generation route
(``anekit.engine.generation_routes``), its plan (``anekit.generate.plan``: widths, cache capacity, layer
groups, vocabulary tiles) and the plan's kernels built from shapes only (``anekit.kernels.generation``;
conv-host-attention: ``anekit.kernels.conv_only``'s qkv_fwd / wo_fwd and the host-norm ffn_fwd at the
generation width, as ``host_attention_kernels`` builds them for every layer: alike, so one is counted and
run once a layer), each counted by
``anekit.cost.work.count``. A kernel a builder refuses (a conv wider than any with a hardware precedent,
which the route would have to split) is counted from its shapes (``anekit.cost.gen_work``) and its row
says so.

A kernel evaluation costs what ``anekit.cost.model`` predicts for any kernel: the dispatch floor, its
surfaces, and the larger of its compute and its DRAM traffic (weights streamed each evaluation, spills of
intermediates past the working set). The cache is an input surface the engine reads whole each call
(capacity columns), so it is priced as surface traffic; dynamic weights travel in the input surface and
are priced the same way. The host's share is the larger of its bytes at the host's stream rate and its
FLOPs at the host's matmul rate (``host_figures``): the embedding row, the chunk's k / v columns it copies
from a kernel's output into the cache surface in place, and per route the norms (dynamic) or the norms,
RoPE and attention over the float32 cache (conv-host-attention). Python's own per-call overhead is not
modelled.

Prefill runs the prompt in chunks of the plan's prefill width through the prefill set, the head only for
the last chunk, then copies the cache once into the decode set's surfaces; decode runs one token (width
32, the token in column 0) through the decode set and the head, priced at the position the prompt leaves.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

from anekit.cost import gen_work as gw
from anekit.cost.gen_work import FP16, FP32
from anekit.cost.model import Params, predict
from anekit.cost.work import Work, count
from anekit.engine.chips import DEVICES
from anekit.engine.generation import DECODE_WIDTH
from anekit.engine.generation_routes import GenerationRoute, NoGenerationRoute, generation_route
from anekit.engine.host import GPT2_PARAMS, HostFigures, host_figures
from anekit.engine.performance import Performance, performance
from anekit.errors import AnekitError
from anekit.generate.plan import GenerationPlan, generation_plan
from anekit.kernels.conv_only import qkv_fwd, wo_fwd
from anekit.kernels.forward import ffn_fwd
from anekit.kernels.generation import attention_kernel, head_kernel, layers_kernel, mlp_kernel
from anekit.kernels.route import KernelRoute
from anekit.mil.ir import Program
from anekit.models.config import ModelConfig

HOST_ATTENTION = "conv-host-attention"


class GenerationCostError(AnekitError, ValueError):
    """A generation cost that cannot be predicted; the message names the field and the limit."""


# -- the host's figures: anekit.engine.host --------------------------------------------------------------


# -- what runs --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dispatch:
    """One engine kernel of a phase: its work, how many times a chunk (or a token) evaluates it, and
    where the work was counted from ("program", or "shapes: " and why the builder refused)."""

    work: Work
    runs: int = 1
    kind: str = "layers"  # layers / attention / mlp / projection / head
    source: str = "program"


def dispatch_of(
    kernel: Program | Work, runs: int = 1, kind: str = "layers", weight_bytes: float | None = None
) -> Dispatch:
    """A Dispatch of a generation kernel's program (counted, ``anekit.cost.work.count``) or of its Work;
    ``weight_bytes``: the weights it streams where the program does not hold them as BLOBFILE constants,
    replacing the counted figure."""
    work = count(kernel) if isinstance(kernel, Program) else kernel
    if weight_bytes is not None:
        work = dataclasses.replace(work, weight_bytes=float(weight_bytes))
    return Dispatch(work, runs, kind)


@dataclass(frozen=True)
class HostStep:
    """Work the host does once per chunk (or token): FLOPs and bytes of memory it reads or writes."""

    name: str
    flops: float
    bytes: float


def counted(
    name: str, build: Callable[[], Program], shapes: Callable[[], Work], runs: int, kind: str
) -> Dispatch:
    """The Dispatch of the program ``build`` makes, or of its ``shapes`` where the builder refuses."""
    try:
        return Dispatch(count(build(), name), runs, kind)
    except AnekitError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return Dispatch(dataclasses.replace(shapes(), name=name), runs, kind, f"shapes: {first}")


def _program(kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> Program:
    """The program of ``kernel(*args, **kwargs)`` (a GenKernel or a KernelSpec)."""
    program: Program = kernel(*args, **kwargs).program
    return program


def _same(work: Work) -> Work:
    return work


@cache
def kernel_set(
    cfg: ModelConfig, route: GenerationRoute, plan: GenerationPlan, width: int
) -> tuple[Dispatch, ...]:
    """The kernels one chunk of ``width`` columns runs on ``route`` with ``plan``: the layers, then the
    head tiles."""
    kr = KernelRoute(*route.kernel_route)
    cap = plan.capacity_for(width)
    out: list[Dispatch] = []
    if route.fused:
        for f, e in plan.groups:
            build = partial(_program, layers_kernel, cfg, f, e, width=width, capacity=cap, route=kr)
            shapes = partial(gw.fused_layers_work, cfg, f, e, width, cap)
            out.append(counted(f"gen_layers_{f}_{e}_w{width}", build, shapes, 1, "layers"))
    elif route.id == HOST_ATTENTION:
        cw = cfg.with_(seq_len=width)
        works = gw.conv_route_works(cfg, width)
        builds = (
            partial(_program, qkv_fwd, cw),
            partial(_program, wo_fwd, cw),
            partial(_program, ffn_fwd, cw, None, norm="host"),
        )
        for part, build, shaped in zip(("qkv", "wo", "ffn"), builds, works):  # one program per layer, alike
            name = f"gen_{part}_w{width}"
            out.append(counted(name, build, partial(_same, shaped), cfg.n_layers, "projection"))
    else:
        for i in range(cfg.n_layers):
            build = partial(_program, attention_kernel, cfg, i, width=width, capacity=cap, route=kr)
            shapes = partial(gw.attention_block_work, cfg, i, width, cap)
            out.append(counted(f"gen_attn_{i}_w{width}", build, shapes, 1, "attention"))
            build = partial(_program, mlp_kernel, cfg, i, width=width, route=kr)
            out.append(
                counted(f"gen_mlp_{i}_w{width}", build, partial(gw.mlp_block_work, cfg, i, width), 1, "mlp")
            )
    norm = route.norm == "engine"
    for s, e in plan.tiles:
        build = partial(_program, head_kernel, cfg, s, e, width=width, route=kr)
        shapes = partial(gw.head_tile_work, cfg, s, e, width, norm)
        out.append(counted(f"gen_head_{s}_{e}_w{width}", build, shapes, 1, "head"))
    return tuple(out)


def host_steps(cfg: ModelConfig, route: GenerationRoute, width: int, n: int, pos: int) -> list[HostStep]:
    """What the host does for one chunk of ``n`` real tokens at position ``pos``."""
    d, kv, q, layers = cfg.dim, cfg.kv_dim, cfg.q_dim, cfg.n_layers
    steps = [HostStep("embedding", 0.0, n * d * FP32)]
    if route.id == HOST_ATTENTION:
        keys = pos + n
        attn_flops = layers * (4.0 * q * keys * n + 5.0 * cfg.n_heads * keys * n)
        steps.append(HostStep("attention", attn_flops, layers * 2 * kv * keys * FP32))  # the float32 cache
        steps.append(
            HostStep("norms, RoPE", layers * (10.0 * d + 3.0 * (q + kv)) * n, layers * 4 * d * width * FP16)
        )
        return steps
    # k / v columns: read from each kernel's output, written in place into its cache surface
    steps.append(HostStep("cache writes", 0.0, 2 * layers * kv * n * FP16 * 2))
    if route.norm == "host":
        steps.append(HostStep("norms", 2 * layers * 5.0 * d * n, 2 * layers * d * width * FP16 * 2))
    return steps


def host_ms(step: HostStep, figures: HostFigures) -> float:
    """max(bytes / stream, FLOPs / matmul rate): the host's time for ``step``."""
    return max(step.bytes / (figures.stream.value * 1e9), step.flops / (figures.gemm.value * 1e12)) * 1e3


# -- the prediction ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseTime:
    """The time of one prefill chunk or one decode token: engine rows, host rows, and their sum (ms)."""

    rows: tuple[tuple[Dispatch, float, str], ...]  # (dispatch, ms per evaluation, bound)
    host: tuple[tuple[HostStep, float], ...]

    @property
    def engine_ms(self) -> float:
        return sum(d.runs * ms for d, ms, _ in self.rows)

    @property
    def host_ms(self) -> float:
        return sum(ms for _, ms in self.host)

    @property
    def ms(self) -> float:
        return self.engine_ms + self.host_ms

    @property
    def dispatches(self) -> int:
        return sum(d.runs for d, _, _ in self.rows)


def predict_phase(
    dispatches: Sequence[Dispatch], steps: Sequence[HostStep], perf: Performance, params: Params
) -> PhaseTime:
    """The time of running ``dispatches`` (each ``runs`` times) and the host's ``steps`` on ``perf``."""
    figures = host_figures(perf)
    rows = []
    for d in dispatches:
        t = predict(d.work, perf, params)
        rows.append((d, t.ms, t.bound))
    return PhaseTime(tuple(rows), tuple((s, host_ms(s, figures)) for s in steps))


@dataclass(frozen=True)
class GenerationCost:
    """The predicted prefill of a ``prompt``-token prompt and the decode rate after it, on one device."""

    model: str
    chip: str
    route: GenerationRoute
    plan: GenerationPlan
    prompt: int
    chunks: int
    prefill_chunk: PhaseTime  # the first chunk (every chunk's engine time; its host part at position 0)
    prefill_ms: float
    decode: PhaseTime

    @property
    def decode_ms(self) -> float:
        return self.decode.ms

    @property
    def decode_tokens_per_s(self) -> float:
        return 1e3 / self.decode.ms


def predict_generation(
    cfg: ModelConfig,
    chip: str,
    params: Params,
    prompt: int,
    *,
    macos: str = "",
    prefill_width: int | None = None,
) -> GenerationCost:
    """The prefill time of a ``prompt``-token prompt and the decode rate after it for ``cfg`` on device
    ``chip`` under ``macos`` ("": every major), on the chip's generation route and plan; one line naming
    the limit when the prompt does not fit the context, the chip has no route or the plan is refused."""
    if not (isinstance(prompt, int) and 0 < prompt < cfg.seq_len):
        raise GenerationCostError(
            f"[cost] --prompt {prompt}: must be between 1 and {cfg.seq_len - 1} (the context of {cfg.name} "
            f"is {cfg.seq_len} tokens and decode needs a slot after the prompt)"
        )
    perf = performance(chip)
    route = generation_route(perf.name, macos)
    plan = generation_plan(cfg, route, prefill_width=prefill_width)
    pw = plan.prefill_width
    chunks = math.ceil(prompt / pw)
    layers_p = [d for d in kernel_set(cfg, route, plan, pw) if d.kind != "head"]
    head_p = [d for d in kernel_set(cfg, route, plan, pw) if d.kind == "head"]
    chunk = predict_phase(layers_p, host_steps(cfg, route, pw, pw, 0), perf, params)
    total = predict_phase(head_p, [], perf, params).ms
    for c in range(chunks):
        n = min(pw, prompt - c * pw)
        total += predict_phase(layers_p, host_steps(cfg, route, pw, n, c * pw), perf, params).ms
    if plan.decode_width != pw:  # the cache, once, into the decode kernels' own surfaces
        copy = 2 * cfg.n_layers * cfg.kv_dim * prompt * FP16 * 2
        total += copy / (host_figures(perf).stream.value * 1e9) * 1e3
    w = plan.decode_width
    decode = predict_phase(
        kernel_set(cfg, route, plan, w), host_steps(cfg, route, w, 1, prompt), perf, params
    )
    return GenerationCost(cfg.name, perf.name, route, plan, prompt, chunks, chunk, total, decode)


def slowest(cfg: ModelConfig, params: Params, prompt: int) -> tuple[GenerationCost, tuple[str, ...]]:
    """``--chip any``: over every device with a generation route (its own), the one predicted to decode
    slowest, and the devices with no route."""
    costs, none = [], []
    for name in DEVICES:
        try:
            costs.append(predict_generation(cfg, name, params, prompt))
        except NoGenerationRoute:
            none.append(name)
    if not costs:
        raise GenerationCostError("[cost] no device has a generation route")
    return min(costs, key=lambda c: c.decode_tokens_per_s), tuple(none)


def _phase_doc(phase: PhaseTime) -> dict[str, Any]:
    return {
        "ms": phase.ms,
        "engine_ms": phase.engine_ms,
        "host_ms": phase.host_ms,
        "dispatches": phase.dispatches,
        "kernels": [
            {
                "name": d.work.name,
                "kind": d.kind,
                "runs": d.runs,
                "ms": ms,
                "total_ms": ms * d.runs,
                "bound": bound,
                "gflop": (d.work.flops + d.work.element_ops) / 1e9,
                "weight_mb": d.work.weight_bytes / 1e6,
                "io_mb": d.work.io_bytes / 1e6,
                "counted_from": d.source,
            }
            for d, ms, bound in phase.rows
        ],
        "host": [
            {"name": s.name, "ms": ms, "gflop": s.flops / 1e9, "mb": s.bytes / 1e6} for s, ms in phase.host
        ],
    }


def generation_doc(cost: GenerationCost) -> dict[str, Any]:
    """``cost`` as a JSON-ready dict: the two figures first, then the plan and every kernel's row."""
    perf = performance(cost.chip)
    host = host_figures(perf)
    return {
        "prefill_ms": cost.prefill_ms,
        "decode_tokens_per_s": cost.decode_tokens_per_s,
        "decode_ms_per_token": cost.decode_ms,
        "model": cost.model,
        "chip": cost.chip,
        "chip_label": perf.label,
        "route": cost.route.id,
        "route_why": cost.route.why,
        "prompt": cost.prompt,
        "prefill_width": cost.plan.prefill_width,
        "prefill_chunks": cost.chunks,
        "prefill_capacity": cost.plan.prefill_capacity,
        "decode_width": cost.plan.decode_width,
        "decode_capacity": cost.plan.capacity,
        "layer_groups": [list(g) for g in cost.plan.groups],
        "vocab_tiles": [list(t) for t in cost.plan.tiles],
        "kernels_loaded": cost.plan.kernel_count,
        "dispatches_per_token": cost.decode.dispatches,
        "dispatches_per_prefill_chunk": cost.prefill_chunk.dispatches,
        "prefill_chunk": _phase_doc(cost.prefill_chunk),
        "decode": _phase_doc(cost.decode),
        "host_figures": {
            name: {"value": f.value, "unit": f.unit, "status": f.status, "source": f.source}
            for name, f in (("stream", host.stream), ("matmul", host.gemm))
        },
    }


__all__ = [
    "DECODE_WIDTH",
    "GPT2_PARAMS",
    "Dispatch",
    "GenerationCost",
    "GenerationCostError",
    "HostFigures",
    "HostStep",
    "PhaseTime",
    "counted",
    "dispatch_of",
    "generation_doc",
    "host_figures",
    "host_steps",
    "kernel_set",
    "predict_generation",
    "predict_phase",
    "slowest",
]
