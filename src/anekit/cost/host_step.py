"""The whole training step on one device: the engine's kernels, the host's work between and beside them,
and the step time their schedule gives (``anekit cost --config M --chip C``).

What the host does per sequence of T tokens follows ``anekit.llama.step.train_step`` (read it for the
data flow), each part priced from the host's figures (``anekit.engine.host``) as

    time = matrix FLOPs / the fp32 sgemm rate + bytes / the host's stream rate

with its FLOPs counted as 2 M N K per product and its bytes as the passes the code makes over float32
arrays (an sgemm's own operand traffic is inside its measured rate, so a product counts no bytes):

* the head: the final RMSNorm, the classifier's logits (vocab x dim x T), the cross-entropy and the loss
  scale over the (vocab, T) logits (``cpu_ops.cross_entropy``: 6 reads and 4 writes of it), the
  classifier's input gradient and its weight gradient;
* per layer: the two residual adds of the forward, every weight gradient dW = dY X^T (Wq, Wk, Wv, Wo,
  W1, W2, W3), the two RMSNorm backwards and the residual adds of the backward; Qwen 3's per-head q / k
  norm backward, the q / k / v bias gradients and Gemma 3's post-norm backwards where the model has them;
* at every kernel evaluation the fp16 conversions of what crosses its surfaces: each activation element
  read as float32 and written as fp16 going in (6 bytes), read as fp16 and written as float32 coming out
  (6 bytes), from the kernel's own layouts;
* once a step: the optimizer, ``ADAMW_BYTES`` per parameter (``cpu_ops.grad_norm`` reads every gradient
  once; the compiled ``cpu_ops.adamw_update`` pass reads w, g, m, v and writes w, m, v: 4 + 16 + 12);
  with dynamic weights the weight writes, each trained weight written in fp16 into every kernel input
  that reads it (the weight segments of the kernels' layouts: a weight read by two kernels is written
  twice; an RMSNorm scale fills its segment's S columns), 2 bytes an element, the float32 weight already
  read by the optimizer's pass.

The schedule (``schedule``): the step's thread runs each kernel and waits for it, and does the host work
the next kernel depends on; the weight gradients (and the classifier's weight gradient) depend on nothing
later in the step but the optimizer, so they queue beside the engine on one serial queue, as maderix/ANE
training/training_dynamic/train.m queues its dW sgemms on a serial dispatch queue while the engine runs
the next layer's backward. The optimizer waits for the queue. The classifier's logits, the cross-entropy
and the classifier's input gradient cannot overlap anything: every backward kernel depends on them. The
queue's sgemms and the thread's conversions are assumed not to slow each other (the matrix unit and the
cores' vector units; both share the memory system, which the model does not divide).

Baked weights: after each optimizer update every weight-bearing kernel (``anekit.llama.step``'s
``KERNELS_PER_LAYER``, per layer) is compiled again (``compile_ms``, at ``anekit.engine.host``'s compile
figure): once per accumulation batch, so it is reported beside the step, not in it.

Left out: Python's per-call overhead and the embedding lookup and its gradient's scatter (T rows).
The kernels are ``anekit.cost.step``'s (the norm on the engine), not a chip's training route.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from anekit.cost.model import Params, predict
from anekit.cost.step import step_programs
from anekit.engine.host import compile_figure, host_figures
from anekit.engine.performance import Performance
from anekit.errors import AnekitError
from anekit.kernels.composable import DynamicKernelSpec
from anekit.kernels.config import ModelConfig
from anekit.kernels.spec import KernelSpec
from anekit.llama.params import layer_shapes
from anekit.llama.step import KERNELS_PER_LAYER

FP16, FP32 = 2, 4
CONVERT = FP32 + FP16  # bytes an element converted between a float32 array and an fp16 surface
CE_PASSES = 10  # cross-entropy and the loss scale: 6 reads and 4 writes of the (vocab, T) float32 array
NORM_BWD_PASSES = 3  # an RMSNorm backward reads dy and x and writes dx (its dw rides the same pass)
NORM_FWD_PASSES = 2  # the final RMSNorm reads x and writes xf
ADD_PASSES = 3  # a residual add reads two arrays and writes one
ADAMW_BYTES = 32  # per parameter: the norm's read of g (4); AdamW's reads of w, g, m, v (16), writes (12)

# Sequences an update of maderix/ANE's pipelines accumulates (training/stories_config.h ACCUM_STEPS,
# training/training_dynamic/train.m accum_steps): the published ms/step figures are steps of such runs.
MADERIX_ACCUM = 10

ENGINE, HOST, BESIDE, WAIT = "engine", "host", "beside", "wait"
_T = TypeVar("_T")


@dataclass(frozen=True)
class Task:
    """One piece of the step: a kernel evaluation (``engine``), host work the step's thread does before
    the next kernel (``host``), host work queued beside the engine (``beside``) or the thread waiting for
    that queue (``wait``); ``group`` names the part of the step it belongs to."""

    name: str
    where: str
    group: str
    flops: float = 0.0  # matrix FLOPs (host)
    bytes: float = 0.0  # memory traffic (host)
    ms: float = 0.0


@dataclass(frozen=True)
class StepTime:
    """The step's tasks, in order, and what their schedule gives (ms)."""

    tasks: tuple[Task, ...]
    engine_ms: float
    host_ms: float
    step_ms: float
    beside_ms: float  # the host work queued beside the engine

    @property
    def overlapped_ms(self) -> float:
        """Host time hidden under the engine's: engine + host - step."""
        return self.engine_ms + self.host_ms - self.step_ms

    def host_by_group(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for t in self.tasks:
            if t.where in (HOST, BESIDE):
                g = out.setdefault(t.group, {"ms": 0.0, "gflop": 0.0, "mb": 0.0})
                g["ms"] += t.ms
                g["gflop"] += t.flops / 1e9
                g["mb"] += t.bytes / 1e6
        return out


def schedule(tasks: Iterable[Task]) -> tuple[float, float]:
    """(the step's time, when the queue beside the engine finished): the thread runs ``engine`` and
    ``host`` tasks one after the other, a ``beside`` task starts when both the thread has reached it and
    the queue is free, a ``wait`` holds the thread until the queue is empty."""
    thread = queue = 0.0
    for t in tasks:
        if t.where in (ENGINE, HOST):
            thread += t.ms
        elif t.where == BESIDE:
            queue = max(thread, queue) + t.ms
        elif t.where == WAIT:
            thread = max(thread, queue)
        else:
            raise ValueError(f"[cost] task '{t.name}': where must be engine, host, beside or wait")
    return max(thread, queue), queue


def _elements(layout: Any) -> int:
    return sum(c for _, c in layout.parts) * layout.spatial


def conversion_bytes(spec: KernelSpec) -> float:
    """The bytes of converting one evaluation's activations into its input surface and its outputs out of
    its output surface (weights excluded)."""
    acts = spec.activations if isinstance(spec, DynamicKernelSpec) else spec.inputs
    return float(CONVERT * (_elements(acts) + _elements(spec.outputs)))


def weight_elements(spec: KernelSpec) -> int:
    """The elements of a dynamic kernel's weight segments (0 for a baked kernel)."""
    if not isinstance(spec, DynamicKernelSpec) or spec.columns is None:
        return 0
    return sum(s.rows * s.columns for s in spec.columns.segments if s.is_weight)


def _gemm(name: str, where: str, group: str, m: int, n: int, k: int) -> Task:
    return Task(name, where, group, flops=2.0 * m * n * k)


def _stream(name: str, group: str, passes: float, elements: int) -> Task:
    return Task(name, HOST, group, bytes=float(passes * elements * FP32))


def _after(step_name: str, cfg: ModelConfig, i: int) -> list[Task]:
    """The host work that follows kernel ``step_name`` of layer ``i`` (``anekit.llama.step``'s order)."""
    d, q, kv, h, t = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim, cfg.seq_len
    dt = d * t
    if step_name.startswith("sdpa_fwd") or step_name.startswith("ffn_fwd"):
        return [_stream(f"residual {i}", "residual adds", ADD_PASSES, dt)]
    if step_name in ("ffn_bwd", "ffn_bwd_w13t_dynamic"):
        out = [
            _gemm(f"dW2 {i}", BESIDE, "weight gradients", d, h, t),
            _gemm(f"dW1 {i}", BESIDE, "weight gradients", h, d, t),
            _gemm(f"dW3 {i}", BESIDE, "weight gradients", h, d, t),
        ]
        if cfg.post_norms:
            out.append(_stream(f"post-FFN norm backward {i}", "RMSNorm backward", NORM_BWD_PASSES, dt))
        out += [
            _stream(f"FFN norm backward {i}", "RMSNorm backward", NORM_BWD_PASSES, dt),
            _stream(f"residual {i}", "residual adds", ADD_PASSES, dt),
        ]
        if cfg.post_norms:
            out.append(_stream(f"post-attention norm backward {i}", "RMSNorm backward", NORM_BWD_PASSES, dt))
        out.append(_gemm(f"dWo {i}", BESIDE, "weight gradients", d, q, t))
        return out
    if step_name == "sdpa_bwd2":
        out = []
        if cfg.qk_norm:
            out.append(_stream(f"q / k norm backward {i}", "RMSNorm backward", NORM_BWD_PASSES, (q + kv) * t))
        if cfg.qkv_bias:
            out.append(_stream(f"bias gradients {i}", "bias gradients", 1, (q + 2 * kv) * t))
        return out
    if step_name in ("qkv_bwd", "qkv_bwd_dynamic"):
        return [
            _gemm(f"dWq {i}", BESIDE, "weight gradients", q, d, t),
            _gemm(f"dWk {i}", BESIDE, "weight gradients", kv, d, t),
            _gemm(f"dWv {i}", BESIDE, "weight gradients", kv, d, t),
            _stream(f"attention norm backward {i}", "RMSNorm backward", NORM_BWD_PASSES, dt),
            _stream(f"residual {i}", "residual adds", ADD_PASSES, dt),
        ]
    return []


def _head(cfg: ModelConfig) -> list[Task]:
    v, d, t = cfg.vocab_size, cfg.dim, cfg.seq_len
    return [
        _stream("final RMSNorm", "classifier", NORM_FWD_PASSES, d * t),
        _gemm("logits", HOST, "classifier", v, t, d),
        _stream("cross-entropy", "classifier", CE_PASSES, v * t),
        _gemm("dW classifier", BESIDE, "classifier", v, d, t),
        _gemm("dx classifier", HOST, "classifier", d, t, v),
        _stream("final RMSNorm backward", "RMSNorm backward", NORM_BWD_PASSES, d * t),
    ]


def _of_kind(table: dict[tuple[str, str], _T], name: str, kind: str) -> _T:
    """``table``'s entry of kernel ``name`` for layer kind ``kind``: its own, or the one every layer
    shares ("full")."""
    return table[(name, kind)] if (name, kind) in table else table[(name, "full")]


def step_tasks(cfg: ModelConfig, weights: str, n_params: int, accum: int = 1) -> list[Task]:
    """Every task of one training step of ``cfg`` (``n_params``: the trained parameters), in order,
    without times. Engine tasks carry their kernel's name in the step ("sdpa_fwd", "wo_t" ...).

    ``accum`` > 1: one sequence of an update that accumulates ``accum`` sequences, in the steady state:
    the optimizer and the weight writes are shared by the ``accum`` sequences (a 1 / accum share each),
    and the weight gradients' queue is waited for only before the update, so it runs on under the next
    sequence's forward (maderix/ANE training_dynamic/train.m waits for its dW group only before Adam,
    every accum_steps)."""
    if not (isinstance(accum, int) and accum >= 1):
        raise AnekitError(f"[cost] accum must be an integer >= 1, not {accum!r}")
    programs = step_programs(cfg, weights)
    by_name = {(name, kind): spec for name, kind, _, spec in programs}
    order = list(dict.fromkeys(name for name, _, _, _ in programs))
    direction = {name: k.direction for name, _, k, _ in programs}
    tasks: list[Task] = []

    def kernel(name: str, i: int) -> None:
        kind = cfg.layer_type(i)
        spec = _of_kind(by_name, name, kind)
        conv = conversion_bytes(spec)
        tasks.append(Task(f"{name} {i}", ENGINE, name))
        tasks.append(Task(f"{name} {i} conversions", HOST, "fp16 conversions", bytes=conv))
        tasks.extend(_after(name, cfg, i))

    for i in range(cfg.n_layers):
        for name in order:
            if direction[name] == "forward":
                kernel(name, i)
    tasks.extend(_head(cfg))
    for i in reversed(range(cfg.n_layers)):
        for name in order:
            if direction[name] == "backward":
                kernel(name, i)
    if accum == 1:
        tasks.append(Task("the weight gradients' queue", WAIT, "wait"))
    tasks.append(Task("AdamW", HOST, "optimizer", bytes=ADAMW_BYTES * n_params / accum))
    if weights == "dynamic":
        written = 0
        for i in range(cfg.n_layers):
            kind = cfg.layer_type(i)
            for name in order:
                written += weight_elements(_of_kind(by_name, name, kind))
        tasks.append(Task("weight writes", HOST, "weight writes", bytes=FP16 * written / accum))
    return tasks


def price(
    tasks: Sequence[Task],
    cfg: ModelConfig,
    weights: str,
    perf: Performance,
    params: Params,
    route: str = "direct",
) -> StepTime:
    """The tasks with their times on ``perf``'s device (the kernels on ``route``), and their schedule."""
    figures = host_figures(perf)
    programs = step_programs(cfg, weights)
    engine = {(name, kind): predict(k.work, perf, params, route).ms for name, kind, k, _ in programs}
    timed = []
    for t in tasks:
        if t.where == ENGINE:
            i = int(t.name.rsplit(" ", 1)[1])
            ms = _of_kind(engine, t.group, cfg.layer_type(i))
        elif t.where in (HOST, BESIDE):
            ms = figures.ms(t.flops, t.bytes)
        else:
            ms = 0.0
        timed.append(Task(t.name, t.where, t.group, t.flops, t.bytes, ms))
    step, _ = schedule(timed)
    return StepTime(
        tasks=tuple(timed),
        engine_ms=sum(t.ms for t in timed if t.where == ENGINE),
        host_ms=sum(t.ms for t in timed if t.where in (HOST, BESIDE)),
        step_ms=step,
        beside_ms=sum(t.ms for t in timed if t.where == BESIDE),
    )


def predict_step(
    cfg: ModelConfig, weights: str, perf: Performance, params: Params, n_params: int
) -> StepTime:
    """The whole training step of ``cfg`` on ``perf``'s device."""
    return price(step_tasks(cfg, weights, n_params), cfg, weights, perf, params)


def compile_ms(cfg: ModelConfig, weights: str, perf: Performance) -> float:
    """The compile time an optimizer update costs with ``weights`` (0 for dynamic weights: their kernels
    are compiled once) on ``perf``'s device (ms)."""
    if weights != "baked":
        return 0.0
    return len(KERNELS_PER_LAYER) * cfg.n_layers * compile_figure(perf).value


def trained_parameters(cfg: ModelConfig, tied: bool = True) -> int:
    """The parameters full training updates: the embedding, every layer's tensors, the final norm and,
    untied, the classifier (``anekit.llama.params``' shapes)."""
    per_layer = sum(math.prod(shape) for shape in layer_shapes(cfg).values())
    return cfg.vocab_size * cfg.dim * (1 if tied else 2) + cfg.n_layers * per_layer + cfg.dim


def steps(
    cfg: ModelConfig,
    weights: str,
    perfs: Sequence[Performance],
    params: Params,
    tied: bool = True,
    accum: int = 1,
    route: str = "direct",
) -> list[tuple[Performance, StepTime]]:
    """The step on each of ``perfs``' devices (the kernels on ``route``); ``accum``: as ``step_tasks``."""
    tasks = step_tasks(cfg, weights, trained_parameters(cfg, tied), accum)
    return [(p, price(tasks, cfg, weights, p, params, route)) for p in perfs]


def whole_step(
    cfg: ModelConfig,
    weights: str,
    perfs: Sequence[Performance],
    params: Params,
    tied: bool = True,
    accum: int = 1,
    route: str = "direct",
) -> tuple[Performance, StepTime]:
    """Of ``steps``, the device whose step is slowest, and its step (one device: its)."""
    return max(steps(cfg, weights, perfs, params, tied, accum, route), key=lambda ps: ps[1].step_ms)


def step_doc(st: StepTime, perf: Performance, cfg: ModelConfig, weights: str) -> dict[str, Any]:
    """The step's figures on ``perf``'s device as a JSON-ready dict (ms)."""
    figures = host_figures(perf)
    compiled = compile_figure(perf)
    return {
        "chip": perf.name,
        "weights": weights,
        "engine_ms": st.engine_ms,
        "host_ms": st.host_ms,
        "overlapped_ms": st.overlapped_ms,
        "step_ms": st.step_ms,
        "host_beside_engine_ms": st.beside_ms,
        "host_gflop": sum(t.flops for t in st.tasks) / 1e9,
        "host_mb": sum(t.bytes for t in st.tasks) / 1e6,
        "host_parts": st.host_by_group(),
        "host_figures": {
            name: {"value": f.value, "unit": f.unit, "status": f.status, "source": f.source}
            for name, f in (("stream", figures.stream), ("matmul", figures.gemm))
        },
        "compile_ms_per_update": compile_ms(cfg, weights, perf),
        "compile_ms_per_kernel": {
            "value": compiled.value,
            "status": compiled.status,
            "source": compiled.source,
        },
    }


__all__ = [
    "ADAMW_BYTES",
    "MADERIX_ACCUM",
    "compile_ms",
    "StepTime",
    "Task",
    "conversion_bytes",
    "predict_step",
    "price",
    "schedule",
    "step_doc",
    "step_tasks",
    "steps",
    "trained_parameters",
    "weight_elements",
    "whole_step",
]
