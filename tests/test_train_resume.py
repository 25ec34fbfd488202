"""``anekit train`` resume: kills during checkpoint writes, contradicting flags, moved checkpoints.

The reference for every resumed run is an uninterrupted run with the same flags: a resumed run must end
with the same weights, Adam moments, counters and loss curve, bit for bit. That proves resume restores
everything the step depends on (the same code computes both runs, so it does not prove the step itself
is right: tests/test_llama_train_reference.py checks the step against an independent float64 one).
These run in-process on a tiny grouped-query preset; tests/test_train_signals.py covers the cases that
need a real process (signals, pipes, re-exec).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from anekit import fileio
from anekit.cli.main import main
from anekit.fileio import SimulatedCrash, is_temporary
from anekit.kernels import PRESETS, ModelConfig
from anekit.llama import corpus, tokenizer
from anekit.llama.checkpoint import load_checkpoint_file
from anekit.llama.llama2c import Tokenizer, write_tokenizer_bin

# 1 layer, 2 heads sharing 1 kv head (so n_kv_heads is not the header's default), seq 32 (the engine's
# shortest rows): a 5-step run with 6 checkpoints takes a fraction of a second.
TINY = ModelConfig(32, 64, 1, 2, 1, 512, 32, name="tiny")
STEPS = 5


@dataclass
class Snapshot:
    """What a checkpoint says about the run: counters, loss history, every tensor."""

    step: int
    adam_t: int
    loss_scale: float
    losses: list[float]
    tensors: dict[str, np.ndarray]

    def same_as(self, other: Snapshot) -> bool:
        return (
            (self.step, self.adam_t, self.loss_scale, self.losses)
            == (other.step, other.adam_t, other.loss_scale, other.losses)
            and self.tensors.keys() == other.tensors.keys()
            and all(np.array_equal(a, other.tensors[k]) for k, a in self.tensors.items())
        )


def snapshot(path: Path) -> Snapshot:
    ck = load_checkpoint_file(path)  # no config given: the run record says what the model is
    assert ck.run is not None and ck.kv_source == "run record"
    state = ck.run["state"]
    tensors = {}
    for prefix, container in (("", ck.params), ("m.", ck.adam_m), ("v.", ck.adam_v)):
        tensors.update({prefix + name: a.copy() for name, a in container.tensors()})
    return Snapshot(ck.meta.step, ck.meta.adam_t, state["loss_scale"], state["losses"], tensors)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small story file and the default 512-token tokenizer (trained once into a private cache)."""
    d = tmp_path_factory.mktemp("inputs")
    tokenizer.default_tokenizer(vocab_size=512, cache_dir=d / "cache")
    (d / "stories.txt").write_text(corpus.generate_corpus(40, 1))
    return d / "stories.txt", tokenizer.default_tokenizer_path(512, d / "cache")


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch, inputs: tuple[Path, Path]) -> tuple[Path, Path]:
    monkeypatch.setitem(PRESETS, "tiny", TINY)
    monkeypatch.setattr(fileio, "fault_hook", None)
    return inputs


def train_args(out: Path, inputs: tuple[Path, Path], *extra: str) -> list[str]:
    data, tok = inputs
    return ["train", "--config", "tiny", "--out", str(out), "--steps", str(STEPS), "--accum", "1",
            "--checkpoint-every", "1", "--sample-steps", "0", "--data", str(data), "--tokenizer", str(tok),
            *extra]  # fmt: skip


def temporaries(out: Path) -> list[Path]:
    return [p for p in out.iterdir() if is_temporary(p)] if out.is_dir() else []


def test_kills_during_checkpoint_writes_lose_nothing(tmp_path, tiny, monkeypatch, capsys):
    """Kill the run at well over 100 points of its checkpoint writes (the atomic writer's fault hook:
    after the temporary file opens, before each write, before the fsync, before and after the rename);
    after each: the directory holds exactly the last completed save (or no checkpoint if the first save
    had not landed) and at most the killed write's temporary file; then ``--resume`` (or a fresh start
    when there was nothing to resume) removes the temporary and ends identical to the reference run.

    Proves: no interruption point of a checkpoint write loses or mixes state, and resume is exact from
    every saved step. Does not prove: behaviour under a kill between writes (trivially the last save,
    see the SIGKILL test in test_train_signals.py) or on a file system that reorders renames."""
    ref = tmp_path / "reference"
    points: list[str] = []
    saved: dict[int, Snapshot] = {}

    def record(point: str, path: Path) -> None:
        if path.name == "ckpt.bin":
            points.append(point)
            if point == "renamed":
                snap = snapshot(path)
                saved[snap.step] = snap

    monkeypatch.setattr(fileio, "fault_hook", record)
    assert main(train_args(ref, tiny)) == 0
    monkeypatch.setattr(fileio, "fault_hook", None)
    final = snapshot(ref / "ckpt.bin")
    assert sorted(saved) == list(range(STEPS + 1)) and final.same_as(saved[STEPS])
    curve = (ref / "loss.csv").read_text()

    # Every point but the open/fsync/rename/renamed ones, and every other write: over 100 kills.
    chosen = [k for k, p in enumerate(points) if p != "write" or k % 2 == 0]
    lost, mismatched, temp_left, resumed = [], [], 0, 0
    for k in chosen:
        out = tmp_path / f"kill{k}"
        seen = 0

        def crash(point: str, path: Path, k: int = k) -> None:
            nonlocal seen
            if path.name == "ckpt.bin":
                if seen == k:
                    raise SimulatedCrash(f"killed at {point} (fault point {k})")
                seen += 1

        monkeypatch.setattr(fileio, "fault_hook", crash)
        with pytest.raises(SimulatedCrash):
            main(train_args(out, tiny))
        monkeypatch.setattr(fileio, "fault_hook", None)

        landed = points[: k + 1].count("renamed")  # saves whose rename had happened when the kill came
        on_disk = out / "ckpt.bin"
        if landed == 0:
            if on_disk.exists():
                mismatched.append((k, "a checkpoint appeared before the first save landed"))
        elif not on_disk.exists():
            lost.append((k, f"step {landed - 1} had been saved"))
        elif not snapshot(on_disk).same_as(saved[landed - 1]):
            mismatched.append((k, f"the file is not the state of step {landed - 1}"))
        n_temp = len(temporaries(out))
        in_write = points[k] in ("open", "write", "fsync", "rename")
        assert n_temp == (1 if in_write else 0), (k, points[k], temporaries(out))
        temp_left += n_temp

        resume = on_disk.exists()
        resumed += resume
        assert main(train_args(out, tiny, *(["--resume"] if resume else []))) == 0
        if not snapshot(on_disk).same_as(final) or (out / "loss.csv").read_text() != curve:
            mismatched.append((k, "the resumed run ended elsewhere"))
        assert temporaries(out) == []  # the killed write's temporary file is gone
    capsys.readouterr()
    figures = f"{len(chosen)} interruptions, {resumed} resumed, {temp_left} temporaries cleaned"
    print(f"kill test: {figures}; lost {len(lost)}, mismatched {len(mismatched)}")
    assert len(chosen) >= 100, figures
    assert lost == [] and mismatched == [], (figures, lost, mismatched)


def test_a_flag_that_contradicts_the_stored_run_is_refused(tmp_path, tiny, capsys):
    """Each contradicting flag: exit 1, one line naming the flag and the stored value, nothing written."""
    out = tmp_path / "run"
    assert main(train_args(out, tiny)) == 0
    other_data = tmp_path / "other.txt"
    other_data.write_text(corpus.generate_corpus(40, 2))
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % b for b in range(256)]
    other_tok = tmp_path / "bytes.bin"
    write_tokenizer_bin(other_tok, Tokenizer(pieces, [0.0] * len(pieces)))
    cases = [
        (["--steps", "6"], "--steps 6 contradicts"),
        (["--accum", "2"], "--accum 2 contradicts"),
        (["--lr", "0.001"], "--lr 0.001 contradicts"),
        (["--seed", "1"], "--seed 1 contradicts"),
        (["--weights", "baked"], "--weights baked contradicts"),
        (["--config", "default"], "--config default contradicts"),
        (["--data", str(other_data)], "is not the run's"),
        (["--tokenizer", str(other_tok)], "is not the run's"),
        (["--force"], "--force starts a new one"),
        (["--init", str(out / "ckpt.bin")], "--init starts a new one"),
    ]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    for flags, message in cases:
        args = train_args(out, tiny, "--resume")
        for i in range(0, len(flags), 2):  # replace the flag where train_args already gives it
            if flags[i] in args and flags[i] not in ("--force", "--init"):
                args[args.index(flags[i]) + 1] = flags[i + 1]
            else:
                args += flags[i : i + 2]
        assert main(args) == 1, flags
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("anekit: [train] --resume") and message in err, err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before, flags

    assert main(train_args(out, tiny)) == 1  # a new run into a directory that holds one
    err = capsys.readouterr().err
    assert "holds a run" in err and "--resume" in err and "--force" in err
    assert main(train_args(out, tiny, "--resume")) == 0  # the same flags: the finished run, nothing to do
    assert main(train_args(out, tiny, "--force", "--steps", "2")) == 0
    assert snapshot(out / "ckpt.bin").step == 2


def test_a_moved_checkpoint_still_loads(tmp_path, tiny, capsys):
    """sample, inspect and --init read a checkpoint alone in another directory: the run record gives
    the model (n_kv_heads 1 of 2 heads, which the BLZT header cannot say)."""
    _, tok = tiny
    out = tmp_path / "run"
    assert main(train_args(out, tiny)) == 0
    moved = tmp_path / "elsewhere" / "model.bin"
    moved.parent.mkdir()
    (out / "ckpt.bin").rename(moved)
    capsys.readouterr()
    assert main(["sample", str(moved), "--steps", "8", "--tokenizer", str(tok), "--seed", "1"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(moved), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["n_kv_heads"] == 1 and info["n_kv_heads_from_file_size"] is False
    fresh = tmp_path / "from-init"
    assert main(train_args(fresh, tiny, "--init", str(moved))) == 0
    run = load_checkpoint_file(fresh / "ckpt.bin").run
    assert run is not None and run["init"]["path"] == str(moved.resolve())


def test_a_checkpoint_without_a_run_record_is_not_resumed(tmp_path, tiny, capsys):
    from anekit.llama import checkpoint

    out = tmp_path / "run"
    assert main(train_args(out, tiny)) == 0
    ck = checkpoint.load_checkpoint_file(out / "ckpt.bin")
    checkpoint.save_checkpoint(out / "ckpt.bin", ck.params, ck.adam_m, ck.adam_v, ck.meta)  # no record
    capsys.readouterr()
    assert main(train_args(out, tiny, "--resume")) == 1
    assert "no run record" in capsys.readouterr().err


def test_stale_temporaries_are_removed_and_nothing_else(tmp_path, tiny):
    out = tmp_path / "run"
    out.mkdir()
    stale = out / ".ckpt.bin.0123abcd.tmp"
    stale.write_bytes(b"half a checkpoint")
    keep = [out / "notes.txt", out / ".ckpt.bin.tmp", out / ".hidden.0123abcd.tmp.bak"]
    for p in keep:
        p.write_text("mine")
    assert main(train_args(out, tiny)) == 0
    assert not stale.exists() and all(p.exists() for p in keep)


def test_a_run_that_cannot_start_leaves_no_run_behind(tmp_path, tiny, capsys, monkeypatch):
    """A model the engine refuses (rows shorter than 64 bytes) fails before the first step: the step-0
    checkpoint is removed, so the directory does not then claim to hold a run."""
    monkeypatch.setitem(PRESETS, "tiny", TINY.with_(seq_len=16))
    out = tmp_path / "run"
    assert main(train_args(out, tiny)) == 1
    assert "min-row-bytes" in capsys.readouterr().err
    assert not (out / "ckpt.bin").exists()


def test_resume_with_seed_0_on_a_run_stored_with_another_seed_is_refused(tmp_path, tiny, capsys):
    """--seed 0 is a given flag like any other (not "no seed"): it contradicts a run stored with seed 3."""
    out = tmp_path / "run"
    assert main(train_args(out, tiny, "--seed", "3")) == 0
    capsys.readouterr()
    assert main(train_args(out, tiny, "--resume", "--seed", "0")) == 1
    err = capsys.readouterr().err
    assert "--seed 0 contradicts" in err and "(--seed 3)" in err, err


def test_a_run_record_naming_dev_zero_as_its_tokenizer_is_refused_not_hashed_forever(tmp_path, tiny, capsys):
    """Only regular files are hashed (stat first): a tokenizer path of /dev/zero is one line, at once."""
    import signal

    from anekit.llama.checkpoint import save_checkpoint

    out = tmp_path / "run"
    assert main(train_args(out, tiny, "--steps", "1")) == 0
    ck = load_checkpoint_file(out / "ckpt.bin")
    ck.run["tokenizer"]["path"] = "/dev/zero"
    save_checkpoint(out / "ckpt.bin", ck.params, ck.adam_m, ck.adam_v, ck.meta, run=ck.run)
    (out / "tokenizer.model").unlink()
    capsys.readouterr()
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("hashing /dev/zero did not end"))
    signal.alarm(30)
    try:
        args = ["train", "--out", str(out), "--resume", "--sample-steps", "0", "--data", str(tiny[0])]
        assert main(args) == 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "tokenizer.path /dev/zero: a character device, not a tokenizer file" in err
    ), err


def _refused_before_writing(out: Path, args: list[str], message: str, capsys) -> None:
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists(), sorted(p.name for p in out.iterdir())


def test_bad_inputs_are_refused_before_out_is_created(tmp_path, tiny, capsys):
    """Empty or tiny data, NaN --init weights and a compile budget below one step: refused with one line,
    and out/ is never created (no tokenizer copy, no lock, no checkpoint)."""
    from anekit.llama.checkpoint import CheckpointMeta, save_checkpoint
    from anekit.llama.params import Params

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time.")
    out = tmp_path / "never"
    for data, message in ((empty, "fewer than the seq_len + 1"), (short, "fewer than the seq_len + 1")):
        args = train_args(out, tiny)
        args[args.index("--data") + 1] = str(data)
        _refused_before_writing(out, args, message, capsys)
    nan = Params.init(TINY, seed=0)
    nan.layers[0].wq[0, 0] = np.nan
    save_checkpoint(tmp_path / "nan.bin", nan, nan.zeros_like(), nan.zeros_like(), CheckpointMeta())
    _refused_before_writing(
        out, train_args(out, tiny, "--init", str(tmp_path / "nan.bin")), "NaN or infinite", capsys
    )
    _refused_before_writing(
        out,
        train_args(out, tiny, "--weights", "baked", "--compile-budget", "3"),
        "smaller than one step's",
        capsys,
    )


def test_an_unwritable_first_checkpoint_leaves_no_tokenizer_behind(tmp_path, tiny, capsys):
    """--force over an out/ whose ckpt.bin is a directory: refused before the tokenizer is copied."""
    out = tmp_path / "run"
    (out / "ckpt.bin").mkdir(parents=True)
    capsys.readouterr()
    assert main(train_args(out, tiny, "--force")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a regular file" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.bin"]


def test_only_regular_files_are_hashed_a_fifo_is_refused_without_opening_it(tmp_path):
    """Opening a FIFO with no writer would block forever: the stat comes first and refuses it."""
    import os

    from anekit.errors import AnekitError
    from anekit.training.identity import sha256_file as _sha256_file

    fifo = tmp_path / "tok.fifo"
    os.mkfifo(fifo)
    with pytest.raises(AnekitError, match="is not a regular file"):
        _sha256_file(fifo)
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 100)
    with pytest.raises(AnekitError, match="more than the 99"):
        _sha256_file(big, max_bytes=99)
    assert len(_sha256_file(big)) == 64
