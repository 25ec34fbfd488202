"""LoRA fine-tuning with the training kernels: the base weights frozen, low-rank adapters trained.

The engine runs the forward and the activation gradients exactly as in full training, with the merged
weights W = W0 + scale * B A of each adapted matrix (``MergedParams``: dynamic-weight kernels take them
as inputs, so nothing is recompiled when the adapters move; baked kernels are compiled with them once
per optimizer step). The host turns each matrix's (dy, x) pair, which full training would contract
into dW = dy x^T, straight into the adapters' gradients (``LoraGradients``):

    dB = scale * dy (A x)^T        (out, r)
    dA = scale * (B^T dy) x^T      (r, in)

so no frozen weight's gradient (nor the classifier's (vocab x dim) one) is ever formed. The adapters take
Adam steps (``LoraTrainable``; weight decay 0 by default, as LoRA runs usually have).

Memory: the frozen matrices are kept as float16 (what the engine's kernels read anyway: a weight input
is rounded to fp16 on its surface), the embedding and norm scales float32 (the CPU head's sgemm), and
merged weights exist for one layer at a time per thread (recomputed as the kernels walk the layers:
twice per sequence, once forward, once backward), so a model costs about 2 bytes per frozen parameter plus the
adapters' 16 bytes (weights, gradients, two moments) per trained one.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from anekit.hf.adapters import Adapters
from anekit.llama import cpu_ops
from anekit.llama.params import LayerParams, Params
from anekit.llama.step import Gradients, unscale

if TYPE_CHECKING:
    from anekit.llama.trainer import TrainConfig, TrainState

MATRICES = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


def frozen_base(params: Params) -> Params:
    """The frozen base of a LoRA run: every matrix of the layers as float16 (the embedding, the
    classifier and the 1-D scales and biases stay float32)."""
    layers = []
    for lp in params.layers:
        d = lp.as_dict()
        frozen = {k: (np.asarray(v, np.float16) if k in MATRICES else v) for k, v in d.items()}
        layers.append(LayerParams(**frozen))
    return Params(params.cfg, params.embed, layers, params.rms_final, params.wcls)


class MergedParams(Params):
    """The weights the kernels see: ``base`` with scale * B A added to each adapted matrix, merged for one
    layer at a time when a kernel asks (``kernel_weights``); ``refresh`` after the adapters change."""

    def __init__(self, base: Params, adapters: Adapters) -> None:
        super().__init__(base.cfg, base.embed, base.layers, base.rms_final, base.wcls)
        self.base = base
        self.adapters = adapters
        self._version = 0  # bumped by refresh: every thread's merged layer is then stale
        self._local = threading.local()  # each worker thread merges the layer it is at

    def refresh(self) -> None:
        """Forget the merged layers: the adapters changed."""
        self._version += 1

    def merged(self, layer: int, name: str) -> np.ndarray:
        """W0 + scale * B A of one matrix (float32), or W0 when it has no adapter."""
        w0 = getattr(self.base.layers[layer], name)
        if (layer, name) not in self.adapters.a:
            return np.asarray(w0, np.float32)
        return w0.astype(np.float32) + self.adapters.delta(layer, name)  # (out, in)

    def kernel_weights(self, layer: int) -> dict[str, np.ndarray]:
        cached = getattr(self._local, "merged", None)  # (version, layer, weights) of this thread
        if cached is None or cached[:2] != (self._version, layer):
            w = self.base.layers[layer].as_dict()
            for name in MATRICES:
                w[name] = self.merged(layer, name)
            w["embed"] = self.base.classifier
            w["rms_final"] = self.base.rms_final
            cached = self._local.merged = (self._version, layer, w)
        return cached[2]


class LoraGradients(Gradients):
    """The adapters' gradients from each adapted matrix's (dy, x); everything frozen is skipped."""

    def __init__(self, adapters: Adapters, accumulate: bool = True) -> None:
        self.adapters = adapters
        self.accumulate = accumulate  # False: a worker's buffer of one sequence (``Gradients``)
        self.da = {k: np.zeros_like(a) for k, a in adapters.a.items()}  # (r, in) each
        self.db = {k: np.zeros_like(b) for k, b in adapters.b.items()}  # (out, r) each

    def matrix(self, layer: int, key: str, dy: np.ndarray, x: np.ndarray) -> None:
        k = (layer, key)
        if k not in self.da:
            return
        a, b = self.adapters.a[k], self.adapters.b[k]
        s = np.float32(self.adapters.spec.scale)
        ax = a @ x  # (r, T)
        db = s * (dy @ ax.T)  # (out, r)
        da = s * ((b.T @ dy) @ x.T)  # (r, in)
        if self.accumulate:
            self.db[k] += db
            self.da[k] += da
        else:
            self.db[k][...] = db
            self.da[k][...] = da

    def add_to(self, total: LoraGradients) -> None:
        """A worker's sequence gradient added to the batch's total (``Gradients.add_to``)."""
        for k in self.da:
            total.da[k] += self.da[k]
            total.db[k] += self.db[k]

    def vector(self, layer: int | None, key: str, g: np.ndarray) -> None:
        return None  # norm scales and biases are frozen

    def classifier(self, params: Params, dlogits: np.ndarray, xf: np.ndarray) -> None:
        return None  # the classifier (or tied embedding) is frozen: its (vocab x dim) gradient is not formed

    def embedding(self, dx: np.ndarray, tokens: np.ndarray) -> None:
        return None

    def tensors(self) -> list[tuple[str, np.ndarray]]:
        """Every gradient with the name of its adapter tensor (``adapter_names``' order)."""
        return [(name, table[k]) for name, table, k in _named(self.da, self.db)]

    def zero(self) -> None:
        for _, g in self.tensors():
            g.fill(0.0)


def _named(a: dict, b: dict) -> list[tuple[str, dict, tuple[int, str]]]:
    """(name, table, key) of every A then B factor, layer by layer: "a.{layer}.{field}" / "b...."."""
    keys = sorted(a, key=lambda k: (k[0], MATRICES.index(k[1])))
    return [(f"a.{k[0]}.{k[1]}", a, k) for k in keys] + [(f"b.{k[0]}.{k[1]}", b, k) for k in keys]


def adapter_tensors(adapters: Adapters) -> list[tuple[str, np.ndarray]]:
    """Every adapter factor by name ("a.{layer}.{field}", "b.{layer}.{field}"), in a fixed order."""
    return [(name, table[k]) for name, table, k in _named(adapters.a, adapters.b)]


class LoraTrainable:
    """What the training loop trains in a LoRA run: the adapters, with their Adam moments."""

    def __init__(self, base: Params, adapters: Adapters, moments: tuple[dict, dict] | None = None) -> None:
        self.adapters = adapters
        self.params = MergedParams(base, adapters)
        self.grads = LoraGradients(adapters)
        if moments is None:
            zeros = [(n, np.zeros_like(a)) for n, a in adapter_tensors(adapters)]
            moments = (dict(zeros), {n: np.zeros_like(a) for n, a in zeros})
        self.adam_m, self.adam_v = moments  # name -> (first, second) moment of each factor

    def zero(self) -> None:
        self.grads.zero()

    def sink(self, kernels: object) -> Gradients:
        return self.grads

    def worker_sink(self, kernels: object) -> LoraGradients:
        """A worker thread's buffer of one sequence's adapter gradients."""
        return LoraGradients(self.adapters, accumulate=False)

    def add(self, sink: LoraGradients) -> None:
        sink.add_to(self.grads)

    def unscale(self, factor: float) -> bool:
        ok = True
        for _, g in self.grads.tensors():
            g *= np.float32(factor)
            ok = ok and bool(np.isfinite(g).all())
        return ok

    def apply(self, state: TrainState, tc: TrainConfig, threads: int = 1) -> None:
        """Clip the adapters' global gradient norm, take one Adam(W) step, and merge anew (the adapters
        are small: one thread)."""
        grads = self.grads.tensors()
        scale = cpu_ops.clip_scale(cpu_ops.grad_norm([g for _, g in grads]), tc.grad_clip)
        state.adam_t += 1
        lr = tc.lr_at(state.step)
        weights = dict(adapter_tensors(self.adapters))
        for name, g in grads:
            cpu_ops.adamw_update(
                weights[name], g, self.adam_m[name], self.adam_v[name], state.adam_t, lr, tc.beta1, tc.beta2,
                1e-8, tc.weight_decay, apply_decay=True, grad_scale=scale,
            )  # fmt: skip
        self.params.refresh()


class FullTrainable:
    """What the training loop trains in a full run: every weight, with Adam moments in the state."""

    def __init__(self, state: TrainState) -> None:
        self.state = state
        self.params = state.params
        self.grads = state.params.zeros_like()
        self._fresh = False  # the total's contents are stale: the batch's first gradient is written over them

    def zero(self) -> None:
        """A new batch: its first sequence's gradients are written into the total, not added (``Gradients``'
        ``fresh``), so nothing is zeroed here."""
        self._fresh = True

    def sink(self, kernels: object) -> Gradients:
        fresh, self._fresh = self._fresh, False
        return Gradients(self.grads, kernels, fresh=fresh)  # type: ignore[arg-type]

    def worker_sink(self, kernels: object) -> Gradients:
        """A worker thread's buffer of one sequence's gradients (``Gradients``, accumulate False)."""
        return Gradients(self.params.zeros_like(), kernels, accumulate=False)  # type: ignore[arg-type]

    def add(self, sink: Gradients) -> None:
        fresh, self._fresh = self._fresh, False
        sink.add_to(self.grads, overwrite=fresh)

    def unscale(self, factor: float) -> bool:
        return unscale(self.grads, factor)

    def apply(self, state: TrainState, tc: TrainConfig, threads: int = 1) -> None:
        from anekit.llama.trainer import apply_adamw

        apply_adamw(state, self.grads, tc, threads)
