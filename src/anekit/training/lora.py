"""LoRA: low-rank adapters on a model's linears, the base weights frozen, and their training.

The wrapper knows no file format: ``Adapters`` holds A and B of every adapted matrix by (layer, field of
``LayerParams``), in anekit's layout, and exposes them by name (``adapter_tensors``); reading and writing
PEFT's adapter directories is ``anekit.hf.adapters``' job (it imports this module, never the reverse).

What LoRA adds to a linear ``W`` (out, in), as huggingface/peft's ``LoraLayer`` does::

    y = W x + scale * B (A x)          A (r, in), B (out, r)
    scale = alpha / r                  (use_rslora: alpha / sqrt(r))
    init: A uniform(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_ with a = sqrt(5)); B zeros

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

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig
from anekit.llama import cpu_ops
from anekit.llama.params import LayerParams, Params, layer_shapes
from anekit.llama.step import Gradients
from anekit.training.state import TrainConfig, TrainState

# The matrices of a layer LoRA can adapt, by short name (the order adapters are kept in) -> the field of
# LayerParams it adapts. (``anekit.hf.adapters`` maps the short names to Hugging Face's module names.)
FIELDS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w1", "up": "w3", "down": "w2"}
TARGETS = tuple(FIELDS)


class AdapterError(AnekitError, ValueError):
    """A LoRA spec, adapter set or adapter directory that anekit cannot use: names the key or field."""


def parse_targets(text: str) -> tuple[str, ...]:
    """The targets named in ``text`` ("q,k,v,o"), in ``TARGETS`` order; an unknown or repeated name is one
    error naming it and listing the known ones."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise AdapterError(f"[lora] no targets given in {text!r}; known: {', '.join(TARGETS)}")
    return LoraSpec._checked_targets(names)


@dataclass(frozen=True)
class LoraSpec:
    """What a LoRA adapter set is: rank, alpha, which matrices of every layer it adapts, dropout.

    ``targets`` is kept in ``TARGETS`` order whatever order it was given in, so two specs of the same
    adapters compare equal."""

    rank: int  # r: A is (r, in), B (out, r)
    alpha: float  # lora_alpha
    targets: tuple[str, ...]  # keys of TARGETS
    dropout: float = 0.0  # lora_dropout: recorded for PEFT; anekit trains without dropout
    use_rslora: bool = False  # scale alpha / sqrt(r) (rank-stabilised LoRA) instead of alpha / r

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank <= 0:
            raise AdapterError(f"[lora] rank must be a positive integer, got {self.rank!r}")
        if not is_number(self.alpha) or not math.isfinite(self.alpha) or self.alpha <= 0:
            raise AdapterError(f"[lora] alpha must be a finite number > 0, got {self.alpha!r}")
        if not is_number(self.dropout) or not 0 <= self.dropout < 1:
            raise AdapterError(f"[lora] dropout must be a number with 0 <= p < 1, got {self.dropout!r}")
        if not isinstance(self.use_rslora, bool):
            raise AdapterError(f"[lora] use_rslora must be true or false, got {self.use_rslora!r}")
        if isinstance(self.targets, str) or not isinstance(self.targets, (tuple, list)):
            raise AdapterError(f"[lora] targets must be a tuple of names, got {self.targets!r}")
        object.__setattr__(self, "targets", self._checked_targets(list(self.targets)))
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "dropout", float(self.dropout))

    @staticmethod
    def _checked_targets(names: list[Any]) -> tuple[str, ...]:
        if not names:
            raise AdapterError(f"[lora] targets is empty; known: {', '.join(TARGETS)}")
        for name in names:
            if name not in TARGETS:
                raise AdapterError(f"[lora] unknown target {name!r}; known: {', '.join(TARGETS)}")
        for name in names:
            if names.count(name) > 1:
                raise AdapterError(f"[lora] target {name!r} is given more than once")
        return tuple(t for t in TARGETS if t in names)

    @property
    def scale(self) -> float:
        """What B A is multiplied by: alpha / r, or alpha / sqrt(r) with use_rslora."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def factor_shapes(spec: LoraSpec, cfg: ModelConfig, target: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """The shapes of A (r, in) and B (out, r) for ``target`` of ``cfg``."""
    out, inp = layer_shapes(cfg)[FIELDS[target]]
    return (spec.rank, inp), (out, spec.rank)


@dataclass
class Adapters:
    """LoRA factors of every adapted matrix, in anekit's layout (q / k rows interleaved per head).

    ``a[layer, field]`` is A (r, in), ``b[layer, field]`` is B (out, r), float32; ``field`` is
    LayerParams' name (``FIELDS``: wq, wk, wv, wo, w1, w3, w2)."""

    spec: LoraSpec
    n_layers: int
    a: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)
    b: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)

    @staticmethod
    def init(spec: LoraSpec, cfg: ModelConfig, rng: np.random.Generator) -> Adapters:
        """PEFT's initialisation: A uniform(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_ with a = sqrt(5)),
        B zeros, so the adapted model starts as the base model."""
        out = Adapters(spec, cfg.n_layers)
        for layer in range(cfg.n_layers):
            for target in spec.targets:
                a_shape, b_shape = factor_shapes(spec, cfg, target)
                bound = 1.0 / math.sqrt(a_shape[1])
                key = (layer, FIELDS[target])
                out.a[key] = rng.uniform(-bound, bound, a_shape).astype(np.float32)  # (r, in)
                out.b[key] = np.zeros(b_shape, np.float32)  # (out, r)
        return out

    def matrices(self) -> list[tuple[int, str]]:
        """(layer, field) of every adapted matrix, layer by layer, in ``TARGETS`` order."""
        return [(i, FIELDS[t]) for i in range(self.n_layers) for t in self.spec.targets]

    def delta(self, layer: int, field: str) -> np.ndarray:
        """scale * B @ A (out, in), float32: what fusing adds to the matrix."""
        key = (layer, field)
        if key not in self.a:
            raise AdapterError(f"[lora] no adapter for layer {layer} {field}")
        return (np.float32(self.spec.scale) * (self.b[key] @ self.a[key])).astype(np.float32)  # (out, in)

    def check(self, cfg: ModelConfig) -> None:
        """Every expected (layer, field) is there with float32 factors of the shapes ``cfg`` gives, and
        nothing else; else one error naming the key."""
        if self.n_layers != cfg.n_layers:
            raise AdapterError(f"[lora] adapters for {self.n_layers} layers, the model has {cfg.n_layers}")
        wanted = self.matrices()
        for name, table in (("A", self.a), ("B", self.b)):
            extra = [k for k in table if k not in wanted]
            if extra:
                raise AdapterError(f"[lora] {name} of layer {extra[0][0]} {extra[0][1]} is not a target")
        for layer, target in ((i, t) for i in range(self.n_layers) for t in self.spec.targets):
            key = (layer, FIELDS[target])
            shapes = factor_shapes(self.spec, cfg, target)
            for name, table, shape in zip(("A", "B"), (self.a, self.b), shapes):
                where = f"[lora] {name} of layer {layer} {key[1]}"
                if key not in table:
                    raise AdapterError(f"{where} is missing")
                array = table[key]
                if not isinstance(array, np.ndarray) or array.dtype != np.float32:
                    raise AdapterError(f"{where}: a float32 array is needed, not {_what(array)}")
                if array.shape != shape:
                    raise AdapterError(f"{where}: shape {list(array.shape)}, expected {list(shape)}")


def _what(value: Any) -> str:
    return f"{value.dtype} array" if isinstance(value, np.ndarray) else type(value).__name__


def fuse(params: Params, adapters: Adapters) -> Params:
    """A new Params with W + scale * B @ A for every adapted matrix; ``params`` is left untouched."""
    adapters.check(params.cfg)
    fused = params.copy()
    for layer, name in adapters.matrices():
        w = getattr(fused.layers[layer], name)  # (out, in)
        setattr(fused.layers[layer], name, (w + adapters.delta(layer, name)).astype(np.float32))
    return fused


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
        self._order = _named(self.da, self.db)  # (name, table, key) of every gradient, in the fixed order

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

    def add_into(self, total: LoraGradients) -> None:
        """A worker's sequence gradient added to the batch's total (as ``Gradients.add_to`` does)."""
        for k in self.da:
            total.da[k] += self.da[k]
            total.db[k] += self.db[k]

    def add_tensor_into(self, total: LoraGradients, index: int) -> None:
        """Tensor ``index`` (``tensors``' order) of a worker's sequence gradient added to the total's."""
        _, table, key = self._order[index]
        total_table = total.da if table is self.da else total.db
        total_table[key] += table[key]

    def vector(self, layer: int | None, key: str, g: np.ndarray) -> None:
        return None  # norm scales and biases are frozen

    def classifier(self, params: Params, dlogits: np.ndarray, xf: np.ndarray) -> None:
        return None  # the classifier (or tied embedding) is frozen: its (vocab x dim) gradient is not formed

    def embedding(self, dx: np.ndarray, tokens: np.ndarray) -> None:
        return None

    def tensors(self) -> list[tuple[str, np.ndarray]]:
        """Every gradient with the name of its adapter tensor (``adapter_names``' order)."""
        return [(name, table[k]) for name, table, k in self._order]

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
        sink.add_into(self.grads)

    def gradient_tensors(self) -> list[np.ndarray]:
        """The total's adapter gradients in ``adapter_tensors``' order: what ranks exchange."""
        return [g for _, g in self.grads.tensors()]

    def add_tensor(self, sink: LoraGradients, index: int) -> None:
        """Tensor ``index`` of a worker's buffer added onto the total's (``add`` a tensor at a time)."""
        sink.add_tensor_into(self.grads, index)

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
                1e-8, tc.weight_decay, apply_decay=True, grad_scale=float(scale),
            )  # fmt: skip
        self.params.refresh()
