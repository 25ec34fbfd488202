"""Outputs that are devices or FIFOs are written into or refused, never replaced by a regular file; output
names near the file system's limit give one line before any work (a legal name whose temporary beside it
would pass the limit included), and a legal run directory name trains.

The character devices are made here with ``os.mknod`` as copies of /dev/null (1, 3) and /dev/full (1, 7):
the same driver, so a write behaves as it would on /dev/null and /dev/full, without risking the system's
own nodes should a regression replace them (root only, as the report's /dev/null case is)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from anekit.cli.main import main
from anekit.errors import AnekitError
from anekit.fileio import replace_path
from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
NAME_MAX = 255  # Linux, macOS: the longest name of one directory entry, in bytes


def _device(path: Path, major: int, minor: int) -> Path:
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    return path


def _node(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev


def _one_line(capsys, says: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert "Traceback" not in err[0]
    return err[0]


@pytest.fixture
def hf(tmp_path) -> Path:
    model = tmp_path / "m"
    make_tokenizer(model, 512, "llama3")
    make_checkpoint(model, small("tiny_llama2c", num_hidden_layers=1), dtype="float32", seed=1)
    return model


needs_root = pytest.mark.skipif(not ROOT, reason="making a character device needs root")


@needs_root
def test_doctor_json_writes_into_a_null_device_and_leaves_the_node(tmp_path, capsys):
    null = _device(tmp_path / "null", 1, 3)
    before = _node(null)
    assert main(["doctor", "--json", str(null)]) == 0
    assert _node(null) == before and stat.S_ISCHR(before[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary, no lock


@needs_root
def test_doctor_json_on_a_full_device_is_one_line_and_leaves_the_node(tmp_path, capsys):
    full = _device(tmp_path / "full", 1, 7)
    before = _node(full)
    capsys.readouterr()
    assert main(["doctor", "--json", str(full)]) == 1
    _one_line(capsys, f"[doctor] --json {full}: cannot write: no space left on the device")
    assert _node(full) == before


def test_doctor_json_into_a_fifo_is_read_by_its_reader(tmp_path, capsys):
    fifo = tmp_path / "report"
    os.mkfifo(fifo)
    before = _node(fifo)
    got: list[bytes] = []

    def drain() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    assert main(["doctor", "--json", str(fifo)]) == 0
    reader.join(20)
    assert not reader.is_alive()
    assert isinstance(json.loads(got[0]), dict)  # the whole report, valid JSON
    assert _node(fifo) == before


def test_doctor_json_into_a_fifo_nobody_reads_is_refused_without_waiting(tmp_path, capsys):
    fifo = tmp_path / "report"
    os.mkfifo(fifo)
    before = _node(fifo)
    capsys.readouterr()
    assert main(["doctor", "--json", str(fifo)]) == 1
    _one_line(capsys, "a FIFO that no process reads")
    assert _node(fifo) == before


@pytest.mark.parametrize("kind", ("null", "fifo"))
def test_a_model_export_onto_a_device_or_fifo_is_refused_naming_its_kind(tmp_path, capsys, hf, kind):
    if kind == "null":
        if not ROOT:
            pytest.skip("making a character device needs root")
        out, says = _device(tmp_path / "null", 1, 3), "a character device, not a regular file"
    else:
        out, says = tmp_path / "pipe", "a FIFO (named pipe), not a regular file"
        os.mkfifo(out)
    before = _node(out)
    capsys.readouterr()
    assert main(["export", str(hf), "--to", "llama2c", str(out), "--force"]) == 1
    _one_line(capsys, f"[export] OUT {out}: {says}")
    assert _node(out) == before
    assert not (tmp_path / "tokenizer.bin").exists()


def test_replace_path_never_renames_over_a_fifo(tmp_path):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    before = _node(fifo)
    new = tmp_path / "new"
    new.mkdir()
    with pytest.raises(AnekitError, match="never replaces a device, FIFO"):
        replace_path(new, fifo)
    assert _node(fifo) == before and new.is_dir()


# -- names at the file system's limit ---------------------------------------------------------------------

TOO_LONG = "n" * 300  # over NAME_MAX: no file system takes it
LONGEST = "k" * 240  # legal, though a temporary named ".<name>.write-<pid>.<hex>.tmp" after it would not be


def _cases(hf: Path, tmp_path: Path, name: str) -> list[list[str]]:
    return [
        ["export", str(hf), "--to", "llama2c", str(tmp_path / name)],
        ["doctor", "--json", str(tmp_path / name)],
        ["kernels", "dump", "--config", "stories260K", str(tmp_path / name)],
        ["train", "--steps", "1", "--sample-steps", "0", "--out", str(tmp_path / name)],
        ["train", "--resume", "--out", str(tmp_path / name)],
    ]


@pytest.mark.parametrize("which", range(5))
def test_a_name_too_long_is_one_line(tmp_path, capsys, hf, which):
    argv = _cases(hf, tmp_path, TOO_LONG)[which]
    capsys.readouterr()
    assert main(argv) == 1
    _one_line(capsys, "file name too long")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


@pytest.mark.parametrize("which", range(3))
def test_a_name_whose_temporary_cannot_fit_is_refused_before_the_work(tmp_path, capsys, hf, which):
    """A legal name whose temporary beside it (".<name>.write-<pid>.<hex>.tmp") would pass NAME_MAX is
    refused in one line before any work, rather than failing after it: nothing is left behind."""
    assert len(LONGEST) + len(".write-1234567.abcdef01.tmp") + 1 > NAME_MAX
    argv = _cases(hf, tmp_path, LONGEST)[which]
    capsys.readouterr()
    assert main(argv) == 1
    _one_line(capsys, "its temporary name beside it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_run_directory_of_the_longest_legal_name_trains(tmp_path, capsys, hf):
    """train --out's temporaries and lock live inside OUT, so a legal directory name is enough."""
    assert main(_cases(hf, tmp_path, LONGEST)[3]) == 0, capsys.readouterr().err
    assert (tmp_path / LONGEST / "ckpt.bin").is_file()


def test_a_package_of_a_long_legal_name_is_refused_before_the_work(tmp_path, capsys, hf):
    out = tmp_path / ("p" * 235 + ".mlpackage")
    capsys.readouterr()
    assert main(["export", str(hf), "--to", "mlpackage", str(out)]) == 1
    _one_line(capsys, "file name too long")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_symlinked_output_file_stays_a_symlink_and_its_target_is_replaced(tmp_path, capsys):
    target = tmp_path / "real" / "report.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "report.json"
    link.symlink_to(target)
    assert main(["doctor", "--json", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert isinstance(json.loads(target.read_text()), dict)
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]  # no temporary left
