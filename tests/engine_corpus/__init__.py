"""A corpus of MIL programs with known fates on real Apple Neural Engines, to judge the rule book against.

Nothing in anekit has run on a Neural Engine, so what ``anekit.rules`` says the engine accepts is
checked against what public, hardware-run projects observed:

- ``known_good.KNOWN_GOOD``: programs those projects really compiled and ran (trained with, benchmarked,
  or probed) on the chips named, each written the way the project's own generator writes it.
- ``known_refused.KNOWN_REFUSED``: programs *measured* to fail on the chips named (the compiler refused
  them, evaluation failed, or the results were wrong), with what exactly failed, and no hardware-run
  program on the same chip and route contradicting it.
- ``known_refused.KNOWN_CONTESTED``: programs measured to fail where another hardware-run program says
  the same construct works on that chip (often under another macOS version). The severity policy makes
  their rules warnings naming both sides (``contested`` lists them), and the macOS backend settles the
  split by trying (``anekit.engine.trials``). Where the two sides name different macOS versions, the
  case's ``macos`` says which it was observed under, and judged under that version the rule is an error
  (the other side's runs, under other versions, do not count there).

A rule that fires as an error on a known-good case for one of its chips and route contradicts a
measurement; a known-refused case that no rule flags is a gap in the book.

Each ``Case`` carries the MIL text (``programs/<name>.mil``), regenerated from the project's generator
(its format strings evaluated with C semantics: ``%f`` of float32 values, integer division) at the
dimensions given in ``source`` — the smallest the project used where those are cheap to simulate, else
stated smaller dimensions with the project's own ones named. ``route`` says how the program reached the
engine: ``"direct"`` (MIL text and weight files handed to ``_ANEInMemoryModel``, the route anekit's
macOS backend takes), ``"e5rt"`` (Espresso's e5rt compiler and runtime, the route of
sbryngelson/ANEForge and the ane-guide book), or ``"coreml"``. ``weights`` holds the weight files a
program reads (BLOBFILE path -> MILBlob bytes, built with ``anekit.blob`` at import, see
``_programs.py``): the projects' own files held random or trained values, so only the layout and the
offsets are theirs, not the numbers.

The sources, abbreviated in the ``source`` strings:

- maderix/ANE, snapshot d91c984 (and pull request #6, commit 709b602): training kernels, benchmarks and
  probes run on M1 Pro / Max, M3 Pro / Ultra, M4 / Pro / Max, M5 (benchmarks/ANE_BENCHMARK_REPORT.md,
  benchmarks/community_results.json, training/m5result.md, README.md).
- mechramc/Orion, snapshot 65372ff: M4 Max (README "Verified ANE private APIs on M4 Max"),
  docs/ane_constraints.md and the commit messages that record each test run.
- sbryngelson/ane-guide, snapshot 9eb1afe: the book; appendix A's M1, M2 and M5 columns are measured on
  silicon, its M3 and M4 cells are predictions (so M3 / M4 are never claimed from it here).
- sbryngelson/ANEForge (read at the commits named in each case): docs/op-catalog.md,
  aneforge/full_mil_vocabulary_sweep.json (an M5 sweep: "fails ANECCompile ... on M5",
  aneforge/_capabilities.py; its per-op results as docs/capabilities.json records them: "evidence":
  "docs/full_mil_vocabulary_sweep.json (klass=...)"), aneforge/_compile.py (its MIL emitter), docs/,
  bench/.
"""

from __future__ import annotations

from dataclasses import dataclass

ROUTES = ("direct", "e5rt", "coreml")
CHIPS = ("m1", "m2", "m3", "m4", "m5")


@dataclass(frozen=True)
class Case:
    """One program and what a hardware-run project observed when it ran it."""

    name: str  # unique, e.g. "maderix-stories-sdpa-fwd-taps"
    mil: str  # MIL text, as the project wrote it (its generator's output at the stated dims)
    chips: tuple[str, ...]  # chips it ran on (known good) / was refused on (known refused), "m1".."m5"
    route: str  # "direct" (in-memory MIL, _ANEInMemoryModel), "e5rt" (Espresso/e5rt) or "coreml"
    source: str  # repository + file (+ function / line / section), and the chip / device evidence
    observed: str  # what was observed, e.g. "trained Stories110M on M4" or "ANECCompile() FAILED"
    weights: dict[str, bytes] | None = None  # BLOBFILE path -> weight file bytes; None: reads none
    contested: tuple[str, ...] = ()  # refused cases measured both ways: the rules that warn about them
    macos: str = ""  # the macOS version(s) it was observed under, where the source states them

    def __post_init__(self) -> None:
        problems = []
        if not self.chips or not set(self.chips) <= set(CHIPS):
            problems.append(f"chips {self.chips} not a non-empty subset of {CHIPS}")
        if self.route not in ROUTES:
            problems.append(f"route {self.route!r} not in {ROUTES}")
        if not self.source.strip() or not self.observed.strip():
            problems.append("no source or no observation")
        if problems:
            raise ValueError(f"[engine_corpus] case '{self.name}': " + "; ".join(problems))


__all__ = ["CHIPS", "ROUTES", "Case"]
