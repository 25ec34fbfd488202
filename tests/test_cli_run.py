"""``anekit run``: timings reported apart, a compiled .mlmodelc, weights found beside the program.

Results are compared with numpy float64 computed here, never with the simulator itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from anekit import mil
from anekit.cli.main import main
from anekit.mil import tensor
from tests.conftest import corpus_path

RNG = np.random.default_rng(11)


def _fp16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float16).astype(np.float64)


def test_compile_first_run_and_warm_runs_are_reported_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The first run carries one-time setup (hundreds of ms for a 10-element multiply, against
    hundredths warm): it is its own number, and the median is taken over the warm runs only."""
    mil_file = corpus_path("mlmodelc", "add_model.mlmodelc", "model.mil")
    program = tmp_path / "mul.mil"
    program.write_text(mil_file.read_text())
    assert main(["run", str(program), "--random", "0", "--repeat", "3", "--no-strict", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"compile_ms", "first_run_ms", "run_ms"} <= set(report) and report["repeat"] == 3
    assert all(report[k] > 0 for k in ("compile_ms", "first_run_ms", "run_ms"))
    assert main(["run", str(program), "--random", "0", "--no-strict"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert (
        ", compile " in line and ", first run " in line and ", warm run " in line and "(median of 1)" in line
    )


def test_a_compiled_mlmodelc_runs_its_model_mil(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`anekit run X.mlmodelc` runs the program inside (it once printed a raw ``[Errno 21]``); its
    [1, 10] I/O is CoreML's, judged by the CoreML route's rules."""
    model = corpus_path("mlmodelc", "add_model.mlmodelc")
    x, y = RNG.standard_normal((2, 1, 10)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    out = tmp_path / "out.npz"
    args = ["run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}"]
    assert main([*args, "--output", str(out)]) == 0
    assert "Errno" not in capsys.readouterr().out
    got = np.load(out)["var_3"]
    np.testing.assert_allclose(got, _fp16(_fp16(x) * _fp16(y)), rtol=1e-3, atol=1e-3)


def test_a_directory_without_a_program_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["run", str(tmp_path), "--random", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("anekit: [run] cannot read") and "without a model.mil" in err
    assert "Errno" not in err and err.count("\n") == 1


def _program_with_weights(folder: Path) -> tuple[Path, np.ndarray]:
    """folder/model.mil multiplying x by a [1, 64, 1, 32] fp16 BLOBFILE weight in folder/weights/."""
    w = RNG.standard_normal((1, 64, 1, 32)).astype(np.float16)
    b = mil.Builder(blob_storage=True, blob_threshold=1024)
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 64, 1, 32]))
    f.output(f.mul(x=x, y=w, name="y"))
    program = b.build()
    ((ref, data),) = b.weights.items()
    (folder / ref.removeprefix("@model_path/")).parent.mkdir(parents=True)
    (folder / ref.removeprefix("@model_path/")).write_bytes(data)
    (folder / "model.mil").write_text(mil.to_text(program))
    return folder / "model.mil", w


def test_weights_beside_the_program_need_no_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """BLOBFILE paths resolve against the program's folder, as `anekit lint` resolves them."""
    program, w = _program_with_weights(tmp_path / "kernel")
    x = RNG.standard_normal((1, 64, 1, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    assert main(["run", str(program), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out)]) == 0
    np.testing.assert_allclose(np.load(out)["y"], _fp16(_fp16(x) * w.astype(np.float64)), rtol=1e-3)
    # without them, one line naming the file and the flag
    (tmp_path / "kernel" / "weights" / "weight.bin").unlink()
    capsys.readouterr()
    assert main(["run", str(program), "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    err = capsys.readouterr().err
    assert "refers to weight file '@model_path/weights/weight.bin', which is not beside the program" in err
    assert "--weights" in err
    assert err.count("\n") == 1


def _two_function_program(path: Path) -> Path:
    """path: MIL text with two functions, ``main`` and ``half``, each scaling a [1, 64, 1, 32] input."""
    b = mil.Builder()
    for name, scale in (("main", 2.0), ("half", 0.5)):
        f = b.function(name)
        x = f.input("x", tensor("fp16", [1, 64, 1, 32]))
        f.output(f.mul(x=x, y=np.float16(scale), name="y"))
    path.write_text(mil.to_text(b.build()))
    return path


@pytest.mark.parametrize("name", ["", " ", "\t"])
def test_an_empty_function_name_is_refused_naming_the_functions(
    tmp_path: Path, capsys: pytest.CaptureFixture, name: str
) -> None:
    """`--function ''` once ran main without a word: an empty name names no function."""
    program = _two_function_program(tmp_path / "two.mil")
    assert main(["run", str(program), "--random", "0", "--function", name]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        err == "anekit: [run] --function is empty: name one of the program's functions (it has: main, half)\n"
    )
    assert main(["run", str(program), "--random", "0", "--function", "half", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"]["y"]["shape"] == [1, 64, 1, 32]


def test_a_python_file_is_sent_to_lint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`run` takes MIL, a package or an .mlmodelc; a Python file defining programs is what `lint` takes."""
    script = tmp_path / "kernel.py"
    script.write_text(
        "from anekit import mil\n\nb = mil.Builder()\nf = b.function('main')\n"
        "x = f.input('x', mil.tensor('fp16', [1, 64, 1, 32]))\nf.output(f.relu(x=x, name='y'))\n"
        "PROGRAM = b.build()\n"
    )
    assert main(["run", str(script), "--random", "0"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"anekit: [run] {script} is a Python file: run takes MIL text (.mil), a CoreML ")
    assert err.rstrip().endswith(f"use `anekit lint {script}`")
    # the advice works: lint finds the program (a module-level function builder `f` is no program)
    assert main(["lint", str(script), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["programs"]) == 1
