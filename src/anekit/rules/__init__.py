"""What the Neural Engine accepts, checked: the rule book's checks over programs, surfaces and weights.

The rule book itself (each rule with its evidence, weighed by one severity policy) lives in the engine
layer, ``anekit.engine.book``; this package re-exports it and adds the checks that ``anekit lint``, the
simulator's strict compile, the kernels' tests and the macOS backend run. See ``anekit.rules.checks``.
"""

from anekit.engine.book import RULES, Rule, UnknownRule, rule
from anekit.engine.evidence import POLICY, ROUTES
from anekit.rules.checks import (
    CHIPS,
    Finding,
    check_chip,
    check_function,
    check_program,
    check_surface_plan,
    check_weight_names,
    errors,
)

__all__ = [
    "CHIPS",
    "POLICY",
    "ROUTES",
    "RULES",
    "Finding",
    "Rule",
    "UnknownRule",
    "check_chip",
    "check_function",
    "check_program",
    "check_surface_plan",
    "check_weight_names",
    "errors",
    "rule",
]
