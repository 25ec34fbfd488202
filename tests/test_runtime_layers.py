"""The runtime as a layer (DESIGN.md, "The layers"): no import circle among its modules, imports inside
functions and under TYPE_CHECKING counted, and no import of a layer under it."""

from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp")

# The layers under the runtime (DESIGN.md), those of today's layout among them.
BELOW = ("models", "kernels", "formats", "train", "generate", "inspect", "coreml", "cost", "cli", "llama", "hf")  # fmt: skip


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("anekit")  # every import statement, wherever it stands


def _circles(graph, modules: set[str]) -> list[list[str]]:
    """The strongly connected components of more than one module of the import graph over ``modules``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v) & modules:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return found


def test_no_import_circle_inside_the_runtime(graph):
    runtime = {m for m in graph.modules if m == "anekit.runtime" or m.startswith("anekit.runtime.")}
    assert "anekit.runtime.sim.chip" in runtime and "anekit.runtime.session" in runtime
    assert _circles(graph, runtime) == []


def test_the_circle_finder_finds_a_circle(graph):
    """The check itself: two modules importing each other are one circle."""

    class Pair:
        modules = {"a", "b", "c"}

        @staticmethod
        def find_modules_directly_imported_by(m: str) -> set[str]:
            return {"a": {"b"}, "b": {"a", "c"}, "c": set()}[m]

    assert _circles(Pair, Pair.modules) == [["a", "b"]]


def test_the_runtime_imports_no_layer_under_it(graph):
    runtime = {m for m in graph.modules if m == "anekit.runtime" or m.startswith("anekit.runtime.")}
    below = tuple(f"anekit.{name}" for name in BELOW)
    up = sorted(
        (m, d)
        for m in runtime
        for d in graph.find_modules_directly_imported_by(m)
        if d in below or d.startswith(tuple(f"{b}." for b in below))
    )
    assert up == []
