"""Which generation route each chip and macOS major gets, chosen from the hardware runs of its constructs.

A generation route is how the prefill and decode kernels are cut: the four construct choices of
``anekit.kernels.route.KernelRoute`` (weights, attention, norm, rope; plain strings here, the engine layer
sits below the kernels), whether the layers are fused several per kernel, and the constructs its kernels
use. The candidates, in order of preference (fastest first):

- ``baked-fused``: baked weights, every layer of a kernel fused (norm, attention with the cache read
  in-kernel, MLP), RoPE as slice + concat: the fewest dispatches a token (``anekit.engine.generation``'s
  fused-dispatch fact);
- ``baked-fused-rope-matmul``: the same with RoPE's pair swap as a matmul by a constant permutation
  (rustane pull request #9, the form that ran on the M3 Ultra);
- ``dynamic-engine-attention``: weights in the input surface (written once, not per token), RMSNorm on the
  host, so one kernel per block (attention, MLP) with the cache read in-kernel;
- ``conv-host-attention``: the projections and the MLP as baked 1x1 convs at the generation width, RoPE and
  attention on the host over a host-memory cache (no matmul anywhere: M1 / M2).

Chip ``any`` (the simulator with no chip named) gets ``legacy``: the kernels anekit built before routes
existed (baked weights, everything on the engine, the swap conv), fused, with no precedent asked.

``generation_route(chip, macos="", extra=None)`` takes the first candidate every one of whose constructs
has precedent "ran" or "nearest" (``anekit.engine.constructs.precedent``), the policy of
``anekit.engine.training_routes``; ``extra`` is a Mac's report by construct id, so a report moves a chip
from one route to another without a code change. ``markdown_table()`` prints the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from anekit.engine.chips import ANY, GENERATIONS
from anekit.engine.constructs import MACOS_MAJORS, Precedent, check_chip, check_extra, macos_major, precedent
from anekit.engine.evidence import Evidence
from anekit.engine.training_routes import shipped
from anekit.errors import AnekitError

LEGACY_ID = "legacy"
NO_ROUTE = "none"  # the table's word for a chip and macOS no candidate runs on
TABLE_CHIPS = (*GENERATIONS, ANY)
TABLE_MACOS = (*MACOS_MAJORS, "")


class NoGenerationRoute(AnekitError, LookupError):
    """No candidate generation route has a precedent for every one of its constructs on the chip."""

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownGenerationRoute(AnekitError, KeyError):
    """A generation route id that is not one of ROUTE_IDS."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class GenerationCandidate:
    """A generation route before a chip is named: its id, its four choices, fusion and constructs."""

    id: str
    weights: str
    attention: str
    norm: str
    rope: str
    fused: bool  # several layers per kernel (False: one kernel per block, or per projection)
    constructs: tuple[str, ...]
    summary: str


@dataclass(frozen=True)
class GenerationRoute:
    """The generation route a chip and macOS get: the candidate's choices, and why (with evidence)."""

    id: str
    weights: str  # "baked" or "dynamic"
    attention: str  # "engine" or "host"
    norm: str  # "engine" or "host"
    rope: str  # "conv", "slice", "matmul" or "host"
    fused: bool
    constructs: tuple[str, ...]
    chip: str
    macos: str  # a major, or "" for every major in MACOS_MAJORS
    why: str  # one line
    evidence: tuple[Evidence, ...]  # the chosen route's evidence, then the skipped candidates' blockers'

    @property
    def kernel_route(self) -> tuple[str, str, str, str]:
        """The four strings of ``anekit.kernels.route.KernelRoute`` (weights, attention, norm, rope)."""
        return (self.weights, self.attention, self.norm, self.rope)

    def sources(self) -> tuple[str, ...]:
        """The sources of its evidence, each once."""
        return tuple(dict.fromkeys(e.source for e in self.evidence))

    def describe(self) -> str:
        """``weights baked, attention engine, norm engine, rope slice, fused`` style."""
        fused = "fused" if self.fused else "one kernel per block"
        return (
            f"weights {self.weights}, attention {self.attention}, norm {self.norm}, rope {self.rope}, {fused}"
        )


_FUSED = ("conv.baked", "rmsnorm.plain", "matmul.activations", "softmax.scores")
CANDIDATES = (
    GenerationCandidate(
        "baked-fused",
        "baked",
        "engine",
        "engine",
        "slice",
        True,
        (*_FUSED, "rope.slice-concat", "gate.silu"),
        "baked convs, layers fused per kernel, the cache read in-kernel",
    ),
    GenerationCandidate(
        "baked-fused-rope-matmul",
        "baked",
        "engine",
        "engine",
        "matmul",
        True,
        (*_FUSED, "rope.permutation-matmul", "gate.silu"),
        "the same, RoPE as a permutation matmul",
    ),
    GenerationCandidate(
        "dynamic-engine-attention",
        "dynamic",
        "engine",
        "host",
        "slice",
        False,
        ("matmul.dynamic-weights", "matmul.activations", "softmax.scores", "rope.slice-concat", "gate.silu"),
        "weights in the input surface, norm on the host, one kernel per block",
    ),
    GenerationCandidate(
        "conv-host-attention",
        "baked",
        "host",
        "host",
        "host",
        False,
        ("conv.baked", "gate.silu"),
        "baked convs only, RoPE and attention on the host",
    ),
)
LEGACY = GenerationCandidate(
    LEGACY_ID,
    "baked",
    "engine",
    "engine",
    "conv",
    True,
    (),
    "the legacy kernels, for the simulator with no chip",
)
ROUTE_IDS = (*(c.id for c in CANDIDATES), LEGACY_ID)


def candidate(route_id: str) -> GenerationCandidate:
    """The candidate with this id (LEGACY_ID included); one line naming the known ids otherwise."""
    for c in (*CANDIDATES, LEGACY):
        if c.id == route_id:
            return c
    raise UnknownGenerationRoute(
        f"[engine] unknown generation route '{route_id}' (known: {', '.join(ROUTE_IDS)})"
    )


def _route(
    cand: GenerationCandidate, chip: str, macos: str, why: str, ev: Iterable[Evidence]
) -> GenerationRoute:
    return GenerationRoute(
        cand.id,
        cand.weights,
        cand.attention,
        cand.norm,
        cand.rope,
        cand.fused,
        cand.constructs,
        chip,
        macos,
        why,
        tuple(dict.fromkeys(ev)),
    )


def _gist(p: Precedent) -> str:
    return f"{p.construct} {p.answer}"


def generation_route(
    chip: str, macos: str = "", extra: Mapping[str, Iterable[Evidence]] | None = None
) -> GenerationRoute:
    """The first candidate all of whose constructs have precedent "ran" or "nearest" on ``chip`` (a
    generation or a device name) under ``macos`` (a major, a version of one, or "": every major); chip
    "any" gets the legacy kernels. ``extra``: further evidence by construct id (None: the reports shipped
    with anekit). NoGenerationRoute when no candidate has a precedent for every construct."""
    check_chip(chip)
    major = macos_major(macos)
    if chip == ANY:
        why = f"{LEGACY_ID}: no chip named (the simulator's legacy kernels, no precedent asked)"
        return _route(LEGACY, chip, major, why, ())
    more = check_extra(shipped() if extra is None else extra)
    skipped: list[tuple[GenerationCandidate, Precedent]] = []
    for cand in CANDIDATES:
        found = [precedent(cid, chip, major, more) for cid in cand.constructs]
        blocker = next((p for p in found if not p.usable), None)
        if blocker is not None:
            skipped.append((cand, blocker))
            continue
        nearest = [p.construct for p in found if p.answer == "nearest"]
        kept = f"{cand.id}: every construct ran" + (
            f" or has its nearest run ({', '.join(nearest)})" if nearest else ""
        )
        why = "; ".join([*(f"{c.id}: {_gist(p)}" for c, p in skipped), kept])
        chosen = [e for p in found for e in p.evidence]
        against = [e for _, p in skipped for e in p.evidence]
        return _route(cand, chip, major, why, [*chosen, *against])
    where = (
        f"{chip} under macOS {major}" if major else f"{chip} under every macOS ({', '.join(MACOS_MAJORS)})"
    )
    raise NoGenerationRoute(
        f"[engine] no generation route on {where}: " + "; ".join(f"{c.id}: {_gist(p)}" for c, p in skipped)
    )


@dataclass(frozen=True)
class GenerationRow:
    """One row of the route table."""

    chip: str
    macos: str
    route: str  # a route id, or NO_ROUTE
    why: str


def route_table(extra: Mapping[str, Iterable[Evidence]] | None = None) -> tuple[GenerationRow, ...]:
    """(chip, macos, route id, why) for m1 ... m5 and "any", each under 15, 26 and "" (every major)."""
    rows = []
    for chip in TABLE_CHIPS:
        for macos in TABLE_MACOS:
            try:
                r = generation_route(chip, macos, extra)
            except NoGenerationRoute as e:
                rows.append(GenerationRow(chip, macos, NO_ROUTE, str(e)))
                continue
            rows.append(GenerationRow(chip, macos, r.id, r.why))
    return tuple(rows)


def markdown_table(extra: Mapping[str, Iterable[Evidence]] | None = None) -> str:
    """The generation route table as markdown (the construct table is training_routes.markdown_tables')."""
    lines = ["| chip | macOS | generation route | why |", "| --- | --- | --- | --- |"]
    for r in route_table(extra):
        lines.append(f"| {r.chip} | {r.macos or 'every'} | {r.route} | {r.why} |")
    return "\n".join(lines)


__all__ = [
    "CANDIDATES",
    "LEGACY",
    "LEGACY_ID",
    "NO_ROUTE",
    "ROUTE_IDS",
    "GenerationCandidate",
    "GenerationRoute",
    "GenerationRow",
    "NoGenerationRoute",
    "UnknownGenerationRoute",
    "candidate",
    "generation_route",
    "markdown_table",
    "route_table",
]
