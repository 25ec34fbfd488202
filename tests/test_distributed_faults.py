"""Faults of a real distributed run, started the way a user starts it (``anekit launch``): a rank killed
(SIGKILL) mid-run ends every rank, leaves an intact checkpoint and ``--resume`` finishes the run of one
process bit for bit; a hung rank (SIGSTOP) is named in one line by the others within a step and the peer
timeout, and killed; Ctrl-C on the launcher stops every rank between two steps with one save that resumes
exactly; a compile budget restarts the job by itself; ranks given different inputs refuse before any step.

Every process runs BLAS on one thread (a float32 matmul's bits depend on its thread count, and the
comparison is of one sequence's arithmetic on a rank against the same sequence's in one process).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anekit.llama import corpus, tokenizer
from anekit.llama.checkpoint import load_checkpoint_file
from tests.distributed_ranks import (
    MAX_TIMEOUT,
    PROJECT_ROOT,
    Started,
    _descendants,
    kill_session,
    need_engine,
    rank_env,
    start_ranks,
)

BLAS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
STEPS = 200  # long enough to be stopped in the middle (a step of the default model takes ~40 ms here)
ENGINES = ["mpi", "mlx"]
PEER_TIMEOUT = 3  # seconds: a hung rank is noticed after this (beyond the step it is in)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small story file, the default 512-token tokenizer (trained once into a private cache)."""
    d = tmp_path_factory.mktemp("inputs")
    cache = d / "cache"
    tokenizer.default_tokenizer(vocab_size=512, cache_dir=cache / "tokenizers")
    (d / "stories.txt").write_text(corpus.generate_corpus(40, 1))
    tok = tokenizer.default_tokenizer_path(512, cache / "tokenizers")
    return {"data": d / "stories.txt", "tokenizer": tok, "cache": cache}


def _train(out: Path, inputs: dict[str, Path], *extra: str) -> list[str]:
    return ["train", "--out", str(out), "--data", str(inputs["data"]), "--tokenizer", str(inputs["tokenizer"]),
            "--seed", "1", "--sample-steps", "0", "--backend", "sim", *extra]  # fmt: skip


def _env(inputs: dict[str, Path]) -> dict[str, str]:
    return {**BLAS, "ANEKIT_CACHE": str(inputs["cache"])}


def _one(inputs: dict[str, Path], args: list[str]) -> subprocess.CompletedProcess[str]:
    """``anekit ARGS`` in one process."""
    done = subprocess.run([sys.executable, "-m", "anekit.cli.main", *args], env=rank_env(_env(inputs)),
                          capture_output=True, text=True, timeout=MAX_TIMEOUT)  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return done


def _launch(inputs: dict[str, Path], n: int, engine: str, args: list[str], *launch: str) -> Started:
    """``anekit launch -n N --engine E LAUNCH -- ARGS`` started (its own session, output read as it comes)."""
    need_engine(engine)
    cmd = [sys.executable, "-m", "anekit.cli.main", "launch", "-n", str(n), "--engine", engine, *launch, "--",
           *args]  # fmt: skip
    return start_ranks(n, [], engine, env=_env(inputs), cwd=PROJECT_ROOT, cmd=cmd)


def _ranks(job: Started, n: int, timeout: float = 60.0) -> dict[int, int]:
    """Rank -> pid of the job's ranks on this machine (``python -m anekit.cli.main train`` processes, their
    rank read from the variable their launcher gave them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found: dict[int, int] = {}
        for pid in _descendants(job.proc.pid):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[1:4] != [b"-m", b"anekit.cli.main", b"train"]:
                continue
            for e in environ:
                if e.startswith((b"OMPI_COMM_WORLD_RANK=", b"MLX_RANK=")):
                    found[int(e.split(b"=")[1])] = pid
        if len(found) == n:
            return found
        time.sleep(0.05)
    kill_session(job.proc)
    pytest.fail(f"the launcher did not start {n} ranks within {timeout:g} s\n{job.stdout}\n{job.stderr}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _tensors(out: Path) -> dict[str, Any]:
    ck = load_checkpoint_file(out / "ckpt.bin")
    assert ck.run is not None and ck.adam_m is not None and ck.adam_v is not None
    tensors = {f"{kind}.{name}": a for kind, container in (("p", ck.params), ("m", ck.adam_m), ("v", ck.adam_v))
               for name, a in container.tensors()}  # fmt: skip
    state = {k: ck.run["state"][k] for k in ("step", "adam_t", "loss_scale", "losses")}
    return {"tensors": tensors, "state": state}


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["state"] == b["state"]
    assert list(a["tensors"]) == list(b["tensors"])
    for name, x in a["tensors"].items():
        assert x.dtype == b["tensors"][name].dtype and np.array_equal(x, b["tensors"][name]), name


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> dict[str, Any]:
    """One process, STEPS steps of 2 sequences: what every interrupted and resumed run must give."""
    out = tmp_path_factory.mktemp("straight") / "run"
    _one(inputs, _train(out, inputs, "--steps", str(STEPS), "--accum", "2"))
    return _tensors(out)


def _resume(inputs: dict[str, Path], out: Path, engine: str) -> None:
    done = _launch(inputs, 2, engine, _train(out, inputs, "--resume")).finish(timeout=MAX_TIMEOUT)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])


def _mid_run(job: Started, out: Path) -> None:
    """Wait until the run has saved its second checkpoint (the first is step 0's, the second step 5's, of
    STEPS): the ranks are mid-run. (Their progress line cannot tell: mpiexec passes a rank's output on by
    whole lines, and on a terminal, which a rank under mpiexec has, the line is rewritten in place.)"""
    deadline = time.monotonic() + 60
    first: int | None = None
    while True:
        try:
            inode = (out / "ckpt.bin").stat().st_ino  # each save is a new file renamed over the last
        except FileNotFoundError:
            inode = None
        if first is None:
            first = inode
        elif inode is not None and inode != first:
            return
        if time.monotonic() > deadline or job.proc.poll() is not None:
            kill_session(job.proc)
            pytest.fail(f"no second checkpoint within 60 s\n{job.stdout[-2000:]}\n{job.stderr[-2000:]}")
        time.sleep(0.01)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_killed_rank_ends_every_rank_and_the_checkpoint_resumes_exactly(
    engine: str, tmp_path: Path, inputs: dict[str, Path], straight: dict[str, Any]
) -> None:
    out = tmp_path / "run"
    job = _launch(inputs, 2, engine, _train(out, inputs, "--steps", str(STEPS), "--accum", "1",
                                              "--checkpoint-every", "5"), "--peer-timeout", str(PEER_TIMEOUT))  # fmt: skip
    ranks = _ranks(job, 2)
    _mid_run(job, out)
    os.kill(ranks[1], signal.SIGKILL)
    t0 = time.monotonic()
    done = job.finish(timeout=PEER_TIMEOUT + 30)  # the documented bound (a step + the peer timeout) + slack
    ended = time.monotonic() - t0
    assert done.returncode != 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert not _alive(ranks[0]) and not _alive(ranks[1])
    print(f"{engine}: every rank ended {ended:.2f} s after rank 1 was killed")
    if engine == "mpi":
        assert "[launch] rank 1 (pid" in done.stderr and "ended by signal 9" in done.stderr, done.stderr
    saved = _tensors(out)["state"]["step"]
    assert saved % 5 == 0 and 5 <= saved < STEPS
    _resume(inputs, out, engine)
    _same(straight, _tensors(out))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_hung_rank_is_named_in_one_line_and_every_rank_ends(
    engine: str, tmp_path: Path, inputs: dict[str, Path]
) -> None:
    out = tmp_path / "run"
    job = _launch(inputs, 2, engine, _train(out, inputs, "--steps", str(STEPS), "--accum", "1",
                                              "--checkpoint-every", "5"), "--peer-timeout", str(PEER_TIMEOUT))  # fmt: skip
    ranks = _ranks(job, 2)
    _mid_run(job, out)
    os.kill(ranks[1], signal.SIGSTOP)
    # mlx.launch cannot end a stopped rank: the launcher kills it PEER_TIMEOUT + END_GRACE after rank 0 fails.
    done = job.finish(timeout=2 * PEER_TIMEOUT + 40)
    assert done.returncode == 3, (done.stdout[-2000:], done.stderr[-2000:])
    lines = [ln for ln in done.stderr.splitlines() if "anekit:" in ln]
    saved = _tensors(out)["state"]["step"]
    assert len(lines) == 1, done.stderr
    # The wait is the peer timeout, or a little more at a gather (so that a rank waiting on the lost one
    # directly speaks first: anekit.training.distributed.mpi / mlx_ring).
    m = re.fullmatch(
        r"anekit: \[train\] rank 1 did not answer within (\d+) s \((gradients of|losses of|stop requests "
        rf"before) step \d+\): it died, hung or lost its link; ending the run on every rank; the checkpoint of "
        rf"step {saved} is intact",
        lines[0],
    )
    assert m is not None and PEER_TIMEOUT <= int(m.group(1)) <= PEER_TIMEOUT + 2, lines[0]
    assert not _alive(ranks[0]) and not _alive(ranks[1])
    if engine == "mlx":
        assert "[launch] ranks still running" in done.stderr, done.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_ctrl_c_on_the_launcher_stops_every_rank_after_one_step_and_the_save_resumes_exactly(
    engine: str, tmp_path: Path, inputs: dict[str, Path], straight: dict[str, Any]
) -> None:
    out = tmp_path / "run"
    job = _launch(
        inputs,
        2,
        engine,
        _train(out, inputs, "--steps", str(STEPS), "--accum", "1", "--checkpoint-every", "5"),
    )
    ranks = _ranks(job, 2)
    _mid_run(job, out)
    os.kill(job.proc.pid, signal.SIGINT)
    done = job.finish(timeout=60)
    assert done.returncode == 130, (done.stdout[-2000:], done.stderr[-2000:])
    stopped = _tensors(out)["state"]["step"]
    assert 5 <= stopped < STEPS
    assert [ln for ln in done.stderr.splitlines() if "anekit:" in ln] == [
        f"anekit: stopped by SIGUSR1 at step {stopped}/{STEPS}: saved {out / 'ckpt.bin'} (weights, Adam state, "
        f"run state); continue with: anekit train --out {out} --resume"
    ], done.stderr
    assert "[launch]" not in done.stderr, done.stderr  # every rank ended as asked, none was killed
    assert not _alive(ranks[0]) and not _alive(ranks[1])
    _resume(inputs, out, engine)
    _same(straight, _tensors(out))


def test_a_compile_budget_restarts_the_job_by_itself_and_finishes_the_run_of_one_process(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    """Baked weights recompile every step: a budget of 45 holds two steps of the default model, so the
    3-step run exits 75 once and ``anekit launch`` starts it again with --resume."""
    _one(inputs, _train(tmp_path / "one", inputs, "--steps", "3", "--accum", "2", "--weights", "baked"))
    out = tmp_path / "two"
    args = _train(out, inputs, "--steps", "3", "--accum", "1", "--weights", "baked", "--compile-budget", "45")
    done = _launch(inputs, 2, "mpi", args).finish(timeout=MAX_TIMEOUT)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "[launch] restart 1: the compile budget ran out; continuing with --resume" in done.stdout
    assert done.stdout.count("mpiexec -n 2") == 2
    _same(_tensors(tmp_path / "one"), _tensors(out))


@pytest.mark.parametrize(
    ("other", "field"),
    [({"--data": "other"}, "data sha256"), ({"--wire": "fp16"}, "wire")],
    ids=["data", "wire"],
)
def test_ranks_given_different_inputs_refuse_before_any_step_in_one_line(
    tmp_path: Path, inputs: dict[str, Path], other: dict[str, str], field: str
) -> None:
    """mpiexec's MPMD form gives rank 1 its own command line. (The model and training configs are rank 0's
    on every rank: the others take them from rank 0, so only what each rank reads or chooses itself can
    differ: its data, its tokenizer, its wire dtype.)"""
    exe = need_engine("mpi")
    (tmp_path / "other").write_text(corpus.generate_corpus(30, 2))
    out = tmp_path / "run"
    base = _train(out, inputs, "--steps", "3", "--accum", "1", "--distributed", "mpi")
    changed = list(base)
    for flag, value in other.items():
        value = str(tmp_path / value) if flag == "--data" else value
        if flag in changed:
            changed[changed.index(flag) + 1] = value
        else:
            changed += [flag, value]
    py = [sys.executable, "-m", "anekit.cli.main"]
    cmd = [exe, "-n", "1", *py, *base, ":", "-n", "1", *py, *changed]
    done = start_ranks(2, [], "mpi", env=_env(inputs), cwd=PROJECT_ROOT, cmd=cmd).finish(timeout=MAX_TIMEOUT)
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    lines = [ln for ln in done.stderr.splitlines() if "anekit:" in ln]
    assert len(lines) == 1 and f"the ranks differ in {field}: rank 0 has " in lines[0], done.stderr
    assert "rank 1 has " in lines[0]
    assert "step " not in done.stdout and not out.exists()  # refused before any step, nothing written
