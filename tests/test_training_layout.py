"""The training package's place in the layers: it imports only what lies below it (llama, kernels, runtime
and the ground modules), nothing below it imports it, no import circle runs through it (imports inside
functions count), LoRA's wrapper knows no file format, one ``Run`` is given a source (never subclassed), and
``anekit train`` asks the run nothing by name (no getattr / hasattr)."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="grimp (installed with import-linter) builds the import graph")

SRC = Path(__file__).resolve().parents[1] / "src" / "anekit"
TRAINING = "anekit.training"
# The modules of the training work: the package, and the Hugging Face source, PEFT's adapter files and the
# command, which sit above it.
OWNED = (TRAINING, "anekit.hf.training", "anekit.hf.adapters", "anekit.cli.train_cmd")
ABOVE = ("anekit.cli", "anekit.cost", "anekit.inspect", "anekit.coreml", "anekit.hf")
BELOW = (
    "anekit.llama",
    "anekit.kernels",
    "anekit.models",
    "anekit.runtime",
    "anekit.rules",
    "anekit.engine",
    "anekit.mil",
)
FORMATS = ("anekit.hf", "anekit.fileio", "anekit.inputs", "anekit.jsonio", "anekit.outputs", "anekit.coreml")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("anekit")


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _imports(graph, module: str) -> list[tuple[str, int, str]]:
    """(imported module, line, the import's text) of every import ``module`` makes."""
    found = []
    for imported in graph.find_modules_directly_imported_by(module):
        for d in graph.get_import_details(importer=module, imported=imported):
            found.append((imported, d["line_number"], d["line_contents"]))
    return found


def _circles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = edges[node]
            if i < len(children):
                work.append((node, i + 1))
                child = children[i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_no_training_module_imports_a_package_above_it(graph):
    up = [
        f"{m}:{line} {text}"
        for m in sorted(graph.modules)
        if _in(m, (TRAINING,))
        for imported, line, text in _imports(graph, m)
        if _in(imported, ABOVE)
    ]
    assert not up, "imports running up from anekit.training:\n" + "\n".join(up)


def test_nothing_below_training_imports_it(graph):
    up = [
        f"{m}:{line} {text}"
        for m in sorted(graph.modules)
        if _in(m, BELOW)
        for imported, line, text in _imports(graph, m)
        if _in(imported, (TRAINING,))
    ]
    assert not up, "imports of anekit.training from below it:\n" + "\n".join(up)


def test_no_import_circle_runs_through_the_training_modules(graph):
    circles = [c for c in _circles(graph) if any(_in(m, OWNED) for m in c)]
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_loras_wrapper_knows_no_file_format(graph):
    """PEFT's files are anekit.hf.adapters' job: it imports the wrapper, never the reverse."""
    formats = [f"line {line}: {text}" for imported, line, text in _imports(graph, "anekit.training.lora")
               if _in(imported, FORMATS)]  # fmt: skip
    assert not formats, "anekit.training.lora reads or writes files:\n" + "\n".join(formats)
    assert "anekit.training.lora" in graph.find_modules_directly_imported_by("anekit.hf.adapters")


def test_one_run_class_given_a_source():
    from anekit.training.run import Run

    for module in ("anekit.cli.train_cmd", "anekit.hf.training"):  # everything that makes runs, loaded
        importlib.import_module(module)

    assert Run.__subclasses__() == []
    assert sys.modules["anekit"].Run is Run


def test_the_command_asks_the_run_nothing_by_name():
    tree = ast.parse((SRC / "cli" / "train_cmd.py").read_text(encoding="utf-8"))
    probes = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr")
    ]
    assert not probes, "anekit train probes an object by name:\n" + "\n".join(probes)
