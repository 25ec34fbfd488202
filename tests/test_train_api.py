"""Training from Python: ``anekit.train`` / ``anekit.Run`` do what ``anekit train`` does, with the same
checkpoint bytes, the same refusals and the same resume."""

from __future__ import annotations

import re

import numpy as np
import pytest

import anekit
from anekit.cli.main import main
from anekit.llama.checkpoint import load_checkpoint_file


def _weights(path):
    return dict(load_checkpoint_file(path).params.tensors())


def test_train_from_python_writes_the_checkpoint_the_command_writes(tmp_path, capsys):
    result = anekit.train(tmp_path / "api", steps=3, accum=1, seed=4)
    assert result.reason == "done" and result.step == 3 and len(result.losses) == 3
    assert result.checkpoint == tmp_path / "api" / "ckpt.bin"
    code = main(["train", "--out", str(tmp_path / "cli"), "--steps", "3", "--accum", "1", "--seed", "4",
                 "--sample-steps", "0"])  # fmt: skip
    assert code == 0
    capsys.readouterr()
    api, cli = _weights(result.checkpoint), _weights(tmp_path / "cli" / "ckpt.bin")
    for name in api:
        np.testing.assert_array_equal(api[name], cli[name], err_msg=name)
    assert (tmp_path / "api" / "loss.csv").read_text() == (tmp_path / "cli" / "loss.csv").read_text()


def test_a_run_stopped_from_python_resumes_to_the_uninterrupted_weights(tmp_path):
    whole = anekit.train(tmp_path / "whole", steps=4, accum=1)
    run = anekit.Run(anekit.TrainOptions(out=tmp_path / "part", steps=4, accum=1))
    try:
        stopped = run.train(should_stop=lambda: run.state.step >= 2)
    finally:
        run.close()
    assert stopped.reason == "stopped" and stopped.step == 2
    resumed = anekit.train(tmp_path / "part", resume=True)
    assert resumed.reason == "done" and resumed.losses == whole.losses
    a, b = _weights(whole.checkpoint), _weights(resumed.checkpoint)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_the_library_refuses_what_the_command_refuses_before_writing(tmp_path):
    with pytest.raises(anekit.AnekitError, match="unknown option 'stepz'"):
        anekit.train(tmp_path / "x", stepz=3)
    with pytest.raises(
        anekit.AnekitError, match=r"^\[train\] resume=True: no checkpoint .* without resume=True"
    ):
        anekit.train(tmp_path / "y", resume=True)
    with pytest.raises(anekit.AnekitError, match="unknown preset"):
        anekit.train(tmp_path / "z", config="nope")
    assert not any((tmp_path / d).exists() for d in ("x", "y", "z"))


def test_python_errors_name_the_parameters_and_the_command_its_flags(tmp_path, capsys):
    out = tmp_path / "run"
    anekit.train(out, steps=2, accum=1, quiet=True)
    with pytest.raises(anekit.AnekitError) as e:
        anekit.train(out, resume=True, steps=5, quiet=True)
    assert str(e.value) == (
        f"[train] resume=True: steps=5 contradicts the run in {out} (steps=2); drop it to continue that run, "
        "or start a new one with force=True"
    )
    with pytest.raises(anekit.AnekitError) as e:
        anekit.train(out, steps=2, quiet=True)
    assert str(e.value).endswith(": resume=True to continue it, force=True to start over")
    assert main(["train", "--out", str(out), "--resume", "--steps", "5", "--sample-steps", "0"]) == 1
    assert capsys.readouterr().err == (
        f"anekit: [train] --resume: --steps 5 contradicts the run in {out} (--steps 2); drop it to continue "
        "that run, or start a new one with --force\n"
    )
    assert main(["train", "--out", str(tmp_path / "none"), "--resume", "--sample-steps", "0"]) == 1
    assert capsys.readouterr().err.startswith("anekit: [train] --resume: no checkpoint ")


def test_train_from_python_prints_progress_unless_quiet(tmp_path, capsys):
    result = anekit.train(tmp_path / "loud", steps=12, accum=1)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[:-1]] == ["1/12", "10/12", "12/12"]
    assert all(line.startswith("step ") and " loss " in line for line in lines[:-1])
    assert lines[-1] == (
        f"trained 12 steps: loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}; saved {result.checkpoint}"
    )
    anekit.train(tmp_path / "one", steps=1, accum=1)
    assert capsys.readouterr().out.splitlines()[-1].startswith("trained 1 step: loss ")
    again = anekit.train(tmp_path / "one", resume=True)
    assert not again.trained
    assert capsys.readouterr().out == f"the run in {tmp_path / 'one'} is finished (1/1 steps)\n"
    anekit.train(tmp_path / "quiet", steps=2, accum=1, quiet=True)
    assert capsys.readouterr().out == ""


def test_the_command_says_trained_1_step(tmp_path, capsys):
    assert (
        main(["train", "--out", str(tmp_path / "r"), "--steps", "1", "--accum", "1", "--sample-steps", "0"])
        == 0
    )
    assert "\ntrained 1 step: loss " in capsys.readouterr().out


def test_the_compile_budget_is_named_as_the_caller_named_it(tmp_path, capsys):
    with pytest.raises(anekit.AnekitError, match=r"\): pass compile_budget=\d+ or more$"):
        anekit.train(tmp_path / "py", steps=2, compile_budget=1, weights="baked", quiet=True)
    args = [
        "train",
        "--out",
        str(tmp_path / "cli"),
        "--steps",
        "2",
        "--compile-budget",
        "1",
        "--weights",
        "baked",
    ]
    assert main(args) == 1
    assert re.search(r"\): pass --compile-budget \d+ or more$", capsys.readouterr().err.strip())
    assert not (tmp_path / "py").exists() and not (tmp_path / "cli").exists()
