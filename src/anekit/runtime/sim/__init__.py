"""The simulator backend: runs any verified MIL program with ANE numerics, on any machine.

Compiling builds an execution plan once: the program is verified, BLOBFILE consts are read through
the blob reader and checked against their declared type, every op whose inputs are all constant
(``const``, ``constexpr_*`` and anything computed only from them) is folded, and the remaining ops
become a list of steps over numbered value slots. Each step is bound to a runner: for the frequent ops
one made by ``runtime.sim.fast`` (the reference's own numpy calls, its constant parameters read once),
else ``run_step``; a value-moving step read only by a reshape runs together with it. Running fills the
input slots from the input surfaces and runs the steps, letting go of each value after its last reader.
Either way every stored value is the one ``run_step`` stores, bit for bit and in the same memory layout
(tests/test_sim_fast_runners.py).

Numerics (DESIGN.md "Numerics"), precision ``"ane"`` (the default): every value is stored in its
declared dtype — fp16 values are rounded to nearest even after every op and overflow to inf, bf16
likewise — while ops compute on float32 operands, so matmul / conv / reductions accumulate in fp32.
On top of that the chip's numeric profile applies (``numerics="engine"``, the default; the profile of
``chip``, "any" the conservative union): ``runtime.sim.numerics`` wraps each step's runner with what
the engine does differently (the MAC port's 2^15 ceiling, NaN coercion and indeterminate forms to +0,
subnormal flushes, the width-offset slice gain, tie rounding, activation tables), and its sanitizer counts
where that departs from the ideal machine. ``numerics="ieee"`` is the ideal machine alone.
Precision ``"fp32"`` keeps every float value in float32 (no fp16 rounding between ops): the exact
reference path for comparisons with float32 tools. Op meaning comes from the op registry's numpy
references; nothing here redefines an op.

Column-lazy runs: a kernel told that its caller reads only its first output columns
(``SimKernel.compute_columns``; the generation runners do) runs a copy of its program narrowed to fewer
columns where the narrowed run gives those columns the same bits — which ``runtime.sim.columns`` measures
once per kernel, on float32 products; the columns not computed hold NaN. The copy is the program's own
when every op keeps each column apart; a program that attends over its own chunk after a cache (a fused
layers kernel, an attention kernel) gets its copies from its caller, who vouches that the padding columns
are masked (``SimKernel.causal``). ``SimBackend(lazy_columns=False)`` computes every column. A program
shaped as a decode kernel at most 32 columns wide sums in one fixed order (``runtime.sim.ordered``: its
convs, matmuls, softmax sums and one-axis reductions, ascending), with or without lazy runs, so that a
column's sums depend neither on how many columns run nor on the masked keys a copy drops. A dynamic
kernel (its weights in its input's columns after its activations) is such a program too; its copies read
the kernel's own input.

Kept steps (``runtime.sim.kept``): the steps that only move elements of columns of an input that did not
change since the last run (a dynamic kernel's weight columns, written once) are not run again: the arrays
they made are handed to the next run, read-only. A held surface's block writes and a mirror's refreshes
say which columns changed.

Strictness: by default compiling refuses, with ``CompilationFailed`` naming the rule, a program that
breaks an ``error`` rule of the rule book (``anekit.rules``) for the target ``chip`` ("any": every
chip) — what the engine would refuse or compute wrongly — so a program that passes here has a fair
chance on a Mac. ``strict=False`` (or ``ANEKIT_STRICT=0`` in the environment) runs anything, for
exploring ops and shapes the engine may not take.

One module per job, each importing only those listed above it:

    heap          glibc's heap kept between runs (no page faults for each run's arrays)
    sanitizer     the per-op record of where a chip's numerics depart from the ideal machine
    chip          the chip binding: a chip name resolved once to the numerics it computes with
    mac           the multiply-accumulate unit modelled (tie rules, 4-lane first stage, port ceiling)
    tables        the ops a chip's profile computes itself (activation tables, reciprocals, round, ...)
    numerics      ``EngineNumerics``: a chip's numerics bound to the steps of one plan
    store         how a value is held between ops (its declared dtype, the engine's rounding)
    columns       column-lazy runs: a function narrowed to the columns its caller reads, measured
    ordered       the sums of a decode-shaped program, each taken in one fixed order
    fast          pre-bound runners for the frequent ops (the references' own numpy calls)
    steps         ``Step``, ``run_step`` and the runner each step is bound to
    engine_steps  steps under a chip's profile
    kept          the moves of an input's unchanged columns, kept between runs
    weights       the weight files a program refers to, opened once
    plan          ``Plan``: a compiled function, its steps over numbered value slots
    mirror        a large fp16 input surface kept decoded between runs
    held          an input surface whose float32 values are held beside its bits, written by blocks
    kernel        ``SimKernel``: a plan behind surfaces
    backend       ``SimBackend``: the options, then compile -> kernel
"""

from __future__ import annotations

from anekit.runtime.sim.backend import NUMERICS, PRECISIONS, SimBackend
from anekit.runtime.sim.kernel import SimKernel
from anekit.runtime.sim.plan import Plan
from anekit.runtime.sim.sanitizer import HAZARDS, Sanitizer
from anekit.runtime.sim.steps import Step, run_step

__all__ = [
    "HAZARDS",
    "NUMERICS",
    "PRECISIONS",
    "Plan",
    "Sanitizer",
    "SimBackend",
    "SimKernel",
    "Step",
    "run_step",
]
