"""One writer per output directory: ``anekit train`` holds ``OUT/.anekit.lock`` (flock) for its run, a second
``train`` on the same --out is refused with one line naming the holder, and the lock is released at the end
(the compile-budget re-exec keeps it: tests/test_train_signals.py's restart test runs through it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from anekit.fileio import LOCK_FILE, DirectoryBusy, DirLock
from tests.conftest import PROJECT_ROOT


def test_a_second_lock_on_a_directory_is_refused_naming_the_holder(tmp_path):
    with DirLock(tmp_path, "anekit train"):
        with pytest.raises(DirectoryBusy) as e:
            DirLock(tmp_path, "anekit export").acquire()
        assert f"anekit train, pid {os.getpid()} on {socket.gethostname()}" in str(e.value)
    with DirLock(tmp_path, "anekit train"):  # released: taken again
        pass
    assert (tmp_path / LOCK_FILE).is_file()


def _env(cache: Path) -> dict[str, str]:
    src = str(PROJECT_ROOT / "src")
    return dict(
        os.environ, ANEKIT_CACHE=str(cache), PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", "")
    )


def _cmd(out: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "anekit.cli.main", "train", "--out", str(out), "--steps", str(steps),
            "--accum", "1", "--sample-steps", "0", "--checkpoint-every", "1000"]  # fmt: skip


def test_two_trains_on_one_out_the_second_is_refused_naming_the_first(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    first = subprocess.Popen(
        _cmd(out, 2000), env=_env(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout is not None
        for line in first.stdout:
            if line.startswith("step "):
                break
        else:
            raise AssertionError(
                f"the first run never stepped: {first.stderr.read() if first.stderr else ''}"
            )
        before = (out / "ckpt.bin").read_bytes()
        second = subprocess.run(
            [*_cmd(out, 5), "--force"], env=_env(cache), capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 1, second.stderr
        assert second.stderr.count("\n") == 1, second.stderr
        assert second.stderr.startswith("anekit: [lock] ") and f"pid {first.pid}" in second.stderr, (
            second.stderr
        )
        assert "anekit train" in second.stderr and second.stdout == ""
        assert (out / "ckpt.bin").read_bytes() == before  # the refused run wrote nothing
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM
    with DirLock(out, "test"):  # the lock went with the first process
        pass
