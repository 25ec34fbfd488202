"""A stand-in for ``anekit train`` under ``anekit launch``: ``python -m tests.distributed_launch_rank -m
anekit.cli.main train --distributed ENGINE ARGS`` (the launch tests give the launcher a Python that runs
this module instead of anekit's own, so the launcher's wiring is tested apart from training).

``LAUNCH_CASE`` chooses what every rank does:

- ``echo``: print ``rank R argv ARGS`` and exit 0;
- ``restart``: exit 75 (a compile-budget restart) unless ``--resume`` is among ARGS, then print
  ``resumed`` and exit 0;
- ``steps``: "train" in steps of ``STEP_SECONDS`` (0.2 s); SIGUSR1, SIGINT or SIGTERM asks for a stop, agreed on by every
  rank at the step boundary (an ``all_sum`` of flags, as the training loop does); rank 0 then prints
  ``saved after step S``, the ranks meet at a barrier; every rank prints ``rank R exits C`` and exits
  128 + the signal;
- ``fail``: rank 1 exits 3 at once, the others stop themselves (SIGSTOP: a rank no signal but SIGKILL ends).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType

import numpy as np

from anekit.training.distributed.open import open_transport


def main() -> int:
    args = sys.argv[3:]  # after "-m anekit.cli.main"
    engine = args[args.index("--distributed") + 1]
    case = os.environ["LAUNCH_CASE"]
    if case == "echo":
        t = open_transport(engine, 20)
        print(f"rank {t.rank} argv {' '.join(args)}", flush=True)
        t.close()
        return 0
    if case == "restart":
        t = open_transport(engine, 20)
        resumed = "--resume" in args
        if resumed and t.rank == 0:
            print("resumed", flush=True)
        t.close()
        return 0 if resumed else 75
    if case == "fail":
        t = open_transport(engine, 20)
        t.barrier("start")
        if t.rank == 1:
            print("rank 1 fails", flush=True)
            os._exit(3)
        os.kill(os.getpid(), signal.SIGSTOP)
        return 0
    return steps(engine)


def steps(engine: str) -> int:
    got: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        got.append(signum)

    for s in (signal.SIGUSR1, signal.SIGINT, signal.SIGTERM):
        signal.signal(s, stop)
    t = open_transport(engine, 20)
    step = 0
    seconds = float(os.environ.get("STEP_SECONDS", "0.2"))
    while step < 500:
        time.sleep(seconds)
        step += 1
        if t.rank == 0:
            print(f"step {step}", flush=True)
        if t.all_sum(np.array([1 if got else 0]), f"stop requests before step {step + 1}")[0]:
            break
    if t.rank == 0:
        print(f"saved after step {step}", flush=True)
    # No rank leaves before rank 0 has saved: the launchers end every rank when one exits non-zero.
    t.barrier(f"the checkpoint of step {step}")
    code = 128 + (got[0] if got else signal.SIGUSR1)  # a rank told by the others stops as they do
    print(f"rank {t.rank} exits {code}", flush=True)
    t.close()
    os._exit(code)  # as anekit's command line ends


if __name__ == "__main__":
    sys.exit(main())
