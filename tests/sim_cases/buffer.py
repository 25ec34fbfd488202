"""Simulator cases for the tensor-buffer ops."""

from __future__ import annotations

import numpy as np

from tests.sim_cases import SimCase, rng

_x = rng("buffer").standard_normal((1, 4, 2, 3))

CASES = [
    SimCase(
        "tensor_to_tensor_buffer",
        {"input": _x},
        lambda input, **_: input,
        params={
            "strides": np.array([24, 6, 3, 1], dtype=np.int64),
            "interleave_factors": np.ones(4, np.uint8),
        },
    ),
]
