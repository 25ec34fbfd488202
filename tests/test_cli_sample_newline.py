"""``anekit sample`` ends its text with a newline, so the statistics line (stderr) starts a line of its
own where both streams go to one terminal or file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from anekit.kernels import PRESETS
from anekit.llama.llama2c import write_llama2c
from anekit.llama.params import Params
from tests.test_cli_train_init_tokenizer import _tokenizer_512

ROOT = Path(__file__).resolve().parents[1]


def test_the_text_ends_with_a_newline_before_the_statistics_line(tmp_path: Path) -> None:
    write_llama2c(tmp_path / "model.bin", Params.init(PRESETS["stories260K"], seed=1))
    _tokenizer_512(tmp_path / "tokenizer.bin")
    argv = [sys.executable, "-m", "anekit.cli.main", "sample", "model.bin", "--steps", "12", "--seed", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    both = subprocess.run(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120
    )
    assert both.returncode == 0, both.stdout
    lines = both.stdout.decode("utf-8", "replace").splitlines()
    assert re.match(r"\d+ tokens generated, 12 positions in ", lines[-1]), lines  # a line of its own
    alone = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert alone.stdout.endswith(b"\n") and alone.stdout.count(b"\n") >= 1, alone.stdout
