"""``anekit launch``: the launcher's command line for each engine, its one-line refusals, and, with real
mpiexec / mlx.launch ranks running a stand-in for ``train`` (tests/distributed_launch_rank.py), the
arguments every rank gets, the restart with ``--resume`` on exit 75, Ctrl-C stopping every rank between
two steps with one save, and the job's exit status passed on (a stopped rank killed for mlx)."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from anekit.cli.main import main
from anekit.errors import AnekitError
from anekit.training.distributed import launch
from anekit.training.distributed.transport import DistributedError
from tests.distributed_ranks import PROJECT_ROOT, Started, need_engine, start_ranks

ENGINES = ["mpi", "mlx"]
ANEKIT = [sys.executable, "-m", "anekit.cli.main", "launch"]


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """A "Python" that runs the stand-in for train with the launcher's arguments."""
    path = tmp_path / "python-standin"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -m tests.distributed_launch_rank "$@"\n')
    path.chmod(0o755)
    return str(path)


# -- the plan: pure


def test_mpi_command_line_adds_distributed_the_timeout_and_oversubscribe_past_the_cores() -> None:
    p = launch.plan(3, ["train", "--config", "default"], engine="mpi", peer_timeout=5, python="PY", cores=2)
    assert p.command[1:] == (
        "-n", "3", "--oversubscribe", "PY", "-m", "anekit.cli.main",
        "train", "--distributed", "mpi", "--config", "default", "--peer-timeout", "5",
    )  # fmt: skip
    assert Path(p.command[0]).name == "mpiexec" and p.peer_timeout == 5
    assert (os.geteuid() == 0) == (p.env == launch.ROOT_VARIABLES)
    fits = launch.plan(2, ["train"], engine="mpi", python="PY", cores=2)
    assert "--oversubscribe" not in fits.command
    hosts = launch.plan(
        4, ["train", "--distributed", "mpi"], engine="mpi", hosts="a:2,b:2", python="PY", cores=1
    )
    assert hosts.command[1:6] == ("-n", "4", "--host", "a:2,b:2", "PY")  # named hosts: their slots decide
    assert hosts.train_args == ("train", "--distributed", "mpi")


def test_mlx_command_line_repeats_each_host_n_over_hosts_times(tmp_path: Path) -> None:
    p = launch.plan(4, ["train", "--distributed=mlx", "--steps", "3"], engine="mlx", hosts="a,b", python="PY")
    assert p.command[1:] == (
        "-n", "2", "--backend", "ring", "--hosts", "a,b", "--python", "PY", "--",
        "-m", "anekit.cli.main", "train", "--distributed", "mlx", "--steps", "3",
    )  # fmt: skip
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        '[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}, {"ssh": "c"}]'
    )
    assert launch.plan(6, ["train"], engine="mlx", hostfile=hostfile, python="PY").command[1:3] == ("-n", "2")
    assert launch.plan(3, ["train"], engine="mlx", python="PY").command[1:3] == ("-n", "3")  # this host
    hostfile.write_text("a b c\n")
    with pytest.raises(
        DistributedError, match=r"mlx\.launch takes a JSON hostfile \(a list of hosts\), this is not"
    ):
        launch.plan(2, ["train"], engine="mlx", hostfile=hostfile, python="PY")
    hostfile.write_text("{}")
    with pytest.raises(DistributedError, match=r"expected a non-empty JSON list of hosts"):
        launch.plan(2, ["train"], engine="mlx", hostfile=hostfile, python="PY")


def test_a_restart_adds_resume_once() -> None:
    p = launch.plan(2, ["train", "--out", "o"], engine="mpi", python="PY")
    r = p.resumed()
    assert r.command == (*p.command, "--resume") and r.train_args[-1] == "--resume" and r.resumed() == r


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ranks": 2, "argv": ["sample", "--config", "default"]},
         r"^\[launch\] expected the command to run after '--': train ARGS\.\.\. \(got 'sample'\)$"),
        ({"ranks": 2, "argv": []}, r"\(got nothing\)$"),
        ({"ranks": 0, "argv": ["train"]}, r"^\[launch\] -n: expected at least 1 rank, got 0$"),
        ({"ranks": 2, "argv": ["train"], "hostfile": Path("/nonexistent/hosts")},
         r"^\[launch\] --hostfile /nonexistent/hosts: no such file or directory$"),
        ({"ranks": 2, "argv": ["train", "--distributed", "mlx"]},
         r"^\[launch\] train --distributed mlx contradicts --engine mpi \(leave --distributed out"),
        ({"ranks": 2, "argv": ["train", "--peer-timeout", "3"], "peer_timeout": 4.0},
         r"^\[launch\] --peer-timeout given both to launch and to train: give it once$"),
        ({"ranks": 3, "argv": ["train"], "engine": "mlx", "hosts": "a,b"},
         r"^\[launch\] -n 3: mlx\.launch starts the same number of ranks on each of the 2 hosts; give a multiple"),
        ({"ranks": 2, "argv": ["train"], "engine": "nccl"}, r"^\[launch\] --engine: unknown engine 'nccl'"),
    ],
)  # fmt: skip
def test_plan_refuses_in_one_line(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(AnekitError, match=message) as e:
        launch.plan(python="PY", **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)


def test_a_launcher_that_is_not_installed_is_named_with_its_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        DistributedError, match=r"--engine mpi: mpiexec is not installed \(the distributed extra"
    ):
        launch.plan(2, ["train"], engine="mpi")
    with pytest.raises(DistributedError, match=r"--engine mlx: mlx\.launch is not installed \(the mlx extra"):
        launch.plan(2, ["train"], engine="mlx")


def test_open_mpis_notices_become_one_line_each() -> None:
    killed = (
        "-" * 74
        + "\nprterun noticed that process rank 2 with PID 10714 on node vm exited on\nsignal 9 (Killed).\n"
    )
    assert launch.notice_line(killed) == "[launch] rank 2 (pid 10714 on vm) ended by signal 9 Killed\n"
    failed = (
        "prterun detected that one or more processes exited with non-zero status,\nthus causing the job to be "
        "terminated. The first process to do so was:\n\n   Process name: [prterun-vm-6134@1,1]\n   Exit code:"
        "    138\n"
    )
    assert launch.notice_line(failed) == "[launch] rank 1 exited with code 138\n"
    aborted = 'prterun has exited due to process rank 1 with PID 0 on node vm calling\n"abort". This may have'
    assert launch.notice_line(aborted) == ""
    assert launch.notice_line("prterun could not find an executable") is None  # passed on as it is


def test_the_cli_refuses_a_command_other_than_train_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "-n", "2", "--", "sample", "--config", "default"]) == 1
    err = capsys.readouterr().err
    assert err == "anekit: [launch] expected the command to run after '--': train ARGS... (got 'sample')\n"


# -- real ranks


def _launch(n: int, engine: str, python: str, case: str, *extra: str, step: float = 0.2) -> Started:
    need_engine(engine)
    cmd = [
        *ANEKIT,
        "-n",
        str(n),
        "--engine",
        engine,
        "--python",
        python,
        *extra,
        "--",
        "train",
        "--config",
        "x",
    ]
    env = {"LAUNCH_CASE": case, "STEP_SECONDS": str(step)}
    return start_ranks(n, [], engine, env=env, cwd=PROJECT_ROOT, cmd=cmd)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_rank_gets_train_with_distributed_and_the_command_line_is_printed_first(
    engine: str, fake_python: str
) -> None:
    done = _launch(3, engine, fake_python, "echo", "--peer-timeout", "7").finish(timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert ("mpiexec -n 3" if engine == "mpi" else "mlx.launch -n 3 --backend ring") in first
    argv = f"train --distributed {engine} --config x --peer-timeout 7"
    assert sorted(re.findall(r"rank (\d) argv (.*)$", done.stdout, re.M)) == [
        (str(r), argv) for r in range(3)
    ]


@pytest.mark.parametrize("engine", ENGINES)
def test_exit_75_starts_the_job_again_with_resume(engine: str, fake_python: str) -> None:
    done = _launch(2, engine, fake_python, "restart").finish(timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [ln for ln in done.stdout.splitlines() if "anekit.cli.main" in ln]
    assert len(lines) == 2 and not lines[0].endswith("--resume") and lines[1].endswith("--config x --resume")
    assert "[launch] restart 1: the compile budget ran out; continuing with --resume" in done.stdout
    assert done.stdout.count("resumed") == 1
    capped = _launch(2, engine, fake_python, "restart", "--max-restarts", "0").finish(timeout=100)
    assert capped.returncode == 75 and "stopping after 0 restarts" in capped.stderr


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launcher_stops_every_rank_between_steps_and_saves_once(
    engine: str, signum: int, fake_python: str
) -> None:
    job = _launch(2, engine, fake_python, "steps")
    job.wait_for(r"^step 2$", timeout=60)
    os.kill(job.proc.pid, signum)
    done = job.finish(timeout=60)
    assert done.returncode == 128 + signum, done.stdout + done.stderr
    assert len(re.findall(r"^saved after step \d+$", done.stdout, re.M)) == 1, done.stdout
    # Every rank ended by itself after the agreed step (SIGUSR1 forwarded), none was killed.
    assert sorted(re.findall(r"rank (\d) exits (\d+)", done.stdout)) == [("0", "138"), ("1", "138")], (
        done.stdout
    )
    assert "ended by signal" not in done.stderr and "exited with code" not in done.stderr, done.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_a_failed_rank_ends_the_job_with_its_code_in_one_line(engine: str, fake_python: str) -> None:
    done = _launch(3, engine, fake_python, "fail", "--peer-timeout", "1").finish(timeout=100)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "[launch] rank 1 exited with code 3" in done.stderr
    assert "prterun" not in done.stderr and "-----" not in done.stderr, done.stderr
    if engine == "mlx":  # the stopped ranks ignore mlx.launch's SIGTERM: the launcher kills them
        assert "[launch] ranks still running 11 s after the first failure: killing them" in done.stderr


def test_a_second_signal_ends_the_job_at_once(fake_python: str) -> None:
    job = _launch(2, "mpi", fake_python, "steps", step=5.0)
    job.wait_for(r"^step 1$", timeout=60)
    # The first becomes a stop request, the second (before the step ends) ends the job: no save.
    os.kill(job.proc.pid, signal.SIGINT)
    time.sleep(0.5)  # two signals at once are one to Python
    os.kill(job.proc.pid, signal.SIGINT)
    done = job.finish(timeout=60)
    assert done.returncode == 130 and "saved after" not in done.stdout, done.stdout + done.stderr


def test_output_passes_a_notice_it_does_not_know_unchanged() -> None:
    err = io.StringIO()
    rule = "-" * 74 + "\n"
    stream = io.StringIO(f"plain line\n{rule}something new\n{rule}[WARN] Node with rank 0 completed\n")
    out = launch._Output(stream, err)  # type: ignore[arg-type]
    out.thread.join(timeout=10)
    assert err.getvalue() == f"plain line\n{rule}something new\n{rule}"
