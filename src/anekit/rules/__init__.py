"""What the Neural Engine accepts: the rule book (rules as data, each with its public source) and its checks.

Read by ``anekit lint``, by the simulator's strict compile, by the kernels' tests and by the macOS
backend. See ``anekit.rules.book`` for the fields of a rule and ``anekit.rules.checks`` for the checks.
"""

from anekit.rules.book import CHIPS, RULES, Rule, UnknownRule, check_chip, rule
from anekit.rules.checks import (
    Finding,
    check_function,
    check_program,
    check_surface_plan,
    check_weight_names,
    errors,
)

__all__ = [
    "CHIPS",
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
