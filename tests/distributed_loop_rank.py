"""One rank of a training run over a real transport, for the tests:
``python -m tests.distributed_loop_rank ENGINE MODE ACCUM [CONFIG STEPS]``.

MODE is ``full`` (every weight, the default preset's tiny shapes unless CONFIG names a preset) or ``lora``.
ACCUM is the global batch. Each rank trains with the loop (``train(transport=...)``, BLAS fixed to one
thread a sequence) and prints one JSON line: its rank, the sha256 of everything the run's bits decide
(weights or adapters, both Adam moments, losses, loss scale, counters) and its phase seconds. The tests
compute the same digest from one process with no transport (``train_tiny``).
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import numpy as np

from anekit import runtime
from anekit.kernels.config import ModelConfig
from anekit.llama.params import Params
from anekit.training.loop import TrainConfig, TrainState, train

TINY = ModelConfig(64, 176, 2, 4, 2, 512, 64, name="tiny")


class Windows:
    """Random windows of the first 40 token ids (repeats included)."""

    def batch(self, rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        w = rng.integers(0, 40, seq_len + 1)
        return w[:-1], w[1:]


def _hash(h: Any, arrays: list[np.ndarray]) -> None:
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())


def train_tiny(
    mode: str, accum: int, transport: Any = None, config: str = "", steps: int = 3
) -> tuple[str, dict]:
    """(digest, phase seconds) of a run of ``steps`` steps of global batch ``accum``."""
    from anekit.models.config import preset

    cfg = preset(config) if config else TINY
    h = hashlib.sha256()
    if mode == "lora":
        from anekit.training.lora import Adapters, LoraSpec, LoraTrainable, frozen_base

        base = frozen_base(Params.init(cfg, seed=1))
        adapters = Adapters.init(LoraSpec(4, 8.0, ("q", "v", "down")), cfg, np.random.default_rng(2))
        trainable = LoraTrainable(base, adapters)
        state = TrainState(base, None, None)
        tc = TrainConfig(steps=steps, accum=accum, lr=1e-2, weights="dynamic", weight_decay=0.0)
        train(
            runtime.open("sim"),
            state,
            Windows(),
            tc,
            trainable=trainable,
            transport=transport,
            blas_threads=1,
        )
        _hash(h, [a for k in sorted(adapters.a) for a in (adapters.a[k], adapters.b[k])])
        _hash(h, [trainable.adam_m[n] for n in sorted(trainable.adam_m)])
        _hash(h, [trainable.adam_v[n] for n in sorted(trainable.adam_v)])
    else:
        state = TrainState.fresh(Params.init(cfg, seed=3, tied=True), TrainConfig())
        tc = TrainConfig(steps=steps, accum=accum, lr=3e-3, weights="dynamic")
        train(runtime.open("sim"), state, Windows(), tc, transport=transport, blas_threads=1)
        for part in (state.params, state.adam_m, state.adam_v):
            assert part is not None
            _hash(h, [a for _, a in part.tensors()])
    h.update(json.dumps([state.losses, state.loss_scale, state.step, state.adam_t]).encode())
    return h.hexdigest(), dict(state.seconds)


def main(argv: list[str]) -> int:
    from anekit.training.distributed.open import open_transport

    engine, mode, accum = argv[0], argv[1], int(argv[2])
    config = argv[3] if len(argv) > 3 else ""
    steps = int(argv[4]) if len(argv) > 4 else 3
    transport = open_transport(engine, timeout=20.0)
    try:
        digest, seconds = train_tiny(mode, accum, transport, config, steps)
        print(json.dumps({"rank": transport.rank, "digest": digest, "seconds": seconds}), flush=True)
    finally:
        transport.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
