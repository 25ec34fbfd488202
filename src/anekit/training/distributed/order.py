"""Which rank runs which micro-batches, and the step's gradient summed across ranks in one fixed order.

Rank r of N runs the contiguous block [r k, (r + 1) k) of a step's global micro-batch indices, k = accum / N
(``local_micro``). One process sums a step's gradients as the left fold g_0 + g_1 + ... + g_{M-1}
(``anekit.training.accumulate``); across ranks that fold is a chain (``ordered_sum``): rank 0 folds its block
into the total as one process does, rank r > 0 keeps each of its sequences' gradients in a buffer of its
own, receives the partial total from rank r - 1 into its total, adds its buffers in micro order with the
trainable's own addition, and sends the result on to rank r + 1; the last rank then broadcasts the sum.
Every rank therefore holds the very bits one process would have summed, whatever the world size, and an
all-reduce (whose order the transport picks) never touches a gradient.

The chain is pipelined per bucket: a bucket is a run of the trainable's gradient tensors in their fixed
order (``buckets_of``: consecutive tensors up to ``BUCKET_BYTES`` together), so rank r adds and forwards
bucket j while rank r - 1 is already sending bucket j + 1. Every addition is elementwise, so how tensors
are grouped into messages changes the speed only, never a bit.

Memory: a rank past the first holds one gradient buffer per local sequence (k of them, each the size of
the trainable's gradients) until the partial total arrives; rank 0 holds only the total.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from anekit.training.distributed.transport import DistributedError, Transport

# The bytes of one message of the chain: small tensors (norm scales, LoRA factors) travel together, since
# every message costs a round of the transport's polling; a large one goes alone.
BUCKET_BYTES = 4 << 20


class Chained(Protocol):
    """What the chain asks of a trainable: its total's gradient tensors (the same list, in the
    same order, on every rank) and the addition of one tensor of a worker's buffer onto the total's."""

    def gradient_tensors(self) -> list[np.ndarray]: ...

    def add_tensor(self, sink: Any, index: int) -> None: ...


def local_micro(rank: int, size: int, accum: int) -> range:
    """The global micro-batch indices rank ``rank`` of ``size`` runs in a step of ``accum`` sequences: the
    contiguous block [rank k, (rank + 1) k), k = accum / size; one line refusing what does not split."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise DistributedError(f"[distributed] the world size must be a positive integer, got {size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise DistributedError(f"[distributed] rank {rank!r} is not one of the {size} ranks 0..{size - 1}")
    if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
        raise DistributedError(f"[distributed] the global batch must be a positive integer, got {accum!r}")
    if accum % size:
        raise DistributedError(
            f"[distributed] a global batch of {accum} sequences does not split over {size} ranks: "
            f"it must be a multiple of the world size"
        )
    k = accum // size
    return range(rank * k, (rank + 1) * k)


def buckets_of(arrays: Sequence[np.ndarray], limit: int = BUCKET_BYTES) -> list[list[int]]:
    """The indices of ``arrays`` cut into runs of consecutive tensors of at most ``limit`` bytes together
    (a tensor larger than that alone): each run is one message."""
    runs: list[list[int]] = []
    size = 0
    for index, a in enumerate(arrays):
        if runs and size + a.nbytes <= limit:
            runs[-1].append(index)
            size += a.nbytes
        else:
            runs.append([index])
            size = a.nbytes
    return runs


def ordered_sum(
    transport: Transport, trainable: Chained, sinks: Sequence[Any], what: str, limit: int = BUCKET_BYTES
) -> None:
    """The step's gradient, summed in micro order across the ranks, into every rank's ``trainable`` total.

    On rank 0 the total already holds its block's partial sum (``sinks`` is empty); on rank r > 0, ``sinks``
    are its sequences' buffers in micro order and the total's contents are overwritten by what rank r - 1
    sends. ``what`` names the exchange in a timeout's message ("gradients of step 7"); ``limit`` is the
    bytes of one message (``buckets_of``)."""
    rank, size = transport.rank, transport.size
    if size == 1:
        return
    if rank == 0 and sinks:
        raise DistributedError("[distributed] rank 0 folds its sequences into its total itself: no buffers")
    totals = trainable.gradient_tensors()
    for run in buckets_of(totals, limit):
        arrays = [totals[index] for index in run]
        if rank > 0:
            transport.recv(arrays, rank - 1, what)
            for index in run:
                for sink in sinks:
                    trainable.add_tensor(sink, index)
        if rank < size - 1:
            transport.send(arrays, rank + 1, what)
    transport.broadcast(totals, size - 1, what)
