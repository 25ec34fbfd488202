"""Predicted time of text generation on the engine: the prefill of an N-token prompt (ms) and the decode
rate (tokens/s), from the work of the generation kernels and the per-device figures
(``anekit cost --generate``).

What runs, per route (the design of the generation kernels, ``anekit.kernels.generation``):

* fused routes (``legacy``, ``baked-fused``, ``baked-fused-rope-matmul``): one "layers kernel" per group
  of layers (as many layers per kernel as the weight ceiling allows), the cache read in-kernel, then one
  head kernel per vocabulary tile (at most 65536 channels, engine.extents CHANNELS);
* ``dynamic-engine-attention``: one attention and one MLP kernel per layer, weights in the input surface
  (written once, streamed by the engine each evaluation), the RMSNorms on the host;
* ``conv-host-attention`` (M1 / M2): the conv route's ``qkv_fwd`` / ``wo_fwd`` / ``ffn_fwd`` at the
  generation width (``anekit.kernels.conv_only``'s shapes: its FFN's output holds the taps h1, h3 and the
  gate's output) and the head tiles; RoPE, the norms and the attention core on the host over a float32
  cache.

A kernel evaluation costs what ``anekit.cost.model`` predicts for any kernel: the dispatch floor, its
surfaces, and the larger of its compute and its DRAM traffic (weights streamed each evaluation, spills of
intermediates past the working set). The cache is an input surface the engine reads whole each call
(capacity columns), so it is priced as surface traffic. The host's share is the larger of its bytes at the
host's stream rate and its FLOPs at the host's matmul rate (``host_figures``): the cache columns it writes
into each kernel's surface, the chunk it writes and the output it reads, and per route the norms and the
attention. Python's own per-call overhead is not modelled.

Prefill runs the prompt in chunks of the prefill width (the head only for the last chunk) and copies the
cache once into the decode kernels' surfaces; decode runs one token (width 32, the token in column 0) and
is priced at the position the prompt leaves (the cache holds the prompt).

Until the generation kernels and the plan exist as programs, the fused kernels' work is counted here from
the shapes, op by op as ``anekit.cost.work.count`` counts a program (``fused_layers_work``,
``attention_block_work``, ``mlp_block_work``, ``head_work``); ``predict_phase`` takes any list of
``Dispatch`` (a Work or a counted program, with its runs), so real programs replace them one for one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from anekit.cost.model import Params, predict
from anekit.cost.work import Layer, Work, count
from anekit.engine.chips import ANY, DEVICES, device
from anekit.engine.constructs import precedent
from anekit.engine.evidence import Evidence
from anekit.engine.performance import Figure, Performance, performance
from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig
from anekit.mil.ir import Program

DECODE_WIDTH = 32  # the smallest fp16 width the engine runs: 64-byte rows (rule surface.min-row-bytes)
PREFILL_WIDTH = 128  # the default prefill chunk (at most the capacity)
VOCAB_TILE = 65536  # channels of one head kernel (engine.extents CHANNELS)
WEIGHT_CEILING = 2 * 10**9  # bytes of weights one program holds (the "near 2 GB")
FP16, FP32 = 2, 4

# The generation routes, in the design's order of preference, with the constructs each needs
# (anekit.engine.constructs); "legacy" is the simulator with no chip.
ROUTES = {
    "baked-fused": (
        "conv.baked", "rmsnorm.plain", "matmul.activations", "softmax.scores", "rope.slice-concat",
        "gate.silu",
    ),
    "baked-fused-rope-matmul": (
        "conv.baked", "rmsnorm.plain", "matmul.activations", "softmax.scores", "rope.permutation-matmul",
        "gate.silu",
    ),
    "dynamic-engine-attention": (
        "matmul.dynamic-weights", "matmul.activations", "softmax.scores", "rope.slice-concat", "gate.silu",
    ),
    "dynamic-engine-attention-rope-matmul": (
        "matmul.dynamic-weights", "matmul.activations", "softmax.scores", "rope.permutation-matmul",
        "gate.silu",
    ),
    "conv-host-attention": ("conv.baked", "gate.silu"),
}  # fmt: skip
DYNAMIC = ("dynamic-engine-attention", "dynamic-engine-attention-rope-matmul")
LEGACY = "legacy"
ROUTE_IDS = (*ROUTES, LEGACY)
FUSED = ("baked-fused", "baked-fused-rope-matmul", LEGACY)


class GenerationCostError(AnekitError, ValueError):
    """A generation cost that cannot be predicted; the message names the field and the limit."""


# -- the host's figures -------------------------------------------------------------------------------------

ORION_CPU = "mechramc/Orion RESULTS.md, 'Inference (GPT-2 124M, M4 Max)'"
GUIDE_CPU = "sbryngelson/ane-guide part-3-performance/11-ane-vs-gpu-vs-cpu.md, 'Where the CPU leads'"
GPT2_PARAMS = 124_439_808  # GPT-2 124M's parameters (wte 50257 x 768 tied, wpe 1024 x 768, 12 layers)
ORION_CPU_MS = 3.5  # its CPU decode, ms per token (p50)
HOST_STREAM_M4_MAX = GPT2_PARAMS * FP32 / (ORION_CPU_MS * 1e-3) / 1e9  # GB/s: every fp32 weight once a token


@dataclass(frozen=True)
class HostFigures:
    """The host CPU's rates: fp32 operands streamed from memory, and a saturated fp32 matmul."""

    stream: Figure  # GB/s
    gemm: Figure  # TFLOP/s


def host_figures(perf: Performance) -> HostFigures:
    """The host's figures on ``perf``'s device. Measured: the M4 Max's stream (Orion's CPU decode of GPT-2
    124M reads its fp32 weights once per token in 3.5 ms) and the M1's matmul (1.9 fp32 TFLOP/s); every
    other device takes these as stand-ins, the stream capped at the device's DRAM bandwidth."""
    gen = perf.device.generation
    stream_ev = Evidence(
        ORION_CPU,
        "derived" if perf.name == "m4-max" else "assumed",
        f"'CPU decode latency (p50) | 3.5 ms/token' for GPT-2 124M: {GPT2_PARAMS} fp32 weights read once a "
        f"token, {HOST_STREAM_M4_MAX:.0f} GB/s"
        + ("" if perf.name == "m4-max" else f" (M4 Max), standing in for the {perf.label}, at most its DRAM"),
        chips=(gen,),
    )
    gemm_ev = Evidence(
        GUIDE_CPU,
        "measured" if gen == "m1" else "assumed",
        "'reaching about 1.9 fp32 TFLOP/s on a saturated matrix multiply' (M1)"
        + ("" if gen == "m1" else f", standing in for the {perf.label}"),
        chips=(gen,),
    )
    stream = min(HOST_STREAM_M4_MAX, perf.dram.value)
    return HostFigures(Figure(stream, "GB/s", stream_ev), Figure(1.9, "TFLOP/s", gemm_ev))


# -- what runs --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dispatch:
    """One engine kernel of a phase: its work and how many times a chunk (or a token) evaluates it."""

    work: Work
    runs: int = 1
    kind: str = "layers"  # layers / attention / mlp / head / projection


def dispatch_of(
    kernel: Program | Work, runs: int = 1, kind: str = "layers", weight_bytes: float | None = None
) -> Dispatch:
    """A Dispatch of a generation kernel's program (counted, ``anekit.cost.work.count``) or of its Work;
    ``weight_bytes``: the weights it streams where the program does not hold them as BLOBFILE constants
    (a kernel built from shapes only, or dynamic weights), replacing the counted figure."""
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


def _conv(out: int, inp: int, width: int, baked: bool = True) -> Layer:
    """A 1x1 conv (or a dynamic-weight matmul) inp -> out channels over ``width`` columns."""
    weights = out * inp * FP16 if baked else 0.0
    return Layer("conv", 2.0 * out * inp * width, 0.0, weights, out, (1, 1), False, (out * width * FP16,))


def _elem(op: str, elements: float, per: float = 1.0) -> Layer:
    return Layer(op, 0.0, per * elements, 0.0, 0, (), False, (elements * FP16,))


def _matmul(flops: float, out_elements: float) -> Layer:
    return Layer("matmul", flops, 0.0, 0.0, 0, (), False, (out_elements * FP16,))


def _work(name: str, layers: Sequence[Layer], io_bytes: float) -> Work:
    return Work(
        name,
        flops=sum(x.flops for x in layers),
        element_ops=sum(x.element_ops for x in layers),
        io_bytes=io_bytes,
        weight_bytes=sum(x.weight_bytes for x in layers),
        intermediate_bytes=sum(b for x in layers for b in x.intermediates),
        live_bytes=max((b for x in layers for b in x.intermediates), default=0.0),
        ops=len(layers),
        layers=tuple(layers),
    )


def capacity_for(seq_len: int, width: int) -> int:
    """The cache slots of a kernel of ``width`` columns: (the smallest power of two >= seq_len + width) -
    width, so that the softmax axis (capacity + width) is a power of two (rule op.softmax-axis-size)."""
    return 2 ** math.ceil(math.log2(seq_len + width)) - width


def _attention_layers(cfg: ModelConfig, width: int, capacity: int, baked: bool) -> list[Layer]:
    """q, k, v, their norms and RoPE, scores over cache + chunk, mask, softmax, probs @ v, Wo."""
    d, q, kv, hd, heads = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.head_dim, cfg.n_heads
    keys = capacity + width
    scores = heads * width * keys
    out = [_conv(q, d, width, baked), _conv(kv, d, width, baked), _conv(kv, d, width, baked)]
    if cfg.qkv_bias:
        out += [_elem("add", (q + 2 * kv) * width)]
    if cfg.qk_norm:
        out += [_elem("rms_norm", (q + kv) * width, 5)]
    out += [
        _elem("rope", (q + kv) * width, 3),  # x cos + rotate(x) sin
        _matmul(2.0 * scores * hd, scores),  # (heads, width, keys)
        _elem("add", scores),  # the mask
        _elem("softmax", scores, 5),
        _matmul(2.0 * scores * hd, q * width),  # (q_dim, width)
        _conv(d, q, width, baked),
    ]
    if cfg.post_norms:
        out += [_elem("rms_norm", d * width, 5)]
    return out


def _mlp_layers(cfg: ModelConfig, width: int, baked: bool) -> list[Layer]:
    d, h = cfg.dim, cfg.hidden_dim
    out = [_conv(h, d, width, baked), _conv(h, d, width, baked), _elem("gate", h * width, 3)]
    out += [_conv(d, h, width, baked)]
    if cfg.post_norms:
        out += [_elem("rms_norm", d * width, 5)]
    return out


def _act_channels(cfg: ModelConfig, capacity: int) -> int:
    """Channels of the "x" input: the residual stream, cos / sin (and local ones), the mask(s)."""
    sliding = "sliding" in cfg.layer_types
    tables = 2 * cfg.head_dim * (2 if sliding and cfg.rope_local_theta else 1)
    return cfg.dim + tables + capacity * (2 if sliding else 1)


def fused_layers_work(cfg: ModelConfig, first: int, last: int, width: int, capacity: int) -> Work:
    """The work of the layers kernel over layers [first, last): per layer RMSNorm, attention over the
    cache and the chunk, the residual, RMSNorm, the MLP, the residual; the cache read in-kernel."""
    d, kv, n = cfg.dim, cfg.kv_dim, last - first
    layers: list[Layer] = []
    for _ in range(n):
        layers += [_elem("rms_norm", d * width, 5), *_attention_layers(cfg, width, capacity, True)]
        layers += [_elem("add", d * width), _elem("rms_norm", d * width, 5), *_mlp_layers(cfg, width, True)]
        layers += [_elem("add", d * width)]
    io = (_act_channels(cfg, capacity) * width + 2 * n * kv * capacity + (d + 2 * n * kv) * width) * FP16
    return _work(f"gen_layers_{first}_{last}_w{width}", layers, io)


def attention_block_work(cfg: ModelConfig, layer: int, width: int, capacity: int) -> Work:
    """The dynamic route's attention kernel of one layer: weights in the input surface, the normalised
    input written by the host; out: the block's output and the chunk's k, v."""
    d, q, kv = cfg.dim, cfg.q_dim, cfg.kv_dim
    layers = _attention_layers(cfg, width, capacity, baked=False)
    weights = (q * d + 2 * kv * d + d * q) * FP16
    io = (_act_channels(cfg, capacity) * width + 2 * kv * capacity + (d + 2 * kv) * width) * FP16 + weights
    return _work(f"gen_attn_{layer}_w{width}", layers, io)


def mlp_block_work(cfg: ModelConfig, layer: int, width: int) -> Work:
    """The dynamic route's MLP kernel of one layer (weights in the input surface)."""
    d, h = cfg.dim, cfg.hidden_dim
    io = (2 * d * width) * FP16 + 3 * h * d * FP16
    return _work(f"gen_mlp_{layer}_w{width}", _mlp_layers(cfg, width, baked=False), io)


def head_work(cfg: ModelConfig, start: int, stop: int, width: int, norm: bool = True) -> Work:
    """The head kernel of vocabulary tile [start, stop): the final RMSNorm (``norm``) and the classifier."""
    d, v = cfg.dim, stop - start
    layers = ([_elem("rms_norm", d * width, 5)] if norm else []) + [_conv(v, d, width)]
    return _work(f"gen_head_{start}_{stop}_w{width}", layers, (d + v) * width * FP16)


def vocab_tiles(cfg: ModelConfig) -> list[tuple[int, int]]:
    """The head's tiles: at most VOCAB_TILE channels and WEIGHT_CEILING bytes each, of equal size."""
    per = min(VOCAB_TILE, max(1, WEIGHT_CEILING // (cfg.dim * FP16)))
    n = math.ceil(cfg.vocab_size / per)
    size = math.ceil(cfg.vocab_size / n)
    return [(s, min(s + size, cfg.vocab_size)) for s in range(0, cfg.vocab_size, size)]


def layer_groups(cfg: ModelConfig) -> list[tuple[int, int]]:
    """Layer ranges of the fused layers kernels: as many layers per kernel as WEIGHT_CEILING allows."""
    per_layer = (2 * cfg.q_dim * cfg.dim + 2 * cfg.kv_dim * cfg.dim + 3 * cfg.hidden_dim * cfg.dim) * FP16
    if per_layer > WEIGHT_CEILING:
        raise GenerationCostError(
            f"[cost] one layer of {cfg.name} holds {per_layer / 1e9:.2f} GB of weights, over the "
            f"{WEIGHT_CEILING / 1e9:.0f} GB a program holds"
        )
    per = WEIGHT_CEILING // per_layer
    return [(f, min(f + per, cfg.n_layers)) for f in range(0, cfg.n_layers, per)]


def engine_dispatches(cfg: ModelConfig, route: str, width: int, capacity: int) -> list[Dispatch]:
    """The kernels one chunk of ``width`` columns runs through the layers on ``route`` (head aside)."""
    if route in FUSED:
        return [Dispatch(fused_layers_work(cfg, f, e, width, capacity)) for f, e in layer_groups(cfg)]
    if route in DYNAMIC:
        out = []
        for i in range(cfg.n_layers):
            out += [Dispatch(attention_block_work(cfg, i, width, capacity), kind="attention")]
            out += [Dispatch(mlp_block_work(cfg, i, width), kind="mlp")]
        return out
    if route == "conv-host-attention":  # conv_only's qkv_fwd / wo_fwd / ffn_fwd at the generation width
        d, q, kv, h = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim
        qkv = _work(f"qkv_fwd_w{width}", [_conv(q, d, width), _conv(kv, d, width), _conv(kv, d, width)],
                    (d + q + 2 * kv) * width * FP16)  # fmt: skip
        wo = _work(f"wo_fwd_w{width}", [_conv(d, q, width)], (q + d) * width * FP16)
        ffn = _work(f"ffn_fwd_w{width}", _mlp_layers(cfg, width, True), (2 * d + 3 * h) * width * FP16)
        return [Dispatch(w, cfg.n_layers, "projection") for w in (qkv, wo, ffn)]
    raise GenerationCostError(f"[cost] unknown generation route '{route}' (known: {', '.join(ROUTE_IDS)})")


def head_dispatches(cfg: ModelConfig, route: str, width: int) -> list[Dispatch]:
    """The head tiles; the final RMSNorm in each tile on the fused routes, on the host otherwise."""
    return [Dispatch(head_work(cfg, s, e, width, route in FUSED), kind="head") for s, e in vocab_tiles(cfg)]


def host_steps(cfg: ModelConfig, route: str, width: int, n: int, pos: int) -> list[HostStep]:
    """What the host does for one chunk of ``n`` real tokens at position ``pos`` over the layers."""
    d, kv, q, L = cfg.dim, cfg.kv_dim, cfg.q_dim, cfg.n_layers
    steps = [
        HostStep("embedding", 0.0, n * d * FP32),
        HostStep("cache writes", 0.0, 2 * L * kv * n * FP16 * 2),  # read from the output, write in place
    ]
    if route in DYNAMIC:
        steps.append(HostStep("norms", 2 * L * 5.0 * d * n, 2 * L * d * width * FP16 * 2))
    if route == "conv-host-attention":
        keys = pos + n
        attn_flops = L * (4.0 * q * keys * n + 5.0 * cfg.n_heads * keys * n)
        attn_bytes = L * 2 * kv * keys * FP32  # the float32 cache, read once a chunk
        steps.append(HostStep("attention", attn_flops, attn_bytes))
        steps.append(HostStep("norms, RoPE", L * (10.0 * d + 3.0 * (q + kv)) * n, L * 4 * d * width * FP16))
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
    route: str
    prompt: int
    prefill_width: int
    decode_width: int
    prefill_capacity: int
    decode_capacity: int
    chunks: int
    prefill_chunk: PhaseTime  # the first chunk (the engine time of every chunk; its host part at position 0)
    prefill_ms: float
    decode: PhaseTime

    @property
    def decode_ms(self) -> float:
        return self.decode.ms

    @property
    def decode_tokens_per_s(self) -> float:
        return 1e3 / self.decode.ms


def route_for(chip: str, macos: str = "") -> str:
    """The first generation route all of whose constructs have a usable precedent on ``chip`` (``any``:
    the legacy route of the simulator)."""
    if chip == ANY:
        return LEGACY
    gen = device(chip).generation
    for rid, constructs in ROUTES.items():
        if all(precedent(c, gen, macos).usable for c in constructs):
            return rid
    raise GenerationCostError(
        f"[cost] no generation route runs on {chip}: every candidate has a refused construct"
    )


def context(cfg: ModelConfig) -> int:
    """The tokens a generation of ``cfg`` holds: its seq_len."""
    return cfg.seq_len


def predict_generation(
    cfg: ModelConfig,
    chip: str,
    params: Params,
    prompt: int,
    *,
    route: str | None = None,
    prefill_width: int | None = None,
) -> GenerationCost:
    """The prefill time of a ``prompt``-token prompt and the decode rate after it for ``cfg`` on device
    ``chip`` (route: the chip's, ``route_for``)."""
    if not (isinstance(prompt, int) and 0 < prompt < context(cfg)):
        raise GenerationCostError(
            f"[cost] --prompt {prompt}: must be between 1 and {context(cfg) - 1} (the context of {cfg.name} "
            f"is {context(cfg)} tokens and decode needs a slot after the prompt)"
        )
    route = route or route_for(chip)
    perf = performance(chip)
    dcap = capacity_for(context(cfg), DECODE_WIDTH)
    pw = prefill_width or PREFILL_WIDTH
    pcap = capacity_for(context(cfg), pw)
    if pw > pcap:  # the prefill width is at most the capacity
        pw = DECODE_WIDTH
        pcap = dcap
    chunks = math.ceil(prompt / pw)
    prefill_kernels = engine_dispatches(cfg, route, pw, pcap)
    chunk = predict_phase(prefill_kernels, host_steps(cfg, route, pw, pw, 0), perf, params)
    head = predict_phase(head_dispatches(cfg, route, pw), [], perf, params)
    total = head.ms
    for c in range(chunks):
        n = min(pw, prompt - c * pw)
        steps = host_steps(cfg, route, pw, n, c * pw)
        total += predict_phase(prefill_kernels, steps, perf, params).ms
    copy = 2 * cfg.n_layers * cfg.kv_dim * prompt * FP16 * 2  # the cache, once, into the decode surfaces
    total += copy / (host_figures(perf).stream.value * 1e9) * 1e3
    decode = predict_phase(
        [*engine_dispatches(cfg, route, DECODE_WIDTH, dcap), *head_dispatches(cfg, route, DECODE_WIDTH)],
        host_steps(cfg, route, DECODE_WIDTH, 1, prompt),
        perf,
        params,
    )
    return GenerationCost(
        cfg.name, perf.name, route, prompt, pw, DECODE_WIDTH, pcap, dcap, chunks, chunk, total, decode
    )


def slowest(cfg: ModelConfig, params: Params, prompt: int) -> GenerationCost:
    """``--chip any``: over every device with its own route, the one predicted to decode slowest."""
    return min(
        (predict_generation(cfg, name, params, prompt) for name in DEVICES),
        key=lambda c: c.decode_tokens_per_s,
    )


__all__ = [
    "DECODE_WIDTH",
    "PREFILL_WIDTH",
    "ROUTE_IDS",
    "Dispatch",
    "GenerationCost",
    "GenerationCostError",
    "HostFigures",
    "HostStep",
    "PhaseTime",
    "capacity_for",
    "dispatch_of",
    "engine_dispatches",
    "fused_layers_work",
    "generation_doc",
    "head_work",
    "host_figures",
    "layer_groups",
    "predict_generation",
    "predict_phase",
    "route_for",
    "slowest",
    "vocab_tiles",
]


# -- other pipelines, priced by the same model (the published figures of anekit.cost.calibration) ----------

# The shapes of the models the published figures ran: TinyLlama-1.1B (its config.json: hidden 2048, 22 layers,
# 32 heads, 4 kv heads, intermediate 5632, vocab 32000), Qwen2.5-0.5B-Instruct (hidden 896, 24 layers, 14
# heads, 2 kv heads, intermediate 4864, vocab 151936) and GPT-2 124M (768, 12 layers, 12 heads, 3072, 50257).
TINYLLAMA = ModelConfig(2048, 5632, 22, 32, 4, 32000, 2048, name="TinyLlama-1.1B")
QWEN25_05B = ModelConfig(896, 4864, 24, 14, 2, 151936, 32768, name="Qwen2.5-0.5B")
GPT2_124M = ModelConfig(768, 3072, 12, 12, 12, 50257, 1024, name="GPT-2 124M")


@dataclass(frozen=True)
class HybridSplit:
    """Where another pipeline runs each projection: engine kernels per layer (a name and the projections
    it holds), the projections the host runs in fp32, whether the classifier runs on the engine (in tiles),
    and the engine's width."""

    engine: tuple[tuple[str, tuple[str, ...]], ...]
    host: tuple[str, ...]
    head_on_engine: bool
    width: int = DECODE_WIDTH


TINYLLAMA_HYBRID = HybridSplit((("qk", ("q", "k")), ("gate_up", ("gate", "up"))), ("v", "o", "down"), True)
QWEN25_SPLIT = HybridSplit(tuple((p, (p,)) for p in ("q", "k", "v", "o", "gate", "up", "down")), (), True)
GPT2_SPLIT = HybridSplit((("proj", ("q", "k", "v")), ("ffn", ("up", "down"))), ("o",), False, 16)


def _projection(cfg: ModelConfig, name: str) -> tuple[int, int]:
    """(out, in) channels of projection ``name``."""
    d, q, kv, h = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim
    return {
        "q": (q, d),
        "k": (kv, d),
        "v": (kv, d),
        "o": (d, q),
        "gate": (h, d),
        "up": (h, d),
        "down": (d, h),
    }[name]


def hybrid_step(
    cfg: ModelConfig, split: HybridSplit, n: int, pos: int
) -> tuple[list[Dispatch], list[HostStep]]:
    """The engine kernels and the host's work of ``n`` tokens at ``pos`` through ``split``'s pipeline."""
    w, L = split.width, cfg.n_layers
    dispatches = []
    host_io = 0.0
    for name, projections in split.engine:
        shapes = [_projection(cfg, p) for p in projections]
        convs = [_conv(o, i, w) for o, i in shapes]
        io = (max(i for _, i in shapes) + sum(o for o, _ in shapes)) * w * FP16
        host_io += L * io
        dispatches.append(Dispatch(_work(f"{name}_w{w}", convs, io), L, "projection"))
    if split.head_on_engine:
        dispatches += head_dispatches(cfg, "conv-host-attention", w)
    keys = pos + n
    q, kv, d = cfg.q_dim, cfg.kv_dim, cfg.dim
    host = [_projection(cfg, p) for p in split.host] + ([] if split.head_on_engine else [(cfg.vocab_size, d)])
    steps = [
        HostStep("surfaces", 0.0, host_io),
        HostStep(
            "fp32 projections",
            sum(2.0 * o * i * n for o, i in host) * L,
            sum(o * i for o, i in host) * FP32 * L,
        ),
        HostStep(
            "attention", L * (4.0 * q * keys * n + 5.0 * cfg.n_heads * keys * n), L * 2 * kv * keys * FP32
        ),
        HostStep("norms, RoPE, residual", L * (12.0 * d + 3.0 * (q + kv)) * n, L * 6 * d * n * FP32),
    ]
    if not split.head_on_engine:  # the classifier on the host: counted once, not per layer
        o, i = cfg.vocab_size, d
        steps[1] = HostStep(
            "fp32 projections",
            sum(2.0 * a * b * n for a, b in host[:-1]) * L + 2.0 * o * i * n,
            sum(a * b for a, b in host[:-1]) * FP32 * L + o * i * FP32,
        )
    return dispatches, steps


def hybrid_ms(cfg: ModelConfig, chip: str, params: Params, split: HybridSplit, pos: int = 0) -> float:
    """One decode token's time (ms) through ``split``'s pipeline at position ``pos``."""
    dispatches, steps = hybrid_step(cfg, split, 1, pos)
    return predict_phase(dispatches, steps, performance(chip), params).ms


def hybrid_tokens_per_s(
    cfg: ModelConfig, chip: str, params: Params, split: HybridSplit, pos: int = 0
) -> float:
    return 1e3 / hybrid_ms(cfg, chip, params, split, pos)


def hybrid_dispatches(cfg: ModelConfig, split: HybridSplit) -> int:
    return sum(d.runs for d in hybrid_step(cfg, split, 1, 0)[0])


def hybrid_prefill_speedup(
    cfg: ModelConfig, chip: str, params: Params, split: HybridSplit, prompt: int, width: int
) -> float:
    """Token-by-token prefill of ``prompt`` tokens over the same pipeline run in chunks of ``width``."""
    perf = performance(chip)
    serial = sum(hybrid_ms(cfg, chip, params, split, pos) for pos in range(prompt))
    chunked = dataclasses.replace(split, width=width)
    batched = 0.0
    for c in range(math.ceil(prompt / width)):
        n = min(width, prompt - c * width)
        batched += predict_phase(*hybrid_step(cfg, chunked, n, c * width), perf, params).ms
    return serial / batched


def floor_ms(chip: str, params: Params) -> float:
    """The predicted time of a kernel too small to be anything but its dispatch (a 64-channel 1x1 conv
    over 32 columns)."""
    work = _work("floor", [_conv(64, 64, DECODE_WIDTH)], 2 * 64 * DECODE_WIDTH * FP16)
    return predict(work, performance(chip), params).ms


def host_weights_ms(n_params: int, chip: str) -> float:
    """The host reading ``n_params`` fp32 weights once (a CPU decode's weight stream), ms."""
    return n_params * FP32 / (host_figures(performance(chip)).stream.value * 1e9) * 1e3


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
        "route": cost.route,
        "prompt": cost.prompt,
        "prefill_width": cost.prefill_width,
        "prefill_chunks": cost.chunks,
        "prefill_capacity": cost.prefill_capacity,
        "decode_width": cost.decode_width,
        "decode_capacity": cost.decode_capacity,
        "dispatches_per_token": cost.decode.dispatches,
        "dispatches_per_prefill_chunk": cost.prefill_chunk.dispatches,
        "prefill_chunk": _phase_doc(cost.prefill_chunk),
        "decode": _phase_doc(cost.decode),
        "host_figures": {
            name: {"value": f.value, "unit": f.unit, "status": f.status, "source": f.source}
            for name, f in (("stream", host.stream), ("matmul", host.gemm))
        },
    }
