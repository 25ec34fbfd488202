"""The op tables of the rule book: ops with no engine path, ops gated by generation, ops the M1 only
reaches through a software fallback, and ops that exist only inside a graph — read off the
operation-by-device matrix (``anekit.engine.op_matrix``) and weighed as rules.

The matrix was measured on M1, M2 and M5 silicon and predicted from decompiled per-chip tables for M3
and M4, through the e5rt runtime; the in-memory route calls the same compiler, so each rule's evidence
covers both compiled routes (``direct`` and ``e5rt``). On the CoreML route an op the engine cannot run
is placed on the CPU or GPU by the framework's segmenter instead of refused (``op.off-engine``).

Where the matrix and a hardware sweep of single ops disagree, the sweep's records are weighed with it:
ANEForge's M5 vocabulary sweep (each op compiled alone through e5rt, recorded in its capability census)
refuses ``cumsum``, which the matrix marks native only "through a curated runtime path, not the standard
compile path" (``op.curated-path-only``), and runs ``sin`` and ``cos``, which the matrix gates to the M3
(``op.from-m3`` speaks of the M1 and M2 only). Its refusal of ``identity`` alone is ``op.identity-alone``
in ``anekit.engine.book``.
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
# ANEForge's capability census: each op's entry records its M5 vocabulary sweep result (evidence
# "docs/full_mil_vocabulary_sweep.json (klass=...)"; the walls it records name the M5: "fails ANECCompile
# (ane_e5rt_program_compile, mask=0x4) on M5").
FORGE_CENSUS = f"{FORGE} docs/capabilities.json (commit 067717a)"
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
# Marked native, but only "through a curated runtime path, not the standard compile path" (the matrix's
# note): the MIL op itself has no implementation on the engine's backend.
CURATED_PATH_ONLY = ("cumsum",)


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
        (
            *_matrix(
                FROM_M3_GATED, "no path on the M1 and M2 on the MIL route, native from the M3", ("m1", "m2")
            ),
            Evidence(
                f"{FORGE_CATALOG}, rows 'sin', 'cos'",
                "measured",
                "'F4 trig, native A15+ only (REJECTED on M1/A14 - silicon-measured)'",
                ("m1", "m2"),
                COMPILED,
            ),
        ),
        chips=("m1", "m2"),
        decision="Where it does not apply: sin and cos compiled and ran alone on the M5 in ANEForge's "
        f"vocabulary sweep ({FORGE_CENSUS}, entries 'sin', 'cos': fused, verified on silicon; relerr 5e-4 "
        "and 5.6e-4), and the matrix predicts them native on the M3 and M4: the rule speaks of the M1 and "
        "M2 only, so a program of sin or cos alone lints clean from the M3 on and is an error on the M1 and "
        'M2 (for no chip in particular, "any", a warning naming those two).',
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
        "op.curated-path-only",
        f"These ops reach the engine only through a curated runtime path that rewrites them into other ops; "
        f"the MIL op itself has no implementation on the engine's backend, so a program handing it to the "
        f"compiler is refused: {_listing(CURATED_PATH_ONLY)}. Write a prefix sum as a matmul by an "
        "upper-triangular matrix of ones (what the curated path runs).",
        "op",
        "refused",
        (
            Evidence(
                f"{FORGE_CENSUS}, entry 'cumsum' (arch-gated-negative, negative-confirmed)",
                "measured",
                "'the native MIL cumsum op is unimplemented on the ANE backend - a native-op gap ... The "
                "prefix-sum capability is reachable on the same e5rt path via an upper-triangular ones "
                "matmul (x @ U; relerr ~3e-4)'; the census's other unimplemented ops fail alone in the M5 "
                "sweep ('ane_e5rt_program_compile fails, mask=0x4') and point to 'the curated reduce_prod/"
                "gather/cumsum entries'",
                ("m5",),
                COMPILED,
            ),
            Evidence(
                f"{FORGE_CATALOG}, row 'cumsum'",
                "reported",
                "'The standard MIL cumsum op is unimplemented, so it is reached via the curated e5rt path' "
                "(the curated path verified on the M1: 'cos 1.0')",
                routes=COMPILED,
            ),
            Evidence(
                f"{SOURCE}, row 'cumsum'; sbryngelson/ane-guide appendices/f-provenance.md",
                "reported",
                "'Native through a curated runtime path, not the standard compile path; M1 measured'; 'The "
                "cumsum result is M1/H13 measured through the curated runtime path, correcting the earlier "
                "no-path status'",
                ("m1",),
                COMPILED,
            ),
        ),
        checked_by="anekit.rules.checks (ops the matrix marks native only through a curated path)",
        decision="The matrix's Native mark for cumsum is a run of the curated path (by ANEForge's census "
        "a matmul by a triangular matrix of ones), not of the MIL op: no hardware-run program hands the op "
        "to the compiler and runs, and ANEForge's census records the op itself refused. Measured on the "
        "M5 and not contradicted on the compiled routes, it is an error on every chip (the backend is the "
        "same code on every chip: ANEForge calls it 'a native-op gap, NOT a ... hardware wall'); on the "
        "CoreML route the converter's own lowering decides, and the rule does not speak of it.",
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
