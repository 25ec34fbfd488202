"""The core MIL modules import one way: types <- values <- ir <- registry <- dialect <- printer.

Every import statement counts, those inside functions included (a deferred import is still a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import anekit.mil

ORDER = ("types", "values", "ir", "registry", "dialect", "printer")
MIL_DIR = Path(anekit.mil.__file__).parent


def _mil_imports(path: Path) -> set[str]:
    """The core mil modules a file imports, wherever the import statement stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # ``from anekit.mil import types as T`` names a module in the imported names
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["anekit", "mil"] and len(parts) > 2 and parts[2] in ORDER:
                found.add(parts[2])
    return found


@pytest.mark.parametrize("module", ORDER)
def test_core_mil_module_imports_only_modules_below_it(module: str) -> None:
    below = set(ORDER[: ORDER.index(module)])
    upward = _mil_imports(MIL_DIR / f"{module}.py") - below - {module}
    assert not upward, (
        f"anekit.mil.{module} imports {sorted(upward)}, which sit above it ({' <- '.join(ORDER)})"
    )


def test_the_scan_sees_imports_inside_functions(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "def f():\n    from anekit.mil.printer import print_program\n    from anekit.mil import ir\n"
    )
    assert _mil_imports(src) == {"printer", "ir"}
