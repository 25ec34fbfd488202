"""One writer per output directory: ``anekit train`` holds ``OUT/.anekit.lock`` (flock) for its run, a second
``train`` on the same --out is refused with one line naming the holder, and the lock is released at the end
(the compile-budget re-exec keeps it: tests/test_train_signals.py's restart test runs through it)."""

from __future__ import annotations

import os
import signal
import socket
import stat
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
    assert not (tmp_path / LOCK_FILE).exists()  # each holder removes its lock file as it releases


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


def test_a_lock_file_found_in_out_is_never_written_and_no_lock_is_left_after_a_run(tmp_path):
    """A file at OUT/.anekit.lock whose flock is free (a killed run's, or anything put there) is unlinked,
    not rewritten: a hard link to it keeps its bytes and mtime; a normal run leaves no lock file."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    keep = tmp_path / "keep.txt"
    keep.write_bytes(b"a user's bytes, not a lock\n")
    os.utime(keep, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    os.link(keep, out / LOCK_FILE)
    before = os.stat(keep)
    done = subprocess.run(_cmd(out, 2), env=_env(cache), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert keep.read_bytes() == b"a user's bytes, not a lock\n"
    after = os.stat(keep)
    assert (after.st_mtime_ns, after.st_size, after.st_ino) == (before.st_mtime_ns, before.st_size,
                                                                 before.st_ino)  # fmt: skip
    assert not (out / LOCK_FILE).exists() and (out / "ckpt.bin").is_file()


def test_a_lock_path_that_is_a_symlink_or_fifo_is_refused_and_left_alone(tmp_path):
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    (tmp_path / "a").mkdir()
    os.symlink(target, tmp_path / "a" / LOCK_FILE)
    with pytest.raises(Exception) as e:
        DirLock(tmp_path / "a", "anekit train").acquire()
    assert str(e.value) == f"[lock] {tmp_path / 'a' / LOCK_FILE} is a symbolic link, not a lock file"
    assert target.read_bytes() == b"keep me" and (tmp_path / "a" / LOCK_FILE).is_symlink()
    (tmp_path / "b").mkdir()
    os.mkfifo(tmp_path / "b" / LOCK_FILE)
    with pytest.raises(Exception) as e:
        DirLock(tmp_path / "b", "anekit train").acquire()
    assert "is not a regular file" in str(e.value)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "b" / LOCK_FILE).st_mode)


def test_the_holders_line_is_written_once_into_the_file_it_created(tmp_path):
    with DirLock(tmp_path, "anekit train"):
        text = (tmp_path / LOCK_FILE).read_text()
        assert text.startswith(f"anekit train, pid {os.getpid()} on {socket.gethostname()}, since ")
        assert text.count("\n") == 1
    assert not (tmp_path / LOCK_FILE).exists()
