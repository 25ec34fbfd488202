"""One evidence record for every fact about the engine, and the one severity policy that weighs them.

The rule book (what the engine accepts), the numeric profiles (what it computes) and the performance
figures (how fast) are three tables of the same kind of fact. Each fact keeps the evidence behind it as a
list of ``Evidence``: who observed what, on which chips and routes, under which macOS where known, with
which status — including the counter-evidence (``refutes=True``): a hardware-run program that
contradicts the fact.

Statuses, strongest first (DESIGN.md "Evidence": hardware-run code and measurements outrank reports,
reports outrank the reference documents and our own assumptions):

- ``measured``: run on hardware by the source, with the outcome published (a refusal, a number, a time);
- ``decompile-derived``: read out of Apple's compiled tables or code;
- ``reported``: stated by a hardware-run project without the measurement behind it, or inferred from
  what hardware-run code does or avoids;
- ``rated``: a vendor's figure as a source reports it;
- ``derived``: computed from sourced figures (the observation says how);
- ``predicted``: modelled or extrapolated by a source for a chip it did not measure;
- ``seed law``: a law of the project's reference ``ane-empirical-laws.md``;
- ``reference``: another of the project's reference documents (not public, not hardware-run);
- ``assumed``: no source for this chip or route: another figure stands in (the observation says which);
- ``unknown``: no data at all.

macOS: a record names the version(s) it was observed under (``macos``: "26.3", "15.0, 15.6.1") where the
source states them. The policy can be asked for one macOS major version; records naming only other majors
then do not count, on either side, and records naming none count under every version.

Routes — how a program reaches the engine (DESIGN.md "Routes"): ``direct`` (MIL text and weight files
handed to the private framework's in-memory model, surfaces the caller allocates: anekit's backend),
``e5rt`` (the Espresso / e5rt runtime, which compiles MIL to an E5 bundle) and ``coreml`` (a CoreML
package; CoreML allocates the buffers and places ops the engine refuses on the CPU or GPU).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from anekit.engine.chips import ANY, GENERATIONS
from anekit.errors import AnekitError

STATUSES = (
    "measured",
    "decompile-derived",
    "reported",
    "rated",
    "derived",
    "predicted",
    "seed law",
    "reference",
    "assumed",
    "unknown",
)
HARDWARE = frozenset({"measured"})  # what the severity policy counts as a measurement on hardware
ROUTES = ("direct", "e5rt", "coreml")
DIRECT = ("direct",)
E5RT = ("e5rt",)
COREML = ("coreml",)
COMPILED = ("direct", "e5rt")  # the routes that hand MIL to Apple's compiler with no CPU fallback


class UnknownRoute(AnekitError, KeyError):
    """A route name other than direct, e5rt and coreml."""

    def __str__(self) -> str:
        return str(self.args[0])


def check_route(route: str, layer: str = "rules") -> str:
    """``route`` if it names a route; one line naming the choices otherwise."""
    if route not in ROUTES:
        raise UnknownRoute(f"[{layer}] unknown route '{route}' (choose one of: {', '.join(ROUTES)})")
    return route


class UnknownMacOS(AnekitError, ValueError):
    """A macOS version that names no major version."""


_VERSION = re.compile(r"(\d+)(?:\.\d+)*")
_PLAIN_VERSION = re.compile(r"\d+(?:\.\d+){0,2}")


def macos_major(version: str) -> str:
    """The major version in a macOS version string ("15.3.1" -> "15", "macOS 26.0 (25A...)" -> "26");
    "" when there is none."""
    found = _VERSION.search(version or "")
    return found.group(1) if found else ""


def check_macos(version: str, layer: str = "rules") -> str:
    """The major version of ``version`` ("15", "26", "15.3", "26.0.1"; "": none asked, returned as is);
    one line saying what is expected otherwise."""
    if version and not _PLAIN_VERSION.fullmatch(version.strip()):
        raise UnknownMacOS(
            f"[{layer}] macOS version '{version}' is not a version number (expected a major version such as "
            "15 or 26, or a full one such as 15.3 or 26.0.1)"
        )
    return macos_major(version)


@dataclass(frozen=True)
class Evidence:
    """One observation behind a fact: who, what, where (chips, routes, macOS) and how strong."""

    source: str  # repository and file (section, line) or issue / pull request, or a seed law
    status: str
    observed: str  # what the source saw: the refusal, the number, the time, the program that ran
    chips: tuple[str, ...] = GENERATIONS  # the generations it was observed on (all: not chip-specific)
    routes: tuple[str, ...] = ROUTES  # the routes it was observed on (all: not route-specific)
    macos: str = ""  # the macOS version(s), where the source states them
    refutes: bool = False  # counter-evidence: it contradicts the fact it is listed under

    def __post_init__(self) -> None:
        problems = []
        if self.status not in STATUSES:
            problems.append(f"status {self.status!r} not in {STATUSES}")
        if self.status != "unknown" and not self.source.strip():
            problems.append("no source (evidence without a source does not go in)")
        if not self.observed.strip():
            problems.append("nothing observed")
        if not self.chips or not set(self.chips) <= set(GENERATIONS):
            problems.append(f"chips {self.chips} not a subset of {GENERATIONS}")
        if not self.routes or not set(self.routes) <= set(ROUTES):
            problems.append(f"routes {self.routes} not a subset of {ROUTES}")
        if self.macos and not all(macos_major(v) for v in self.macos.split(",")):
            problems.append(f"macOS {self.macos!r} is not a list of versions (e.g. '26.3' or '15.0, 15.6.1')")
        if problems:
            raise ValueError(f"[engine] evidence from '{self.source}': " + "; ".join(problems))

    @property
    def is_hardware(self) -> bool:
        return self.status in HARDWARE

    @property
    def majors(self) -> frozenset[str]:
        """The macOS major versions it names (none: it does not say)."""
        return frozenset(macos_major(v) for v in self.macos.split(",") if v.strip())

    def holds_under(self, major: str) -> bool:
        """Whether it counts under macOS ``major`` ("": no version asked): a record that names no version
        counts under every one, a record that names versions only under theirs."""
        return not major or not self.majors or major in self.majors

    def covers(self, chip: str, route: str) -> bool:
        """Whether it was observed on ``chip`` ("any": some chip) and ``route``."""
        return route in self.routes and (chip == ANY or chip in self.chips)

    def where(self) -> str:
        """``m1, m2 / direct`` style: the chips and routes it covers (blank parts: all)."""
        chips = "all chips" if set(self.chips) == set(GENERATIONS) else ", ".join(self.chips)
        routes = "all routes" if set(self.routes) == set(ROUTES) else ", ".join(self.routes)
        os_ = f", macOS {self.macos}" if self.macos else ""
        return f"{chips} / {routes}{os_}"

    def __str__(self) -> str:
        against = "AGAINST: " if self.refutes else ""
        return f"{against}{self.observed} ({self.status}, {self.where()}) [{self.source}]"


# -- the severity policy -----------------------------------------------------------------------------

POLICY = (
    "Measurements on hardware outrank reports. A rule applies only to the routes its evidence covers and "
    "the chips it speaks of. On a chip and route where a hardware-run program contradicts it, a rule is "
    "a warning if it was also measured there (both sides named), and does not apply if only reports or "
    "measurements on other chips support it. Otherwise it is an error when it says the engine refuses a "
    "program or computes wrong numbers and that was measured on hardware on its route (on this chip, or "
    "on another chip it speaks of while no hardware-run program on the route contradicts it); in every "
    "other case (reports, decompiled tables, seed laws, slowness, CPU fallback) it is a warning. For no "
    'chip in particular ("any") a rule is an error only when it is one on every chip. Under a macOS major '
    "version (15, 26, ...) only the evidence observed under that version, or under no version it names, "
    "counts, on either side: a refusal measured under macOS 26 says nothing under macOS 15, and a run under "
    "macOS 15 does not contradict it under 26. Without a version all the evidence counts."
)


def severity(
    evidence: Iterable[Evidence],
    chip: str,
    route: str,
    claimed: tuple[str, ...] = GENERATIONS,
    can_refuse: bool = True,
    macos: str = "",
) -> str | None:
    """``error``, ``warn`` or None (the rule does not apply) on ``chip`` and ``route``: POLICY.

    ``claimed``: the generations the rule speaks of (a generation-gated rule names its own); on other
    chips it does not apply. ``can_refuse``: whether the rule says the engine refuses a program or
    computes wrong numbers (only such a rule can be an error). ``macos``: a macOS version ("26", "15.3";
    "": every version): the evidence naming other major versions is left out, on both sides."""
    major = check_macos(macos)
    items = tuple(e for e in evidence if e.holds_under(major))
    if chip == ANY:
        found = [severity(items, c, route, claimed, can_refuse) for c in GENERATIONS]
        if all(s is None for s in found):
            return None
        return "error" if all(s == "error" for s in found) else "warn"
    if chip not in claimed:
        return None
    support = [e for e in items if not e.refutes and route in e.routes]
    if not support:
        return None
    against = [e for e in items if e.refutes and e.is_hardware and route in e.routes]
    measured = [e for e in support if e.is_hardware]
    if any(chip in e.chips for e in against):  # a hardware-run program contradicts it here
        return "warn" if any(chip in e.chips for e in measured) else None
    if not can_refuse:
        return "warn"
    if any(chip in e.chips for e in measured):
        return "error"  # measured here, not contradicted here
    if measured and not against:
        return "error"  # measured on another chip it speaks of, never contradicted on this route
    return "warn"


def chips_at(
    evidence: Iterable[Evidence],
    route: str,
    level: str,
    claimed: tuple[str, ...] = GENERATIONS,
    can_refuse: bool = True,
    macos: str = "",
) -> tuple[str, ...]:
    """The generations on which the policy gives ``level`` ("error" or "warn") on ``route`` (under macOS
    ``macos``: "" for every version)."""
    items = tuple(evidence)
    return tuple(c for c in GENERATIONS if severity(items, c, route, claimed, can_refuse, macos) == level)
