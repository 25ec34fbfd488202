"""The pipelines the published generation figures measured, priced by the generation cost model: the
guide's hybrid TinyLlama decoder, maderix/ANE pull request #26's Qwen2.5-0.5B (every projection its own
kernel) and Orion's GPT-2 124M (two kernels a layer). Each is its own split of the projections between
engine kernels and the host's fp32 arithmetic, so ``anekit.cost.calibration`` checks the per-kernel model
on what was measured rather than on anekit's own layout.

The models' shapes come from their Hugging Face configs: TinyLlama-1.1B (hidden 2048, 22 layers, 32
heads, 4 kv heads, intermediate 5632, vocab 32000: the guide names its 22 layers and its 5632
contraction), Qwen2.5-0.5B-Instruct (896, 24 layers, 14 heads, 2 kv heads, 4864, vocab 151936: the pull
request names its 24 layers and 14 / 2 heads) and GPT-2 124M (768, 12 layers, 12 heads, 3072, 50257;
Orion's model/configs/gpt2_124m.h). GPT-2's LayerNorm, GELU and learned positions cost what RMSNorm,
SiLU and RoPE cost here, within this model's element-op counts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from anekit.cost import gen_work as gw
from anekit.cost.gen_work import FP16, FP32
from anekit.cost.generation import (
    DECODE_WIDTH,
    GPT2_PARAMS,
    Dispatch,
    HostStep,
    host_figures,
    predict_phase,
)
from anekit.cost.model import Params, predict
from anekit.engine.performance import performance
from anekit.models.config import ModelConfig

TINYLLAMA = ModelConfig(2048, 5632, 22, 32, 4, 32000, 2048, name="TinyLlama-1.1B")
QWEN25_05B = ModelConfig(896, 4864, 24, 14, 2, 151936, 32768, name="Qwen2.5-0.5B")
GPT2_124M = ModelConfig(768, 3072, 12, 12, 12, 50257, 1024, name="GPT-2 124M")
TILE = 65536  # the engine's channel limit: the width of a classifier tile


@dataclass(frozen=True)
class HybridSplit:
    """Where a pipeline runs each projection: engine kernels per layer (a name and the projections it
    holds), the projections the host runs in fp32, whether the classifier runs on the engine (in tiles
    of at most 65536 rows) or on the host, and the engine's width."""

    engine: tuple[tuple[str, tuple[str, ...]], ...]
    host: tuple[str, ...]
    head_on_engine: bool
    width: int = DECODE_WIDTH


# The guide's placement table: q, k, gate, up and the output embedding on the engine; v, o, down off it.
TINYLLAMA_HYBRID = HybridSplit((("qk", ("q", "k")), ("gate_up", ("gate", "up"))), ("v", "o", "down"), True)
# Pull request #26: "All linear projections (Q, K, V, O, gate, up, down x 24 layers + chunked LM head)".
QWEN25_SPLIT = HybridSplit(tuple((p, (p,)) for p in ("q", "k", "v", "o", "gate", "up", "down")), (), True)
# Orion's decode_ane.m: "ANE decode_proj (LN1 + Q,K,V) -> CPU attention -> ANE decode_ffn", seq 16, logits
# and Wo on the CPU.
GPT2_SPLIT = HybridSplit((("proj", ("q", "k", "v")), ("ffn", ("up", "down"))), ("o",), False, 16)


def projection(cfg: ModelConfig, name: str) -> tuple[int, int]:
    """(out, in) channels of projection ``name``."""
    d, q, kv, h = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim
    shapes = {
        "q": (q, d),
        "k": (kv, d),
        "v": (kv, d),
        "o": (d, q),
        "gate": (h, d),
        "up": (h, d),
        "down": (d, h),
    }
    return shapes[name]


def _tiles(vocab: int) -> list[tuple[int, int]]:
    n = math.ceil(vocab / TILE)
    size = math.ceil(vocab / n)
    return [(s, min(s + size, vocab)) for s in range(0, vocab, size)]


def hybrid_step(
    cfg: ModelConfig, split: HybridSplit, n: int, pos: int
) -> tuple[list[Dispatch], list[HostStep]]:
    """The engine kernels and the host's work of ``n`` tokens at position ``pos`` through ``split``."""
    w, layers = split.width, cfg.n_layers
    dispatches = []
    surfaces = 0.0
    for name, projections in split.engine:
        shapes = [projection(cfg, p) for p in projections]
        io = (max(i for _, i in shapes) + sum(o for o, _ in shapes)) * w * FP16
        surfaces += layers * io
        convs = [gw.conv(o, i, w) for o, i in shapes]
        dispatches.append(Dispatch(gw.work(f"{name}_w{w}", convs, io), layers, "projection"))
    per_layer = [projection(cfg, p) for p in split.host]
    flops = sum(2.0 * o * i * n for o, i in per_layer) * layers
    weights = sum(o * i for o, i in per_layer) * FP32 * layers
    if split.head_on_engine:
        for start, stop in _tiles(cfg.vocab_size):
            tile = gw.head_tile_work(cfg, start, stop, w, norm=False)
            dispatches.append(Dispatch(tile, 1, "head"))
    else:  # the classifier on the host, once a token
        flops += 2.0 * cfg.vocab_size * cfg.dim * n
        weights += cfg.vocab_size * cfg.dim * FP32
    keys = pos + n
    q, kv, d, heads = cfg.q_dim, cfg.kv_dim, cfg.dim, cfg.n_heads
    steps = [
        HostStep("surfaces", 0.0, surfaces),
        HostStep("fp32 projections", flops, weights),
        HostStep(
            "attention", layers * (4.0 * q * keys * n + 5.0 * heads * keys * n), layers * 2 * kv * keys * FP32
        ),
        HostStep(
            "norms, RoPE, residual", layers * (12.0 * d + 3.0 * (q + kv)) * n, layers * 6 * d * n * FP32
        ),
    ]
    return dispatches, steps


def hybrid_ms(cfg: ModelConfig, chip: str, params: Params, split: HybridSplit, pos: int = 0) -> float:
    """One decode token's time (ms) through ``split`` at position ``pos``."""
    dispatches, steps = hybrid_step(cfg, split, 1, pos)
    return predict_phase(dispatches, steps, performance(chip), params).ms


def hybrid_tokens_per_s(
    cfg: ModelConfig, chip: str, params: Params, split: HybridSplit, pos: int = 0
) -> float:
    return 1e3 / hybrid_ms(cfg, chip, params, split, pos)


def hybrid_dispatches(cfg: ModelConfig, split: HybridSplit) -> int:
    """Engine evaluations a token makes through ``split``."""
    return sum(d.runs for d in hybrid_step(cfg, split, 1, 0)[0])


def hybrid_prefill_speedup(
    cfg: ModelConfig, chip: str, params: Params, split: HybridSplit, prompt: int, width: int
) -> float:
    """A ``prompt``-token prefill token by token over the same pipeline run in chunks of ``width``."""
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
    tiny = gw.work("floor", [gw.conv(64, 64, DECODE_WIDTH)], 2 * 64 * DECODE_WIDTH * FP16)
    return predict(tiny, performance(chip), params).ms


def host_weights_ms(n_params: int, chip: str) -> float:
    """The host reading ``n_params`` fp32 weights once (a CPU decode's weight stream), ms."""
    return n_params * FP32 / (host_figures(performance(chip)).stream.value * 1e9) * 1e3


__all__ = [
    "GPT2_124M",
    "GPT2_PARAMS",
    "GPT2_SPLIT",
    "QWEN25_05B",
    "QWEN25_SPLIT",
    "TINYLLAMA",
    "TINYLLAMA_HYBRID",
    "HybridSplit",
    "floor_ms",
    "host_weights_ms",
    "hybrid_dispatches",
    "hybrid_ms",
    "hybrid_prefill_speedup",
    "hybrid_step",
    "hybrid_tokens_per_s",
]
