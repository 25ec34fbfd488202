"""Checks of the rule book over a program, a surface plan and weight files: each finding names its rule.

``check_program`` walks every function of a Program once and applies the op, tensor and program rules
for a chip, a route and (optionally) a macOS version; ``check_surface_plan`` judges the surfaces a
backend is about to allocate and bind; ``check_weight_names`` and the BLOBFILE check look at the weight
files a program refers to. A finding says which rule, where (function, op, line), why, and the source of
the rule.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from anekit.blob import BlobFile
from anekit.engine import extents as ext
from anekit.engine import ops as op_tables
from anekit.engine.book import Rule, rule
from anekit.engine.chips import ANY, GENERATIONS, check_generation
from anekit.engine.evidence import check_macos, check_route
from anekit.errors import AnekitError, CompilationFailed
from anekit.mil import types as T
from anekit.mil.dialect import function_problems
from anekit.mil.ir import Function, Op, Program, Var
from anekit.mil.values import BlobRef, Literal

CHIPS = GENERATIONS
FP16_MAX = 65504.0
BLOB_SENTINEL = 0xDEADBEEF
MAX_PROVEN_CONV_INPUT = 14336  # conv.input-channels-unproven
REFUSED_CONV_INPUT = 32000  # conv.input-channels-refused
LARGE_OPERAND_DIM = 128  # op.transposed-weight-matmul: head-sized operands (<= 128) are fine
MIN_ROW_BYTES = 64  # surface.min-row-bytes
SPATIAL_MULTIPLE = 16  # surface.spatial-multiple-16
GLOBAL_SURFACE_BYTES = 16 * 1024 * 1024  # surface.global-over-16mb
MAX_OUTPUTS = 2  # surface.max-outputs
MIN_CHANNELS = 64  # tensor.channels-multiple-64
# numerics.fp16-sum-of-squares looks at sums of 256 or more squares, which overflow once RMS(x) > 16. Fewer
# terms overflow only at an RMS above 16, past what activations reach in anekit's models (an assumption of
# anekit's, not a measurement: RMSNorm inputs of trained llama2.c models stay far below it).
SUM_OF_SQUARES_MIN_TERMS = 256
SHARD_WEIGHT_BYTES = 250 * 10**6  # package.shard-size: law 4's ~250 MB ceiling (validated: 223 MB)
# Files of an in-memory model's directory that are not weights (weights.reserved-name): the MIL text
# every public project writes there, and the compiler's own net.plist and data.
RESERVED_WEIGHT_NAMES = frozenset({"model.mil", "net.plist", "data"})

# A weight file's bytes, or the path of the file holding them.
WeightFiles = Mapping[str, "bytes | bytearray | memoryview | str | os.PathLike[str]"]


@dataclass(frozen=True)
class Finding:
    """One rule broken at one place."""

    rule: Rule
    where: str
    message: str
    line: int | None = None
    severity: str = ""  # the rule's on this chip and route (default: its worst anywhere)
    chip: str = ANY
    route: str = "direct"
    macos: str = ""  # the macOS version it was judged for ("": every version)

    def __post_init__(self) -> None:
        if not self.severity:
            found = self.rule.severity_on(self.chip, self.route, self.macos)
            object.__setattr__(self, "severity", found or "warn")

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        return f"{self.short()} ({self.scope()}) [{self.rule.source}]"

    def short(self) -> str:
        """The finding without its source: ``rule-id severity where: why``."""
        return f"{self.rule.id} {self.severity} {self.where}: {self.message}"

    def scope(self) -> str:
        """``chip m4, route direct: error on m4, warn on m3`` — where the finding applies and how (with
        ``, macOS 26`` after the route when it was judged for one)."""
        os_ = f", macOS {self.macos}" if self.macos else ""
        return f"chip {self.chip}, route {self.route}{os_}: {self.rule.verdict(self.route, self.macos)}"

    def as_dict(self) -> dict[str, object]:
        return {
            "rule": self.rule.id,
            "severity": self.severity,
            "chip": self.chip,
            "route": self.route,
            "macos": self.macos,
            "verdict": self.rule.verdict(self.route, self.macos),
            "status": self.rule.status,
            "where": self.where,
            "line": self.line,
            "message": self.message,
            "source": self.rule.source,
            "decision": self.rule.decision,
        }


def errors(findings: Iterable[Finding]) -> list[Finding]:
    """The findings of ``error`` severity."""
    return [f for f in findings if f.is_error]


def enforce(
    program: Program,
    fn: Function,
    chip: str,
    weights: WeightFiles | None,
    who: str,
    route: str = "direct",
    macos: str = "",
) -> list[Finding]:
    """Refuse ``fn`` with CompilationFailed listing every error rule it breaks for ``chip`` (under macOS
    ``macos``, "" for every version); returns the warnings. What both backends call before compiling
    (``who`` says which, for the message)."""
    findings = check_function(program, fn, chip, weights, route, macos)
    broken = errors(findings)
    if broken:
        listing = "\n".join(f"  {f.short()}" for f in broken)
        os_ = f", macOS {macos}" if macos else ""
        raise CompilationFailed(
            f"[compile] the engine would refuse or miscompute '{fn.name}' ({who}, chip {chip}, "
            f"route {route}{os_}; `anekit lint` gives each rule's source; `anekit run --no-strict`, "
            "strict=False or ANEKIT_STRICT=0 runs it anyway):\n"
            f"{listing}"
        )
    return [f for f in findings if not f.is_error]


def reserved_weight_name(path: str) -> str | None:
    """The reserved name a weight path (``@model_path/...`` or relative) collides with: its first
    component, case-insensitively (macOS file systems usually are); None when it is free."""
    rel = path.split("@model_path/", 1)[-1]
    head = rel.split("/", 1)[0].casefold() if rel else ""
    return head if head in RESERVED_WEIGHT_NAMES else None


# -- program checks ------------------------------------------------------------------------------


class _Context:
    """What the checks of one function share: the chip, the weight files, and who consumes what."""

    def __init__(
        self,
        program: Program,
        fn: Function,
        chip: str,
        weights: WeightFiles | None,
        route: str = "direct",
        macos: str = "",
    ) -> None:
        self.program = program
        self.fn = fn
        self.chip = chip
        self.route = route
        self.macos = macos
        self.weights = weights
        self.findings: list[Finding] = []

    def report(
        self,
        rule_id: str,
        where: str,
        message: str,
        line: int | None = None,
        broken_on: tuple[str, ...] = GENERATIONS,
    ) -> None:
        """Record a finding of ``rule_id`` if it applies on this chip and route. ``broken_on``: the
        generations whose limit the program breaks (an extent differs by chip). For no chip in particular
        ("any") the finding is an error when it is one on every generation, a warning when it is an error
        on some or a warning on all, and left out when it is a warning on some chips only."""
        r = rule(rule_id)
        if self.chip == ANY:
            levels = [
                r.severity_on(c, self.route, self.macos) if c in broken_on else None for c in GENERATIONS
            ]
            errors_on = [c for c, level in zip(GENERATIONS, levels) if level == "error"]
            if not errors_on and not all(level == "warn" for level in levels):
                return  # a warning on some chips only: ``--chip`` shows it
            severity = "error" if len(errors_on) == len(GENERATIONS) else "warn"
            if severity == "warn" and errors_on:
                message = f"{message} (an error on {', '.join(errors_on)})"
        else:
            found = r.severity_on(self.chip, self.route, self.macos) if self.chip in broken_on else None
            if found is None:
                return
            severity = found
        where = f"{self.fn.name}: {where}"
        self.findings.append(Finding(r, where, message, line, severity, self.chip, self.route, self.macos))

    def report_op(self, rule_id: str, op: Op, message: str, broken_on: tuple[str, ...] = GENERATIONS) -> None:
        line = f" (line {op.line})" if op.line else ""
        self.report(rule_id, f"{op.op_type} '{op.name}'{line}", message, op.line, broken_on)


OpCheck = Callable[[_Context, Op], None]
_OP_CHECKS: dict[str, list[OpCheck]] = {}


def _on(*op_types: str) -> Callable[[OpCheck], OpCheck]:
    """Register an op check for these op types."""

    def register(check: OpCheck) -> OpCheck:
        for t in op_types:
            _OP_CHECKS.setdefault(t, []).append(check)
        return check

    return register


def check_program(
    program: Program,
    chip: str = "any",
    weights: WeightFiles | None = None,
    route: str = "direct",
    macos: str = "",
) -> list[Finding]:
    """Every finding of the op, tensor and program rules for ``chip`` ("any": the rules of every chip)
    and ``route`` ("direct": the in-memory framework with caller-made surfaces; "e5rt": the Espresso /
    e5rt runtime; "coreml": a package), under macOS ``macos`` ("15", "26.3"; "": every version — the
    evidence observed under other major versions then does not count, see ``anekit.engine.evidence``).

    ``weights`` maps BLOBFILE paths (``@model_path/weights/x.bin``) to their bytes or files; when given,
    BLOBFILE offsets are checked against the files' metadata records.
    """
    findings: list[Finding] = []
    for fn in program.functions.values():
        findings.extend(check_function(program, fn, chip, weights, route, macos))
    return findings


def check_function(
    program: Program,
    fn: Function,
    chip: str = "any",
    weights: WeightFiles | None = None,
    route: str = "direct",
    macos: str = "",
) -> list[Finding]:
    """The findings of one function of ``program`` (what a backend compiles)."""
    check_chip(chip)
    check_route(route)
    check_macos(macos)
    ctx = _Context(program, fn, chip, weights, route, macos)
    _check_io(ctx)
    _check_extents(ctx)
    for op in fn.ops:
        _check_op_tables(ctx, op)
        for check in _OP_CHECKS.get(op.op_type, ()):
            check(ctx, op)
    _check_bridge_only(ctx)
    _check_identity_alone(ctx)
    _check_outputs(ctx)
    _check_dialect(ctx)
    return ctx.findings


def check_chip(chip: str) -> str:
    """``chip`` if it is a generation or "any"; one line naming the choices otherwise."""
    return check_generation(chip, "rules")


def _tensor_shape(v: Var) -> tuple[int, ...] | None:
    t = v.type
    if isinstance(t, T.TensorType) and all(isinstance(d, int) for d in t.shape):
        return tuple(int(d) for d in t.shape)
    return None


def _check_io(ctx: _Context) -> None:
    """Function inputs and outputs: rank 4 batch 1, row and surface sizes, channels, how many outputs."""
    for kind, vars_ in (("input", ctx.fn.inputs), ("output", ctx.fn.outputs)):
        for v in vars_:
            shape = _tensor_shape(v)
            if shape is None or not isinstance(v.type, T.TensorType):  # (a shape is a tensor's)
                continue
            where = f"{kind} '{v.name}' {list(shape)}"
            line = ctx.fn.line
            if len(shape) != 4 or shape[0] != 1:
                ctx.report("io.rank4-batch1", where, "expected [1, C, H, W]", line)
            if not shape:
                continue
            width = shape[-1]
            itemsize = v.type.dtype.bits / 8
            if width % SPATIAL_MULTIPLE:
                ctx.report(
                    "surface.spatial-multiple-16", where, f"spatial width {width} (not a multiple of 16)"
                )
            if width * itemsize < MIN_ROW_BYTES:
                ctx.report(
                    "surface.min-row-bytes",
                    where,
                    f"rows of {width * itemsize:g} bytes; at least {MIN_ROW_BYTES} needed "
                    f"(spatial >= {math.ceil(MIN_ROW_BYTES / itemsize)})",
                )
            if len(shape) >= 3 and shape[-3] < MIN_CHANNELS:
                ctx.report("tensor.channels-multiple-64", where, f"{shape[-3]} channels (< {MIN_CHANNELS})")
            nbytes = math.prod(shape) * itemsize
            if kind == "input" and nbytes > GLOBAL_SURFACE_BYTES:
                ctx.report("surface.global-over-16mb", where, f"{nbytes / 2**20:.1f} MB (> 16 MB)")
    outputs = [v.name for v in ctx.fn.outputs]
    if len(outputs) > MAX_OUTPUTS:
        ctx.report(
            "surface.max-outputs",
            f"outputs {outputs}",
            f"{len(outputs)} outputs (> {MAX_OUTPUTS}): concatenate them into one",
            ctx.fn.line,
        )


def _check_extents(ctx: _Context) -> None:
    """Every tensor the function builds (inputs and op results): rank, width / height, channels."""
    seen: set[str] = set()
    values: list[tuple[Var, Op | None]] = [(v, None) for v in ctx.fn.inputs]
    values += [(v, op) for op in ctx.fn.ops if op.op_type != "const" for v in op.outputs]
    for v, op in values:
        shape = _tensor_shape(v)
        if shape is None or v.name in seen:
            continue
        seen.add(v.name)
        where = f"'{v.name}' {list(shape)}" if op is None else f"{op.op_type} '{op.name}' -> {list(shape)}"
        line = op.line if op is not None else ctx.fn.line
        if len(shape) > ext.RANK.limits["m1"]:
            ctx.report("extent.rank", where, f"rank {len(shape)} (> 5)", line)
        spatial = max(shape[-2:], default=0)
        broken = ext.SPATIAL.broken_on(spatial)
        if broken:
            ctx.report(
                "extent.spatial",
                where,
                f"width / height {spatial} (> {ext.SPATIAL.limit(ctx.chip)})",
                line,
                broken,
            )
        if len(shape) >= 3 and ext.CHANNELS.broken_on(shape[-3]):
            ctx.report("extent.channels", where, f"{shape[-3]} channels (> 65536)", line)


_OP_TABLE_RULES = (
    (op_tables.NO_PATH, "op.no-engine-path", "has no engine path on any chip"),
    (op_tables.NO_PATH, "op.off-engine", "is placed off the engine by CoreML"),
    (op_tables.FROM_M2, "op.from-m2", "needs the M2 or later"),
    (op_tables.FROM_M3_GATED, "op.from-m3", "runs on the engine only from the M3"),
    (op_tables.CURATED_PATH_ONLY, "op.curated-path-only", "has no implementation on the compile path"),
    (op_tables.M1_FALLBACK, "op.m1-software-fallback", "takes a software path on the M1"),
)


def _check_op_tables(ctx: _Context, op: Op) -> None:
    """The op tables read off the operation-by-device matrix (``anekit.engine.ops``)."""
    for ops, rule_id, why in _OP_TABLE_RULES:
        if op.op_type in ops:
            ctx.report_op(rule_id, op, f"{op.op_type} {why}")


def _check_bridge_only(ctx: _Context) -> None:
    """op.bridge-only: a function whose computing ops are all compiler-internal or folded ones."""
    computing = [op for op in ctx.fn.ops if op.op_type not in op_tables.FOLDED]
    if computing and all(op.op_type in op_tables.BRIDGE_ONLY for op in computing):
        for op in computing:
            ctx.report_op("op.bridge-only", op, f"{op.op_type} is the only kind of op in the function")


def _check_identity_alone(ctx: _Context) -> None:
    """op.identity-alone: a function whose only computing op is identity (its output is its input)."""
    computing = [op for op in ctx.fn.ops if op.op_type not in op_tables.FOLDED]
    if computing and all(op.op_type == "identity" for op in computing):
        for op in computing:
            ctx.report_op("op.identity-alone", op, "identity is the function's only op")


def _check_dialect(ctx: _Context) -> None:
    """dialect.m1-m2: what the older program(1.0) / <ios16> form cannot express."""
    if not rule("dialect.m1-m2").applies_to(ctx.chip, ctx.route, ctx.macos):
        return
    for op, problem in function_problems(ctx.fn, "ios16"):
        if op is None:
            ctx.report("dialect.m1-m2", "function inputs", problem, ctx.fn.line)
        else:
            ctx.report_op("dialect.m1-m2", op, problem)


def _check_outputs(ctx: _Context) -> None:
    for v in ctx.fn.outputs:
        if v.op is not None and v.op.op_type == "identity":
            source = _arg_name(v.op)
            ctx.report_op("op.identity-output", v.op, f"output '{v.name}' is an identity of '{source}'")


def _arg_name(op: Op) -> str:
    x = op.inputs.get("x")
    return x.name if isinstance(x, Var) else "?"


def _scalar(op: Op, name: str) -> object | None:
    """The value of a scalar input (inline literal or const var), or None when it is not constant."""
    arg = op.inputs.get(name)
    lit = arg if isinstance(arg, Literal) else arg.const if isinstance(arg, Var) else None
    if lit is None or not isinstance(lit.value, np.ndarray) or lit.value.size != 1:
        return None
    return lit.value.reshape(()).item()


def _const_array(arg: object) -> np.ndarray | None:
    lit = arg if isinstance(arg, Literal) else arg.const if isinstance(arg, Var) else None
    if lit is None or not isinstance(lit.value, np.ndarray) or lit.value.dtype == object:
        return None
    return lit.value


@_on("gelu")
def _gelu(ctx: _Context, op: Op) -> None:
    if op.inputs.get("mode") is None:
        ctx.report_op("op.gelu-mode", op, "gelu without its mode argument")


@_on("cast")
def _cast(ctx: _Context, op: Op) -> None:
    dtype = _scalar(op, "dtype")
    if dtype in ("int32", "fp32", "fp16") or dtype is None:
        ctx.report_op("op.cast-m1-m2", op, f"cast to {dtype or 'another type'}")
    if dtype == "int32":
        ctx.report_op("op.cast-int32-m1", op, "cast to int32")


@_on("matmul", "scaled_dot_product_attention")
def _matmul_m1(ctx: _Context, op: Op) -> None:
    ctx.report_op("op.matmul-sdpa-m1", op, f"{op.op_type} (fails on M1 / M2 under macOS 26, in memory)")


@_on("softmax")
def _softmax(ctx: _Context, op: Op) -> None:
    shape = _tensor_shape(op.outputs[0])
    axis = _scalar(op, "axis")
    if shape is None or not isinstance(axis, int):
        return
    size = shape[axis % len(shape)]
    if size & (size - 1):
        ctx.report_op("op.softmax-axis-size", op, f"softmax over an axis of {size} (not a power of two)")


@_on("concat")
def _concat(ctx: _Context, op: Op) -> None:
    if op.inputs.get("interleave") is None:
        ctx.report_op("op.concat-interleave", op, "concat without its interleave argument")
    shape = _tensor_shape(op.outputs[0])
    axis = _scalar(op, "axis")
    if shape is None or not isinstance(axis, int):
        return
    axis = axis % len(shape)
    if axis not in (1, len(shape) - 1):
        ctx.report_op("op.concat-axis", op, f"concat on axis {axis} of a rank-{len(shape)} tensor")


@_on("scaled_dot_product_attention")
def _sdpa(ctx: _Context, op: Op) -> None:
    if op.inputs.get("attn_mask") is not None:
        ctx.report_op("op.sdpa-mask", op, "the attention mask would be ignored")


@_on("reduce_mean", "rsqrt")
def _reduce_mean_rsqrt(ctx: _Context, op: Op) -> None:
    ctx.report_op("op.reduce-mean-rsqrt", op, f"{op.op_type} (reported rejected)")


@_on("reduce_argmax", "reduce_argmin")
def _arg_axis(ctx: _Context, op: Op) -> None:
    x = op.inputs.get("x")
    shape = _tensor_shape(x) if isinstance(x, Var) else None
    axis = _scalar(op, "axis")
    if shape is None or not isinstance(axis, int) or not shape:
        return
    size = shape[axis % len(shape)]
    if ext.ARG_AXIS.broken_on(size):
        ctx.report_op("extent.arg-axis", op, f"{op.op_type} over an axis of {size} (> 2048)")


_PASS_THROUGH = ("add", "sub", "mul", "real_div", "cast")


@_on("sqrt", "rsqrt")
def _sqrt_after_reduce(ctx: _Context, op: Op) -> None:
    x = op.inputs.get("x")
    for _ in range(4):  # through a few elementwise steps (the eps add, a 1/N scale)
        if not isinstance(x, Var) or x.op is None:
            return
        if x.op.op_type.startswith("reduce_"):
            ctx.report_op("op.sqrt-after-reduce", op, f"{op.op_type} of the reduction '{x.op.name}'")
            return
        if x.op.op_type not in _PASS_THROUGH:
            return
        x = next((a for a in x.op.input_vars() if a.const is None), None)


@_on("reshape")
def _reshape_noop(ctx: _Context, op: Op) -> None:
    x = op.inputs.get("x")
    if not isinstance(x, Var):
        return
    shape = _tensor_shape(x)
    if shape is not None and shape == _tensor_shape(op.outputs[0]):
        ctx.report_op("op.reshape-noop", op, f"reshape of '{x.name}' to its own shape {list(shape)}")


@_on("matmul")
def _matmul(ctx: _Context, op: Op) -> None:
    for operand, flag in (("x", "transpose_x"), ("y", "transpose_y")):
        v = op.inputs.get(operand)
        if not isinstance(v, Var):
            continue
        if v.const is not None:
            ctx.report_op("op.matmul-const-weight", op, f"constant operand '{v.name}': use a 1x1 conv")
        if _scalar(op, flag) is not True:
            continue
        shape = _tensor_shape(v)
        # Attention's transposed products (probabilities, score gradients) are computed in the kernel, as
        # in maderix/ANE training/stories_mil.h; a weight comes from a const or straight from an input.
        if shape is not None and len(shape) >= 2 and min(shape[-2:]) > LARGE_OPERAND_DIM and _is_data(v):
            ctx.report_op(
                "op.transposed-weight-matmul",
                op,
                f"'{v.name}' {list(shape)}, a weight, is the transposed operand ({flag} = true)",
            )


_DATA_MOVEMENT = ("reshape", "slice_by_size", "slice_by_index", "transpose", "cast", "squeeze", "expand_dims")


def _is_data(v: Var) -> bool:
    """Whether ``v`` is a constant or a function input moved around without computing (a weight)."""
    while v.op is not None and v.op.op_type in _DATA_MOVEMENT:
        x = v.op.inputs.get("x")
        if not isinstance(x, Var):
            return False
        v = x
    return v.op is None or v.op.op_type.startswith(("const", "constexpr_"))


@_on("conv")
def _conv(ctx: _Context, op: Op) -> None:
    x, weight = op.inputs.get("x"), op.inputs.get("weight")
    shape = _tensor_shape(x) if isinstance(x, Var) else None
    if shape is None or len(shape) < 2:
        return
    channels = shape[1]
    if channels >= REFUSED_CONV_INPUT:
        ctx.report_op("conv.input-channels-refused", op, f"{channels} input channels")
    elif channels > MAX_PROVEN_CONV_INPUT:
        ctx.report_op(
            "conv.input-channels-unproven", op, f"{channels} input channels (> {MAX_PROVEN_CONV_INPUT})"
        )
    w_shape = _tensor_shape(weight) if isinstance(weight, Var) else None
    if w_shape is not None and len(w_shape) >= 3:
        fp16 = any(
            isinstance(v, Var) and isinstance(v.type, T.TensorType) and v.type.dtype.name == "fp16"
            for v in (x, weight)
        )
        extent = ext.CONV_KERNEL_WIDTH_FP16 if fp16 else ext.CONV_KERNEL_WIDTH
        broken = extent.broken_on(w_shape[-1])
        if broken:
            ctx.report_op(
                "extent.conv-kernel-width",
                op,
                f"{'fp16 ' if fp16 else ''}kernel width {w_shape[-1]} (> {extent.limit(ctx.chip)})",
                broken_on=broken,
            )
    out = _tensor_shape(op.outputs[0])
    if (out is not None and len(out) >= 2 and out[1] != 512) or channels != 512:
        ctx.report_op(
            "conv.channels-512-m3", op, f"{channels} -> {out[1] if out else '?'} channels (not 512)"
        )
    if isinstance(weight, Var) and not _is_constant(weight) and shape[0] >= 2:
        ctx.report_op("op.dynamic-conv-batch-m1", op, f"a run-time weight at batch {shape[0]}")


_NONLINEAR = frozenset(
    {"sigmoid", "tanh", "relu", "gelu", "silu", "exp", "log", "softplus", "softsign", "elu", "sqrt", "rsqrt"}
)


@_on("square")
def _square_then_activation(ctx: _Context, op: Op) -> None:
    shape = _tensor_shape(op.outputs[0])
    if not shape or shape[-1] % 128 <= 64:
        return
    followers = [u.op_type for u in ctx.fn.ops if op.outputs[0] in u.input_vars()]
    if any(t in _NONLINEAR for t in followers):
        ctx.report_op(
            "op.square-activation-width-m5",
            op,
            f"square at width {shape[-1]} ({shape[-1]} % 128 > 64) feeds a nonlinearity: write mul(x, x)",
        )


@_on("layer_norm")
def _layer_norm_affine(ctx: _Context, op: Op) -> None:
    gamma, beta = op.inputs.get("gamma"), op.inputs.get("beta")
    live = [n for n, arg, one in (("gamma", gamma, 1.0), ("beta", beta, 0.0)) if _affine_live(ctx, arg, one)]
    if len(live) == 1:
        ctx.report_op("op.layer-norm-one-affine", op, f"only {live[0]} is live (the other folds away)")


@_on("add")
def _normalized_affine(ctx: _Context, op: Op) -> None:
    """The same rule on a layer norm written out: add(mul(normalised, gamma), beta), both constants."""
    scaled, beta = op.inputs.get("x"), op.inputs.get("y")
    if (
        not isinstance(scaled, Var)
        or scaled.op is None
        or scaled.op.op_type != "mul"
        or not _is_constant(beta)
    ):
        return
    pair = [scaled.op.inputs.get("x"), scaled.op.inputs.get("y")]
    gamma = next((v for v in pair if isinstance(v, Var) and _is_constant(v)), None)
    normalized = next((v for v in pair if v is not gamma), None)
    if gamma is None or not isinstance(normalized, Var) or not _normalized(normalized):
        return
    live = [n for n, arg, one in (("gamma", gamma, 1.0), ("beta", beta, 0.0)) if _affine_live(ctx, arg, one)]
    if len(live) == 1:
        ctx.report_op("op.layer-norm-one-affine", op, f"only {live[0]} is live (the other folds away)")


def _normalized(v: Var) -> bool:
    """Whether ``v`` = mul(x - mean, rsqrt / pow(-0.5) of a variance): a layer norm's normalised value."""
    op = v.op
    if op is None or op.op_type not in ("mul", "real_div"):
        return False
    roots = ("rsqrt", "pow", "sqrt")
    return any(isinstance(a, Var) and a.op is not None and a.op.op_type in roots for a in op.input_vars())


def _affine_live(ctx: _Context, arg: object, identity: float) -> bool:
    """Whether an affine term survives compilation: given and not all ``identity``. A term whose values
    are unknown (a BLOBFILE without its file) counts as live."""
    if arg is None:
        return False
    values = _const_array(arg)
    if values is None and isinstance(arg, Var):
        values = _blob_values(ctx, _constant_source(arg))
    if values is None:
        return True
    return not np.all(np.asarray(values, np.float64) == identity)


def _blob_values(ctx: _Context, v: Var) -> np.ndarray | None:
    """The values of a BLOBFILE const from the weight files given, or None."""
    if v.op is None or v.op.op_type != "const":
        return None
    val = v.op.attributes.get("val")
    if not isinstance(val, Literal) or not isinstance(val.value, BlobRef):
        return None
    data = _weight_bytes(ctx.weights, val.value.path)
    if data is None:
        return None
    try:
        return np.array(BlobFile(data).read(val.value.offset))
    except AnekitError:
        return None


@_on("matmul")
def _matmul_depth(ctx: _Context, op: Op) -> None:
    for operand in ("x", "y"):
        v = op.inputs.get(operand)
        if not isinstance(v, Var):
            continue
        shape = _tensor_shape(v)
        if shape is not None and len(shape) >= 5 and shape[-3] > 1:
            ctx.report_op("op.matmul-depth", op, f"'{v.name}' {list(shape)} has depth {shape[-3]}")


def _constant_source(v: Var) -> Var:
    """The const a constant ``v`` was moved from (through reshapes and transposes)."""
    while v.op is not None and v.op.op_type in _DATA_MOVEMENT and isinstance(x := v.op.inputs.get("x"), Var):
        v = x
    return v


def _is_constant(v: object) -> bool:
    """Whether ``v`` is a constant, possibly moved around (reshaped, transposed) without computing."""
    if not isinstance(v, Var):
        return False
    while v.op is not None and v.op.op_type in _DATA_MOVEMENT:
        x = v.op.inputs.get("x")
        if not isinstance(x, Var):
            return False
        v = x
    return v.op is not None and v.op.op_type.startswith(("const", "constexpr_"))


@_on("reduce_sum", "reduce_sum_square")
def _sum_of_squares(ctx: _Context, op: Op) -> None:
    out = op.outputs[0]
    if not isinstance(out.type, T.TensorType) or out.type.dtype.name != "fp16":
        return
    x = op.inputs.get("x")
    if not isinstance(x, Var):
        return
    in_shape, out_shape = _tensor_shape(x), _tensor_shape(out)
    if in_shape is None or out_shape is None:
        return
    count = math.prod(in_shape) // max(1, math.prod(out_shape))  # elements summed into each result
    if count < SUM_OF_SQUARES_MIN_TERMS:  # overflows only once RMS > sqrt(65504 / count) >= 16
        return
    base = x if op.op_type == "reduce_sum_square" else _squared(x)
    if base is None:
        return
    if _max_normalized(base) and count <= FP16_MAX:  # |base| <= 1: the sum is at most count
        return
    scale = _prescale(base)
    if scale is None or scale * scale * count > 1.0 + 1e-3:  # room for the scale rounded to fp16
        bound = math.sqrt(FP16_MAX / count)
        ctx.report_op(
            "numerics.fp16-sum-of-squares",
            op,
            f"sum of {count} fp16 squares overflows once RMS > {bound:.3g}: scale by <= 1/sqrt({count})",
        )


def _max_normalized(v: Var) -> bool:
    """Whether ``v`` = real_div(a, m) with m = reduce_max(abs(a)) (possibly through maximum with a
    positive constant floor): every |v| <= 1."""
    op = v.op
    if op is None or op.op_type != "real_div":
        return False
    a, m = op.inputs.get("x"), op.inputs.get("y")
    if not isinstance(a, Var) or not isinstance(m, Var) or m.op is None:
        return False
    if m.op.op_type == "maximum":  # a floor: maximum(reduce_max(...), c) with c > 0
        operands = [(x, _const_array(x)) for x in m.op.input_vars()]
        inner = [x for x, c in operands if c is None]
        floor = [c for _, c in operands if c is not None]
        if len(inner) != 1 or not floor or float(np.min(floor[0])) <= 0:
            return False
        m = inner[0]
    peak = m.op
    if peak is None or peak.op_type != "reduce_max":
        return False
    absolute = peak.inputs.get("x")
    return (
        isinstance(absolute, Var)
        and absolute.op is not None
        and absolute.op.op_type == "abs"
        and absolute.op.inputs.get("x") is a
    )


def _squared(v: Var) -> Var | None:
    """``a`` when ``v`` is a*a (mul of a var by itself, square, or pow(a, 2)), else None."""
    op = v.op
    if op is None:
        return None
    x = op.inputs.get("x")
    if op.op_type == "mul":
        y = op.inputs.get("y")
        if isinstance(x, Var) and isinstance(y, Var) and _same_value(x, y):
            return x
    if op.op_type == "square" and isinstance(x, Var):
        return x
    if op.op_type == "pow" and _scalar(op, "y") == 2 and isinstance(x, Var):
        return x
    return None


def _same_value(a: Var, b: Var) -> bool:
    """Whether two vars hold the same value: one var, or one op applied twice to the same arguments."""
    if a is b:
        return True
    if (
        a.op is None
        or b.op is None
        or a.op.op_type != b.op.op_type
        or a.op.inputs.keys() != b.op.inputs.keys()
    ):
        return False
    for name, x in a.op.inputs.items():
        y = b.op.inputs[name]
        if isinstance(x, Var) and isinstance(y, Var):
            cx, cy = _const_array(x), _const_array(y)
            same = x is y or (cx is not None and cy is not None and np.array_equal(cx, cy))
        else:
            same = x == y
        if not same:
            return False
    return True


def _prescale(v: Var) -> float | None:
    """|c| when ``v`` = mul(a, c) (or real_div(a, 1/c)) by a constant scalar c, else None."""
    op = v.op
    if op is None:
        return None
    if op.op_type == "mul":
        for name in ("x", "y"):
            c = _const_array(op.inputs.get(name))
            if c is not None and c.size == 1:
                return abs(float(c.reshape(())))
    if op.op_type == "real_div":
        c = _const_array(op.inputs.get("y"))
        if c is not None and c.size == 1 and float(c.reshape(())) != 0:
            return abs(1.0 / float(c.reshape(())))
    return None


@_on("const")
def _blobfile(ctx: _Context, op: Op) -> None:
    val = op.attributes.get("val")
    if not isinstance(val, Literal) or not isinstance(val.value, BlobRef):
        return
    ref = val.value
    name = ref.path.rsplit("/", 1)[-1]
    if reserved_weight_name(ref.path) is not None:
        ctx.report_op("weights.reserved-name", op, f"weight file '{ref.path}' collides with a framework file")
    if ref.offset != 64:
        ctx.report_op("weights.one-blob-per-file-m1", op, f"{name} referred to at offset {ref.offset}")
    if ref.offset < 64 or ref.offset % 64:
        ctx.report_op(
            "weights.blobfile-offset", op, f"offset {ref.offset} is not a 64-aligned metadata record offset"
        )
        return
    data = _weight_bytes(ctx.weights, ref.path)
    if data is None:
        return
    if ref.offset + 8 > len(data):
        ctx.report_op(
            "weights.blobfile-offset", op, f"offset {ref.offset} is past the end of {name} ({len(data)} B)"
        )
        return
    sentinel = struct.unpack_from("<I", data, ref.offset)[0]
    if sentinel != BLOB_SENTINEL:
        ctx.report_op(
            "weights.blobfile-offset",
            op,
            f"offset {ref.offset} of {name} holds {sentinel:#010x}, not a metadata record (0xdeadbeef)",
        )


def _weight_bytes(weights: WeightFiles | None, path: str) -> bytes | bytearray | memoryview | None:
    if not weights or path not in weights:
        return None
    source = weights[path]
    if isinstance(source, (bytes, bytearray, memoryview)):
        return source
    try:
        return Path(source).read_bytes()
    except OSError:
        return None


# -- surfaces and weight names --------------------------------------------------------------------


def check_surface_plan(
    inputs: Sequence[tuple[str, int]], outputs: Sequence[tuple[str, int]], chip: str = "any"
) -> list[Finding]:
    """Judge the surfaces a backend will bind on the in-memory route: ``[(MIL name, allocation bytes)]``
    per direction, in the order they are bound. Sizes must be equal within a direction, and the order
    alphabetical by name."""
    check_chip(chip)
    found = []
    for direction, plan in (("input", inputs), ("output", outputs)):
        sizes = {size for _, size in plan}
        if len(sizes) > 1:
            r = rule(f"surface.uniform-{direction}-size")
            listing = ", ".join(f"{n}: {s}" for n, s in plan)
            found.append(
                Finding(r, f"{direction} surfaces", f"allocation sizes differ ({listing})", chip=chip)
            )
        names = [n for n, _ in plan]
        if names != sorted(names):
            r = rule("surface.bind-alphabetical")
            found.append(
                Finding(
                    r,
                    f"{direction} surfaces",
                    f"bound as {names}, the engine binds {sorted(names)}",
                    chip=chip,
                )
            )
    return [f for f in found if f.rule.applies_to(chip, "direct")]


def check_package(weight_bytes: int, where: str, chip: str = "any") -> list[Finding]:
    """Package-scope rules: ``package.shard-size`` (weights over ~250 MB do not compile for the engine)."""
    check_chip(chip)
    r = rule("package.shard-size")
    if weight_bytes <= SHARD_WEIGHT_BYTES or not r.applies_to(chip, "coreml"):
        return []
    mb = weight_bytes / 1e6
    message = f"{mb:.0f} MB of weights (> {SHARD_WEIGHT_BYTES // 10**6} MB): shard it"
    return [Finding(r, where, message, chip=chip, route="coreml")]


def check_weight_names(names: Iterable[str]) -> list[Finding]:
    """Weight files whose names collide with files the framework writes (``weights.reserved-name``)."""
    r = rule("weights.reserved-name")
    found = []
    for path in names:
        clash = reserved_weight_name(path)
        if clash is not None:
            found.append(Finding(r, f"weight '{path}'", f"'{clash}' is a file of the model directory"))
    return found


def iter_rules_checked() -> Iterator[str]:
    """Rule ids that ``check_program`` can report (for the README table and tests)."""
    yield from (
        "io.rank4-batch1",
        "surface.spatial-multiple-16",
        "surface.min-row-bytes",
        "surface.global-over-16mb",
        "surface.max-outputs",
        "tensor.channels-multiple-64",
        "extent.rank",
        "extent.spatial",
        "extent.channels",
        "extent.arg-axis",
        "extent.conv-kernel-width",
        "conv.channels-512-m3",
        "op.square-activation-width-m5",
        "op.layer-norm-one-affine",
        "op.matmul-depth",
        "op.dynamic-conv-batch-m1",
        "op.no-engine-path",
        "op.off-engine",
        "op.from-m2",
        "op.from-m3",
        "op.m1-software-fallback",
        "op.bridge-only",
        "op.curated-path-only",
        "op.cast-int32-m1",
        "op.identity-output",
        "op.identity-alone",
        "op.cast-m1-m2",
        "op.matmul-sdpa-m1",
        "op.softmax-axis-size",
        "op.gelu-mode",
        "op.concat-interleave",
        "op.concat-axis",
        "op.sdpa-mask",
        "op.reduce-mean-rsqrt",
        "op.sqrt-after-reduce",
        "op.reshape-noop",
        "op.transposed-weight-matmul",
        "op.matmul-const-weight",
        "conv.input-channels-refused",
        "conv.input-channels-unproven",
        "numerics.fp16-sum-of-squares",
        "weights.blobfile-offset",
        "weights.reserved-name",
        "weights.one-blob-per-file-m1",
        "dialect.m1-m2",
    )


def iter_package_rules_checked() -> Iterator[str]:
    """Rule ids that ``check_package`` can report."""
    yield "package.shard-size"
