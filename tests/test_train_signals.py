"""``anekit train`` as a real process: Ctrl-C, a closed stdout, ``kill -9``, and its numeric flags.

Each interrupted run is resumed and compared with an uninterrupted run of the same flags (the
reference), bit for bit: weights, Adam moments, counters and the loss curve. That proves the stop saves
a whole step and resume continues from it exactly; it does not prove the step itself is right (see
tests/test_llama_train_reference.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import build_parser, main
from anekit.fileio import is_temporary
from anekit.llama.checkpoint import load_checkpoint_file
from tests.conftest import PROJECT_ROOT

STEPS = 40
BASE = ["--steps", str(STEPS), "--accum", "1", "--sample-steps", "0", "--config", "default"]


def _env(cache: Path) -> dict[str, str]:
    src = str(PROJECT_ROOT / "src")
    return dict(
        os.environ, ANEKIT_CACHE=str(cache), PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", "")
    )


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "anekit.cli.main", "train", "--out", str(out), *BASE, *extra]


def _run(out: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(out, *extra), env=_env(cache), capture_output=True, text=True, timeout=300)


def _state(out: Path) -> tuple:
    ck = load_checkpoint_file(out / "ckpt.bin")
    assert ck.run is not None
    arrays = [a.copy() for c in (ck.params, ck.adam_m, ck.adam_v) for _, a in c.tensors()]
    st = ck.run["state"]
    return (st["step"], st["adam_t"], st["loss_scale"], st["losses"]), arrays


def _assert_same_run(a: Path, b: Path) -> None:
    (ca, aa), (cb, ab) = _state(a), _state(b)
    assert ca == cb
    assert all(np.array_equal(x, y) for x, y in zip(aa, ab, strict=True))
    assert (a / "loss.csv").read_text() == (b / "loss.csv").read_text()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(an uninterrupted run's directory, the tokenizer cache all runs share)."""
    d = tmp_path_factory.mktemp("reference")
    r = _run(d / "out", d / "cache")
    assert r.returncode == 0, r.stderr
    return d / "out", d / "cache"


def _start(out: Path, cache: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        _cmd(out, *extra), env=_env(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_step(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step "):
            return
    raise AssertionError(f"no step line; stderr: {proc.stderr.read() if proc.stderr else ''}")


def test_ctrl_c_saves_prints_one_line_exits_130_and_resumes_exactly(tmp_path, reference):
    ref, cache = reference
    out = tmp_path / "out"
    proc = _start(out, cache, "--checkpoint-every", "1000")  # only the stop's own save holds the step
    _wait_for_step(proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("anekit: stopped by SIGINT at step "), err
    assert f"saved {out / 'ckpt.bin'}" in lines[0] and "--resume" in lines[0]
    stopped = _state(out)[0][0]
    assert 1 <= stopped < STEPS
    r = _run(out, cache, "--resume")
    assert r.returncode == 0, r.stderr
    _assert_same_run(ref, out)


def test_a_closed_stdout_stops_with_a_checkpoint_and_exit_141(tmp_path, reference):
    """`anekit train | head -1`: the reader quits after the first line; the run must not end with 0."""
    ref, cache = reference
    out = tmp_path / "out"
    proc = _start(out, cache)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("anekit train:")
    proc.stdout.close()
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(timeout=120) == 141, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("anekit: stdout was closed at step "), err
    assert "--resume" in lines[0]
    r = _run(out, cache, "--resume")
    assert r.returncode == 0, r.stderr
    _assert_same_run(ref, out)


def test_kill_9_mid_run_resumes_exactly(tmp_path, reference):
    ref, cache = reference
    out = tmp_path / "out"
    proc = _start(out, cache, "--checkpoint-every", "1")
    _wait_for_step(proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert load_checkpoint_file(out / "ckpt.bin").run is not None  # whatever instant: a whole checkpoint
    r = _run(out, cache, "--resume", "--checkpoint-every", "1")
    assert r.returncode == 0, r.stderr
    _assert_same_run(ref, out)
    assert not any(is_temporary(p) for p in out.iterdir())


def test_compile_budget_restarts_continue_exactly(tmp_path, reference):
    """Baked weights recompile per step: a budget of 45 re-executes the process every two steps."""
    _, cache = reference
    straight = _run(tmp_path / "a", cache, "--steps", "6", "--weights", "baked", "--compile-budget", "1000")
    assert straight.returncode == 0, straight.stderr
    restarted = _run(tmp_path / "b", cache, "--steps", "6", "--weights", "baked", "--compile-budget", "45")
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.count("anekit train:") == 1
    assert restarted.stdout.count("continuing in a fresh process") == 2
    _assert_same_run(tmp_path / "a", tmp_path / "b")
    marks = load_checkpoint_file(tmp_path / "b" / "ckpt.bin").run["marks"]
    assert marks == [[2, "budget"], [4, "budget"]]


# --------------------------------------------------------------------------------------------------------
# flags: every bad value is a usage error naming the flag and its range, and nothing is written
# --------------------------------------------------------------------------------------------------------

BAD_FLAGS = [
    ("--steps", "0", "1 .. 2147483647"),
    ("--steps", "-5", "1 .. 2147483647"),
    ("--steps", "2147483648", "1 .. 2147483647"),
    ("--steps", "ten", "1 .. 2147483647"),
    ("--steps", "1.5", "1 .. 2147483647"),
    ("--accum", "0", "1 .. 65536"),
    ("--accum", "65537", "1 .. 65536"),
    ("--lr", "0", "(0, 1]"),
    ("--lr", "-0.001", "(0, 1]"),
    ("--lr", "2", "(0, 1]"),
    ("--lr", "nan", "(0, 1]"),
    ("--lr", "inf", "(0, 1]"),
    ("--lr", "fast", "(0, 1]"),
    ("--seed", "-1", "0 .. 4294967295"),
    ("--seed", "4294967296", "0 .. 4294967295"),
    ("--seed", "0x10", "0 .. 4294967295"),
    ("--sample-steps", "-1", "0 .. 1000000"),
    ("--sample-steps", "1000001", "0 .. 1000000"),
    ("--checkpoint-every", "0", "1 .. 2147483647"),
    ("--compile-budget", "0", "1 .. 2147483647"),
    ("--weights", "frozen", "choose from"),
]


@pytest.mark.parametrize("flag, value, range_", BAD_FLAGS, ids=[f"{f}={v}" for f, v, _ in BAD_FLAGS])
def test_a_bad_flag_value_is_a_usage_error_naming_the_range(tmp_path, capsys, flag, value, range_):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["train", "--out", str(out), flag, value])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"anekit train: error: argument {flag}") and range_ in last, last
    assert not out.exists()


def test_an_unknown_preset_is_a_usage_error_like_every_table_lookup(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["train", "--out", str(out), "--config", "huge"])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("anekit train: error: argument --config: unknown preset 'huge' (known: ")
    assert not out.exists()


def test_values_that_only_fail_together_are_one_anekit_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["train", "--out", str(out), "--steps", "2147483647", "--accum", "2"]) == 1
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and err.startswith("anekit: [train] --steps x --accum") and "2147483647" in err
    )
    assert not out.exists()
    (tmp_path / "file").write_text("x")
    assert main(["train", "--out", str(tmp_path / "file")]) == 1
    assert "is a file" in capsys.readouterr().err


def test_every_train_flag_has_help_and_numeric_ones_show_their_default():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    train = sub.choices["train"]
    for action in train._actions:
        if action.dest in ("help", "restarted"):  # --restarted: internal, set on the re-executed process
            continue
        assert action.help and action.help != "==SUPPRESS==", action.dest
        if action.type is not None and action.dest not in ("data", "tokenizer", "init"):
            assert "default" in action.help, action.dest
