"""The small interface the ranks of a run talk through, and the one-process transport.

A transport moves numpy arrays between ranks, in place and in the order asked: ``send`` / ``recv`` (the
fixed-order sum is a chain from rank 0 to the last, so it needs point-to-point messages, not an
all-reduce whose order the transport chooses), ``broadcast``, ``all_gather_bytes`` (small records: losses,
fingerprints, stop requests), ``barrier``. Every call that waits names what it waits for (``what``) and
gives up after ``timeout`` seconds with ``PeerLost``, naming the rank it waited on; ``abort`` ends every
rank of the run (the launcher's job) after printing one line. ``all_sum`` exists for what the transport's
own order cannot change (integers, flags); gradients never go through it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol

import numpy as np

from anekit.errors import AnekitError

DEFAULT_TIMEOUT = 60.0  # seconds a rank waits at an exchange beyond its own work before it gives up


class DistributedError(AnekitError):
    """A distributed run cannot start or go on (a transport missing, ranks that disagree)."""


class PeerLost(DistributedError):
    """A rank did not answer within the timeout, died or lost its link."""

    def __init__(self, rank: int, what: str, message: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.what = what


class Transport(Protocol):
    """What the training loop asks of the ranks' transport."""

    name: str  # "mpi", "mlx" or "local"
    rank: int
    size: int
    local_size: int  # ranks on this host (they share its cores)
    timeout: float

    def send(self, arrays: Sequence[np.ndarray], dst: int, what: str) -> None: ...

    def recv(self, arrays: Sequence[np.ndarray], src: int, what: str) -> None:
        """Into ``arrays`` (contiguous, the sender's shapes and dtypes), in place."""
        ...

    def broadcast(self, arrays: Sequence[np.ndarray], root: int, what: str) -> None:
        """``root``'s arrays into every other rank's, in place."""
        ...

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        """Every rank's ``data``, in rank order, on every rank."""
        ...

    def all_sum(self, array: np.ndarray, what: str) -> np.ndarray:
        """The element-wise sum over ranks in the transport's order: for integers and flags only."""
        ...

    def barrier(self, what: str) -> None: ...

    def abort(self, line: str, code: int = 1) -> NoReturn:
        """Print ``line`` on stderr and end every rank of the run with ``code``."""
        ...

    def close(self) -> None: ...


def sum_over_ranks(
    array: np.ndarray, gather: Callable[[bytes], list[bytes]], rank: int, what: str
) -> np.ndarray:
    """``all_sum`` over a transport that gathers bytes: every rank's integers or flags, added in rank order
    (a gradient is refused: gradients are summed in the run's fixed order, through send / recv)."""
    a = np.ascontiguousarray(array)
    if a.dtype.kind not in "biu":
        raise DistributedError(
            f"[distributed] {what}: all_sum takes integers or flags, not {a.dtype} (gradients are summed "
            "in the run's fixed order, through send / recv)"
        )
    total = np.zeros(a.shape, dtype=a.dtype)
    for r, rec in enumerate(gather(a.tobytes())):
        if len(rec) != a.nbytes:
            raise DistributedError(
                f"[distributed] {what}: rank {r} summed {len(rec)} bytes, rank {rank} {a.nbytes}"
            )
        total += np.frombuffer(rec, dtype=a.dtype).reshape(a.shape)
    return total


class LocalTransport:
    """One process, one rank: every exchange is a no-op (what ``anekit train`` uses without
    ``--distributed``)."""

    name = "local"
    rank = 0
    size = 1
    local_size = 1
    timeout = DEFAULT_TIMEOUT

    def send(self, arrays: Sequence[np.ndarray], dst: int, what: str) -> None:
        raise DistributedError(f"[distributed] {what}: a one-rank run has no rank {dst} to send to")

    def recv(self, arrays: Sequence[np.ndarray], src: int, what: str) -> None:
        raise DistributedError(f"[distributed] {what}: a one-rank run has no rank {src} to receive from")

    def broadcast(self, arrays: Sequence[np.ndarray], root: int, what: str) -> None:
        return None

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        return [data]

    def all_sum(self, array: np.ndarray, what: str) -> np.ndarray:
        return np.array(array, copy=True)

    def barrier(self, what: str) -> None:
        return None

    def abort(self, line: str, code: int = 1) -> NoReturn:
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(code)

    def close(self) -> None:
        return None
