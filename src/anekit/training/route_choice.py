"""Which training route a run's kernels take: its chip's, chosen by the engine layer from the evidence.

- On a Mac (the ``ane`` backend) the route is this Mac's: its chip and macOS version, as the backend
  detected them (``anekit.engine.training_routes.training_route``).
- In the simulator with a chip named (``--chip C``, ``numerics={"chip": C}``) it is the route that runs
  on every macOS version the engine layer knows for C: the route a user of that chip gets whatever
  macOS they run.
- In the simulator with no chip named, or "any" (the conservative numerics of every chip: no route has a
  precedent on every chip under every macOS — the M1's kernels have no RoPE run, the M3 under macOS 15
  refuses convs other than 512 channels), the kernels stay the legacy set (``anekit.kernels.route.LEGACY``):
  no chip's route, the simulator's own default. A Mac never gets it.

An explicit weight mode (``--weights``) picks the route of the same attention with that mode when every
construct of that route has a precedent on the chip (``--weights baked`` on an M4: the baked
engine-attention route); otherwise it is refused in one line naming the route and why. A resumed run keeps
the route it was started with: its kernels, and so its bits, stay the run's.
"""

from __future__ import annotations

from typing import Any

from anekit.engine.chips import ANY
from anekit.engine.constructs import precedent
from anekit.engine.training_routes import CANDIDATES, TrainingRoute, training_route
from anekit.errors import AnekitError
from anekit.training.options import opt


def chosen_route(backend: Any, numerics: dict[str, Any]) -> TrainingRoute | None:
    """The route of ``backend``'s chip (and macOS, on a Mac); None for the simulator with no chip named."""
    if getattr(backend, "name", "") == "ane":
        return training_route(backend.chip, getattr(backend, "macos", ""))
    chip = numerics.get("chip")
    if chip is None or chip == ANY:  # "any" names no chip: no route runs on every chip under every macOS
        return None
    return training_route(chip, "")


def with_weights(route: TrainingRoute, weights: str | None) -> str:
    """The id of the route a run takes given an explicit weight mode (None: ``route`` itself)."""
    if weights is None or weights == route.weights:
        return route.id
    where = f"{route.chip}" + (f" under macOS {route.macos}" if route.macos else " (every macOS)")
    for cand in CANDIDATES:
        same = (cand.attention, cand.norm, cand.rope) == (route.attention, route.norm, route.rope)
        if not same or cand.weights != weights:
            continue
        found = [precedent(c, route.chip, route.macos) for c in cand.constructs]
        missing = [p for p in found if not p.usable]
        if not missing:
            return cand.id
        named = ", ".join(f"{p.construct} {p.answer}" for p in missing)
        raise AnekitError(
            f"[train] {opt('weights', weights)}: the {cand.id} route has no precedent on {where} ({named}); "
            f"this chip's route is {route.id}: drop {opt('weights')}"
        )
    raise AnekitError(
        f"[train] {opt('weights', weights)}: {where}'s training route {route.id} runs {route.weights} "
        f"weights only ({route.why}): drop {opt('weights')}"
    )


__all__ = ["chosen_route", "with_weights"]
