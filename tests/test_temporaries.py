"""Temporaries named by kind and pid (``fileio.temporary_name``): a starting writer removes only its own
kind's leftovers of dead processes, never a live process's in-flight file; ``replace_path`` puts the old
output back when the final rename fails; killed ``kernels dump`` leftovers go on the next dump."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from anekit import fileio
from anekit.cli.main import main
from anekit.fileio import is_temporary, remove_stale_temporaries, replace_path, temporary_name


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_temporary_name_carries_its_kind_and_pid():
    t = temporary_name(Path("/x/ckpt.bin"), "write")
    assert t.name.startswith(f".ckpt.bin.write-{os.getpid()}.") and t.name.endswith(".tmp")
    assert is_temporary(t) and is_temporary(t, "write") and not is_temporary(t, "kernels")
    assert is_temporary(Path(".ckpt.bin.0123abcd.tmp"), "write")  # older anekit's names: atomic writes'
    with pytest.raises(ValueError):
        temporary_name(Path("x"), "Bad-kind")


def test_only_stale_temporaries_of_the_same_kind_are_removed(tmp_path):
    dead, live = dead_pid(), os.getppid()  # the parent (pytest's launcher) outlives this test
    stale = tmp_path / f".ckpt.bin.write-{dead}.0123abcd.tmp"
    in_flight = tmp_path / f".ckpt.bin.write-{live}.89abcdef.tmp"  # another live run's checkpoint write
    other_kind = tmp_path / f".k.kernels-{dead}.0123abcd.tmp"
    legacy = tmp_path / ".ckpt.bin.deadbeef.tmp"
    user = tmp_path / "notes.tmp"
    for p in (stale, in_flight, legacy, user):
        p.write_bytes(b"x")
    other_kind.mkdir()
    removed = remove_stale_temporaries(tmp_path, "write")
    assert sorted(removed) == sorted([stale, legacy])
    assert in_flight.exists() and other_kind.exists() and user.exists()
    assert remove_stale_temporaries(tmp_path, "kernels") == [other_kind] and not other_kind.exists()


def test_replace_path_puts_the_old_output_back_when_the_final_rename_fails(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    new = tmp_path / "new"
    new.mkdir()
    (new / "new.txt").write_text("new")
    real = os.replace

    def failing(src, dst):
        if Path(src) == new:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError):
        replace_path(new, out)
    monkeypatch.setattr(os, "replace", real)
    assert (out / "old.txt").read_text() == "old" and not (out / "new.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "out"]  # no aside directory left


def test_a_killed_kernels_dump_leaves_nothing_the_next_dump_keeps(tmp_path, monkeypatch, capsys):
    leftover = tmp_path / f".k.kernels-{dead_pid()}.0123abcd.tmp"  # what a killed dump left
    leftover.mkdir()
    (leftover / "half.mil").write_text("x")
    live = tmp_path / f".k.kernels-{os.getppid()}.89abcdef.tmp"  # a dump running now in another process
    live.mkdir()
    seen: list[str] = []
    real = fileio.temporary_dir

    def spy(out: Path, kind: str) -> Path:
        t = real(out, kind)
        seen.append(t.name)
        return t

    monkeypatch.setattr("anekit.cli.kernels_cmd.temporary_dir", spy)
    assert main(["kernels", "dump", "--config", "stories260K", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    assert seen and seen[0].startswith(f".k.kernels-{os.getpid()}.")
    assert not leftover.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["k", live.name])


def test_a_sigterm_mid_dump_removes_the_dump_temporary(tmp_path, monkeypatch, capsys):
    """SIGTERM while a dump writes unwinds (exit 143, one line): its temporary directory is removed."""
    import signal

    from anekit.cli import kernels_cmd

    real = kernels_cmd.write_kernels

    def write_then_term(folder, *args):
        lines = real(folder, *args)
        assert any(folder.iterdir())
        os.kill(os.getpid(), signal.SIGTERM)
        return lines

    monkeypatch.setattr(kernels_cmd, "write_kernels", write_then_term)
    with pytest.raises(SystemExit) as e:
        main(["kernels", "dump", "--config", "stories260K", str(tmp_path / "k")])
    assert e.value.code == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is not None  # the handler before the dump is back


def test_a_sigterm_mid_export_removes_the_package_temporary(tmp_path, monkeypatch, capsys):
    pytest.importorskip("coremltools")
    import signal

    from anekit.coreml import model_export
    from anekit.kernels.config import ModelConfig
    from anekit.llama.llama2c import write_llama2c
    from anekit.llama.params import Params

    src = tmp_path / "src" / "m.bin"
    src.parent.mkdir()
    write_llama2c(src, Params.init(ModelConfig(32, 48, 1, 4, 2, 64, 16, name="t"), seed=0))
    real = model_export._write_stage

    def write_then_term(*args, **kwargs):
        result = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(model_export, "_write_stage", write_then_term)
    out = tmp_path / "o" / "m.mlpackage"
    out.parent.mkdir()
    with pytest.raises(SystemExit) as e:
        main(["export", str(src), "--to", "mlpackage", str(out)])
    assert e.value.code == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in capsys.readouterr().err
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # no hidden temporary


def test_a_killed_exports_temporaries_are_removed_by_the_next_export(tmp_path, capsys):
    """SIGKILL cannot be caught: what a killed export (or package writer) left beside OUT is named by its
    kind and pid, and the next export removes it once its writer is gone; a live writer's is kept."""
    from anekit.cli.main import main
    from tests.conftest import corpus_path

    dead = 2**22 + 12345  # above the default pid_max: no such process
    stale = [
        tmp_path / f".m.mlpackage.export-{dead}.0123abcd.tmp",
        tmp_path / f".m.mlpackage.package-{dead}.89abcdef.tmp",
    ]
    live = tmp_path / ".m.mlpackage.export-1.fedcba98.tmp"  # pid 1 is always running
    for d in (*stale, live):
        (d / "Data").mkdir(parents=True)
    model = corpus_path("llama2c", "stories260K.bin")
    assert main(["export", str(model), "--to", "mlpackage", str(tmp_path / "m.mlpackage")]) == 0
    assert not any(d.exists() for d in stale) and live.is_dir()
