"""How the ranks of a run start together: rank 0 prepares, the others follow, every rank checks the same run.

Rank 0 alone reads the output directory (a new run's options, or the stored run to resume), so a resume
works when OUT exists on rank 0's machine only. The start is four exchanges, each a rank's one line when it
fails, the same outcome on every rank:

1. ``announce`` / ``receive``: rank 0's description of the run (its source's kind and what a rank needs to
   read the same run from its own inputs: the model, the training config, the data's and the tokenizer's
   paths, the state's counters), or the line that refused it;
2. ``all_ready``: every rank's outcome of reading its own inputs (one that failed is named by rank 0);
3. ``agree`` on the run's fingerprint (``fingerprint``: model and training configs, data and tokenizer
   sha256, anekit's version, the backend, what is trained, the world size, the wire dtype);
4. ``share_state``: rank 0's weights and moments (``RunSource.state_arrays``) and counters into every rank.

A rank that stops because another refused raises ``StartRefused``: the refusing rank said why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from anekit.training.distributed.transport import DistributedError, Transport

if TYPE_CHECKING:
    from anekit.training.state import TrainState

MICRO_ORDER = "global index blocks"  # rank r of N runs the global micro-batches [r*k, (r+1)*k), k = accum/N


class StartRefused(DistributedError):
    """This rank does not start because another rank refused the run (that rank printed why)."""


def _payload(kind: str, body: Any) -> bytes:
    return json.dumps({kind: body}, sort_keys=True).encode()


def announce(transport: Transport, description: Mapping[str, Any] | None, refusal: str | None) -> None:
    """Rank 0: the run's description (or the line that refused it) to every rank."""
    body = _payload("refused", refusal) if refusal is not None else _payload("run", dict(description or {}))
    transport.all_gather_bytes(body, "the run's description")


def receive(transport: Transport) -> dict[str, Any]:
    """Ranks > 0: rank 0's description of the run; StartRefused when rank 0 refused it."""
    got = json.loads(transport.all_gather_bytes(b"", "the run's description")[0])
    if "refused" in got:
        raise StartRefused(f"[train] rank 0 refused the run: {got['refused']}")
    description: dict[str, Any] = got["run"]
    return description


def all_ready(transport: Transport, error: BaseException | None, what: str) -> None:
    """Every rank's outcome of ``what``; when one failed, every rank raises: rank 0 with that rank's line
    (the first failed), the others ``StartRefused``. ``error`` is this rank's own failure, or None."""
    line = b"" if error is None else str(error).encode()
    outcomes = transport.all_gather_bytes(line, what)
    failed = [(r, o.decode()) for r, o in enumerate(outcomes) if o]
    if not failed:
        return
    rank, reason = failed[0]
    if transport.rank == 0 and error is not None and rank == 0:
        raise error
    if transport.rank == 0:
        raise DistributedError(f"[train] rank {rank} cannot start the run: {reason}")
    if error is not None and not isinstance(error, StartRefused):
        raise StartRefused(f"[train] this rank cannot start the run: {error}") from error
    raise StartRefused(f"[train] rank {rank} cannot start the run: {reason}")


def fingerprint(
    cfg: Any, tc: Any, identity: Mapping[str, str], backend: str, size: int, wire: str, blas: int | None
) -> dict[str, str]:
    """What must be the same on every rank before a step, as strings (``agree`` compares them by field):
    the model and training configs, the source's identities (data, tokenizer, base model, what is
    trained), anekit's version, the backend, the world size, the wire dtype and the BLAS threads a
    sequence runs on."""
    from anekit import __version__

    fields = {
        "model config": json.dumps(asdict(cfg), sort_keys=True),
        "training config": json.dumps(asdict(tc), sort_keys=True),
    }
    fields.update(identity)
    fields.update({"anekit version": __version__, "backend": backend, "world size": str(size), "wire": wire,
                   "blas threads per sequence": str(blas)})  # fmt: skip
    return fields


def state_counters(state: TrainState) -> dict[str, Any]:
    """The state's counters and histories, as JSON (floats round-trip exactly)."""
    return {
        "step": state.step,
        "adam_t": state.adam_t,
        "loss_scale": state.loss_scale,
        "losses": state.losses,
        "seconds": state.seconds,
        "val_losses": {str(k): v for k, v in state.val_losses.items()},
    }


def adopt_counters(state: TrainState, counters: Mapping[str, Any]) -> None:
    """Rank 0's counters (``state_counters``) into this rank's state."""
    state.step, state.adam_t = int(counters["step"]), int(counters["adam_t"])
    state.loss_scale = float(counters["loss_scale"])
    state.losses = [float(x) for x in counters["losses"]]
    state.seconds = {str(k): float(v) for k, v in counters["seconds"].items()}
    state.val_losses = {int(k): float(v) for k, v in counters["val_losses"].items()}


def share_state(transport: Transport, arrays: Sequence[np.ndarray]) -> None:
    """Rank 0's state tensors into every rank's, in place, bit for bit (never through a lossy wire: the
    caller passes the plain transport). Shapes and dtypes were agreed by the fingerprint."""
    for a in arrays:
        if not a.flags.c_contiguous:
            raise DistributedError("[train] a state tensor is not contiguous: it cannot be received in place")
    transport.broadcast(list(arrays), 0, "the run's state")
