"""The construct rungs of the smoke ladder: one small program per construct of the engine layer's vocabulary
(``anekit.engine.report.VOCABULARY``), and the constructs found in any program (the tags of the kernel rungs).

Each rung is as small as the construct allows ([1, 64, 1, 64] surfaces, two heads of 32 channels, 64
positions: the smallest shape with hardware precedent is 64 x 32, maderix/ANE training/test_ane_advanced.m,
and the dynamic kernels align segments to 64 columns) and written as anekit's own kernels write the
construct (``anekit.kernels.blocks.KernelBuilder``, ``anekit.kernels.composable``), so that a rung that
runs on a Mac is evidence for what the training kernels emit. Where anekit's kernels do not write a
construct (``rmsnorm.plain``), the rung writes it as the hardware-run code it comes from does:
reduce_sum of x * x, pow(-0.5), as maderix/ANE training/stories_mil.h.

A rung that combines constructs (the RMSNorm ahead of three dynamic matmuls) lists them all; the report
lays a failure on the constructs no other rung ran (``anekit.engine.report``), so the single-construct
rungs come first.

Two generation rungs follow (``GENERATION_RUNGS``): the prefill and the decode layers kernel of a
two-layer model (``anekit.kernels.generation.layers_kernel``, both layers fused, cut as
``anekit.generate.plan`` cuts them), with their inputs written as the host writes them for a chunk at a
position past 0: the activations, RoPE's cos / sin at the chunk's positions, the additive mask of the cache
slots, and a cache whose slots before the position hold keys and values (the rest zero). They exercise what
generation adds to the constructs: two inputs of different sizes ("x" declared before "cache", bound the
other way round), the cache concatenated with the chunk's keys along the spatial axis, a masked softmax over
a power of two of keys, and one output holding the residual stream and the chunk's keys and values. They
are built on the kernel choices of route "baked-fused" (baked weights, norm and attention on the engine,
RoPE as slice + concat), the route of the newest chips. Their weights have unit gain (std 1 / sqrt(fan-in)),
so that the attention and the cache matter to the output as much as the residual stream does.

``constructs_in(program)`` finds the constructs in a program by its ops (the kernel rungs are tagged with
it): a conv with a const weight (``conv.baked``; ``rope.swap-conv`` when the weight is the RoPE swap),
a matmul one of whose operands is a width-offset slice of the input moved only by reshape / transpose
(``matmul.dynamic-weights``; any other matmul is ``matmul.activations``), a softmax over the last axis
(``softmax.scores``), the peak-normalised RMSNorm (reduce_max of abs) or the plain one (pow -0.5 without
it), a norm scale multiplied from a width-offset input slice (``rmsnorm.scale-repeated``), an RMSNorm in a
kernel with three matmuls or more (``rmsnorm.fused-before-matmuls``), a concat on the last axis with a
mul by -1 (``rope.slice-concat``), sigmoid (``gate.silu``), gelu (``gelu.tanh``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from anekit.blob import fp16_blob
from anekit.engine.generation_routes import candidate
from anekit.generate.plan import generation_plan
from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.composable import (
    COLUMN_ALIGN,
    Segment,
    SpatialLayout,
    dynamic_builder,
    dynamic_linear,
    dynamic_matmul,
    dynamic_slice,
    token_rows,
)
from anekit.kernels.config import ModelConfig
from anekit.kernels.generation import cache_mask, layers_kernel, rope_columns
from anekit.kernels.route import KernelRoute
from anekit.kernels.spec import KernelSpec, Layout
from anekit.llama.params import layer_shapes
from anekit.mil import Builder, Program, Var, tensor
from anekit.mil.ir import Op

DIM, HEADS, SEQ = 64, 2, 64
# The model the rungs are cut for: two heads of 32 channels, 64 positions (llama2.c's RMSNorm epsilon).
CONFIG = ModelConfig(DIM, 2 * DIM, 1, HEADS, HEADS, 32, SEQ, name="smoke")
NORM_FILE = "@model_path/weights/rms.bin"


@dataclass(frozen=True)
class ConstructProgram:
    """One construct rung: its program, weight files, the constructs it exercises and what it is;
    ``inputs`` (by MIL input name, full shape) where the rung has inputs of its own (else the ladder draws
    random ones)."""

    name: str
    program: Program
    weights: dict[str, bytes]
    constructs: tuple[str, ...]
    what: str
    inputs: dict[str, np.ndarray] | None = None


def _spec(spec: KernelSpec, constructs: tuple[str, ...], what: str, name: str = "") -> ConstructProgram:
    return ConstructProgram(name or spec.name, spec.program, spec.weight_files(), constructs, what)


def _builder(name: str, parts: list[tuple[str, int]], cfg: ModelConfig = CONFIG) -> KernelBuilder:
    return KernelBuilder(name, cfg, Layout.of(parts, SEQ), None)


def _finish(kb: KernelBuilder, out: Var) -> KernelSpec:
    return kb.finish(Layout.of([("y", int(out.type.shape[1]))], SEQ), {"y": out})  # type: ignore[attr-defined]


def _unit_scale(rng: np.random.Generator) -> np.ndarray:
    return (1.0 + 0.1 * rng.standard_normal(DIM)).astype(np.float32)  # (C,): an RMSNorm scale about 1


# -- one rung per construct --------------------------------------------------------------------------------


def matmul_activations(rng: np.random.Generator) -> ConstructProgram:
    """Q K^T of two heads: [1, 2, S, hd] x [1, 2, S, hd]^T -> scores [1, 2, S, S], back as channels."""
    kb = _builder("matmul_activations", [("q", DIM), ("k", DIM)])
    qh = kb.heads(kb.part("q"), HEADS, "q")  # (1, H, S, hd)
    kh = kb.heads(kb.part("k"), HEADS, "k")  # (1, H, S, hd)
    scores = kb.f.matmul(x=qh, y=kh, transpose_x=False, transpose_y=True, name="qk")  # (1, H, S, S)
    out = kb.flat_scores(scores, "scores")  # (1, H*S, 1, S)
    return _spec(_finish(kb, out), ("matmul.activations",), "matmul of two activations (Q K^T)")


def softmax_scores(rng: np.random.Generator) -> ConstructProgram:
    """softmax over the key axis of [1, 2, S, S] scores that travel as [1, 2 S, 1, S] channels."""
    kb = _builder("softmax_scores", [("scores", HEADS * SEQ)])
    scores = kb.score_heads(kb.part("scores"), "heads")  # (1, H, S, S)
    probs = kb.f.softmax(x=scores, axis=-1, name="probs")  # (1, H, S, S)
    return _spec(_finish(kb, kb.flat_scores(probs, "flat")), ("softmax.scores",), "softmax over the keys")


def matmul_dynamic_weights(rng: np.random.Generator) -> ConstructProgram:
    """anekit's dynamic matmul (``composable.dynamic_matmul``): W^T sliced from the input's columns."""
    spec = dynamic_matmul(DIM, DIM, SEQ)
    what = "matmul by weights sliced from the input"
    return _spec(spec, ("matmul.dynamic-weights",), what, "matmul_dynamic_weights")


def rmsnorm_plain(rng: np.random.Generator) -> ConstructProgram:
    """x * (mean(x^2) + eps)^-1/2 * w, the reduce_sum + pow(-0.5) of maderix/ANE training/stories_mil.h."""
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, DIM, 1, SEQ]))  # (1, C, 1, S)
    w = f.weight(tensor("fp16", [1, DIM, 1, 1]), NORM_FILE, 64, name="rms_w")  # (1, C, 1, 1)
    sq = f.mul(x=x, y=x, name="sq")  # (1, C, 1, S)
    ss = f.reduce_sum(x=sq, axes=[1], keep_dims=True, name="ss")  # (1, 1, 1, S)
    ms = f.mul(x=ss, y=1.0 / DIM, name="ms")  # (1, 1, 1, S)
    e = f.add(x=ms, y=CONFIG.norm_eps, name="ms_eps")  # (1, 1, 1, S)
    r = f.pow(x=e, y=-0.5, name="rrms")  # (1, 1, 1, S)
    xr = f.mul(x=x, y=r, name="xr")  # (1, C, 1, S)
    f.output(f.mul(x=xr, y=w, name="out"))  # (1, C, 1, S)
    weights = {NORM_FILE: fp16_blob(_unit_scale(rng).reshape(1, DIM, 1, 1))}
    return ConstructProgram(
        "rmsnorm_plain", b.build(), weights, ("rmsnorm.plain",), "RMSNorm, reduce_sum + pow"
    )


def rmsnorm_peak(rng: np.random.Generator) -> ConstructProgram:
    """anekit's RMSNorm (``KernelBuilder.rmsnorm``: the squares of x / max|x|), baked scale."""
    kb = KernelBuilder("rmsnorm_peak", CONFIG, Layout.of([("x", DIM)], SEQ), {"rms": _unit_scale(rng)})
    out = kb.rmsnorm(kb.part("x"), kb.norm_scale("rms_w", "rms", DIM), "norm")  # (1, C, 1, S)
    return _spec(_finish(kb, out), ("rmsnorm.peak-normalised",), "anekit's peak-normalised RMSNorm")


def _norm_columns(*weights: str) -> SpatialLayout:
    """Columns act (C x S), then each weight's W^T (C x C), then the norm scale repeated (C x S)."""
    segments = [Segment("act", DIM, SEQ)]
    segments += [Segment(w, DIM, DIM, ((w, DIM, True),)) for w in weights]
    segments.append(Segment("rms", DIM, SEQ, (("rms", DIM, False),)))
    return SpatialLayout.of(DIM, segments, align=COLUMN_ALIGN)


def rmsnorm_scale_repeated(rng: np.random.Generator) -> ConstructProgram:
    """anekit's RMSNorm of the dynamic kernels: the scale a [C, S] segment of the input (repeated)."""
    columns = _norm_columns()
    kb = dynamic_builder("rmsnorm_scale_repeated", CONFIG, columns)
    x = dynamic_slice(kb, columns, "act")  # (1, C, 1, S)
    scale = dynamic_slice(kb, columns, "rms")  # (1, C, 1, S): the scale on every position
    out = kb.rmsnorm(x, scale, "norm")  # (1, C, 1, S)
    constructs = ("rmsnorm.peak-normalised", "rmsnorm.scale-repeated")
    return _spec(_finish(kb, out), constructs, "RMSNorm by a scale repeated over S in the input")


def rmsnorm_before_matmuls(rng: np.random.Generator) -> ConstructProgram:
    """The dynamic SDPA's head: the RMSNorm, then Q, K and V as three dynamic matmuls of one kernel."""
    columns = _norm_columns("wq", "wk", "wv")
    kb = dynamic_builder("rmsnorm_before_matmuls", CONFIG, columns)
    x = dynamic_slice(kb, columns, "act")  # (1, C, 1, S)
    xn = kb.rmsnorm(x, dynamic_slice(kb, columns, "rms"), "norm")  # (1, C, 1, S)
    at = token_rows(kb, xn, "xn")  # (1, 1, S, C)
    qkv = [dynamic_linear(kb, None, dynamic_slice(kb, columns, w), w, at=at) for w in ("wq", "wk", "wv")]
    out = kb.f.concat(values=tuple(qkv), axis=1, interleave=False, name="out")  # (1, 3C, 1, S)
    kb.f.output(out)
    spec = KernelSpec(kb.name, kb.builder.build(), kb.inputs, Layout.of([("y", 3 * DIM)], SEQ), kb.pack)
    constructs = (
        "rmsnorm.fused-before-matmuls",
        "rmsnorm.peak-normalised",
        "rmsnorm.scale-repeated",
        "matmul.dynamic-weights",
    )
    return _spec(spec, constructs, "RMSNorm ahead of three dynamic matmuls")


def rope_swap_conv(rng: np.random.Generator) -> ConstructProgram:
    """anekit's RoPE (``KernelBuilder.rope``): the pair swap as a constant C x C 1x1 conv."""
    kb = _builder("rope_swap_conv", [("x", DIM)])
    out = kb.rope(kb.part("x"), DIM, "rope")  # (1, C, 1, S)
    return _spec(_finish(kb, out), ("rope.swap-conv",), "RoPE, the pair swap as a 1x1 conv")


def rope_slice_concat(rng: np.random.Generator) -> ConstructProgram:
    """RoPE as the training routes' kernels write it (``KernelBuilder.rope`` with rope "slice"): each pair
    (a, b) of a [1, H, S hd / 2, 2] view of the heads becomes (-b, a) by two slices, a mul by -1 and a
    concat on the last axis; x * cos + swapped * sin."""
    kb = KernelBuilder("rope_slice_concat", CONFIG, Layout.of([("x", DIM)], SEQ), None, rope="slice")
    out = kb.rope(kb.part("x"), DIM, "rope")  # (1, C, 1, S)
    return _spec(_finish(kb, out), ("rope.slice-concat",), "RoPE as reshape + slice + negate + concat")


def rope_permutation_matmul(rng: np.random.Generator) -> ConstructProgram:
    """RoPE as the M3's route writes it (``KernelBuilder.rope`` with rope "matmul", ncdrone/rustane pull
    request #9): rotate-half as a matmul of the [1, H, S, hd] heads by a constant hd x hd permutation;
    x * cos + rotated * sin."""
    kb = KernelBuilder("rope_permutation_matmul", CONFIG, Layout.of([("x", DIM)], SEQ), None, rope="matmul")
    out = kb.rope(kb.part("x"), DIM, "rope")  # (1, C, 1, S)
    what = "RoPE as a matmul by the rotate-half permutation"
    return _spec(_finish(kb, out), ("rope.permutation-matmul",), what)


def gate_silu(rng: np.random.Generator) -> ConstructProgram:
    """SwiGLU's gate (``KernelBuilder.gate``): h1 * sigmoid(h1) * h3."""
    kb = _builder("gate_silu", [("h1", DIM), ("h3", DIM)])
    out = kb.gate(kb.part("h1"), kb.part("h3"))  # (1, C, 1, S)
    return _spec(_finish(kb, out), ("gate.silu",), "SwiGLU gate, sigmoid + mul")


def gelu_tanh(rng: np.random.Generator) -> ConstructProgram:
    """GeGLU's gate (``KernelBuilder.gate`` for mlp_act gelu_tanh): gelu(h1, TANH_APPROXIMATION) * h3."""
    cfg = ModelConfig(DIM, 2 * DIM, 1, HEADS, HEADS, 32, SEQ, mlp_act="gelu_tanh", name="smoke")
    kb = _builder("gelu_tanh", [("h1", DIM), ("h3", DIM)], cfg)
    out = kb.gate(kb.part("h1"), kb.part("h3"))  # (1, C, 1, S)
    return _spec(_finish(kb, out), ("gelu.tanh",), "GeGLU gate, gelu(mode = TANH_APPROXIMATION)")


RUNGS: tuple[Callable[[np.random.Generator], ConstructProgram], ...] = (
    matmul_activations,
    softmax_scores,
    matmul_dynamic_weights,
    rmsnorm_plain,
    rmsnorm_peak,
    rmsnorm_scale_repeated,
    rmsnorm_before_matmuls,
    rope_swap_conv,
    rope_slice_concat,
    rope_permutation_matmul,
    gate_silu,
    gelu_tanh,
)


def names() -> list[str]:
    """The construct rungs' names, in ladder order."""
    return [r.__name__ for r in RUNGS]


# -- the generation rungs ----------------------------------------------------------------------------------

# Two layers of the rungs' model, fused in one kernel as decode fuses them; 64 positions of context.
GEN_CONFIG = CONFIG.with_(n_layers=2)
GEN_ROUTE = "baked-fused"  # the generation route whose kernel choices the rungs are built on
GEN_POSITION = {"prefill": 16, "decode": 21}  # the chunk's first position: slots before it hold the cache
GEN_TOKENS = {"prefill": 40, "decode": 1}  # real tokens in the chunk (the rest of its width is padding)


def _unit_gain_weights(cfg: ModelConfig, rng: np.random.Generator) -> dict[int, dict[str, np.ndarray]]:
    """Each layer's weights: matrices N(0, 1 / fan-in), norm scales about 1, biases about 0."""
    out = {}
    for i in range(cfg.n_layers):
        w = {}
        for key, shape in layer_shapes(cfg).items():
            if len(shape) == 2:
                w[key] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
            elif key.startswith("b"):
                w[key] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
            else:
                w[key] = (1 - cfg.norm_offset + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        out[i] = w
    return out


def _generation(phase: str, rng: np.random.Generator) -> ConstructProgram:
    """The ``phase`` ("prefill" or "decode") layers kernel of GEN_CONFIG and its inputs (module docstring)."""
    cfg = GEN_CONFIG
    plan = generation_plan(cfg, GEN_ROUTE)
    width = plan.prefill_width if phase == "prefill" else plan.decode_width
    cap = plan.capacity_for(width)
    c = candidate(GEN_ROUTE)
    route = KernelRoute(c.weights, c.attention, c.norm, c.rope)
    weights = _unit_gain_weights(cfg, rng)
    g = layers_kernel(cfg, 0, cfg.n_layers, width=width, capacity=cap, route=route, weights=weights)
    pos, n = GEN_POSITION[phase], GEN_TOKENS[phase]
    cos, sin = rope_columns(cfg, np.arange(pos, pos + width))  # (head_dim, W)
    x = np.zeros((cfg.dim, width), np.float32)
    x[:, :n] = rng.standard_normal((cfg.dim, n)) * 0.5  # (dim, W): the real tokens, zero padding
    act = g.pack_x({"x": x, "cos": cos, "sin": sin, "mask": cache_mask(cap, pos, n, width)})
    assert g.cache is not None
    cache = np.zeros((g.cache.channels, cap), np.float32)  # (2 L kv, capacity)
    cache[:, :pos] = rng.standard_normal((g.cache.channels, pos)) * 0.5  # slots 0 .. pos-1 are valid
    inputs = {"x": act.reshape(1, -1, 1, width), "cache": cache.reshape(1, -1, 1, cap)}
    found = constructs_in(g.program)
    what = f"{phase} of 2 fused layers, {n} token(s) at position {pos} over a {cap}-slot cache input"
    return ConstructProgram(f"gen_{phase}", g.program, g.weight_files(), found, what, inputs)


def gen_prefill(rng: np.random.Generator) -> ConstructProgram:
    """The prefill kernel: a chunk of 40 tokens after 16 cached positions."""
    return _generation("prefill", rng)


def gen_decode(rng: np.random.Generator) -> ConstructProgram:
    """The decode kernel: one token (column 0 of 32) after 21 cached positions."""
    return _generation("decode", rng)


GENERATION_RUNGS: tuple[Callable[[np.random.Generator], ConstructProgram], ...] = (gen_prefill, gen_decode)


def generation_names() -> list[str]:
    """The generation rungs' names, in ladder order."""
    return [r.__name__ for r in GENERATION_RUNGS]


# -- the constructs in a program ---------------------------------------------------------------------------

_MOVES = frozenset({"reshape", "transpose"})


def _const(v: object) -> np.ndarray | None:
    lit = getattr(v, "const", None)
    value = getattr(lit, "value", None)
    return value if isinstance(value, np.ndarray) else None


def _width_slice(v: Var, inputs: set[str]) -> bool:
    """Whether ``v`` is a slice of a function input at a nonzero width offset, moved only by reshape /
    transpose since."""
    while v.op is not None and v.op.op_type in _MOVES:
        v = v.op.inputs["x"]  # type: ignore[assignment]
    op = v.op
    if op is None or op.op_type != "slice_by_size":
        return False
    src, begin = op.inputs.get("x"), _const(op.inputs.get("begin"))
    return isinstance(src, Var) and src.name in inputs and begin is not None and int(begin[-1]) != 0


def _scalar(op: Op, name: str) -> float | None:
    value = _const(op.inputs.get(name))
    return float(value) if value is not None and value.size == 1 else None


def constructs_in(program: Program) -> tuple[str, ...]:
    """The construct ids found in ``program``'s main function by its ops (the module docstring)."""
    fn = program.main
    inputs = {v.name for v in fn.inputs}
    ops = fn.ops
    types = [op.op_type for op in ops]
    found: set[str] = set()
    for op in ops:
        t = op.op_type
        if t == "conv":
            w = op.inputs.get("weight")
            if isinstance(w, Var) and w.op is not None and w.op.op_type == "const":
                found.add("rope.swap-conv" if w.name.startswith("rope_swap") else "conv.baked")
        elif t == "matmul":
            operands = [op.inputs.get("x"), op.inputs.get("y")]
            dynamic = any(isinstance(v, Var) and _width_slice(v, inputs) for v in operands)
            perm = any(isinstance(v, Var) and v.name.startswith("rope_perm") for v in operands)
            if perm:
                found.add("rope.permutation-matmul")
            else:
                found.add("matmul.dynamic-weights" if dynamic else "matmul.activations")
        elif t == "softmax":
            axis = _scalar(op, "axis")
            rank = len(op.outputs[0].type.shape)  # type: ignore[attr-defined]
            if axis is not None and int(axis) in (-1, rank - 1):
                found.add("softmax.scores")
        elif t == "reduce_max" and any(v.op is not None and v.op.op_type == "abs" for v in op.input_vars()):
            found.add("rmsnorm.peak-normalised")
        elif (
            t == "concat"
            and _scalar(op, "axis") in (-1.0, 3.0)
            and any(o.op_type == "mul" and _scalar(o, "y") == -1.0 for o in ops)
        ):
            found.add("rope.slice-concat")
        elif t == "sigmoid":
            found.add("gate.silu")
        elif t == "gelu":
            found.add("gelu.tanh")
    norm = "rmsnorm.peak-normalised" in found
    if not norm and any(t == "pow" and _scalar(op, "y") == -0.5 for op, t in zip(ops, types)):
        found.add("rmsnorm.plain")
        norm = True
    if norm:
        scaled = any(
            op.op_type == "mul" and any(_width_slice(v, inputs) for v in op.input_vars()) for op in ops
        )
        if scaled:
            found.add("rmsnorm.scale-repeated")
        if types.count("matmul") >= 3:
            found.add("rmsnorm.fused-before-matmuls")
    return tuple(sorted(found))
