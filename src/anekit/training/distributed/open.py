"""``open_transport``: the transport a run's ``--distributed`` names (``mpi``, ``mlx``, or none: one process).

The engines load here, lazily: importing anekit never needs mpi4py or mlx.
"""

from __future__ import annotations

from anekit.training.distributed.transport import DEFAULT_TIMEOUT, DistributedError, LocalTransport, Transport

KINDS = ("mpi", "mlx", "local")


def open_transport(kind: str | None, timeout: float = DEFAULT_TIMEOUT) -> Transport:
    """The transport of this rank: ``"mpi"`` (started by ``mpiexec``), ``"mlx"`` (started by ``mlx.launch``),
    ``None`` or ``"local"`` (one process). Waits at every exchange at most ``timeout`` seconds."""
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise DistributedError(
            f"[distributed] --peer-timeout: expected a number of seconds > 0, got {timeout!r}"
        )
    if kind is None or kind == "local":
        local = LocalTransport()
        local.timeout = float(timeout)
        return local
    if kind == "mpi":
        from anekit.training.distributed.mpi import MpiTransport

        return MpiTransport(timeout)
    if kind == "mlx":
        from anekit.training.distributed.mlx_ring import MlxTransport

        return MlxTransport(timeout)
    raise DistributedError(
        f"[distributed] --distributed: unknown transport {kind!r} (expected one of mpi, mlx)"
    )
