"""AdamW over every tensor of a model, its global gradient norm clipped (llama2.c's rules)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from anekit.llama import cpu_ops
from anekit.llama.params import Params
from anekit.threads import cores
from anekit.training.state import TrainConfig, TrainState

ADAM_CHUNK = 1 << 20  # elements an optimizer worker updates at a time


def update_threads(workers: int, parameters: int) -> int:
    """The threads an optimizer step runs on: every core the process may use once the model holds at
    least 4 chunks (``ADAM_CHUNK``) of parameters, at most one thread a chunk, and never fewer than the
    step's ``workers``. The update and the surface writes beside it are memory passes that a second
    core speeds up even when the step's sequences ran on one thread: measured on 2 cores (AdamW with its
    fp16 writes into the dynamic kernels' surfaces, medians of 15 interleaved calls), stories110M 341 ms
    on one thread and 214 ms on two, stories15M 38.6 ms and 35.5 ms. Below 4 chunks, starting threads
    costs more than they save. The bits are the same on any number (``apply_adamw``)."""
    if parameters < 4 * ADAM_CHUNK:
        return max(1, workers)
    return max(1, workers, min(cores(), parameters // ADAM_CHUNK))


# Called with each tensor's name and new value once the step has updated it (``Params.tensors`` names).
WeightWriter = Callable[[str, np.ndarray], None]


def apply_adamw(
    state: TrainState, grads: Params, tc: TrainConfig, threads: int = 1, write: WeightWriter | None = None
) -> None:
    """Clip the global gradient norm and take one AdamW step on every tensor.

    ``write(name, value)`` is called for each tensor as soon as it is updated (while it is still in the
    cache): the dynamic kernels write it into the surfaces that hold it (``DynamicKernels.write_weight``),
    so no pass over the weights is needed before the next step.

    The clip's scale is applied by the AdamW pass itself (``grad_scale``: the same float32 product, one
    pass over the gradients less); the gradients are left clipped, as ``clip_grad_norm`` leaves them.
    With ``threads`` > 1 the tensors are updated in chunks of ``ADAM_CHUNK`` elements on that many
    threads (the update is elementwise, and the compiled pass releases the GIL: the same bits).
    """
    tensors = list(grads.tensors())
    scale = cpu_ops.clip_scale(cpu_ops.grad_norm([g for _, g in tensors]), tc.grad_clip)
    state.adam_t += 1
    lr = tc.lr_at(state.step)
    assert state.adam_m is not None and state.adam_v is not None
    weights = dict(state.params.tensors())
    ms, vs = dict(state.adam_m.tensors()), dict(state.adam_v.tensors())
    work: list[tuple[list[np.ndarray], bool]] = []
    whole: list[tuple[str, np.ndarray, range]] = []  # (name, the tensor's work items) for ``write``
    for name, g in tensors:
        w = weights[name]
        decay = cpu_ops.takes_weight_decay(w)  # matrices only: never the RMSNorm scales (llama2.c's rule)
        parts = (w, g, ms[name], vs[name])
        first = len(work)
        if threads > 1 and w.size > ADAM_CHUNK and all(a.flags.c_contiguous for a in parts):
            flats = [a.reshape(-1) for a in parts]
            for i in range(0, w.size, ADAM_CHUNK):
                work.append(([f[i : i + ADAM_CHUNK] for f in flats], decay))
        else:
            work.append((list(parts), decay))
        whole.append((name, w, range(first, len(work))))

    def update(item: tuple[list[np.ndarray], bool]) -> None:
        (w, g, m, v), decay = item
        cpu_ops.adamw_update(
            w, g, m, v, state.adam_t, lr, tc.beta1, tc.beta2, 1e-8, tc.weight_decay,
            apply_decay=decay, grad_scale=float(scale),
        )  # fmt: skip

    if threads > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:
            if write is None:
                list(pool.map(update, work))
                return

            def tensor(entry: tuple[str, np.ndarray, range]) -> None:  # its chunks, then its write
                name, w, items = entry
                for i in items:
                    update(work[i])
                write(name, w)

            list(pool.map(tensor, whole))
    else:
        for name, w, items in whole:
            for i in items:
                update(work[i])
            if write is not None:
                write(name, w)
