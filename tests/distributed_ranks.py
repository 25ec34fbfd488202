"""Start N real ranks on this machine, bounded in time, and collect what they print.

    from tests.distributed_ranks import run_ranks, start_ranks, need_engine

    need_engine("mpi")                                   # skips the test, with its reason, when absent
    done = run_ranks(2, ["-m", "anekit.cli.main", "train", "--distributed", "mpi", ...], timeout=100)
    done.returncode, done.stdout, done.stderr            # the launcher's: every rank's lines, merged

``argv`` is what follows the Python interpreter in each rank (a script and its arguments, or ``-m
module ...``); every rank runs this venv's interpreter with the project's ``src`` first on its path.
``engine="mpi"`` runs ``mpiexec -n N --oversubscribe`` (Open MPI's variables for root set),
``engine="mlx"`` runs ``mlx.launch -n N --backend ring`` (its exit status is 0 whatever the ranks do, so
``returncode`` there is worked out from its "exited with code" lines: the first non-zero one). A run
that passes ``timeout`` seconds (at most 120) is killed, every rank with it, and fails the test with
what it printed.

``start_ranks`` is the same start without the wait, for tests that act while the ranks run::

    job = start_ranks(2, argv)                    # or start_ranks(0, [], cmd=[... "anekit", "launch", ...])
    job.wait_for(r"^step 3 ")                     # a regex over what has been printed so far
    os.kill(rank_pids(job, 2)[1], signal.SIGKILL)  # the ranks' pids on this machine
    done = job.finish(timeout=60)                  # as run_ranks returns
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from anekit.training.distributed.launch import free_ports

PROJECT_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MAX_TIMEOUT = 120.0  # seconds: no test waits longer on its ranks


def launcher(engine: str) -> str | None:
    """The engine's launcher next to this interpreter, else on PATH, else None."""
    name = {"mpi": "mpiexec", "mlx": "mlx.launch"}[engine]
    here = BIN / name
    return str(here) if here.exists() else shutil.which(name)


def need_engine(engine: str) -> str:
    """The engine's launcher, or skip the test with one reason (its package and the extra it comes in)."""
    found = launcher(engine)
    if engine == "mpi":
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            pytest.skip("mpi4py is not installed (the distributed extra)")
    else:
        try:
            import mlx.core  # noqa: F401
        except ImportError:
            pytest.skip("mlx is not installed (the mlx extra)")
    if found is None:
        pytest.skip(f"{'mpiexec' if engine == 'mpi' else 'mlx.launch'} is not installed")
    return found


def rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every rank gets: this one, src first on PYTHONPATH, Open MPI's root variables."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT / "src"), str(PROJECT_ROOT)])
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.update(extra or {})
    return env


def command(n: int, argv: list[str], engine: str = "mpi") -> list[str]:
    """The launcher's command line for N ranks running ``python argv``."""
    exe = need_engine(engine)
    if engine == "mpi":
        return [exe, "-n", str(n), "--oversubscribe", sys.executable, *argv]
    port = str(free_ports(n))  # not mlx's default: a job left behind by another test cannot meet this one
    return [
        exe,
        "-n",
        str(n),
        "--backend",
        "ring",
        "--starting-port",
        port,
        "--python",
        sys.executable,
        "--",
        *argv,
    ]


@dataclass
class Ranks:
    """What a finished run of ranks left: the launcher's status and every rank's merged output."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


MLX_EXIT = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")


def _mlx_status(stderr: str) -> int:
    for m in MLX_EXIT.finditer(stderr):
        code = int(m.group(2)) if m.group(2) is not None else -int(signal.SIGTERM)
        if code != 0:
            return code
    return 0


class Started:
    """A launcher running: its process (``proc``) and what it has printed so far, read by two threads."""

    def __init__(self, proc: subprocess.Popen[str], engine: str) -> None:
        self.proc = proc
        self.engine = engine
        self._out: list[str] = []
        self._err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(proc.stdout, self._out), daemon=True),
            threading.Thread(target=self._read, args=(proc.stderr, self._err), daemon=True),
        ]
        for r in self._readers:
            r.start()

    @staticmethod
    def _read(stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            into.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self._out)

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """The first match of ``pattern`` (a regex, multi-line) in stdout + stderr, waiting at most
        ``timeout`` seconds; past it (or when the launcher ends without it) the session is killed and the
        test fails with what was printed."""
        deadline = time.monotonic() + min(timeout, MAX_TIMEOUT)
        while True:
            m = re.search(pattern, self.stdout + self.stderr, re.M)
            if m:
                return m
            if time.monotonic() > deadline or self.proc.poll() is not None:
                if self.proc.poll() is not None:
                    for r in self._readers:
                        r.join(timeout=5)
                    m = re.search(pattern, self.stdout + self.stderr, re.M)
                    if m:
                        return m
                kill_session(self.proc)
                pytest.fail(
                    f"no {pattern!r} within {timeout:g} s\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
                )
            time.sleep(0.05)

    def finish(self, timeout: float = 100.0) -> Ranks:
        """Wait for the launcher at most ``timeout`` seconds (killing its session and failing the test past
        it) and return what it left."""
        t0 = time.monotonic()
        try:
            self.proc.wait(timeout=min(timeout, MAX_TIMEOUT))
        except subprocess.TimeoutExpired:
            kill_session(self.proc)
            self.proc.wait(timeout=10)
            pytest.fail(
                f"ranks still running after {timeout:g} s\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
            )
        for r in self._readers:
            r.join(timeout=10)
        out, err = self.stdout, self.stderr
        code = self.proc.returncode if self.engine == "mpi" else (self.proc.returncode or _mlx_status(err))
        return Ranks([str(a) for a in self.proc.args], code, out, err, time.monotonic() - t0)  # type: ignore[union-attr]

    def kill(self) -> None:
        """SIGKILL the launcher and every process under it."""
        kill_session(self.proc)
        self.proc.wait(timeout=10)


def start_ranks(
    n: int,
    argv: list[str],
    engine: str = "mpi",
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    cmd: list[str] | None = None,
) -> Started:
    """The launcher started in its own session (a signal to its group reaches it alone), its output read
    as it comes; ``cmd`` replaces the launcher's command line (an ``anekit launch`` line, say)."""
    proc = subprocess.Popen(
        cmd if cmd is not None else command(n, argv, engine),
        env=rank_env(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    STARTED.append(proc)
    return Started(proc, engine)


# Every launcher started, so that ``end_leftovers`` (called after each test by tests/conftest.py) ends what
# a failed assertion left running: a stopped rank would otherwise outlive the test run.
STARTED: list[subprocess.Popen[str]] = []


def _session_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[4])  # the fields after the command: state ppid pgrp session


def end_leftovers() -> None:
    """SIGKILL every process of the sessions the tests' launchers started (orphans included), then forget
    them."""
    sessions = {p.pid for p in STARTED}
    STARTED.clear()
    if not sessions:
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _session_of(int(entry)) in sessions:
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)


def run_ranks(
    n: int,
    argv: list[str],
    engine: str = "mpi",
    timeout: float = 100.0,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> Ranks:
    """Run N ranks of ``python argv`` under the engine's launcher and wait (module docstring)."""
    return start_ranks(n, argv, engine, env, cwd).finish(timeout)


def rank_pids(started: Started, n: int, timeout: float = 30.0) -> list[int]:
    """The pids of the launcher's N rank processes on this machine (its Python children), once all are up."""
    proc = started.proc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(p for p in _descendants(proc.pid) if _is_python(p))
        if len(found) >= n:
            return found[:n]
        time.sleep(0.05)
    kill_session(proc)
    pytest.fail(f"the launcher did not start {n} ranks within {timeout:g} s")


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = Path(f"/proc/{p}/task/{t}/children").read_text().split()
            except OSError:
                continue
            for k in kids:
                out.append(int(k))
                todo.append(int(k))
    return out


def _is_python(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmd) and os.path.basename(cmd[0]).startswith(b"python")


def kill_session(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the launcher's whole session (and its ranks, which Open MPI puts in groups of their own)."""
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
