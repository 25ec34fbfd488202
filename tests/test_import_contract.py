"""The layer contract holds: no import circle between anekit's modules (imports inside functions count),
every top-level module placed in a layer, and import-linter's contracts of pyproject.toml kept.

The import graph is grimp's (installed with import-linter, the dev extra), built from the source of the
anekit these tests import. The imports the contracts list in ``ignore_imports`` (being removed) are left
out of the module graph too, so this file and ``lint-imports`` read one list.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

import anekit

grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (pip install -e '.[dev]')")
pytest.importorskip("importlinter", reason="import-linter is in the dev extra (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
SRC = Path(anekit.__file__).resolve().parents[1]


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` (node -> the nodes it points at), each sorted, in
    the order Tarjan's algorithm closes them. Iterative: a long chain needs no deep recursion."""
    nodes = sorted(set(graph) | {w for ws in graph.values() for w in ws})
    edges = {v: sorted(graph.get(v, ())) for v in nodes}
    index: dict[str, int] = {}  # order of discovery
    low: dict[str, int] = {}  # the smallest index reachable through the DFS subtree and one back edge
    stack: list[str] = []  # nodes of components not yet closed
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, 0)]  # (node, how many of its edges were followed)
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(edges[v]):
                w = edges[v][i]
                work.append((v, i + 1))
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:  # v roots a component: everything above it on the stack
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                found.append(sorted(component))
            if work:  # back in the parent: it reaches whatever v reaches
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return found


def _reachable(graph: Mapping[str, Iterable[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _components_by_reachability(graph: Mapping[str, Iterable[str]]) -> set[frozenset[str]]:
    """The reference: u and v share a component exactly when each reaches the other."""
    nodes = set(graph) | {w for ws in graph.values() for w in ws}
    reach = {v: _reachable(graph, v) for v in nodes}
    return {frozenset(w for w in reach[v] if v in reach[w]) for v in nodes}


def test_tarjan_on_a_graph_drawn_by_hand():
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["e"], "e": ["d", "f"], "f": ["f"], "g": []}
    got = strongly_connected(graph)
    assert sorted(got) == [["a", "b", "c"], ["d", "e"], ["f"], ["g"]]
    assert got.index(["d", "e"]) < got.index(["a", "b", "c"])  # a component closes after those it reaches


def test_tarjan_agrees_with_mutual_reachability_on_random_graphs():
    rng = random.Random(29)
    for trial in range(200):
        n = rng.randint(1, 12)
        graph = {str(v): [str(rng.randrange(n)) for _ in range(rng.randint(0, 3))] for v in range(n)}
        got = strongly_connected(graph)
        assert {frozenset(c) for c in got} == _components_by_reachability(graph), (trial, graph)
        assert sum(len(c) for c in got) == n


def test_tarjan_on_a_chain_deeper_than_the_recursion_limit():
    n = sys.getrecursionlimit() + 500
    graph = {str(v): [str(v + 1)] for v in range(n)}
    assert len(strongly_connected(graph)) == n + 1
    graph[str(n)] = ["0"]  # close the chain into one circle
    assert [len(c) for c in strongly_connected(graph)] == [n + 1]


# -- anekit's own graph ------------------------------------------------------------------------------


def _config() -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomllib or tomli")
    config: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return config


def _contract(config: dict[str, Any], contract_type: str) -> dict[str, Any]:
    found = [c for c in config["contracts"] if c["type"] == contract_type]
    assert len(found) == 1, f"pyproject.toml must hold one {contract_type} contract, holds {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def graph() -> Any:
    spec = importlib.util.find_spec("anekit")
    assert spec is not None and spec.origin == anekit.__file__, "grimp would read another anekit"
    return grimp.build_graph("anekit", include_external_packages=False, cache_dir=None)


def _pattern(expression: str) -> re.Pattern[str]:
    """A module expression as import-linter reads it: ``*`` one name, ``**`` one or more."""
    names = {"*": r"[^.]+", "**": r"[^.]+(?:\.[^.]+)*"}
    return re.compile(r"\.".join(names.get(part, re.escape(part)) for part in expression.split(".")))


def test_module_expressions_read_as_import_linter_reads_them():
    assert _pattern("anekit.models.**").fullmatch("anekit.models.gemma3")
    assert _pattern("anekit.models.**").fullmatch("anekit.models.sub.deep")
    assert not _pattern("anekit.models.**").fullmatch("anekit.models")
    assert _pattern("anekit.*.lora").fullmatch("anekit.llama.lora")
    assert not _pattern("anekit.*.lora").fullmatch("anekit.a.b.lora")
    assert not _pattern("anekit.mil").fullmatch("anekit_mil")  # a dot is a dot


def _ignored(graph: Any, config: dict[str, Any]) -> set[tuple[str, str]]:
    """The imports (importer, imported) that the contracts' ``ignore_imports`` name; each must match one."""
    pairs = set()
    for contract in config["contracts"]:
        for expression in contract.get("ignore_imports", []):
            importer, _, imported = (_pattern(part.strip()) for part in expression.partition("->"))
            matched = {
                (m, w)
                for m in graph.modules
                if importer.fullmatch(m)
                for w in graph.find_modules_directly_imported_by(m)
                if imported.fullmatch(w)
            }
            assert matched, (
                f"[{contract['id']}] ignore_imports: {expression!r} matches no import (gone: drop it)"
            )
            pairs |= matched
    return pairs


def _lines(graph: Any, importer: str, imported: str) -> list[str]:
    return [
        f"{d['importer']}:{d['line_number']} {d['line_contents']}"
        for d in graph.get_import_details(importer=importer, imported=imported)
    ]


def test_no_import_circle_between_modules(graph):
    ignored = _ignored(graph, _config())
    modules = {
        m: {w for w in graph.find_modules_directly_imported_by(m) if (m, w) not in ignored and w != m}
        for m in graph.modules
    }
    circles = [c for c in strongly_connected(modules) if len(c) > 1]
    report = []
    for circle in circles:
        members = set(circle)
        imports = [line for m in circle for w in sorted(modules[m] & members) for line in _lines(graph, m, w)]
        report.append(f"circle of {', '.join(circle)}:\n    " + "\n    ".join(imports))
    assert not circles, "import circles between anekit's modules:\n" + "\n".join(report)


def test_every_top_level_module_has_a_layer(graph):
    layers = _contract(_config(), "layers")
    assert layers["containers"] == ["anekit"]
    placed = {
        tail.strip().strip("()") for layer in layers["layers"] for tail in layer.replace(":", "|").split("|")
    }
    top = {m.split(".")[1] for m in graph.modules if m.count(".") >= 1}
    missing = sorted(top - placed)
    assert not missing, (
        f"pyproject.toml's layers contract places no layer for anekit.{', anekit.'.join(missing)}"
    )


def test_import_linter_contracts_are_kept():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
    }
    run = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    done = subprocess.run(
        [sys.executable, "-c", run, "--no-cache", "--no-logo", str(PYPROJECT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    rc = done.returncode
    assert rc == 0, f"lint-imports:\n{done.stdout}\n{done.stderr}"
    assert "0 broken" in done.stdout, done.stdout
