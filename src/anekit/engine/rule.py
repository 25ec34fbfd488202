"""One rule of the rule book: a fact about what the engine accepts, with the evidence behind it.

A rule says what it is about (``scope``), what it claims (``statement``), on which generations
(``chips``: a generation-gated rule names its own) and who enforces it (``checked_by``). Everything else
follows from its evidence (``anekit.engine.evidence``): the routes it applies to are the routes of its
supporting evidence, and its severity on a chip and route is the one severity policy's verdict
(``evidence.POLICY``), never a field someone sets; asked for a macOS major version, only the evidence
observed under it (or under no stated version) counts. ``decision`` records, where sources disagree, what
anekit does about it.

Scopes: ``program`` (the program as a whole), ``op`` (one operation), ``tensor`` (a function input or
output), ``surface`` (the IOSurfaces a backend allocates and binds), ``package`` (a CoreML package),
``quantization``, ``process`` (how a backend drives the framework).
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.engine.chips import ANY, GENERATIONS
from anekit.engine.evidence import ROUTES, STATUSES, Evidence, check_route, chips_at, severity

SCOPES = ("program", "op", "tensor", "surface", "package", "quantization", "process")
SEVERITIES = ("error", "warn")
# What breaking the rule does. Only a refusal or wrong numbers can make a rule an error.
CONSEQUENCES = ("refused", "wrong numbers", "hazard", "falls back", "slow", "no precedent")


@dataclass(frozen=True)
class Rule:
    """One fact about what the engine accepts, weighed by its evidence."""

    id: str
    statement: str
    scope: str
    consequence: str
    evidence: tuple[Evidence, ...]
    chips: tuple[str, ...] = GENERATIONS  # the generations the rule speaks of
    checked_by: str = "anekit.rules.checks"
    decision: str = ""  # where the evidence conflicts: what anekit does, and why

    def __post_init__(self) -> None:
        problems = []
        if self.scope not in SCOPES:
            problems.append(f"scope {self.scope!r} not in {SCOPES}")
        if self.consequence not in CONSEQUENCES:
            problems.append(f"consequence {self.consequence!r} not in {CONSEQUENCES}")
        if not self.statement.strip():
            problems.append("no statement")
        if not any(not e.refutes for e in self.evidence):
            problems.append("no supporting evidence (a rule without evidence does not go in)")
        if not self.chips or not set(self.chips) <= set(GENERATIONS):
            problems.append(f"chips {self.chips} not a subset of {GENERATIONS}")
        if self.conflicted and not self.decision.strip():
            problems.append("evidence on both sides but no decision recorded")
        if problems:
            raise ValueError(f"[rules] rule '{self.id}': " + "; ".join(problems))

    # -- what follows from the evidence -----------------------------------------------------------

    @property
    def support(self) -> tuple[Evidence, ...]:
        return tuple(e for e in self.evidence if not e.refutes)

    @property
    def against(self) -> tuple[Evidence, ...]:
        return tuple(e for e in self.evidence if e.refutes)

    @property
    def conflicted(self) -> bool:
        return bool(self.against)

    @property
    def can_refuse(self) -> bool:
        return self.consequence in ("refused", "wrong numbers")

    @property
    def routes(self) -> tuple[str, ...]:
        """The routes its supporting evidence covers."""
        covered = {r for e in self.support for r in e.routes}
        return tuple(r for r in ROUTES if r in covered)

    @property
    def status(self) -> str:
        """The strongest status among its supporting evidence."""
        return min((e.status for e in self.support), key=STATUSES.index)

    @property
    def source(self) -> str:
        """Its supporting sources, then the counter-evidence, as one line."""
        parts = [e.source for e in self.support]
        parts += [f"against: {e.source}" for e in self.against]
        return "; ".join(dict.fromkeys(parts))

    def severity_on(self, chip: str = ANY, route: str = "direct", macos: str = "") -> str | None:
        """``error``, ``warn`` or None (does not apply) on ``chip`` and ``route`` under macOS ``macos`` ("":
        every version), by the policy."""
        check_route(route)
        return severity(self.evidence, chip, route, self.chips, self.can_refuse, macos)

    @property
    def severity(self) -> str:
        """The worst severity on any chip and route (what the book's table shows first)."""
        found = {self.severity_on(c, r) for c in GENERATIONS for r in self.routes}
        return "error" if "error" in found else "warn"

    def chips_at(self, level: str, route: str = "direct", macos: str = "") -> tuple[str, ...]:
        """The generations on which it is ``level`` ("error" or "warn") on ``route`` under ``macos``."""
        return chips_at(self.evidence, route, level, self.chips, self.can_refuse, macos)

    def verdict(self, route: str, macos: str = "") -> str:
        """``error on m1, m2; warn on m3`` style: its severity per chip on ``route`` under ``macos`` ("":
        every version; "-": applies nowhere)."""
        parts = []
        for level in SEVERITIES:
            chips = self.chips_at(level, route, macos)
            if chips:
                named = "all chips" if set(chips) == set(GENERATIONS) else ", ".join(chips)
                parts.append(f"{level} on {named}")
        return "; ".join(parts) or "-"

    def applies_to(self, chip: str, route: str = "direct", macos: str = "") -> bool:
        """Whether it applies on ``chip`` ("any": on some chip) and ``route`` under ``macos``."""
        return route in self.routes and self.severity_on(chip, route, macos) is not None
