"""Benchmark: the fixed-order gradient exchange of 2 ranks on this machine (loopback, mpiexec) against a
training step's compute, and against ``anekit.cost.distributed``'s model of it.

Run: python benchmarks/bench_allreduce.py [--ranks 2] [--repeats 7] [--models stories15M stories110M]
     [--step-config stories15M]

What it does, in order:

1. times one stories15M sequence's forward and backward on the simulator in this process (the kernels
   compiled and warmed first; the median of ``--steps``), with OPENBLAS_NUM_THREADS=1: one core, what each
   of 2 ranks has on a 2-core machine;
2. starts ``--ranks`` ranks with mpiexec (bounded by a timeout) that measure the loopback link (a small
   message's one-way time from a ping-pong, a 64 MiB message's rate) and a float32 add's memory rate,
   then the exchange a distributed step makes of each model's gradients (float32, one bucket per tensor,
   in the parameters' order, one sequence's buffer per rank): anekit's own ``ordered_sum`` over its MPI
   transport (rank r receives the partial total from r - 1, adds its buffer, sends it to r + 1; the last
   rank broadcasts every bucket), and the same chain written with mpi4py's blocking Send / Recv / Bcast;
   the median of ``--repeats``, every total checked against the sum in rank order;
3. prints, per model: the measured exchange, the model's prediction for a link of the measured rate and
   latency, the ratio of the exchange to the measured step, and the accumulation per rank that keeps the
   exchange at most 10% of a step.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: one BLAS thread per rank

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

from anekit.cost import distributed as dist
from anekit.cost.links import Link
from anekit.engine.evidence import Evidence
from anekit.engine.performance import Figure
from anekit.kernels.config import preset

RANK_TIMEOUT = 120  # seconds the ranks may take, all of them together
PROBE_BYTES = 64 << 20  # the message the link's rate is measured with
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


# -- the ranks ---------------------------------------------------------------------------------------------


def chain_exchange(comm, local: list[np.ndarray], total: list[np.ndarray]) -> None:
    """One step's exchange: the chain sum of every bucket in order, then the last rank's broadcasts."""
    rank, size = comm.Get_rank(), comm.Get_size()
    for j, (mine, acc) in enumerate(zip(local, total)):
        if rank == 0:
            comm.Send(mine, dest=1, tag=j)  # rank 0's partial total is its own block's
            continue
        comm.Recv(acc, source=rank - 1, tag=j)
        np.add(acc, mine, out=acc)  # the received partial total, then this rank's sequence
        if rank < size - 1:
            comm.Send(acc, dest=rank + 1, tag=j)
    for acc in total:
        comm.Bcast(acc, root=size - 1)


def probe_link(comm, repeats: int) -> tuple[float, float]:
    """The one-way time of an 8-byte message (half a ping-pong's round trip) and the rate of a
    ``PROBE_BYTES`` message from rank 0 to rank 1 (bytes/s), medians."""
    rank = comm.Get_rank()
    small = np.zeros(1, np.float64)
    big = np.zeros(PROBE_BYTES // 4, np.float32)
    trips, sends = [], []
    for _ in range(repeats * 20):
        comm.Barrier()
        t0 = time.perf_counter()
        if rank == 0:
            comm.Send(small, dest=1)
            comm.Recv(small, source=1)
        elif rank == 1:
            comm.Recv(small, source=0)
            comm.Send(small, dest=0)
        trips.append((time.perf_counter() - t0) / 2)
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        if rank == 0:
            comm.Send(big, dest=1)
            comm.Recv(small, source=1)  # the receiver's word that it has it all
        elif rank == 1:
            comm.Recv(big, source=0)
            comm.Send(small, dest=0)
        sends.append(time.perf_counter() - t0)
    latency = statistics.median(trips)
    return latency, PROBE_BYTES / max(statistics.median(sends) - latency, 1e-9)


def add_rate(nbytes: int, repeats: int) -> float:
    """Bytes of memory traffic per second of ``np.add(total, buffer, out=total)`` on float32 arrays of
    ``nbytes`` (3 x nbytes an add: two read, one written), the median of ``repeats``."""
    total = np.ones(nbytes // 4, np.float32)
    buf = np.ones(nbytes // 4, np.float32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.add(total, buf, out=total)
        times.append(time.perf_counter() - t0)
    return 3 * nbytes / statistics.median(times)


class Buckets:
    """The chain's view of a trainable (``ordered_sum``'s ``Chained``): the total's gradient tensors, and
    one buffer's tensor added onto the total's, as the trainables add them (in place, elementwise)."""

    def __init__(self, total: list[np.ndarray]) -> None:
        self.total = total

    def buckets(self) -> list[np.ndarray]:
        return self.total

    def add_bucket(self, sink: list[np.ndarray], index: int) -> None:
        self.total[index] += sink[index]


def timed(comm, repeats: int, exchange) -> tuple[float, float]:
    """(median, slowest) seconds of ``exchange()`` over ``repeats``, after one warm-up; every rank starts
    each repeat together, the slowest is over every rank."""
    from mpi4py import MPI

    exchange()  # the first messages set up the connections
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        exchange()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), comm.allreduce(max(times), op=MPI.MAX)


def measure(comm, transport, name: str, repeats: int, ordered_sum) -> dict:
    """The exchange of ``name``'s gradients, with ``ordered_sum`` and with plain mpi4py, checked."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    buckets = dist.full_buckets(preset(name))

    def gradients(r: int) -> list[np.ndarray]:  # rank r's sequence gradient, bucket by bucket
        rng = np.random.default_rng(r)
        return [rng.standard_normal(b // 4, dtype=np.float32) for b in buckets]

    local = gradients(rank)
    expect = gradients(0)  # the total the ranks' gradients add up to, in rank order
    for r in range(1, size):
        for e, g in zip(expect, gradients(r)):
            np.add(e, g, out=e)
    raw_total = [np.empty_like(a) for a in local]
    raw = timed(comm, repeats, lambda: chain_exchange(comm, local, raw_total))
    chained = Buckets([a.copy() for a in local])

    def real() -> None:
        if rank == 0:  # rank 0's total is its own block's partial sum
            for t, a in zip(chained.total, local):
                t[...] = a
        ordered_sum(transport, chained, [] if rank == 0 else [local], f"the {name} benchmark")

    used = timed(comm, repeats, real)
    exact = all(np.array_equal(t, e) for t, e in zip(raw_total, expect))
    exact = exact and all(np.array_equal(t, e) for t, e in zip(chained.total, expect))
    return {"model": name, "bytes": sum(buckets), "buckets": len(buckets), "raw_s": raw[0],
            "median_s": used[0], "max_s": used[1],
            "exact": bool(comm.allreduce(int(exact), op=MPI.MIN))}  # fmt: skip


def rank_main(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    from anekit.training.distributed.open import open_transport
    from anekit.training.distributed.order import ordered_sum

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    latency, rate = probe_link(comm, args.repeats)
    adds = add_rate(PROBE_BYTES, args.repeats)  # each rank alone would be faster: both run it at once
    transport = open_transport("mpi", timeout=60.0)
    rows = [measure(comm, transport, name, args.repeats, ordered_sum) for name in args.models]
    if rank == 0:
        print(json.dumps({"ranks": size, "latency_s": latency, "rate": rate, "add_rate": adds,
                          "rows": rows}))  # fmt: skip
    transport.close()


# -- the parent --------------------------------------------------------------------------------------------


def sequence_time(name: str, steps: int) -> float:
    """The median time of one sequence's forward and backward of ``name`` on the simulator (seconds)."""
    from anekit import runtime
    from anekit.llama import Params
    from anekit.llama.kernel_sets import make_kernels
    from anekit.llama.step import Timer, train_step

    cfg = preset(name)
    params = Params.init(cfg, seed=0)
    kernels = make_kernels(runtime.open("sim", compile_budget=10**9), cfg, "dynamic")
    kernels.compile(params, Timer())
    grads = params.zeros_like()
    rng = np.random.default_rng(0)
    times = []
    for i in range(steps + 1):  # the first is a warm-up
        window = rng.integers(0, cfg.vocab_size, cfg.seq_len + 1)
        t0 = time.perf_counter()
        train_step(kernels, params, grads, window[:-1], window[1:], Timer(), loss_scale=1024.0)
        if i:
            times.append(time.perf_counter() - t0)
    kernels.close()
    return statistics.median(times)


def run_ranks(args: argparse.Namespace) -> dict:
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if mpiexec is None:
        sys.exit("bench_allreduce: mpiexec not found (pip install 'anekit[distributed]')")
    cmd = [mpiexec, "-n", str(args.ranks), "--oversubscribe", sys.executable, __file__, "--rank",
           "--repeats", str(args.repeats), "--models", *args.models]  # fmt: skip
    env = {**os.environ, **(ROOT_ENV if os.geteuid() == 0 else {}), "OPENBLAS_NUM_THREADS": "1"}
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RANK_TIMEOUT, check=True)
    except subprocess.TimeoutExpired:
        sys.exit(f"bench_allreduce: the ranks did not finish within {RANK_TIMEOUT} s")
    except subprocess.CalledProcessError as e:
        sys.exit(f"bench_allreduce: mpiexec failed ({e.returncode}): {e.stderr.strip()[-400:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3, help="timed sequences of --step-config")
    ap.add_argument("--models", nargs="+", default=["stories15M", "stories110M"])
    ap.add_argument("--step-config", default="stories15M")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        rank_main(args)
        return
    load = os.getloadavg()[0]
    step = sequence_time(args.step_config, args.steps)
    got = run_ranks(args)
    ev = Evidence("this machine", "measured", "loopback, mpiexec")
    loop = Link("loopback", "loopback", "mpi", "mpi", Figure(got["rate"] / 1e9, "GB/s", ev),
                Figure(max(got["latency_s"] * 1e6, 1e-3), "us", ev))  # fmt: skip
    print(
        f"{got['ranks']} ranks on loopback (mpiexec, OPENBLAS_NUM_THREADS=1): one-way "
        f"{got['latency_s'] * 1e6:.1f} us, {got['rate'] / 1e9:.2f} GB/s ({PROBE_BYTES >> 20} MiB messages), "
        "adds at "
        f"{got['add_rate'] / 1e9:.1f} GB/s of memory traffic; one {args.step_config} "
        f"sequence on the simulator {step * 1e3:.0f} ms (median of {args.steps}); load average "
        f"{load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(f"{'gradients':<12} {'MB':>7} {'buckets':>7} {'exchange ms':>11} {'max ms':>8} {'mpi4py ms':>9} "
          f"{'model ms':>8} {'/ step':>7} {'k to hide':>9}  same total")  # fmt: skip
    for row in got["rows"]:
        buckets = dist.full_buckets(preset(row["model"]))
        predicted = dist.exchange(buckets, got["ranks"], loop, 1, got["add_rate"]).total_s
        x = row["median_s"]
        k = max(1, int(np.ceil(9 * x / step)))  # x <= 10% of (k step + x)
        print(
            f"{row['model']:<12} {row['bytes'] / 1e6:>7.1f} {row['buckets']:>7} {x * 1e3:>11.1f} "
            f"{row['max_s'] * 1e3:>8.1f} {row['raw_s'] * 1e3:>9.1f} {predicted * 1e3:>8.1f} {x / step:>7.2f} "
            f"{k:>9}  {row['exact']}"
        )
    print(
        "exchange: anekit's ordered_sum over the MPI transport, median (max: the slowest repeat on any "
        "rank); mpi4py: the same chain and broadcast with blocking Send / Recv / Bcast; model: "
        "anekit.cost.distributed for a link of the measured rate and latency, adds at the measured rate"
    )


if __name__ == "__main__":
    main()
