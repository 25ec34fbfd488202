"""The chip table: the engine generations anekit knows (m1 ... m5) and the devices of each (base, Pro, Max,
Ultra), shared by the rule book, the numeric profiles and the cost model.

A *generation* (``m1`` ... ``m5``) is what the rule book and the numeric profiles key on: every device of
one generation has the same engine architecture (M(n) has H(n+12): sbryngelson/ane-guide
part-3-performance/12-cross-chip.md, "An M(n) chip has the H(n+12) ANE architecture"). A *device*
(``m1-pro``, ``m4-max``, ``m3-ultra`` ...) is what a published timing was measured on; the cost model keys
on devices, because memory bandwidth and the number of dies differ between them. An Ultra is two dies
joined: one program runs on one die (maderix/ANE pull request #28, M3 Ultra submission).

``any`` names no chip in particular: the rule book applies every chip's rules and the numeric profile is
the conservative union.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.errors import AnekitError

GENERATIONS = ("m1", "m2", "m3", "m4", "m5")
ANY = "any"
CHIP_TABLE_SOURCE = "sbryngelson/ane-guide part-3-performance/12-cross-chip.md ('M1 is H13 ... M5 is H17')"


class UnknownChip(AnekitError, KeyError):
    """A chip or device name anekit has no data for."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Device:
    """One device: its generation, its label, its engine architecture and its number of dies."""

    name: str
    generation: str
    label: str
    architecture: str
    dies: int = 1

    @property
    def variant(self) -> str:
        """``base``, ``pro``, ``max`` or ``ultra``."""
        return self.name.split("-", 1)[1] if "-" in self.name else "base"


_ARCH = {"m1": "H13", "m2": "H14", "m3": "H15", "m4": "H16", "m5": "H17"}
_VARIANTS = {"base": "", "pro": " Pro", "max": " Max", "ultra": " Ultra"}
# The devices with a published measurement somewhere in anekit's sources, per generation.
_PUBLISHED = {
    "m1": ("base", "pro", "max", "ultra"),
    "m2": ("base", "pro", "max", "ultra"),
    "m3": ("base", "pro", "max", "ultra"),
    "m4": ("base", "pro", "max"),
    "m5": ("base", "pro", "max"),
}


def _devices() -> dict[str, Device]:
    out = {}
    for gen, variants in _PUBLISHED.items():
        for v in variants:
            name = gen if v == "base" else f"{gen}-{v}"
            label = gen.upper() + _VARIANTS[v]
            out[name] = Device(name, gen, label, _ARCH[gen], 2 if v == "ultra" else 1)
    return out


DEVICES: dict[str, Device] = _devices()


def device(name: str) -> Device:
    """The device named ``name`` ("m4", "m4-max", "M4 Max" ...); UnknownChip naming the known ones
    otherwise."""
    key = name.strip().lower().replace(" ", "-")
    if key not in DEVICES:
        raise UnknownChip(f"[engine] unknown chip '{name}' (known: {', '.join(DEVICES)})")
    return DEVICES[key]


def generation(name: str) -> str:
    """The generation of a chip or device name ("m4-max" -> "m4"); "any" stays "any"."""
    if name == ANY:
        return ANY
    return device(name).generation


def check_generation(name: str, layer: str = "engine") -> str:
    """``name`` if it is a generation or "any"; one line naming the choices otherwise (``layer`` prefixes
    the message: the rule book says ``[rules]``, the profiles ``[numerics]``)."""
    if name != ANY and name not in GENERATIONS:
        raise UnknownChip(f"[{layer}] unknown chip '{name}' (choose one of: any, {', '.join(GENERATIONS)})")
    return name
