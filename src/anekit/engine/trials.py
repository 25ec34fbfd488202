"""Questions the public record answers both ways, which the macOS backend settles by trying.

Where hardware-run sources disagree in a way that splits by macOS version (or that no source explains),
the backend does not guess: it tries each option in the order the evidence favours, falls back to the
next on ``CompilationFailed``, and remembers the option that compiled per chip and macOS version
(``anekit.runtime.ane.memory``; ``anekit doctor`` reports it). A ``Trial`` is such a question: its
options, each with the hardware runs behind it (supporting evidence) and the failures (``refutes``).

The order on a machine (``Trial.order``): options with more hardware runs on this generation under this
macOS major version first; then more runs on this generation under any version; then more runs on any
chip; failures count against an option on the same keys. Ties keep the declared order.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.engine.chips import ANY
from anekit.engine.evidence import Evidence, macos_major
from anekit.engine.sources import MADERIX, MADERIX_COMMUNITY, MADERIX_REPORT
from anekit.errors import AnekitError


@dataclass(frozen=True)
class Option:
    """One answer to a trial and the hardware runs with it (refuting evidence: runs where it failed)."""

    value: str
    evidence: tuple[Evidence, ...]

    def _count(self, chip: str, macos: str, refutes: bool) -> tuple[int, int, int]:
        runs = [e for e in self.evidence if e.refutes == refutes and e.is_hardware and "direct" in e.routes]
        on_chip = [e for e in runs if chip == ANY or chip in e.chips]
        same_os = [e for e in on_chip if macos and macos in {macos_major(v) for v in e.macos.split(",")}]
        return len(same_os), len(on_chip), len(runs)

    def score(self, chip: str, macos: str) -> tuple[int, int, int]:
        ran = self._count(chip, macos, refutes=False)
        failed = self._count(chip, macos, refutes=True)
        return (ran[0] - failed[0], ran[1] - failed[1], ran[2] - failed[2])


@dataclass(frozen=True)
class Trial:
    """A question the backend answers by trying its options in the evidence's order."""

    id: str
    question: str
    options: tuple[Option, ...]

    def __post_init__(self) -> None:
        if len(self.options) < 2:
            raise ValueError(f"[engine] trial '{self.id}' needs at least two options")
        for o in self.options:
            if not any(e.is_hardware and not e.refutes for e in o.evidence):
                raise ValueError(f"[engine] trial '{self.id}': option '{o.value}' has no hardware run")

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(o.value for o in self.options)

    def order(self, chip: str, macos: str = "") -> tuple[str, ...]:
        """The options to try on ``chip`` under macOS ``macos``, most hardware runs first."""
        major = macos_major(macos)
        ranked = sorted(
            enumerate(self.options), key=lambda io: (tuple(-s for s in io[1].score(chip, major)), io[0])
        )
        return tuple(o.value for _, o in ranked)


DIALECT = Trial(
    "dialect",
    "Which MIL dialect the in-memory compiler takes: program(1.3) / <ios18> (ios18) or program(1.0) / "
    "<ios16> with tensor<string, []> scalars (ios16).",
    (
        Option(
            "ios18",
            (
                Evidence(
                    f"{MADERIX_COMMUNITY} (M1 Pro and M1 Max submissions)",
                    "measured",
                    "the program(1.3) / ios18 benchmark kernels compiled and ran on M1 Pro and M1 Max",
                    chips=("m1",),
                    routes=("direct",),
                    macos="15",
                ),
                Evidence(
                    f"{MADERIX} README.md and {MADERIX_REPORT} (training on M1 Pro / Max, M3 Ultra, M4, M5)",
                    "measured",
                    "the program(1.3) / ios18 training kernels of training/stories_mil.h trained stories110M",
                    chips=("m1", "m3", "m4", "m5"),
                    routes=("direct",),
                ),
            ),
        ),
        Option(
            "ios16",
            (
                Evidence(
                    f"{MADERIX} pull request #6 (commit 709b602, M1 Pro)",
                    "measured",
                    "program(1.3) / ios18 failed to compile; the same kernels in program(1.0) / ios16 ran",
                    chips=("m1",),
                    routes=("direct",),
                    macos="26",
                ),
            ),
        ),
    ),
)

TRIALS: dict[str, Trial] = {t.id: t for t in (DIALECT,)}


def trial(trial_id: str) -> Trial:
    """The trial with this id; one line naming the known ones otherwise."""
    if trial_id not in TRIALS:
        raise AnekitError(f"[engine] no trial '{trial_id}' (known: {', '.join(TRIALS)})")
    return TRIALS[trial_id]


__all__ = ["DIALECT", "TRIALS", "Option", "Trial", "macos_major", "trial"]
