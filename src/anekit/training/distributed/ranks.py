"""One rank's part in each step of a data-parallel run: its block of the batch, the exchanges, the agreement.

Between two steps every rank says whether it was asked to stop and whether its compile budget is short, and
an ``all_sum`` of those flags makes one decision for all (any rank asked: every rank stops after the same
step). In a step, rank 0 folds its block into the total as one process does, a later rank keeps one buffer
per sequence (``Accumulator.run_kept``); the losses and overflow flags of every micro-batch are gathered so
every rank has the same list, in global micro order; then the gradients go round the chain
(``anekit.training.distributed.order.ordered_sum``). Every exchange names the step in what it waits for.

The timer's "comm" phase is the time in these exchanges, waiting for a slower rank included.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from anekit.llama.step import StepResult, Timer
from anekit.training.accumulate import Accumulator
from anekit.training.distributed.order import local_micro, ordered_sum
from anekit.training.distributed.transport import DistributedError, Transport

RECORD = struct.Struct("<d?d")  # one micro-batch's loss, finiteness, peak |gradient|: exact round trips


class Ranks:
    """This rank of ``transport`` in a run whose global batch is ``accum`` sequences."""

    def __init__(self, transport: Transport, accum: int, trainable: Any) -> None:
        self.transport = transport
        self.micro = local_micro(transport.rank, transport.size, accum)
        chained = hasattr(trainable, "gradient_tensors") and hasattr(trainable, "add_tensor")
        if transport.size > 1 and not chained:
            raise DistributedError(
                f"[distributed] {type(trainable).__name__} cannot be summed across ranks: it has no "
                "gradient_tensors() / add_tensor()"
            )
        self.trainable = trainable

    def agree(self, stop: bool, short: bool, step: int) -> tuple[bool, bool]:
        """(any rank asked to stop, any rank's compile budget short) before ``step``, on every rank."""
        flags = np.array([int(stop), int(short)], np.int64)
        total = self.transport.all_sum(flags, f"stop requests before step {step}")
        return bool(total[0] > 0), bool(total[1] > 0)

    def step(
        self,
        workers: Accumulator,
        batch: Callable[[int], tuple[np.ndarray, ...]],
        loss_scale: float,
        timer: Timer,
        step: int,
    ) -> list[StepResult]:
        """Run this rank's block, then exchange: every micro-batch's result in global order, and the summed
        gradient in the trainable's total (not summed when a loss is not finite: the run stops there)."""
        if self.transport.rank == 0:
            self.trainable.zero()
            results = workers.run(self.trainable, batch, self.micro, loss_scale, timer)
            sinks: list[Any] = []
        else:
            results, sinks = workers.run_kept(self.trainable, batch, self.micro, loss_scale, timer)
        with timer.phase("comm"):
            everyone = self.gather(results, step)
            if all(math.isfinite(r.loss) for r in everyone):
                ordered_sum(self.transport, self.trainable, sinks, f"gradients of step {step}")
        return everyone

    def gather(self, results: list[StepResult], step: int) -> list[StepResult]:
        """Every rank's results, concatenated in rank order (= global micro order)."""
        data = b"".join(RECORD.pack(r.loss, r.finite, r.peak) for r in results)
        parts = self.transport.all_gather_bytes(data, f"losses of step {step}")
        size = len(self.micro) * RECORD.size
        everyone = []
        for rank, part in enumerate(parts):
            if len(part) != size:
                raise DistributedError(
                    f"[distributed] rank {rank} sent {len(part)} bytes of results for step {step}, "
                    f"expected {size} ({len(self.micro)} micro-batches)"
                )
            everyone += [StepResult(*RECORD.unpack_from(part, k)) for k in range(0, size, RECORD.size)]
        return everyone
