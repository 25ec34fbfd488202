"""Starting a distributed training job with its engine's own launcher (what ``anekit launch`` runs).

``plan(...)`` checks the request and builds the launcher's command line; ``run(plan)`` runs it, passes
its output on, and ends the way the job ended:

- **mpi**: ``mpiexec -n N [--host H | --hostfile F] [--oversubscribe] PYTHON -m anekit.cli.main train
  --distributed mpi ARGS`` (``--oversubscribe`` when N ranks exceed this host's cores and no host is
  named). Open MPI's variables for running as root are set when this process is root.
- **mlx**: ``mlx.launch -n K --backend ring [--hosts H | --hostfile F] --python PYTHON -- -m
  anekit.cli.main train --distributed mlx ARGS`` (mlx.launch's ``-n`` repeats each host: K = N / hosts).

The launcher is looked for next to this Python first, then on PATH. Its exit status is the job's: for
mpiexec its own; mlx.launch always exits 0, so the status is read from its report of the ranks ("Node
with rank R exited with code C": the first non-zero one, a signal S as 128 + S). Open MPI's multi-line
notices about a rank that failed become one line (``[launch] rank 2 (pid 123 on host) ended by signal 9
Killed``), those about a rank that aborted none (the rank has said what happened in its own line).

**Restarts.** A job that exits ``EXIT_RESTART`` (75, EX_TEMPFAIL: the ranks agreed that the compile
budget ran out and rank 0 saved a checkpoint) is started again with ``--resume``, at most
``max_restarts`` times.

**Stopping.** prterun answers SIGINT / SIGTERM by sending SIGTERM to every rank and SIGKILL 0.2 s later
(measured, Open MPI 5.0.11; it cannot be told otherwise), which leaves no time to finish a step and
save. So the launcher runs in a session of its own (a terminal's Ctrl-C reaches this process only), and
a first SIGINT / SIGTERM here becomes ``STOP_SIGNAL`` (SIGUSR1): sent to mpiexec, which forwards it to
every rank untouched, or, for mlx.launch (which forwards nothing), to the ranks on this host. A rank
under ``--distributed`` takes SIGUSR1 as a stop request: the ranks agree on it at the next step
boundary, rank 0 saves, every rank exits. This process then exits 128 + the signal it received, as a
single ``anekit train`` does. A second signal ends the job at once (SIGTERM to mpiexec, SIGKILL to
mlx.launch's processes).

**A rank that cannot be ended.** mlx.launch stops the other ranks with SIGTERM when one fails, which a
stopped (SIGSTOP) or wedged rank never acts on; once a rank has failed, the launcher gives the job
``peer_timeout + END_GRACE`` seconds more, then kills every process mlx.launch started on this host.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TextIO

from anekit.errors import install_hint
from anekit.inputs import check_input, read_text
from anekit.training.distributed.transport import DEFAULT_TIMEOUT, DistributedError

ENGINES = ("mpi", "mlx")
LAUNCHERS = {"mpi": "mpiexec", "mlx": "mlx.launch"}
EXTRAS = {"mpi": "distributed", "mlx": "mlx"}
EXIT_RESTART = 75  # EX_TEMPFAIL: the compile budget ran out on every rank, rank 0 saved; start again
MAX_RESTARTS = 100  # restarts of one launch (each is ~100 compiles of progress)
STOP_SIGNAL = signal.SIGUSR1  # what a SIGINT / SIGTERM of the launcher reaches the ranks as
END_GRACE = 10.0  # seconds past the peer timeout a failed mlx job gets before its processes are killed
RANK_MODULE = "anekit.cli.main"  # what every rank runs (python -m ...)
HOSTFILE_LIMIT = 1 << 20  # bytes: a list of hosts
ROOT_VARIABLES = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@dataclass(frozen=True)
class Plan:
    """One launch: the engine, the launcher's command line, its environment additions."""

    engine: str
    ranks: int
    command: tuple[str, ...]  # the launcher's full command line
    train_args: tuple[str, ...]  # what follows ``train`` (with --distributed ENGINE), for a restart
    env: dict[str, str] = field(default_factory=dict)
    peer_timeout: float = DEFAULT_TIMEOUT
    max_restarts: int = MAX_RESTARTS

    def shell_line(self) -> str:
        """The command line as a shell would take it, the environment additions first."""
        return shlex.join([*(f"{k}={v}" for k, v in sorted(self.env.items())), *self.command])

    def resumed(self) -> Plan:
        """The same launch continuing from the checkpoint: ``--resume`` added to the train arguments."""
        if "--resume" in self.train_args:
            return self
        cut = len(self.command) - len(self.train_args)
        args = (*self.train_args, "--resume")
        return Plan(
            self.engine,
            self.ranks,
            (*self.command[:cut], *args),
            args,
            self.env,
            self.peer_timeout,
            self.max_restarts,
        )


def find_launcher(engine: str) -> str:
    """The engine's launcher: next to this Python, else on PATH, else one line naming the extra."""
    name = LAUNCHERS[engine]
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise DistributedError(
            f"[launch] --engine {engine}: {name} is not installed (the {EXTRAS[engine]} extra: "
            f"{install_hint(EXTRAS[engine])})"
        )
    return found


def _option(args: Sequence[str], name: str) -> tuple[int, str | None] | None:
    """Where ``name`` is among ``args`` and its value (``--x V`` or ``--x=V``), or None."""
    for i, a in enumerate(args):
        if a == name:
            return i, args[i + 1] if i + 1 < len(args) else None
        if a.startswith(name + "="):
            return i, a[len(name) + 1 :]
    return None


def _host_count(hosts: str | None, hostfile: Path | None) -> int | None:
    if hosts is not None:
        return len([h for h in hosts.split(",") if h.strip()])
    if hostfile is None:
        return None
    text = read_text(hostfile, "[launch] --hostfile", HOSTFILE_LIMIT, "a hostfile")
    try:
        entries = json.loads(text)
    except ValueError:
        raise DistributedError(
            f"[launch] --hostfile {hostfile}: mlx.launch takes a JSON hostfile (a list of hosts), "
            "this is not JSON"
        ) from None
    if not isinstance(entries, list) or not entries:
        raise DistributedError(f"[launch] --hostfile {hostfile}: expected a non-empty JSON list of hosts")
    return len(entries)


def plan(
    ranks: int,
    argv: Sequence[str],
    *,
    engine: str = "mpi",
    hosts: str | None = None,
    hostfile: Path | None = None,
    peer_timeout: float | None = None,
    max_restarts: int = MAX_RESTARTS,
    python: str | None = None,
    cores: int | None = None,
) -> Plan:
    """Check a launch of ``ranks`` ranks of ``anekit ARGV`` (ARGV starting with ``train``) and build the
    launcher's command line (module docstring). Every refusal is one line."""
    if engine not in ENGINES:
        raise DistributedError(f"[launch] --engine: unknown engine {engine!r} (expected one of mpi, mlx)")
    if ranks < 1:
        raise DistributedError(f"[launch] -n: expected at least 1 rank, got {ranks}")
    if not argv or argv[0] != "train":
        got = f"got {argv[0]!r}" if argv else "got nothing"
        raise DistributedError(f"[launch] expected the command to run after '--': train ARGS... ({got})")
    if hosts is not None and hostfile is not None:
        raise DistributedError("[launch] --hosts and --hostfile: give one of them, not both")
    if hosts is not None and not [h for h in hosts.split(",") if h.strip()]:
        raise DistributedError(f"[launch] --hosts: expected a comma-separated list of hosts, got {hosts!r}")
    if hostfile is not None:
        check_input(hostfile, "[launch] --hostfile", HOSTFILE_LIMIT, "a hostfile")
    if max_restarts < 0:
        raise DistributedError(f"[launch] --max-restarts: expected 0 or more, got {max_restarts}")
    train = list(argv[1:])
    given = _option(train, "--distributed")
    if given is not None:
        if given[1] != engine:
            raise DistributedError(
                f"[launch] train --distributed {given[1]} contradicts --engine {engine} (leave --distributed "
                "out: the launcher adds it)"
            )
        del train[given[0] : given[0] + (1 if "=" in train[given[0]] else 2)]
    timeout = peer_timeout
    in_train = _option(train, "--peer-timeout")
    if in_train is not None and peer_timeout is not None:
        raise DistributedError("[launch] --peer-timeout given both to launch and to train: give it once")
    if in_train is None and peer_timeout is not None:
        if not peer_timeout > 0:
            raise DistributedError(f"[launch] --peer-timeout: expected seconds > 0, got {peer_timeout:g}")
        train += ["--peer-timeout", f"{peer_timeout:g}"]
    if in_train is not None:
        try:
            timeout = float(in_train[1] or "")
        except ValueError:
            timeout = None  # train itself refuses it, in its own words
    train_args = ("train", "--distributed", engine, *train)
    count = _host_count(hosts, hostfile) if engine == "mlx" else None
    if count is not None and ranks % count:
        raise DistributedError(
            f"[launch] -n {ranks}: mlx.launch starts the same number of ranks on each of the {count} "
            f"hosts; give a multiple of {count}"
        )
    py = python or sys.executable
    exe = find_launcher(engine)
    env: dict[str, str] = {}
    if engine == "mpi":
        cmd = [exe, "-n", str(ranks)]
        if hosts is not None:
            cmd += ["--host", hosts]
        elif hostfile is not None:
            cmd += ["--hostfile", str(hostfile)]
        elif ranks > (cores or os.cpu_count() or 1):
            cmd.append("--oversubscribe")
        cmd += [py, "-m", RANK_MODULE, *train_args]
        if os.geteuid() == 0:
            env.update(ROOT_VARIABLES)
    else:
        cmd = [exe, "-n", str(ranks // (count or 1)), "--backend", "ring"]
        if hosts is not None:
            cmd += ["--hosts", hosts]
        elif hostfile is not None:
            cmd += ["--hostfile", str(hostfile)]
        else:  # on this host alone: ports nobody holds, so that two jobs (or one left behind) cannot meet
            cmd += ["--starting-port", str(free_ports(ranks))]
        cmd += ["--python", py, "--", "-m", RANK_MODULE, *train_args]
    return Plan(engine, ranks, tuple(cmd), train_args, env, timeout or DEFAULT_TIMEOUT, max_restarts)


def free_ports(count: int, first: int = 20000, last: int = 60000) -> int:
    """The first of ``count`` consecutive TCP ports on the loopback that nothing listens on now (mlx.launch's
    ring on one host listens on ``--starting-port`` + rank; its default, 32323, is shared by every job).
    Blocks are tried from a random start, so two launches at the same instant rarely pick the same one."""
    import random
    import socket

    span = max(1, (last - first) // max(1, count))
    start = random.randrange(span)
    for k in range(span):
        base = first + ((start + k) % span) * count
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise DistributedError(
        f"[launch] no {count} consecutive free ports between {first} and {last} for mlx's ring"
    )


# -- running it


# Open MPI's multi-line notices (between rules of dashes), as one line each, or none (None): a rank that
# aborted has printed its own line already.
MPI_NOTICES: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (
        re.compile(r"MPI_ABORT was invoked|prterun has exited due to process rank .* calling\s+\"abort\""),
        None,
    ),
    (
        re.compile(
            r"process rank (\d+) with PID (\d+) on node (\S+) exited on\s+signal (\d+)(?: \((\w+)\))?"
        ),
        "[launch] rank {0} (pid {1} on {2}) ended by signal {3} {4}",
    ),
    (
        re.compile(
            r"one or more processes exited with non-zero status.*?Process name:\s+\[\S+,(\d+)\]"
            r".*?Exit code:\s+(\d+)",
            re.S,
        ),
        "[launch] rank {0} exited with code {1}",
    ),
)
MLX_REPORT = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")
MLX_DONE = re.compile(r"Node with rank \d+ completed")
RULE = re.compile(r"^-{20,}$")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def notice_line(block: str) -> str | None:
    """One of Open MPI's notices as one line ("" to leave it out), or None when it is not one we know
    (it is then passed on as it is)."""
    for pattern, form in MPI_NOTICES:
        m = pattern.search(block)
        if m:
            return "" if form is None else form.format(*(g or "" for g in m.groups())).rstrip() + "\n"
    return None


class _Output:
    """Passes the launcher's stderr on, line by line, Open MPI's notices and mlx.launch's reports of the
    ranks' ends made one line each (``notice_line``); keeps the first non-zero rank exit code mlx.launch
    reports and when it came. Once a stop request was passed on, the ranks' ends it asked for (exit
    128 + STOP_SIGNAL, or mlx.launch's SIGTERM to the ranks still exiting) are not reported."""

    EXPECTED = (f"code {128 + STOP_SIGNAL}\n", f"signal {int(signal.SIGTERM)} Terminated\n")

    def __init__(self, stream: IO[str], out: TextIO) -> None:
        self.stream = stream
        self.out = out
        self.rank_code: int | None = None
        self.failed_at: float | None = None
        self.stopping = False  # a stop request was passed on: ranks exiting 128 + STOP_SIGNAL are expected
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        block: list[str] | None = None
        for raw in self.stream:
            line = raw.replace("\0", "")
            text = COLOUR.sub("", line).strip()
            if RULE.match(text):
                if block is None:
                    block = [line]
                    continue
                one = notice_line("".join(block))
                if one is not None and self.stopping and one.endswith(self.EXPECTED):
                    one = ""  # the ranks ending as asked, after a stop request
                self._write("".join(block) + line if one is None else one)
                block = None
                continue
            if block is not None:
                block.append(line)
                continue
            m = MLX_REPORT.search(text)
            if m:
                self._mlx_report(int(m.group(1)), int(m.group(2)) if m.group(2) else -int(signal.SIGKILL))
                continue
            if MLX_DONE.search(text):
                continue
            self._write(line[1:] if line.startswith(" [") else line)  # prterun's stray space before a line
        if block:
            self._write("".join(block))

    def _mlx_report(self, rank: int, code: int) -> None:
        if (
            code == 0
            or self.rank_code is not None
            or (self.stopping and code in (128 + STOP_SIGNAL, -signal.SIGTERM))
        ):
            return  # the ranks mlx.launch ended after the first failure say nothing new
        self.rank_code = code if code > 0 else 128 - code
        self.failed_at = time.monotonic()
        how = f"exited with code {code}" if code > 0 else f"ended by signal {-code}"
        self._write(f"[launch] rank {rank} {how}; mlx.launch ends the other ranks\n")

    def say(self, text: str) -> None:
        self._write(text)

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # our own stderr closed: the status still says it
            self.out.write(text)
            self.out.flush()


class _Stopper:
    """SIGINT / SIGTERM while the job runs: the first is passed to the ranks as STOP_SIGNAL, a second ends
    the job at once (module docstring)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, deliver: Callable[[int], None]) -> None:
        self.deliver = deliver
        self.signum: int | None = None
        self.count = 0
        self.previous: dict[int, object] = {}

    def __enter__(self) -> _Stopper:
        for s in self.SIGNALS:
            self.previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum
        self.deliver(self.count)


def _tree(pid: int, only: str | None = None) -> list[int]:
    """The processes under ``pid`` on this host (from ``ps``); with ``only``, those whose command line
    holds it."""
    found: list[int] = []
    try:
        table = subprocess.run(
            ["ps", "-A", "-o", "pid=,ppid=,args="], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return found
    children: dict[int, list[int]] = {}
    args: dict[int, str] = {}
    for row in table.stdout.split("\n"):
        parts = row.split(None, 2)
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
            args[int(parts[0])] = parts[2] if len(parts) == 3 else ""
    todo = [pid]
    while todo:
        for kid in children.get(todo.pop(), []):
            todo.append(kid)
            if only is None or only in args.get(kid, ""):
                found.append(kid)
    return found


def _signal(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def _run_once(p: Plan, out: TextIO, err: TextIO) -> tuple[int, int | None]:
    """Run the launcher once; (the job's exit status, the signal this process received or None)."""
    print(p.shell_line(), file=out, flush=True)
    env = dict(os.environ)
    env.update(p.env)
    proc = subprocess.Popen(
        p.command, env=env, stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True
    )
    assert proc.stderr is not None
    output = _Output(proc.stderr, err)

    def deliver(count: int) -> None:
        output.stopping = True
        if p.engine == "mpi":
            _signal([proc.pid], STOP_SIGNAL if count == 1 else signal.SIGTERM)
        elif count == 1:  # mlx.launch forwards nothing: the ranks on this host are its grandchildren
            _signal(_tree(proc.pid, only=RANK_MODULE), STOP_SIGNAL)
        else:
            _signal([*_tree(proc.pid), proc.pid], signal.SIGKILL)

    with _Stopper(deliver) as stopper:
        while True:
            try:
                status = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if (
                p.engine == "mlx"
                and output.failed_at is not None
                and time.monotonic() - output.failed_at > p.peer_timeout + END_GRACE
            ):
                output.say(
                    f"[launch] ranks still running {p.peer_timeout + END_GRACE:g} s after the first failure: "
                    "killing them\n"
                )
                _signal([*_tree(proc.pid), proc.pid], signal.SIGKILL)
                output.failed_at = float("inf")
    output.thread.join(timeout=10)
    if (
        p.engine == "mlx" and output.rank_code is not None
    ):  # mlx.launch's own status says nothing of the ranks
        status = output.rank_code
    if status < 0:
        status = 128 - status
    return status, stopper.signum


def run(p: Plan, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the launch (restarting it with ``--resume`` on EXIT_RESTART) and return the exit status: the
    job's, or 128 + the signal that stopped it."""
    out = out or sys.stdout
    err = err or sys.stderr
    restarts = 0
    while True:
        status, signum = _run_once(p, out, err)
        if signum is not None:
            return 128 + signum
        if status != EXIT_RESTART:
            return status
        if restarts >= p.max_restarts:
            print(
                f"anekit: [launch] the job asked for a restart (exit {EXIT_RESTART}) {restarts + 1} times; "
                f"stopping after {p.max_restarts} restarts (continue with --resume)",
                file=err,
                flush=True,
            )
            return status
        restarts += 1
        p = p.resumed()
        print(
            f"[launch] restart {restarts}: the compile budget ran out; continuing with --resume",
            file=out,
            flush=True,
        )
