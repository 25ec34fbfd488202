"""The facts that decide how generation kernels are laid out, each resting on the book's rules and figures.

Every fact names the rule (``anekit.engine.book``) or performance figure (``anekit.engine.performance``)
it follows from and carries that record's evidence, so the limit a generation plan applies and its source
are one lookup apart; nothing here restates a measurement of its own:

- ``decode-width``: 32 columns, the smallest fp16 width whose rows are 64 bytes (surface.min-row-bytes) and
  a multiple of 16 (surface.spatial-multiple-16): one decoded token is padded to it;
- ``weight-ceiling``: 2 GiB of weights per program (program.weight-ceiling): layers are grouped under it;
- ``classifier-tile``: 65536 channels (extent.channels): the classifier is tiled over the vocabulary;
- ``spatial``: the widest spatial axis per chip (extent.spatial): the cache's capacity stays under it;
- ``state-ops``: none on the direct route (program.state-ops-direct): the cache is a plain input surface;
- ``max-outputs``: one concatenated output per kernel (surface.max-outputs);
- ``fused-dispatch``: the dispatch floor per evaluation (performance ``dispatch_floor``): decode fuses as
  many layers per kernel as the limits allow;
- ``loaded-programs``: 120 programs loaded at once (process.loaded-program-ceiling): a plan needing more
  kernels is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.engine.book import RULES, WEIGHT_CEILING_BYTES
from anekit.engine.chips import GENERATIONS
from anekit.engine.evidence import Evidence
from anekit.engine.extents import CHANNELS, SPATIAL
from anekit.engine.performance import performance
from anekit.errors import AnekitError

ROW_BYTES = 64  # surface.min-row-bytes: every input / output row at least 64 bytes
FP16_BYTES = 2
SPATIAL_STEP = 16  # surface.spatial-multiple-16
DECODE_WIDTH = max(ROW_BYTES // FP16_BYTES, SPATIAL_STEP)  # 32: the smallest width the engine runs, fp16
LOADED_PROGRAMS = 120  # process.loaded-program-ceiling: what anekit keeps loaded (runtime.ane.residency)


class UnknownFact(AnekitError, KeyError):
    """A generation fact id that is not in FACTS."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class GenerationFact:
    """One limit a generation plan applies: its value, the rule or figure it follows from, and why."""

    id: str
    value: float
    unit: str
    rule: str  # a rule id of the book, or "performance.<figure>"
    why: str  # one line
    evidence: tuple[Evidence, ...]


def _from_rule(fid: str, value: float, unit: str, rule_id: str, why: str) -> GenerationFact:
    return GenerationFact(fid, value, unit, rule_id, why, RULES[rule_id].evidence)


def _dispatch() -> GenerationFact:
    figures = [performance(g).dispatch_floor for g in GENERATIONS]
    return GenerationFact(
        "fused-dispatch",
        max(f.value for f in figures),
        "ms",
        "performance.dispatch_floor",
        "every kernel evaluation costs the dispatch floor (0.07-0.23 ms by chip): decode fuses as many "
        "layers per kernel as the weight ceiling allows",
        tuple(dict.fromkeys(f.evidence for f in figures)),
    )


FACTS: dict[str, GenerationFact] = {
    f.id: f
    for f in (
        _from_rule(
            "decode-width",
            DECODE_WIDTH,
            "columns",
            "surface.min-row-bytes",
            "fp16 rows of at least 64 bytes, a multiple of 16 columns: one decoded token runs padded to 32",
        ),
        _from_rule(
            "weight-ceiling",
            WEIGHT_CEILING_BYTES,
            "bytes",
            "program.weight-ceiling",
            "no program's weights exceed 2 GiB: the layers are grouped under it, one group per kernel",
        ),
        _from_rule(
            "classifier-tile",
            CHANNELS.limit("any"),
            "channels",
            "extent.channels",
            "the channel axis is at most 65536: the classifier is tiled over the vocabulary",
        ),
        _from_rule(
            "spatial",
            SPATIAL.limit("any"),
            "columns",
            "extent.spatial",
            "the spatial axis is at most 16384 on M1 to M3 (65536 on M4, M5): the cache stays under it",
        ),
        _from_rule(
            "state-ops",
            0,
            "ops",
            "program.state-ops-direct",
            "read_state / write_state are refused on the direct route: the cache is a plain input surface",
        ),
        _from_rule(
            "max-outputs",
            1,
            "outputs",
            "surface.max-outputs",
            "three outputs corrupt all but the last on M5: a kernel concatenates its results into one output",
        ),
        _dispatch(),
        _from_rule(
            "loaded-programs",
            LOADED_PROGRAMS,
            "programs",
            "process.loaded-program-ceiling",
            "a process holds near 128 loaded programs, anekit at most 120: a plan needing more is refused",
        ),
    )
}


def fact(fact_id: str) -> GenerationFact:
    """The fact with this id; one line naming the known ones otherwise."""
    try:
        return FACTS[fact_id]
    except KeyError:
        raise UnknownFact(f"[engine] no generation fact '{fact_id}' (known: {', '.join(FACTS)})") from None


def spatial_limit(chip: str) -> int:
    """The widest spatial axis on ``chip`` ("any": the smallest of every generation's)."""
    return SPATIAL.limit(chip)


__all__ = [
    "DECODE_WIDTH",
    "FACTS",
    "LOADED_PROGRAMS",
    "GenerationFact",
    "UnknownFact",
    "fact",
    "spatial_limit",
]
