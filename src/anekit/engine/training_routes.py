"""Which training route each chip and macOS major gets, chosen from the hardware runs of its constructs.

A training route is the kernels' four construct choices (weights, attention, norm, rope: the strings of
``anekit.kernels.route.KernelRoute``, kept as plain strings here since the engine layer sits below the
kernels) and the constructs its kernels use. The candidates, in order of preference (fastest first):

- ``dynamic-engine-attention``: weights travel in the inputs (compiled once), attention on the engine,
  RMSNorm on the host, RoPE as hardware-run code writes it (slice + concat);
- ``dynamic-engine-attention-rope-matmul``: the same, with RoPE's pair swap as a matmul by a constant
  hd x hd permutation, as rustane writes it since the M3 Ultra refused the slice form (pull request #9);
- ``baked-engine-attention``: baked weights (recompiled per batch), the same attention;
- ``conv-host-attention``: baked 1x1 convs and the gate only; attention core, RMSNorm and RoPE on the
  host (no matmul anywhere).

``training_route(chip, macos="", extra=None)`` takes the first candidate every one of whose constructs
has precedent "ran" or "nearest" (``anekit.engine.constructs.precedent``) on that chip and macOS; macOS
"" means under every major in ``MACOS_MAJORS``, and chip "any" under every generation too. ``extra``
is the evidence a Mac's own report adds, by construct id (``anekit.engine.report``), so a report moves
a chip from one route to another without a code change.

With today's record (``route_table()``; ``markdown_tables()`` prints it with the construct table):
M4 and M5 get the dynamic route; the M3 gets it under macOS 15 (from M4's runs), the permutation-matmul
RoPE route under 26, where rustane measured the slice + concat RoPE refused on the M3 Ultra and the
matmul form training (pull request #9), and that route under every macOS too (the conv route is out on
the M3 under 15, where only 512-channel convs compiled); M1 and M2 get the conv route everywhere — matmul
was measured failing on the M1 under 26.3, and no RoPE written in a kernel has ever run on an M1 or M2
(maderix's M1 training, stories_mil.h, has no RoPE), so not even macOS 15, where the M1's matmul
attention trained, has a precedent for the engine-attention routes. Chip "any" under 26 gets the conv
route; under 15 (and so under every macOS) no route runs on every chip: the M1's RoPE and the M3's convs
exclude every candidate (``NoTrainingRoute``; the table's row says "none" and why).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from anekit.engine.chips import ANY, GENERATIONS
from anekit.engine.constructs import (
    CONSTRUCTS,
    MACOS_MAJORS,
    Precedent,
    check_chip,
    check_extra,
    macos_major,
    precedent,
)
from anekit.engine.evidence import Evidence
from anekit.engine.report import shipped_evidence
from anekit.errors import AnekitError


@lru_cache(maxsize=1)
def shipped() -> dict[str, tuple[Evidence, ...]]:
    """The evidence of the reports shipped with anekit (read once per process)."""
    return shipped_evidence()


class NoTrainingRoute(AnekitError, LookupError):
    """No candidate route has a precedent for every one of its constructs on the chip and macOS."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Candidate:
    """A training route before a chip is named: its id, its four choices and the constructs it uses."""

    id: str
    weights: str
    attention: str
    norm: str
    rope: str
    constructs: tuple[str, ...]
    summary: str


@dataclass(frozen=True)
class TrainingRoute:
    """The route a chip and macOS get: the candidate's choices and constructs, and why (with evidence)."""

    id: str
    weights: str  # "baked" or "dynamic"
    attention: str  # "engine" or "host"
    norm: str  # "engine" or "host"
    rope: str  # "conv", "slice", "matmul" or "host"
    constructs: tuple[str, ...]
    chip: str
    macos: str  # a major, or "" for every major in MACOS_MAJORS
    why: str  # one line
    evidence: tuple[Evidence, ...]  # the evidence that decided it: the chosen route's, then the skipped ones'

    def sources(self) -> tuple[str, ...]:
        """The sources of its evidence, each once."""
        return tuple(dict.fromkeys(e.source for e in self.evidence))

    def describe(self) -> str:
        """``weights dynamic, attention engine, norm host, rope slice`` style (KernelRoute's words)."""
        return f"weights {self.weights}, attention {self.attention}, norm {self.norm}, rope {self.rope}"


CANDIDATES = (
    Candidate(
        "dynamic-engine-attention",
        "dynamic",
        "engine",
        "host",
        "slice",
        ("matmul.dynamic-weights", "matmul.activations", "softmax.scores", "rope.slice-concat", "gate.silu"),
        "dynamic weights, attention on the engine",
    ),
    Candidate(
        "dynamic-engine-attention-rope-matmul",
        "dynamic",
        "engine",
        "host",
        "matmul",
        (
            "matmul.dynamic-weights",
            "matmul.activations",
            "softmax.scores",
            "rope.permutation-matmul",
            "gate.silu",
        ),
        "dynamic weights, attention on the engine, RoPE as a permutation matmul",
    ),
    Candidate(
        "baked-engine-attention",
        "baked",
        "engine",
        "host",
        "slice",
        ("conv.baked", "matmul.activations", "softmax.scores", "rope.slice-concat", "gate.silu"),
        "baked convs, attention on the engine",
    ),
    Candidate(
        "conv-host-attention",
        "baked",
        "host",
        "host",
        "host",
        ("conv.baked", "gate.silu"),
        "baked convs only, attention on the host",
    ),
)
ROUTE_IDS = tuple(c.id for c in CANDIDATES)
NO_ROUTE = "none"  # the route table's word for a chip and macOS no candidate runs on
TABLE_CHIPS = (*GENERATIONS, ANY)
TABLE_MACOS = (*MACOS_MAJORS, "")


def _blocker(found: list[Precedent]) -> Precedent | None:
    """The first construct that keeps a candidate out (not "ran" or "nearest"), if any."""
    return next((p for p in found if not p.usable), None)


def _gist(p: Precedent) -> str:
    return f"{p.construct} {p.answer}"


def training_route(
    chip: str, macos: str = "", extra: Mapping[str, Iterable[Evidence]] | None = None
) -> TrainingRoute:
    """The first candidate all of whose constructs have precedent "ran" or "nearest" on ``chip`` (a
    generation, a device name, or "any") under ``macos`` (a major, a version of one, or "" for every
    major in MACOS_MAJORS); ``extra``: further evidence by construct id (a Mac's report; None: the
    reports shipped with anekit, ``anekit.engine.report.shipped_evidence``, so a report placed there
    moves the routes without a code change). NoTrainingRoute when none has."""
    check_chip(chip)
    major = macos_major(macos)
    more = check_extra(shipped() if extra is None else extra)
    skipped: list[Precedent] = []
    for cand in CANDIDATES:
        found = [precedent(cid, chip, major, more) for cid in cand.constructs]
        blocker = _blocker(found)
        if blocker is not None:
            skipped.append(blocker)
            continue
        nearest = [p.construct for p in found if p.answer == "nearest"]
        kept = f"{cand.id}: every construct ran"
        if nearest:
            kept += f" or has its nearest run ({', '.join(nearest)})"
        why = "; ".join([*(f"{c.id}: {_gist(p)}" for c, p in zip(CANDIDATES, skipped)), kept])
        chosen = tuple(e for p in found for e in p.evidence)
        against = tuple(e for p in skipped for e in p.evidence)
        return TrainingRoute(
            cand.id,
            cand.weights,
            cand.attention,
            cand.norm,
            cand.rope,
            cand.constructs,
            chip,
            major,
            why,
            tuple(dict.fromkeys((*chosen, *against))),
        )
    where = (
        f"{chip} under macOS {major}" if major else f"{chip} under every macOS ({', '.join(MACOS_MAJORS)})"
    )
    raise NoTrainingRoute(
        f"[engine] no training route on {where}: "
        + "; ".join(f"{c.id}: {_gist(p)}" for c, p in zip(CANDIDATES, skipped))
    )


@dataclass(frozen=True)
class RouteRow:
    """One row of the route table."""

    chip: str
    macos: str
    route: str  # a route id, or NO_ROUTE
    why: str


@dataclass(frozen=True)
class ConstructRow:
    """One row of the construct table: a construct's precedent per (chip, macOS) and its sources."""

    construct: str
    precedents: tuple[tuple[str, str, str], ...]  # (chip, macos, answer)
    sources: tuple[str, ...]

    def answer(self, chip: str, macos: str) -> str:
        """Its precedent on ``chip`` under ``macos``."""
        return next(a for c, m, a in self.precedents if (c, m) == (chip, macos))


def route_table(extra: Mapping[str, Iterable[Evidence]] | None = None) -> tuple[RouteRow, ...]:
    """(chip, macos, route id, why) for m1 ... m5 and "any", each under 15, 26 and "" (every major); where
    no candidate runs, the route is NO_ROUTE and why is NoTrainingRoute's line."""
    rows = []
    for chip in TABLE_CHIPS:
        for macos in TABLE_MACOS:
            try:
                r = training_route(chip, macos, extra)
            except NoTrainingRoute as e:
                rows.append(RouteRow(chip, macos, NO_ROUTE, str(e)))
                continue
            rows.append(RouteRow(chip, macos, r.id, r.why))
    return tuple(rows)


def construct_table(extra: Mapping[str, Iterable[Evidence]] | None = None) -> tuple[ConstructRow, ...]:
    """Each construct's precedent on m1 ... m5 under 15 and 26, with its sources."""
    rows = []
    for cid, c in CONSTRUCTS.items():
        cells = tuple(
            (chip, macos, precedent(cid, chip, macos, extra).answer)
            for chip in GENERATIONS
            for macos in MACOS_MAJORS
        )
        rows.append(ConstructRow(cid, cells, c.sources()))
    return tuple(rows)


def markdown_tables(extra: Mapping[str, Iterable[Evidence]] | None = None) -> str:
    """The route table and the construct table as markdown (for the closing note of a change)."""
    lines = ["| chip | macOS | training route | why |", "| --- | --- | --- | --- |"]
    for r in route_table(extra):
        lines.append(f"| {r.chip} | {r.macos or 'every'} | {r.route} | {r.why} |")
    heads = [f"{chip}/{macos}" for chip in GENERATIONS for macos in MACOS_MAJORS]
    lines += ["", "| construct | " + " | ".join(heads) + " | sources |", "| --- " * (len(heads) + 2) + "|"]
    for row in construct_table(extra):
        cells = [a for _, _, a in row.precedents]
        note = CONSTRUCTS[row.construct].note
        sources = " · ".join(row.sources) or f"no precedent: {note}"
        lines.append(f"| {row.construct} | " + " | ".join(cells) + f" | {sources} |")
    return "\n".join(lines)


__all__ = [
    "CANDIDATES",
    "MACOS_MAJORS",
    "NO_ROUTE",
    "ROUTE_IDS",
    "Candidate",
    "ConstructRow",
    "NoTrainingRoute",
    "RouteRow",
    "TrainingRoute",
    "construct_table",
    "markdown_tables",
    "route_table",
    "training_route",
]
