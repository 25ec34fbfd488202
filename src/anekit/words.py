"""Counted nouns in what anekit prints: "1 program", "2 programs"."""

from __future__ import annotations


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1: ``plural(1, "step")`` is "1 step",
    ``plural(3, "step")`` "3 steps"; ``many`` is an irregular plural (``plural(2, "entry", "entries")``)."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"
