"""The op tables of the rule book: ops with no engine path, ops gated by generation, ops the M1 only
reaches through a software fallback, and ops that exist only inside a graph — read off the
operation-by-device matrix (``anekit.engine.op_matrix``) and weighed as rules.

The matrix was measured on M1, M2 and M5 silicon and predicted from decompiled per-chip tables for M3
and M4, through the e5rt runtime; the in-memory route calls the same compiler, so each rule's evidence
covers both compiled routes (``direct`` and ``e5rt``). On the CoreML route an op the engine cannot run
is placed on the CPU or GPU by the framework's segmenter instead of refused (``op.off-engine``).
"""

from __future__ import annotations

from anekit.engine.chips import GENERATIONS
from anekit.engine.evidence import COMPILED, COREML, Evidence
from anekit.engine.op_matrix import MATRIX, SOURCE, marks
from anekit.engine.rule import Rule
from anekit.engine.sources import FORGE, GUIDE_SURFACE, LAWS

MEASURED_CHIPS = ("m1", "m2", "m5")  # the matrix's columns measured on silicon
PREDICTED_CHIPS = ("m3", "m4")  # decompile-derived
FORGE_CATALOG = f"{FORGE} docs/op-catalog.md (187 ops x device ladder, grounded in live M1 probes)"
# Ops folded or inlined by the compiler: never judged as standalone operations.
FOLDED = frozenset({"const", "call", "cond", "while_loop"})


def _with(pattern: str) -> tuple[str, ...]:
    """The ops whose marks (M1, M2, M3, M4/M5) match ``pattern`` exactly."""
    return tuple(op for op, (m, _) in MATRIX.items() if m == pattern and op not in FOLDED)


NO_PATH = _with("XXXX")
FROM_M2 = _with("GNNN")  # family-gated: no path on the M1
FROM_M3_GATED = ("sin", "cos", "reduce_argmin", "random_uniform")  # GGNN, and BBNN on the MIL route
M1_FALLBACK = _with("BNNN")  # the M1 reaches them only through a software path
BRIDGE_ONLY = tuple(op for op in _with("BBBB") if not op.startswith("constexpr_"))


def _matrix(ops: tuple[str, ...], observed: str, chips: tuple[str, ...]) -> tuple[Evidence, ...]:
    measured = tuple(c for c in chips if c in MEASURED_CHIPS)
    predicted = tuple(c for c in chips if c in PREDICTED_CHIPS)
    out = []
    if measured:
        out.append(Evidence(SOURCE, "measured", observed, measured, COMPILED))
    if predicted:
        out.append(Evidence(SOURCE, "decompile-derived", f"{observed} (predicted)", predicted, COMPILED))
    return tuple(out)


def _listing(ops: tuple[str, ...]) -> str:
    return ", ".join(ops)


OP_RULES: tuple[Rule, ...] = (
    Rule(
        "op.no-engine-path",
        f"These ops have no engine path on any generation; the compiler rejects them: {_listing(NO_PATH)}. "
        "Decompose them on the host (the matrix's note for each says how).",
        "op",
        "refused",
        (
            *_matrix(NO_PATH, "'No path: rejected on every family from the M1 through the M5'", GENERATIONS),
            Evidence(
                FORGE_CATALOG,
                "decompile-derived",
                "marked N (walled) on every device: reduce_prod, mod, logical_and/or/xor, tan, asin, acos, "
                "atanh, sinh, cosh, shape, one_hot, scatter, ...",
                routes=COMPILED,
            ),
        ),
        checked_by="anekit.rules.checks (ops of the matrix marked X on every family)",
    ),
    Rule(
        "op.off-engine",
        "On the CoreML route an op with no engine path (op.no-engine-path) is placed on the CPU or GPU: the "
        "program splits into engine and host segments around it.",
        "op",
        "falls back",
        (
            Evidence(
                f"{GUIDE_SURFACE}; sbryngelson/ane-guide part-2-reaching/05-software-stack.md, 'Placement "
                "segmenter'",
                "decompile-derived",
                "'An operation the engine cannot accept has no engine node in the cost graph' and is routed "
                "through the central or graphics processor",
                routes=COREML,
            ),
            Evidence(f"{LAWS} law 6", "seed law", "compiling is not proof of placement", routes=COREML),
        ),
        checked_by="anekit.rules.checks (CoreML route)",
    ),
    Rule(
        "op.from-m2",
        f"These ops need the M2's texture engine or its rank and sort unit; the M1 rejects them: "
        f"{_listing(FROM_M2)}.",
        "op",
        "refused",
        _matrix(FROM_M2, "'Family-gated': no path on the M1, native from the M2", ("m1",)),
        chips=("m1",),
    ),
    Rule(
        "op.from-m3",
        f"These ops run on the engine only from the M3 (on the MIL route): {_listing(FROM_M3_GATED)}; the M1 "
        "and M2 compute them on the host (sin, cos: a host polynomial) or reach them only through the "
        "netplist bridge (reduce_argmin).",
        "op",
        "refused",
        _matrix(FROM_M3_GATED, "no path on the M1 and M2 on the MIL route, native from the M3", ("m1", "m2")),
        chips=("m1", "m2"),
    ),
    Rule(
        "op.m1-software-fallback",
        f"On the M1 these ops take a software path (the texture engine arrives with the M2), with different "
        f"rounding and a narrower envelope: {_listing(M1_FALLBACK)}.",
        "op",
        "falls back",
        _matrix(M1_FALLBACK, "'Bridge' on the M1 (software fallback), native from the M2", ("m1",)),
        chips=("m1",),
    ),
    Rule(
        "op.bridge-only",
        "Ops the compiler only reaches inside a graph (folded into a neighbour, or compiler-internal), never "
        f"as a standalone code-generated operation: {_listing(BRIDGE_ONLY)}. A program of nothing but such "
        "ops has no precedent.",
        "op",
        "no precedent",
        _matrix(BRIDGE_ONLY, "'Bridge': never a standalone code-generated operation", GENERATIONS),
        checked_by="anekit.rules.checks (functions whose only computing ops are bridge ops)",
    ),
    Rule(
        "op.cast-int32-m1",
        "The M1 rejects a cast to int32 (fp16 <-> fp32 and bool casts are native).",
        "op",
        "refused",
        (
            Evidence(
                f"{SOURCE}, 'Quantization and dtype' (cast); {GUIDE_SURFACE}, 'Type limits'",
                "measured",
                "'The compiler rejects a cast to int32 on the M1'",
                ("m1",),
                COMPILED,
            ),
        ),
        chips=("m1",),
    ),
)


def gate(op_type: str) -> dict[str, str] | None:
    """The op's marks per generation (see ``anekit.engine.op_matrix``), None when the matrix lacks it."""
    return marks(op_type)


def native_on(op_type: str, chip: str) -> bool:
    """Whether the matrix marks the op native on ``chip`` (a generation)."""
    m = marks(op_type)
    return m is not None and m[chip] == "N"
