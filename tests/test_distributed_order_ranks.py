"""The loop's fixed-order sum over real ranks: 2 and 3 processes over MPI (``mpiexec``) and 2 over mlx's ring
train the bits one process trains with the whole batch, full training and LoRA (each rank prints the sha256
of its weights, moments and losses; ``tests.distributed_loop_rank``). Skipped without the launchers."""

from __future__ import annotations

import json

import pytest

from tests.distributed_loop_rank import train_tiny
from tests.distributed_ranks import need_engine, run_ranks


def _digests(engine: str, size: int, mode: str, accum: int) -> list[str]:
    need_engine(engine)
    done = run_ranks(
        size, ["-m", "tests.distributed_loop_rank", engine, mode, str(accum)], engine, timeout=110
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(line["rank"] for line in lines) == list(range(size)), done.stdout[-2000:]
    return [line["digest"] for line in lines]


@pytest.mark.parametrize(
    "engine,size,mode", [("mpi", 2, "full"), ("mpi", 3, "full"), ("mpi", 2, "lora"), ("mlx", 2, "full")]
)
def test_real_ranks_train_the_bits_of_one_process(engine, size, mode):
    digests = _digests(engine, size, mode, 2 * size)
    one, _ = train_tiny(mode, 2 * size)
    assert digests == [one] * size
