"""Data parallelism across processes: the ranks of one run, each on its own engine (or simulator), over a
transport (MPI through mpi4py, ``mlx.distributed``, or the one-process ``LocalTransport``).

Micro-batch i of step t runs on the rank that owns i's block (contiguous blocks of the global batch), and a
step's gradients are summed in the order one process sums them (``anekit.training.distributed.order``), so
N ranks x accumulation k give the bits of one rank x accumulation N * k.
"""
