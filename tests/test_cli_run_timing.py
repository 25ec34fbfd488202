"""``anekit run``'s timings in a fresh process: the process's one-time set-up (importing numba's compiled
loops, hundreds of ms) is not counted as the program's compile, which takes about a millisecond for a
three-op program (README, "The sanitizer")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 64, 1, 32]> x) {
            tensor<fp16, [1, 64, 1, 32]> y = mul(x = x, y = x)[name = string("y")];
            tensor<fp16, [1, 64, 1, 32]> z = sub(x = y, y = y)[name = string("z")];
            tensor<fp16, [1, 64, 1, 32]> s = sigmoid(x = z)[name = string("s")];
    } -> (s);
}
"""
COMPILE_MS_MAX = 150.0  # a three-op program; the set-up measured 760-1250 ms on a 2-core machine


def test_compile_in_a_fresh_process_does_not_count_the_set_up(tmp_path: Path) -> None:
    pytest.importorskip("numba", reason="without the fast extra there are no compiled loops to set up")
    (tmp_path / "prog.mil").write_text(PROGRAM)
    np.save(tmp_path / "x.npy", np.full((1, 64, 1, 32), 3, np.float32))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ANEKIT_JIT": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "anekit.cli.main", "run", "prog.mil", "--input", "x=x.npy", "--chip", "m1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    found = re.search(r"compile ([\d.]+) ms, first run ([\d.]+) ms", proc.stdout)
    assert found, proc.stdout
    assert float(found.group(1)) < COMPILE_MS_MAX, proc.stdout
