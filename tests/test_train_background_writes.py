"""What a run does beside its steps: the checkpoints written on a thread while training goes on (the
step-0 one while the kernels compile and the first step computes; the periodic ones during the next step;
the last one while the curves are drawn), and loss.png drawn by a helper process that imported matplotlib
while the run trained.

A checkpoint written on a thread must hold the weights of its step (the trainer waits for it before the
optimizer changes a weight), a failed write must still stop the run with its one line, and the helper must
give the same picture as drawing in the process, or the process draws it itself."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from anekit.errors import AnekitError
from anekit.kernels import preset
from anekit.llama import checkpoint
from anekit.llama.params import Params
from anekit.llama.plot import PlotUnavailable, write_loss_png
from anekit.llama.plot_helper import PlotHelper
from anekit.threads import Background
from anekit.training import run

QUICK = ["--accum", "1", "--sample-steps", "0"]


def needs_matplotlib() -> None:
    pytest.importorskip("matplotlib", reason="the plot extra (pip install 'anekit[plot]') is not installed")


# -- a write in flight ------------------------------------------------------------------------------------


def test_a_background_job_hands_its_error_to_wait_once() -> None:
    def fail() -> None:
        raise AnekitError("[x] disk full")

    w = Background(fail)
    with pytest.raises(AnekitError, match="disk full"):
        w.wait()
    w.wait()  # reported once: settling again is quiet
    done: list[int] = []
    Background(lambda: done.append(threading.get_ident())).wait()
    assert done and done[0] != threading.get_ident()  # it ran on a thread of its own


def test_the_step_0_checkpoint_holds_the_initial_weights_however_slow_its_write(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step-0 write is held back until the first step has computed; had the trainer not waited for
    it, the optimizer would have changed the weights it writes."""
    original = checkpoint.save_checkpoint
    written: dict[int, np.ndarray] = {}

    def slow(path, params, adam_m, adam_v, meta, run=None):
        if meta.step == 0:
            time.sleep(0.5)
            written[0] = params.embed.copy()
        return original(path, params, adam_m, adam_v, meta, run)

    monkeypatch.setattr(checkpoint, "save_checkpoint", slow)
    assert main(["train", "--out", str(tmp_path / "run"), "--steps", "2", *QUICK]) == 0
    init = Params.init(preset("default"), seed=0)
    np.testing.assert_array_equal(written[0], init.embed)
    final = checkpoint.load_checkpoint_file(tmp_path / "run" / "ckpt.bin")
    assert final.meta.step == 2 and not np.array_equal(final.params.embed, init.embed)


def test_a_failed_step_0_write_stops_the_run_with_one_line_and_leaves_no_run(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full(*args, **kwargs):
        raise AnekitError("[blzt] cannot write checkpoint: No space left on device")

    monkeypatch.setattr(checkpoint, "save_checkpoint", full)
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "3", *QUICK]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["anekit: [blzt] cannot write checkpoint: No space left on device"]
    assert not out.exists()  # the run made the directory: it leaves nothing behind


def test_periodic_checkpoints_written_on_a_thread_resume_exactly(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped after step 3 with a checkpoint every 2 steps (the step-2 write in flight during step 3), then
    resumed: the same weights as one uninterrupted run."""
    straight, parts = tmp_path / "straight", tmp_path / "parts"
    assert main(["train", "--out", str(straight), "--steps", "5", "--checkpoint-every", "2", *QUICK]) == 0
    calls = {"n": 0}

    def stop_after_three() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    options = run.TrainOptions(out=parts, steps=5, accum=1, checkpoint_every=2)
    stopped = run.Run(options)
    try:
        result = stopped.train(should_stop=stop_after_three)
    finally:
        stopped.close()
    assert result.reason == "stopped" and result.step == 3
    assert main(["train", "--out", str(parts), "--resume", "--sample-steps", "0"]) == 0
    a = checkpoint.load_checkpoint_file(straight / "ckpt.bin")
    b = checkpoint.load_checkpoint_file(parts / "ckpt.bin")
    for (name, x), (_, y) in zip(a.params.tensors(), b.params.tensors(), strict=True):
        np.testing.assert_array_equal(x, y, err_msg=name)


# -- the loss.png helper -----------------------------------------------------------------------------------


def test_the_helper_draws_the_picture_the_process_would(tmp_path: Path) -> None:
    needs_matplotlib()
    losses = list(np.linspace(6.0, 2.5, 25))
    marks = [(10, "budget"), (20, "resume")]
    write_loss_png(tmp_path / "here.png", losses, "a run", marks)
    helper = PlotHelper.start()
    assert helper is not None
    helper.draw(tmp_path / "there.png", losses, "a run", marks)
    assert (tmp_path / "there.png").read_bytes() == (tmp_path / "here.png").read_bytes()
    assert helper.proc is None  # used once, then gone


def test_a_helper_that_died_or_answers_nonsense_leaves_the_drawing_to_the_process(tmp_path: Path) -> None:
    needs_matplotlib()
    write_loss_png(tmp_path / "want.png", [3.0, 2.0, 1.0], "t")
    dead = PlotHelper.start()
    assert dead is not None and dead.proc is not None
    dead.proc.kill()
    dead.proc.wait()
    dead.draw(tmp_path / "a.png", [3.0, 2.0, 1.0], "t", [])
    liar = PlotHelper.start()
    assert liar is not None and liar.proc is not None
    liar.close()
    liar.proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read(); print('{not json')"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    liar.draw(tmp_path / "b.png", [3.0, 2.0, 1.0], "t", [])
    want = (tmp_path / "want.png").read_bytes()
    assert (tmp_path / "a.png").read_bytes() == want and (tmp_path / "b.png").read_bytes() == want


def test_a_helper_without_matplotlib_says_so_in_the_process(tmp_path: Path) -> None:
    helper = PlotHelper.start()
    assert helper is not None
    helper.close()
    reason = "[plot] no loss.png: matplotlib is not installed (pip install -e '.[plot]' in anekit's checkout)"
    code = f"import sys, json; sys.stdin.read(); print(json.dumps({{'unavailable': {reason!r}}}))"
    helper.proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    with pytest.raises(PlotUnavailable) as e:
        helper.draw(tmp_path / "x.png", [1.0], "t", [])
    assert str(e.value) == reason and not (tmp_path / "x.png").exists()


def test_the_helper_ignores_ctrl_c_and_leaves_when_its_run_does(tmp_path: Path) -> None:
    needs_matplotlib()
    helper = PlotHelper.start()
    assert helper is not None and helper.proc is not None
    proc = helper.proc
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # a terminal's Ctrl-C: the run decides, the helper carries on
    helper.draw(tmp_path / "x.png", [2.0, 1.0], "t", [])
    assert (tmp_path / "x.png").read_bytes().startswith(b"\x89PNG")
    unused = PlotHelper.start()
    assert unused is not None and unused.proc is not None
    proc = unused.proc
    unused.close()  # stdin closed without a request: it leaves at once, drawing nothing
    assert proc.returncode == 0 and unused.proc is None


def test_the_helper_answers_one_json_line(tmp_path: Path) -> None:
    needs_matplotlib()

    def ask(request: dict) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "anekit.llama.plot_helper"],
            input=json.dumps(request).encode() + b"\n",
            capture_output=True,
            timeout=120,
            check=True,
        )
        return json.loads(done.stdout)

    request = {"path": str(tmp_path / "x.png"), "losses": [2.0, 1.0], "title": "t", "marks": [[1, "resume"]]}
    assert ask(request) == {"ok": True}
    assert (tmp_path / "x.png").read_bytes().startswith(b"\x89PNG")
    assert "error" in ask(dict(request, losses="nope"))


def test_a_long_run_draws_through_a_helper_and_ends_it(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    needs_matplotlib()
    monkeypatch.setattr(run, "PLOT_HELPER_MIN_FLOPS", 0.0)  # the default model counts as long
    monkeypatch.setattr(run, "cores", lambda: 2)  # a helper needs a core to spare
    started: list[PlotHelper] = []
    real_start = PlotHelper.start

    def start() -> PlotHelper | None:
        helper = real_start()
        assert helper is not None
        started.append(helper)
        return helper

    monkeypatch.setattr(PlotHelper, "start", staticmethod(start))
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "3", *QUICK]) == 0
    assert len(started) == 1 and started[0].proc is None  # asked to draw, then gone
    assert (out / "loss.png").read_bytes().startswith(b"\x89PNG") and "loss.png" in capsys.readouterr().out
    # a run that fails after the helper started ends it too
    from anekit.training import loop as trainer

    def boom(*args, **kwargs):
        raise AnekitError("[train] the backend refused a kernel")

    monkeypatch.setattr(trainer, "train", boom)
    assert main(["train", "--out", str(tmp_path / "failed"), "--steps", "3", *QUICK]) == 1
    assert len(started) == 2 and started[1].proc is None


def test_the_closing_sample_is_the_one_the_saved_weights_give(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Generated on a thread while the final checkpoint is written: from the final weights all the same."""
    from anekit.llama.sample import Sampler
    from anekit.llama.tokenizer import load_tokenizer

    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "3", "--accum", "1", "--sample-steps", "40"]) == 0
    printed = capsys.readouterr().out
    summary = printed.index("trained 3 steps")
    text = printed.split("sample:\n", 1)[1]
    assert printed.index("sample:\n") > summary
    final = checkpoint.load_checkpoint_file(out / "ckpt.bin")
    (tok_file,) = [p for p in out.iterdir() if p.name.startswith("tokenizer.")]
    sampler = Sampler(final.params, load_tokenizer(tok_file))
    want = "".join(sampler.generate("Once upon a time", 40, temperature=0.8, top_p=0.9, seed=0))
    assert text == want + "\n" and len(want) > len("Once upon a time")
