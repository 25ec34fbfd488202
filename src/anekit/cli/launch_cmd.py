"""``anekit launch -n N [--hosts A,B | --hostfile F] [--engine mpi|mlx] [--peer-timeout S] -- train ARGS``:
start a data-parallel training job on N ranks with the engine's own launcher.

The command line run (mpiexec's or mlx.launch's) is printed first. The exit status is the job's; a job
that ran out of its compile budget (every rank exits 75, rank 0 has saved) is started again with
``--resume``. Ctrl-C (or SIGTERM) stops every rank between two steps, rank 0 saves, and the launcher
exits 128 + the signal; a second Ctrl-C ends the job at once. The job is
``anekit.training.distributed.launch``; this module parses.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from anekit.cli import flags
from anekit.training.distributed import launch


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch",
        help="start a data-parallel training job on N ranks (mpiexec or mlx.launch): -- train ARGS...",
    )
    p.add_argument(
        "-n",
        dest="ranks",
        type=flags.int_range(1, 4096),
        required=True,
        metavar="N",
        help="the number of ranks (processes), each on its own engine: 1 .. 4096 (required, no default)",
    )
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("--hosts", metavar="A,B", help="the hosts to start ranks on (default: this one)")
    hosts.add_argument(
        "--hostfile",
        type=Path,
        metavar="F",
        help="the engine's hostfile (Open MPI's; mlx.launch's JSON list)",
    )
    p.add_argument(
        "--engine",
        choices=launch.ENGINES,
        default="mpi",
        help="mpi: mpiexec and mpi4py (default); mlx: mlx.launch and mlx.distributed's ring",
    )
    p.add_argument(
        "--peer-timeout",
        type=flags.float_range(0, 86400, lo_open=True),
        metavar="S",
        default=None,
        help="seconds a rank waits at an exchange beyond its own work before it ends the run, in (0, 86400] "
        f"(default {launch.DEFAULT_TIMEOUT:g}; passed to train)",
    )
    p.add_argument(
        "--max-restarts",
        type=flags.int_range(0, 100000),
        default=launch.MAX_RESTARTS,
        metavar="K",
        help="compile-budget restarts (exit 75, then --resume) allowed, 0 .. 100000 "
        f"(default {launch.MAX_RESTARTS})",
    )
    p.add_argument(
        "--python",
        metavar="PY",
        default=None,
        help="the Python every rank runs (its path on every host; default: this one)",
    )
    p.add_argument(
        "job",
        nargs=argparse.REMAINDER,
        metavar="-- train ARGS",
        help="the anekit command every rank runs: train and its arguments",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    job = list(args.job)
    if job and job[0] == "--":
        job = job[1:]
    plan = launch.plan(
        args.ranks,
        job,
        engine=args.engine,
        hosts=args.hosts,
        hostfile=args.hostfile,
        peer_timeout=args.peer_timeout,
        max_restarts=args.max_restarts,
        python=args.python,
    )
    return launch.run(plan)
