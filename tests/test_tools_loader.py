"""The loader (``anekit.tools.loader``) and weights resolution (``anekit.tools.weights``) called from
Python: each kind of path, a missing one, a directory of the wrong kind, weights beside a program or given.

The expected weight files are the paths this test wrote; the programs are checked by what they compute
against numpy (float64), never against the loader's own view of them.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.errors import AnekitError, MilSyntaxError
from anekit.inputs import InputError
from anekit.mil import tensor
from anekit.tools import loader, weights
from anekit.tools.lint import lint_paths
from tests.coreml_oracle import coremltools

SRC = Path(__file__).resolve().parents[1] / "src" / "anekit"
RNG = np.random.default_rng(29)


def _program_with_weights(folder: Path) -> tuple[Path, np.ndarray]:
    """folder/model.mil multiplying x by a [1, 64, 1, 32] fp16 weight stored in folder/weights/."""
    w = RNG.standard_normal((1, 64, 1, 32)).astype(np.float16)
    b = mil.Builder(blob_storage=True, blob_threshold=1024)
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 64, 1, 32]))
    f.output(f.mul(x=x, y=w, name="y"))
    ((ref, data),) = b.weights.items()
    folder.mkdir(parents=True)
    (folder / "weights").mkdir()
    (folder / "weights" / "weight.bin").write_bytes(data)
    assert ref == "@model_path/weights/weight.bin"
    (folder / "model.mil").write_text(mil.to_text(b.build()))
    return folder / "model.mil", w


def _computes(loaded: loader.Loaded, w: np.ndarray) -> None:
    """The loaded program, with the weight files the loader found, computes x * w."""
    x = RNG.standard_normal((1, 64, 1, 32)).astype(np.float32)
    kernel = runtime.open("sim").compile(loaded.program, dict(loaded.weights))
    want = x.astype(np.float16).astype(np.float64) * w.astype(np.float64)
    np.testing.assert_allclose(kernel(x=x)["y"], want, rtol=2e-3, atol=1e-3)


# -- one program ------------------------------------------------------------------------------------


def test_a_mil_file_opens_with_its_weights_beside_it(tmp_path: Path) -> None:
    path, w = _program_with_weights(tmp_path / "k")
    loaded = loader.open_program(path)
    assert (loaded.kind, loaded.path, loaded.function, loaded.route) == ("mil", path, "main", None)
    assert dict(loaded.weights) == {
        "@model_path/weights/weight.bin": tmp_path / "k" / "weights" / "weight.bin"
    }
    assert loaded.name == "k" and loaded.missing == ()
    _computes(loaded, w)


def test_a_compiled_model_directory_opens_on_the_coreml_route(tmp_path: Path) -> None:
    path, w = _program_with_weights(tmp_path / "m.mlmodelc")
    loaded = loader.open_program(tmp_path / "m.mlmodelc")
    assert (loaded.kind, loaded.path, loaded.route) == ("compiled", path, "coreml")
    _computes(loaded, w)


def test_weights_given_as_a_directory_or_a_file(tmp_path: Path) -> None:
    path, w = _program_with_weights(tmp_path / "k")
    moved = tmp_path / "elsewhere"
    (tmp_path / "k" / "weights").rename(moved)
    other = tmp_path / "w16.bin"  # one file of another name: the only one the program reads
    other.write_bytes((moved / "weight.bin").read_bytes())
    for source, file in (
        (moved, moved / "weight.bin"),
        (moved / "weight.bin", moved / "weight.bin"),
        (other, other),
    ):
        loaded = loader.open_program(path, source)
        assert dict(loaded.weights)["@model_path/weights/weight.bin"] == file
        _computes(loaded, w)


def test_a_missing_weight_file_names_the_const_and_the_file(tmp_path: Path) -> None:
    path, _ = _program_with_weights(tmp_path / "k")
    (tmp_path / "k" / "weights" / "weight.bin").unlink()
    with pytest.raises(weights.MissingWeightFile) as e:
        loader.open_program(path, where="[t]")
    said = str(e.value)
    assert said.startswith("[t] const '") and "'@model_path/weights/weight.bin'" in said
    assert str(tmp_path / "k" / "weights" / "weight.bin") in said
    # beside() does not refuse: it lists what is missing
    found = weights.beside(loader.read_mil(path).program, path.parent)
    assert found.files == {} and [c.path for c in found.missing] == ["@model_path/weights/weight.bin"]


def test_a_missing_path_is_an_anekit_error_naming_it(tmp_path: Path) -> None:
    nowhere = tmp_path / "nowhere.mil"
    with pytest.raises(AnekitError, match=r"nowhere\.mil: no such file or directory"):
        loader.open_program(nowhere)
    with pytest.raises(InputError, match=r"^\[load\] .*nowhere\.mil: no such file or directory"):
        loader.locate(nowhere)


def test_a_directory_of_the_wrong_kind_says_what_was_expected(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no program here")
    with pytest.raises(loader.PathKindError) as e:
        loader.open_program(tmp_path)
    assert str(tmp_path) in str(e.value) and "a directory without a model.mil" in str(e.value)
    with pytest.raises(loader.PathKindError, match=r"no \.mil file below this directory"):
        loader.locate(tmp_path)
    with pytest.raises(loader.PathKindError, match=r"no model\.mil or \.mil files in this directory"):
        loader.locate(tmp_path, layout="dump")


def test_text_that_is_not_mil_is_a_syntax_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.mil"
    bad.write_text("program(1.0)\n{\n  func main<ios18>( {\n")
    with pytest.raises(MilSyntaxError):
        loader.open_program(bad)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "p.mil"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"a FIFO \(named pipe\), not a MIL text file"):
        loader.locate(fifo, expected="a MIL text file")


def test_a_package_opens_with_its_own_weights_and_default_function(tmp_path: Path) -> None:
    coremltools()  # the package writer needs coremltools' protobuf classes
    from anekit.coreml import save_mlpackage

    path, w = _program_with_weights(tmp_path / "k")
    program = loader.open_program(path).program
    pkg = save_mlpackage(program, tmp_path / "m.mlpackage", weights=dict(loader.open_program(path).weights))
    loaded = loader.open_program(pkg)
    assert (loaded.kind, loaded.route, loaded.function) == ("package", "coreml", "main")
    assert loaded.weight_bytes == sum(p.stat().st_size for p in set(loaded.weights.values()))
    _computes(loaded, w)
    with pytest.raises(AnekitError, match="carries its own weights"):
        loader.open_program(pkg, tmp_path / "k" / "weights")
    assert loader.locate(pkg) == [("package", pkg)]


# -- every program a path holds ------------------------------------------------------------------------


def test_a_kernels_dump_is_found_in_both_layouts(tmp_path: Path) -> None:
    for name in ("b_kernel", "a_kernel"):
        _program_with_weights(tmp_path / "dump" / name)
    want = [("mil", tmp_path / "dump" / n / "model.mil") for n in ("a_kernel", "b_kernel")]
    assert loader.locate(tmp_path / "dump") == want
    assert loader.locate(tmp_path / "dump", layout="dump") == want
    [loaded] = loader.load("mil", want[0][1])
    assert loaded.name == "a_kernel"
    (tmp_path / "dump" / "b_kernel" / "model.mil").unlink()
    with pytest.raises(loader.PathKindError, match=r"kernel folder\(s\) b_kernel hold no model\.mil"):
        loader.locate(tmp_path / "dump", layout="dump")


def test_a_python_file_yields_its_module_level_programs(tmp_path: Path) -> None:
    script = tmp_path / "gen.py"
    script.write_text(
        "from anekit.mil import Builder, tensor\n"
        "b = Builder()\n"
        "f = b.function('main')\n"
        "f.output(f.mul(x=f.input('x', tensor('fp16', [1, 64, 1, 32])), y=2.0, name='y'))\n"
        "doubled = b.build()\n"
        "_hidden = doubled\n"
    )
    assert loader.locate(script) == [("python", script)]
    [found] = loader.load("python", script)
    assert (found.target, found.kind) == (f"{script}::doubled", "python")
    x = RNG.standard_normal((1, 64, 1, 32)).astype(np.float32)
    got = runtime.open("sim").compile(found.program)(x=x)["y"]
    np.testing.assert_allclose(got, x.astype(np.float16).astype(np.float64) * 2, rtol=1e-3)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(loader.PathKindError, match="defines no module-level Program"):
        loader.python_programs(empty)


def test_lint_paths_from_python(tmp_path: Path) -> None:
    path, _ = _program_with_weights(tmp_path / "k")
    [result] = lint_paths([tmp_path / "k"])
    assert result.target == str(path) and result.errors == 0 and result.missing_weights == []
    (tmp_path / "k" / "weights" / "weight.bin").unlink()
    [result] = lint_paths([path])
    assert len(result.missing_weights) == 1 and "which is not in" in result.missing_weights[0]


def test_the_rule_checks_open_no_package_and_no_file() -> None:
    """rules/lint.py checks a program it is given: it imports nothing from the layers above it."""
    tree = ast.parse((SRC / "rules" / "lint.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [
        m for m in imported if m.startswith(("anekit.coreml", "anekit.tools", "anekit.inputs", "runpy"))
    ]
