"""The generation kernels lint clean on every chip profile: for m1 .. m5 under each macOS major the engine
layer knows and under every macOS, and for "any", the decode and prefill kernels of the chip's generation
route (``anekit.engine.generation_routes``, cut by ``anekit.generate.plan``: the kernels
``anekit.tools.gen_dump.plan_kernels`` builds, which the dump writes) give no lint error and no warning from
a rule the evidence contests or contradicts (the training routes' test in tests/test_cli_lint.py, for
generation)."""

from __future__ import annotations

import pytest

from anekit.engine.constructs import MACOS_MAJORS
from anekit.engine.generation_routes import CANDIDATES, NoGenerationRoute, generation_route
from anekit.generate.plan import generation_plan
from anekit.kernels import preset
from anekit.kernels.generation import gen_weights
from anekit.llama.params import Params
from anekit.rules import CHIPS, check_program
from anekit.tools.gen_dump import plan_kernels


def _contested(cfg, chip: str, macos: str) -> tuple[str, list[tuple[str, str]]]:
    """The route's id and every (kernel, finding) of its decode and prefill kernels that is an error or a
    warning of a contested rule."""
    route = generation_route(chip, macos)
    plan = generation_plan(cfg, route)
    weights = gen_weights(Params.init(cfg, 0))  # baked kernels with their weight files, offsets checked
    found = []
    for width in plan.widths:
        for k in plan_kernels(cfg, route, plan, width, weights):
            for f in check_program(k.spec.program, chip, k.spec.weight_files(), macos=macos):
                if f.is_error or f.rule.conflicted:
                    found.append((k.name, f.short()))
    return route.id, found


@pytest.mark.parametrize("chip", CHIPS)
def test_the_generation_route_of_every_chip_lints_clean_under_every_macos(chip):
    cfg = preset("stories260K")
    routes = set()
    for macos in ("", *MACOS_MAJORS):
        try:
            route_id, contested = _contested(cfg, chip, macos)
        except NoGenerationRoute:  # no candidate runs under every macOS: each major has its own
            assert macos == "", (chip, macos)
            continue
        routes.add(route_id)
        assert not contested, (chip, macos or "every macOS", route_id, contested)
    assert routes, chip


def test_the_legacy_kernels_of_chip_any_lint_clean():
    """The simulator with no chip named runs the legacy kernels; under the rules of every chip together."""
    route_id, contested = _contested(preset("stories260K"), "any", "")
    assert route_id == "legacy" and not contested, contested


def test_every_candidate_route_is_some_chip_s_route():
    """The lint test above reaches every candidate's kernels (none is left unchecked)."""
    chosen = set()
    for chip in CHIPS:
        for macos in ("", *MACOS_MAJORS):
            try:
                chosen.add(generation_route(chip, macos).id)
            except NoGenerationRoute:
                continue
    assert chosen == {c.id for c in CANDIDATES}
