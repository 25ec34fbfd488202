"""The Makefile's quickstart targets: ``make run`` twice resumes the run out/ holds (``ARGS`` passes flags,
``ARGS=--force`` starts over), and ``make test`` sums skipped tests up in one line per reason."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")

# Stands in for the venv's anekit: logs its arguments; a new run leaves out/ckpt.bin as the real one does.
FAKE_ANEKIT = """#!/bin/sh
echo "anekit $*" >> calls.log
case "$*" in *--resume*) ;; *) mkdir -p out && touch out/ckpt.bin ;; esac
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The Makefile in a folder whose venv is installed already (its stamp newer than pyproject.toml)."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    os.utime(tmp_path / "pyproject.toml", (1e9, 1e9))
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "anekit").write_text(FAKE_ANEKIT)
    (bin_dir / "anekit").chmod(0o755)
    (tmp_path / "venv" / ".anekit-installed").write_text("")
    return tmp_path


def _make(project: Path, *args: str) -> str:
    proc = subprocess.run(
        [MAKE, "-s", "run", "VENV=venv", *args], cwd=project, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(MAKE is None, reason="needs make")
def test_make_run_twice_continues_the_run_and_args_start_over(project: Path) -> None:
    _make(project)
    again = _make(project)
    # make names the command; anekit's own first line says whether it continues the run or, the run
    # being finished, only samples it (tests/test_train_partial_writes.py)
    assert again.splitlines()[0] == (
        "venv/bin/anekit train --out out --resume   # out/ holds a run (make run ARGS=--force starts over)"
    )
    assert "continuing" not in again
    _make(project, "ARGS=--force --steps 10")
    assert (project / "calls.log").read_text().splitlines() == [
        "anekit train --out out",
        "anekit train --out out --resume",
        "anekit train --out out --force --steps 10",
    ]


SKIPPING = """
import pytest

from tests.conftest import corpus_path


def test_reads_one_corpus_file():
    corpus_path("nowhere", "a.bin")


def test_reads_another_corpus_file():
    corpus_path("nowhere", "b.bin")


@pytest.mark.parametrize("n", [1, 2])
def test_needs_a_mac(n):
    pytest.skip("needs a Mac")
"""


def _pytest(folder: Path, report: str) -> str:
    """pytest as `make test` runs it (the project's settings, ``-ra`` included, then ``report``)."""
    test = folder / "test_skipping.py"
    test.write_text(SKIPPING)
    settings = ["-c", str(ROOT / "pyproject.toml"), "-p", "no:cacheprovider", "-p", "tests.conftest"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *settings, report, str(test)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_make_test_sums_skips_up_in_one_line_per_reason_naming_the_corpus(tmp_path: Path) -> None:
    report = re.search(r"^PYTEST_REPORT := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert report and "s" not in report.group(1) and "a" not in report.group(1)
    out = _pytest(tmp_path, report.group(1))
    assert "SKIPPED" not in out
    lines = [line for line in out.splitlines() if " skipped: " in line]
    assert len(lines) == 2, out
    assert lines[0].startswith("2 skipped: they read real artifacts from ../shared/corpus (public files")
    assert lines[1] == "2 skipped: needs a Mac (pytest -rs lists each)"


def test_pytest_rs_still_lists_each_skip(tmp_path: Path) -> None:
    out = _pytest(tmp_path, "-rs")
    assert out.count("SKIPPED [") == 3 and " skipped: " not in out.replace("4 skipped", "")
