"""The writers that build their output aside and rename it in (``export``, ``kernels dump``) hold a lock
beside the target while they write: a second writer of the same path is refused with one line naming the
holder, the lock file goes when the writer does, and a Ctrl-C mid-write leaves no output, no temporary and
no lock behind (the ``train`` lock, inside its directory, is tests/test_train_lock.py's)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from anekit.cli import kernels_cmd
from anekit.cli.main import main
from anekit.fileio import DirectoryBusy, DirLock
from anekit.kernels.config import ModelConfig
from anekit.llama.llama2c import write_llama2c
from anekit.llama.params import Params
from tests.conftest import PROJECT_ROOT

TINY = ModelConfig(32, 48, 2, 4, 2, 512, 16, name="tiny")


def _leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_a_lock_beside_a_target_refuses_a_second_holder_and_goes_on_release(tmp_path):
    target = tmp_path / "sub" / "model.mlpackage"
    with DirLock.beside(target, "anekit export"):
        assert _leftovers(tmp_path / "sub") == [".model.mlpackage.anekit.lock"]
        with pytest.raises(DirectoryBusy) as e:
            DirLock.beside(target, "anekit export").acquire()
        holder = f"{target} is being written by another process (anekit export, pid {os.getpid()} on "
        assert holder + socket.gethostname() in str(e.value)
        with DirLock.beside(tmp_path / "sub" / "other.mlpackage", "anekit export"):  # another path: free
            pass
    assert _leftovers(tmp_path / "sub") == []


def test_a_lock_file_replaced_under_a_waiting_writer_is_not_trusted(tmp_path, monkeypatch):
    """The holder removes the file as it releases; a writer that opened the old file then locks a file
    that is no longer at the path, and must open the new one instead of believing it holds the lock."""
    target = tmp_path / "k"
    lock = DirLock.beside(target, "anekit kernels dump")
    opened = []
    real = lock._lock_once

    def lock_once() -> int:
        fd = real()
        opened.append(fd)
        if len(opened) == 1:  # the releasing holder removed it between this open and this flock
            os.unlink(lock.path)
        return fd

    monkeypatch.setattr(lock, "_lock_once", lock_once)
    with lock:
        assert len(opened) == 2 and lock.fd == opened[1]
        assert os.fstat(lock.fd).st_ino == os.stat(lock.path).st_ino


def test_kernels_dump_is_refused_while_another_dump_writes_the_same_folder(tmp_path, capsys):
    out = tmp_path / "k"
    with DirLock.beside(out, "anekit kernels dump"):
        assert main(["kernels", "dump", "--config", "stories260K", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"anekit: [lock] {out} is being written by another")
    assert "anekit kernels dump, pid" in err and not out.exists()


@pytest.mark.parametrize("to, name", [("llama2c", "m.bin"), ("mlpackage", "m.mlpackage")])
def test_export_is_refused_while_another_export_writes_the_same_path(tmp_path, capsys, to, name):
    model, out = tmp_path / "tiny.bin", tmp_path / "out" / name
    write_llama2c(model, Params.init(TINY, seed=1))
    with DirLock.beside(out, "anekit export"):
        assert main(["export", str(model), "--to", to, str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"anekit: [lock] {out} is being written by another"), err
    assert not out.exists()
    assert main(["export", str(model), "--to", to, str(out)]) == 0  # free again: it writes
    assert out.exists() and _leftovers(out.parent) == []


def test_ctrl_c_during_kernels_dump_is_one_line_130_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "k"
    real = kernels_cmd.write_kernels

    def interrupted(folder, names, *rest):
        real(folder, names[:2], *rest)  # two kernels written into the temporary, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(kernels_cmd, "write_kernels", interrupted)
    assert main(["kernels", "dump", "--config", "stories260K", str(out)]) == 130
    captured = capsys.readouterr()
    assert captured.err == "anekit: interrupted\n" and captured.out == ""
    assert list(tmp_path.iterdir()) == []  # no OUT_DIR, no temporary, no lock file


def test_two_kernels_dumps_started_together_one_writes_and_the_other_is_refused_or_finds_it(tmp_path):
    """Two processes on one OUT_DIR: whichever order they meet in, exactly one writes it, the other ends
    with one line (refused by the lock, or by the finished folder without --force), nothing is left."""
    out = tmp_path / "k"
    env = dict(
        os.environ, PYTHONPATH=str(PROJECT_ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    cmd = [sys.executable, "-m", "anekit.cli.main", "kernels", "dump", "--config", "stories15M", str(out)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 1], results
    err = next(r[2] for r in results if r[0] == 1)
    assert err.count("\n") == 1 and ("[lock]" in err or "exists (use --force" in err), err
    assert (out / "kernels.json").is_file() and _leftovers(tmp_path) == []


def test_a_dump_that_finished_while_this_one_started_is_not_replaced_without_force(
    tmp_path, capsys, monkeypatch
):
    """OUT_DIR is checked again once the lock is held: another dump may have written it in between."""
    from anekit import fileio

    out = tmp_path / "k"
    real = fileio.DirLock.acquire

    def acquire(self):
        out.mkdir(exist_ok=True)  # the other dump finished just before this one got the lock
        (out / "kernels.json").write_text("{}")
        return real(self)

    monkeypatch.setattr(fileio.DirLock, "acquire", acquire)
    assert main(["kernels", "dump", "--config", "stories260K", str(out)]) == 1
    assert "exists (use --force" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["kernels.json"]
