"""One training step of the llama2.c model: kernels on the backend, weight gradients on the CPU.

Where the time goes, per micro-step of T tokens and L layers:

* backend (the engine, or the simulator): per layer the SDPA and FFN forward kernels, then backwards
  the FFN backward, SDPA backward 1 and 2 and QKV backward kernels (activation gradients only);
* CPU: embedding lookup / scatter-add, RMSNorm backward (dw stays on the host, as in the training
  reference), final RMSNorm, the tied classifier (a vocab x dim sgemm each way), cross-entropy, and
  every weight gradient as an outer-product sgemm (dW = dY @ X^T) from the kernels' taps; for Hugging
  Face attention also the backward of Qwen 3's per-head q / k norm (from the taps q_pre / k_pre, before
  the weight gradients and QKV backward, which take the projections' gradients) and the q / k / v bias
  gradients (row sums); for Gemma 3 the backward of the post-attention / post-FFN RMSNorms (from the
  taps o_pre / ffn_pre, ``cpu_ops.rmsnorm_bwd``: a norm's backward runs on the host as the other
  RMSNorms' do), the embedding's scale (lookup and gradient) and every norm scale read as offset + w.

Layer types: a model with sliding-window layers beside full ones (Gemma 3) compiles each kind's
attention kernels (the mask and the RoPE tables differ; the weights are the layer's own): baked, each
layer's kernels of its kind as before and one SDPA backward 2 per kind; dynamic, the SDPA forward and
backward 1 once per kind.

Two weight modes (DESIGN.md): baked — weights are BLOBFILE consts (``Kernels``), so the kernels of a
layer are compiled again whenever its weights change (once per accumulation batch); dynamic — weights
travel in the inputs (``DynamicKernels``), every kernel is compiled once. The SDPA backward 2 kernel
has no trained weights and is compiled once in both modes. Activation gradients entering the kernels
are multiplied by ``loss_scale`` so small gradients survive fp16 storage; weight gradients are divided
by it again.

Training routes (``anekit.kernels.route.KernelRoute``, chosen per chip by the engine layer): the route's
``weights`` is the weight mode above; its ``norm`` "host" normalises each kernel's input here, as maderix/
ANE's dynamic pipeline (training/training_dynamic, c3c5094) and ncdrone/rustane do, and its ``rope``
"slice" writes RoPE as their kernels write it ("matmul": as rustane's since pull request #9, for the
M3). Either way ``run`` answers the same names with the same keys: with the norm on the host it puts the
normalised input it computed under ``xnorm`` / ``x2norm`` (rounded to fp16, the value the kernel read)
and, for Gemma 3, normalises the kernel's Wo / W2 output itself (``o_pre`` / ``ffn_pre`` the kernel's
output, ``o_out`` / ``ffn_out`` the normalised one), so ``train_step`` and ``forward_layers`` never ask
which route runs.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from anekit import jit, pages
from anekit.engine.numerics import behaviour
from anekit.fp16 import round_to_fp16
from anekit.kernels import ModelConfig, attention_bwd, backward, dynamic, forward
from anekit.kernels.route import LEGACY, BadKernelRoute, KernelRoute
from anekit.kernels.spec import KernelSpec
from anekit.llama import cpu_ops
from anekit.llama.host_queue import HostJobs, host_jobs, overlap_pays
from anekit.llama.params import Params
from anekit.runtime.base import Backend, Kernel, Surface

# Kernels whose weights change with every optimizer step (compiled once per accumulation batch).
KERNELS_PER_LAYER = ("sdpa_fwd", "ffn_fwd", "ffn_bwd", "sdpa_bwd1", "qkv_bwd")
# The legacy baked kernel set (``LEGACY`` is the dynamic one): everything on the engine, the swap conv.
LEGACY_BAKED = KernelRoute("baked", LEGACY.attention, LEGACY.norm, LEGACY.rope)
# With the norm on the host, per forward kernel: (the scale of its input's norm, the tap of the normalised
# input, Gemma 3's post-norm scale, the tap the post-norm gives, the tap of the post-norm's input).
HOST_NORMS = {
    "sdpa_fwd": ("rms_att", "xnorm", "post_att_norm", "o_out", "o_pre"),
    "ffn_fwd": ("rms_ffn", "x2norm", "post_ffn_norm", "ffn_out", "ffn_pre"),
}
NORM_SCALES = ("rms_att", "rms_ffn", "post_att_norm", "post_ffn_norm")


@dataclass
class Timer:
    """Cumulative seconds per phase (compile, kernels, cpu, io)."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0


def norm_scale(cfg: ModelConfig, w: np.ndarray) -> np.ndarray:
    """What an RMSNorm with weight w scales by: ``cfg.norm_offset`` + w (w itself for Llama). Its gradient
    is w's."""
    return w + np.float32(cfg.norm_offset) if cfg.norm_offset else w


class Kernels:
    """The compiled kernels for one set of weights: ``layers[i][name]`` and ``sdpa_bwd2``, shared by the
    layers of a kind (``bwd2[kind]``; ``sdpa_bwd2`` is the first kind's).

    ``route``: the training route whose kernels these are (``WEIGHTS`` its weight mode; default the
    legacy kernels of that mode); with engine attention the SDPA backward 2 kernels are compiled here."""

    WEIGHTS = "baked"

    def __init__(self, backend: Backend, cfg: ModelConfig, route: KernelRoute | None = None) -> None:
        if route is None:
            route = LEGACY_BAKED if self.WEIGHTS == "baked" else LEGACY
        if route.weights != self.WEIGHTS:
            raise BadKernelRoute(
                f"[step] {type(self).__name__} runs {self.WEIGHTS} weights; the route has {route.weights} "
                f"({route.describe()})"
            )
        self.backend = backend
        self.cfg = cfg
        self.route = route
        self.specs: list[dict[str, KernelSpec]] = []
        self.layers: list[dict[str, Kernel]] = []
        self._buffers: dict[str, np.ndarray] = {}
        self._scales: list[dict[str, np.ndarray]] = []  # per layer, the norm scales the host applies
        self.bwd2: dict[str, tuple[KernelSpec, Kernel]] = {}
        if route.attention == "engine":
            for kind in cfg.layer_kinds:
                spec2 = attention_bwd.sdpa_bwd2(cfg, kind=kind, rope=route.rope)
                self.bwd2[kind] = (spec2, spec2.compile(backend).load())
            self.sdpa_bwd2 = self.bwd2[cfg.layer_kinds[0]]

    @staticmethod
    def compiles_per_batch(cfg: ModelConfig) -> int:
        return len(KERNELS_PER_LAYER) * cfg.n_layers

    def compiles_needed(self) -> int:
        """How many programs the next ``compile`` call will compile."""
        return self.compiles_per_batch(self.cfg)

    def compile(self, params: Params, timer: Timer) -> None:
        """(Re)compile every weight-bearing kernel with the current weights."""
        self.close_layers()
        cfg, route = self.cfg, self.route
        with timer.phase("compile"):
            for i in range(cfg.n_layers):
                w = params.kernel_weights(i)
                kind = cfg.layer_type(i)  # the attention kernels' mask and RoPE tables are the kind's
                specs = {
                    "sdpa_fwd": forward.sdpa_fwd(cfg, w, kind=kind, norm=route.norm, rope=route.rope),
                    "ffn_fwd": forward.ffn_fwd(cfg, w, norm=route.norm),
                    "ffn_bwd": backward.ffn_bwd(cfg, w),
                    "sdpa_bwd1": attention_bwd.sdpa_bwd1(cfg, w, kind=kind),
                    "qkv_bwd": attention_bwd.qkv_bwd(cfg, w),
                }
                self.specs.append(specs)
                self.layers.append({name: spec.compile(self.backend).load() for name, spec in specs.items()})
                if route.norm == "host":  # the scales the kernels were built with, for the host's norms
                    self._scales.append({k: w[k].copy() for k in NORM_SCALES if k in w})

    def run(self, layer: int, name: str, **parts: np.ndarray) -> dict[str, np.ndarray]:
        """The outputs of kernel ``name`` of ``layer`` given its input parts, by tap name; with the route's
        norm on the host the forward kernels' norms are computed here (``host_normed``)."""
        if self.route.norm == "host" and name in HOST_NORMS:
            return self.host_normed(layer, name, parts["x"])
        return self.run_kernel(layer, name, **parts)

    def host_normed(self, layer: int, name: str, x: np.ndarray) -> dict[str, np.ndarray]:
        """A forward kernel whose norms run on the host: x (dim, T) normalised here and rounded to fp16 (the
        values the kernel's fp16 input holds, so the weight gradients read what the kernel read), the
        kernel run on it, and the taps completed as the kernel with the norms in it gives them."""
        cfg = self.cfg
        scale, tap, post, out, pre = HOST_NORMS[name]
        xn = round_to_fp16(cpu_ops.rmsnorm(x, norm_scale(cfg, self.norm_weight(layer, scale)), cfg.norm_eps))
        taps = self.run_kernel(layer, name, x=xn)  # (dim, T) in, the kernel's taps out
        taps[tap] = xn  # (dim, T)
        if cfg.post_norms:  # Gemma 3: the kernel gave Wo's / W2's output; the residual adds it normalised
            taps[pre] = taps[out]  # (dim, T)
            post_scale = norm_scale(cfg, self.norm_weight(layer, post))
            taps[out] = cpu_ops.rmsnorm(taps[pre], post_scale, cfg.norm_eps)  # (dim, T)
        return taps

    def norm_weight(self, layer: int, key: str) -> np.ndarray:
        """The norm weight ``key`` of ``layer`` the kernels were compiled with (baked: a copy taken then)."""
        return self._scales[layer][key]

    def run_kernel(self, layer: int, name: str, **parts: np.ndarray) -> dict[str, np.ndarray]:
        """Run kernel ``name`` of ``layer`` on its input parts as they are."""
        if name == "sdpa_bwd2":
            spec, kernel = self.bwd2[self.cfg.layer_type(layer)]
        else:
            spec, kernel = self.specs[layer][name], self.layers[layer][name]
        return spec.run(kernel, **parts)

    def buffer(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A float32 host array kept for the step's use under ``name`` (contents undefined), reused from
        step to step while its shape stays; its pages mapped when it is made (``anekit.pages``: the step
        writes all of it, tens of MB for the logits)."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape:
            buf = self._buffers[name] = pages.zeros(shape, np.float32)
        return buf

    def close_layers(self) -> None:
        for kernels in self.layers:
            for k in kernels.values():
                k.close()
        self.layers, self.specs, self._scales = [], [], []

    def close(self) -> None:
        self.close_layers()
        for _, kernel in self.bwd2.values():
            kernel.close()
        self._buffers.clear()


class DynamicKernels(Kernels):
    """Weights travel in the kernels' inputs (after the activation columns): each kernel is compiled
    once and serves every layer and every optimizer step.

    SDPA backward 1 bakes Wo^T; here it is compiled with Wo = I and fed da = Wo^T @ do, computed by
    the dynamic-weight matmul kernel, so it too never needs recompiling. The FFN backward is two
    kernels (dgate = W2^T dffn, then the SwiGLU backward and dx), as maderix/ANE's dynamic pipeline
    splits it (training/training_dynamic/train.m: ffnBwdW2t, ffnBwdW13t), so each input is dense.

    Weights that live in the surfaces: every layer has its own input set of each weight-bearing kernel
    (``Kernel.input_set``), as maderix's train.m gives each layer its own IOSurfaces and requests. A
    layer's weights are written there (rounded to fp16 by the surface) when ``compile`` is given weights
    the surfaces do not hold, and after an optimizer step by the optimizer itself, tensor by tensor
    (``write_weight``): a run writes only its activation columns. ``compile`` therefore stages every
    weight again unless every change since it last did was written through (``weights_written``): the
    safe default for any code that changes weights in place. Weights that are not a plain ``Params`` (LoRA's
    merged view, ``anekit.training.lora``) are packed into the kernel's own input on every run, as before.
    """

    WEIGHTS = "dynamic"

    def __init__(self, backend: Backend, cfg: ModelConfig, route: KernelRoute | None = None) -> None:
        super().__init__(backend, cfg, route)
        self.params: Params | None = None
        self.dynamic: dict[str, tuple[KernelSpec, Kernel]] = {}
        self._sets: list[dict[str, list[Surface]]] = []  # per layer: kernel name -> its input set
        self._staged: Params | None = None  # whose weights the sets hold
        self._written_through = False  # every change since the last staging was written to the sets
        self.staged_bytes = 0  # weight bytes written into the sets so far (staging and write-through)
        self._count = threading.Lock()  # the optimizer writes tensors from several threads

    @staticmethod
    def compiles_for(cfg: ModelConfig) -> int:
        """The weight-bearing programs of the dynamic set (seven for a model of one layer kind)."""
        return 5 + 2 * len(cfg.layer_kinds)

    def compiles_needed(self) -> int:
        return 0 if self.dynamic else self.compiles_for(self.cfg)

    def compile(self, params: Params, timer: Timer) -> None:
        """Compile the kernels the first time only; make the surfaces hold ``params``' weights (staged
        unless they were written through since the last staging)."""
        self.params = params
        if not self.dynamic:
            self._compile_kernels(timer)
        resident = type(params) is Params
        if resident and (params is not self._staged or not self._written_through):
            with timer.phase("io"):
                self.stage(params)
        self._written_through = False
        if not resident:
            self._staged = None

    def _compile_kernels(self, timer: Timer) -> None:
        cfg, route = self.cfg, self.route
        specs: dict[str, KernelSpec] = {
            "ffn_fwd": dynamic.ffn_fwd_dynamic(cfg, norm=route.norm),
            "ffn_bwd_w2t": dynamic.ffn_bwd_w2t_dynamic(cfg),
            "ffn_bwd_w13t": dynamic.ffn_bwd_w13t_dynamic(cfg),
            "qkv_bwd": dynamic.qkv_bwd_dynamic(cfg),
            "wo_t": dynamic.wo_t_dynamic(cfg),  # da = Wo^T do: (q_dim, T)
        }
        for kind in cfg.layer_kinds:  # "sdpa_fwd" / "sdpa_bwd1" for full layers, "sdpa_fwd:sliding" ...
            tail = "" if kind == "full" else f":{kind}"
            specs[f"sdpa_fwd{tail}"] = dynamic.sdpa_fwd_dynamic(
                cfg, kind=kind, norm=route.norm, rope=route.rope
            )
            legacy = route == LEGACY  # the legacy kernels bake Wo = I; a route's take da itself
            specs[f"sdpa_bwd1{tail}"] = attention_bwd.sdpa_bwd1_weightless(cfg, kind=kind, identity_wo=legacy)
        with timer.phase("compile"):
            self.dynamic = {name: (spec, spec.compile(self.backend).load()) for name, spec in specs.items()}

    # -- the weights in the surfaces -------------------------------------------------------------------

    def _layer_kernels(self, layer: int) -> list[str]:
        """The weight-bearing kernels layer ``layer`` runs (its kind's SDPA forward)."""
        kind = self.cfg.layer_type(layer)
        tail = "" if kind == "full" else f":{kind}"
        return [f"sdpa_fwd{tail}", "ffn_fwd", "ffn_bwd_w2t", "ffn_bwd_w13t", "qkv_bwd", "wo_t"]

    @staticmethod
    def _spec_weights(name: str, w: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """A layer's weights as kernel ``name`` names them: the Wo^T matmul's one weight is "w" = Wo^T."""
        return {"w": w["wo"].T} if name == "wo_t" else w

    def _spec_keys(self, name: str, key: str) -> list[str]:
        """The weights of kernel ``name`` that layer weight ``key`` is (none: the kernel does not read it)."""
        if name == "wo_t":
            return ["w"] if key == "wo" else []
        spec = self.dynamic[name][0]
        return [key] if key in spec.weight_keys() else []  # type: ignore[attr-defined]

    def _layer_sets(self, layer: int) -> dict[str, list[Surface]]:
        while len(self._sets) <= layer:
            self._sets.append({})
        sets = self._sets[layer]
        for name in self._layer_kernels(layer):
            if name not in sets:
                sets[name] = self.dynamic[name][1].input_set()
        return sets

    def stage(self, params: Params) -> None:
        """Write every layer's weights into its input sets (what ``compile`` does for new weights)."""
        for i in range(self.cfg.n_layers):
            w = params.kernel_weights(i)
            for name, surfaces in self._layer_sets(i).items():
                spec = self.dynamic[name][0]
                weights = self._spec_weights(name, w)
                self.staged_bytes += 2 * spec.stage(surfaces, weights)  # type: ignore[attr-defined]
        self._staged = params
        self._written_through = False

    def write_weight(self, name: str, value: np.ndarray) -> None:
        """Tensor ``name`` of ``Params.tensors`` ("layers.3.wq") changed to ``value``: write it into every
        input set that holds it (rounded to fp16 there). The optimizer calls this after updating each
        tensor; tensors no kernel holds (the embedding, the final norm) are ignored."""
        if self._staged is None or not name.startswith("layers."):
            return
        _, index, key = name.split(".")
        layer = int(index)
        w = {key: value}
        for kernel, surfaces in self._layer_sets(layer).items():
            keys = self._spec_keys(kernel, key)
            if keys:
                spec = self.dynamic[kernel][0]
                written = spec.stage(surfaces, self._spec_weights(kernel, w), keys)  # type: ignore[attr-defined]
                with self._count:
                    self.staged_bytes += 2 * written

    def weights_written(self, params: Params) -> None:
        """Every tensor ``params`` changed since ``compile`` was written through (``write_weight``): the
        next ``compile`` with them stages nothing."""
        if params is self._staged:
            self._written_through = True

    def norm_weight(self, layer: int, key: str) -> np.ndarray:
        """The norm weight ``key`` of ``layer`` as it is now (the kernels read the weights at every run)."""
        assert self.params is not None, "compile() first"
        return getattr(self.params.layers[layer], key)

    def run_kernel(self, layer: int, name: str, **parts: np.ndarray) -> dict[str, np.ndarray]:
        if name == "sdpa_bwd2":
            return super().run_kernel(layer, name, **parts)
        assert self.params is not None, "compile() first"
        kind = self.cfg.layer_type(layer)
        tail = "" if kind == "full" else f":{kind}"
        sets = self._layer_sets(layer) if self._staged is not None else None
        w = None if sets is not None else self.params.kernel_weights(layer)

        def run(kernel_name: str, **acts: np.ndarray) -> dict[str, np.ndarray]:
            spec, kernel = self.dynamic[kernel_name]
            if sets is not None:
                return spec.run_staged(kernel, sets[kernel_name], **acts)  # type: ignore[attr-defined]
            assert w is not None
            return spec.run(kernel, self._spec_weights(kernel_name, w), **acts)  # type: ignore[call-arg]

        if name == "sdpa_bwd1":
            da = run("wo_t", x=parts["do"])["y"]  # Wo^T @ do
            spec, kernel = self.dynamic[f"sdpa_bwd1{tail}"]
            last = spec.inputs.names[-1]  # "do" (Wo = I baked) or "da"
            return spec.run(kernel, q=parts["q"], k=parts["k"], v=parts["v"], **{last: da})
        if name == "ffn_bwd":
            dgate = run("ffn_bwd_w2t", dffn=parts["dffn"])["dgate"]  # (hidden, T)
            return run("ffn_bwd_w13t", dgate=dgate, h1=parts["h1"], h3=parts["h3"])
        return run(f"sdpa_fwd{tail}" if name == "sdpa_fwd" else name, **parts)

    def close(self) -> None:
        for _, kernel in self.dynamic.values():
            kernel.close()  # its input sets with it
        self._sets, self._staged = [], None
        super().close()


# The largest scaled activation gradient a step lets into the kernels: half the MAC output port's 2^15
# ceiling (anekit.engine.numerics 'mac.output-ceiling', the same on every chip measured). A gradient
# that grows past it is one product away from +inf, and on the engine an inf meeting another inf or a
# zero becomes +0 (``indeterminate.plus-zero``), which no finiteness check sees: so the step is skipped
# and the loss scale halved before that can happen.
GRADIENT_HEADROOM = behaviour("mac.output-ceiling").conservative / 2


@dataclass
class StepResult:
    loss: float
    finite: bool  # False when a gradient overflowed (the step must be skipped and the scale lowered)
    peak: float = 0.0  # the largest |scaled activation gradient| the kernels saw

    @property
    def overflowed(self) -> bool:
        """The step must be skipped and the scale lowered: a gradient is not finite or left the headroom."""
        return not self.finite or not self.peak < GRADIENT_HEADROOM


class Gradients:
    """Where a step's parameter gradients go: every weight's gradient into a ``Params`` of the model's
    shapes (full training). LoRA (``anekit.training.lora``) overrides it to keep only its adapters'
    gradients, computed from the same (dy, x) pairs, so a frozen weight's gradient is never formed.

    One order of summation, whatever the number of threads: a batch's gradient is each sequence's own
    gradient added to the total in sequence order. Every tensor but the embedding receives one product per
    sequence, so adding it in place (``accumulate``, one thread) gives the same bits as forming it alone
    and adding it later (a worker's buffer, ``accumulate=False``, reduced by ``add_to`` in order). The
    embedding receives several (the tied classifier's product, then one row per token), so its
    per-sequence gradient is always formed on its own first and then added.

    ``fresh``: the total holds nothing yet (the first sequence of a batch), so this sequence's gradients
    are written into it instead of added to it: no pass zeroing the total before, no add pass per tensor
    (about 15 ms of stories15M's step). The bits are the sum's but for the sign of a zero (0 + -0 is +0),
    which no update can see: Adam's moments take the gradient in products, sums with +0 and squares. A
    worker's buffer added first (``add_to(total, overwrite=True)``) is copied the same way, so any number
    of threads still gives the same bits.

    ``matrix`` and ``classifier`` may run on the step's host thread (``train_step``'s ``overlap``), one
    call at a time in the step's order, while the step's own thread calls ``vector``: they touch
    different tensors. ``embedding`` and everything after it run once that thread has drained."""

    def __init__(
        self, grads: Params, kernels: Kernels | None = None, accumulate: bool = True, fresh: bool = False
    ) -> None:
        self.grads = grads
        self.kernels = kernels  # the owner of the step's reusable buffers
        self.accumulate = accumulate  # True: add into ``grads`` (the total); False: ``grads`` is a buffer
        self.fresh = fresh and accumulate  # True until the first sequence's gradients are in the total
        self._embed: np.ndarray | None = None  # the tied classifier's product, the embedding's start
        self._rows: tuple[np.ndarray, np.ndarray] | None = None  # untied: (token ids, their rows)

    def _adds(self) -> bool:
        """True when a gradient goes onto what ``grads`` holds; False when it is written there."""
        return self.accumulate and not self.fresh

    def matrix(self, layer: int, key: str, dy: np.ndarray, x: np.ndarray) -> None:
        """dW += dy x^T for weight ``key`` of ``layer`` (dy (out, T), x (in, T))."""
        g = getattr(self.grads.layers[layer], key)
        if self._adds():
            g += dy @ x.T
        else:
            np.matmul(dy, x.T, out=g)

    def vector(self, layer: int | None, key: str, g: np.ndarray) -> None:
        """A vector's gradient (a norm scale, a bias); ``layer`` None for rms_final."""
        target = self.grads if layer is None else self.grads.layers[layer]
        value = getattr(target, key)
        if self._adds():
            value += g
        else:
            value[...] = g

    def classifier(self, params: Params, dlogits: np.ndarray, xf: np.ndarray) -> None:
        """The classifier's gradient dlogits xf^T, into wcls, or (tied) the start of the embedding's."""
        if params.wcls is None:
            out = self._buffer(params.classifier.shape) if self._adds() else self.grads.embed
            self._embed = np.matmul(dlogits, xf.T, out=out)
        else:
            assert self.grads.wcls is not None
            if self._adds():
                self.grads.wcls += np.matmul(dlogits, xf.T, out=self._buffer(params.classifier.shape))
            else:
                np.matmul(dlogits, xf.T, out=self.grads.wcls)

    def _buffer(self, shape: tuple[int, ...]) -> np.ndarray | None:
        return None if self.kernels is None else self.kernels.buffer("dclassifier", shape)

    def embedding(self, dx: np.ndarray, tokens: np.ndarray) -> None:
        """The embedding's rows of this sequence; then its whole gradient goes to the total (one thread)."""
        if self._embed is not None:  # tied: the rows go onto the classifier's product
            cpu_ops.embed_backward(self._embed, dx, tokens)
        else:
            ids, inverse = np.unique(np.asarray(tokens), return_inverse=True)
            rows = np.zeros((ids.shape[0], dx.shape[0]), np.float32)  # (distinct tokens, dim)
            np.add.at(rows, inverse, dx.T)
            self._rows = (ids, rows)
        if self.fresh:  # tied: the rows went onto the total's own embedding gradient, written above
            self._add_embedding(self.grads, overwrite=self._embed is None)
            self.fresh = False
        elif self.accumulate:
            self._add_embedding(self.grads)

    def _add_embedding(self, total: Params, overwrite: bool = False) -> None:
        if self._embed is not None:
            if self._embed is not total.embed:
                if overwrite:
                    total.embed[...] = self._embed
                else:
                    total.embed += self._embed
        elif self._rows is not None:
            ids, rows = self._rows
            if overwrite:
                total.embed.fill(0.0)  # an untied embedding's rows of tokens not in the sequence: zero
            total.embed[ids] += rows
        self._embed = self._rows = None

    def add_to(self, total: Params, overwrite: bool = False) -> None:
        """A worker's sequence gradient (``accumulate=False``) added to the batch's total, or copied into it
        (``overwrite``: the batch's first, into a total that holds nothing yet)."""
        for (name, g), (_, t) in zip(self.grads.tensors(), total.tensors()):
            if name != "embed":
                if overwrite:
                    t[...] = g
                else:
                    t += g
        self._add_embedding(total, overwrite)

    def add_tensor_to(self, total: Params, index: int) -> None:
        """Tensor ``index`` (``Params.tensors``' order) of a worker's sequence gradient added to the total's:
        ``add_to`` one tensor at a time, the same bits (the chain across ranks adds bucket by bucket)."""
        name, g = _nth(self.grads, index)
        if name == "embed":
            self._add_embedding(total)
        else:
            t = _nth(total, index)[1]
            t += g


def forward_layers(
    kernels: Kernels, params: Params, tokens: np.ndarray, timer: Timer
) -> tuple[np.ndarray, list[tuple[np.ndarray, dict, np.ndarray, dict]]]:
    """The layers' forward for one sequence: the last residual stream (dim, T) and, per layer, what the
    backward needs (x, the SDPA taps, x2, the FFN taps)."""
    cfg = kernels.cfg
    with timer.phase("cpu"):
        x = cpu_ops.embed_lookup(params.embed, tokens)  # (dim, T)
        if (
            cfg.embed_scale != 1.0
        ):  # Gemma: the embeddings times sqrt(dim); the tied classifier reads them unscaled
            x *= np.float32(cfg.embed_scale)
    saved = []
    for i in range(cfg.n_layers):
        with timer.phase("kernels"):
            att = kernels.run(
                i, "sdpa_fwd", x=x
            )  # taps o_out, q, k, v, attn_out, xnorm (q_pre, k_pre, o_pre)
        x2 = x + att["o_out"]  # (dim, T) residual
        with timer.phase("kernels"):
            ffn = kernels.run(i, "ffn_fwd", x=x2)  # taps ffn_out, h1, h3, silu_out, x2norm (ffn_pre)
        saved.append((x, att, x2, ffn))
        x = x2 + ffn["ffn_out"]  # (dim, T)
    return x, saved


def _loss(
    kernels: Kernels, logits: np.ndarray, targets: np.ndarray, weights: np.ndarray | None
) -> tuple[float, np.ndarray]:
    """(loss, dlogits) of one sequence: the mean over its positions, or over those ``weights`` trains."""
    if weights is None:
        return cpu_ops.cross_entropy(logits, targets, out=logits)  # dlogits in place of the logits
    return cpu_ops.weighted_cross_entropy(logits, targets, weights)


def eval_loss(
    kernels: Kernels,
    params: Params,
    tokens: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray | None,
    timer: Timer,
) -> tuple[float, float]:
    """The forward alone (validation): (sum of the weighted per-position losses, sum of the weights)."""
    x, _ = forward_layers(kernels, params, tokens, timer)
    with timer.phase("cpu"):
        xf = cpu_ops.rmsnorm(x, norm_scale(kernels.cfg, params.rms_final), kernels.cfg.norm_eps)  # (dim, T)
        logits = params.classifier @ xf  # (vocab, T)
        w = np.ones(tokens.shape[0], np.float32) if weights is None else weights
        loss, _ = cpu_ops.weighted_cross_entropy(logits, targets, w)
        total = float(w.sum(dtype=np.float64))
    return loss * total, total


def train_step(
    kernels: Kernels,
    params: Params,
    grads: Params | Gradients,
    tokens: np.ndarray,  # (T,) input token ids
    targets: np.ndarray,  # (T,) next-token ids
    timer: Timer,
    loss_scale: float = 1.0,
    weights: np.ndarray | None = None,  # (T,) which positions the loss counts (None: all, equally)
    *,
    overlap: bool | None = None,
) -> StepResult:
    """Forward, loss and backward for one sequence; adds this sequence's gradients into ``grads`` (a
    ``Params``, or a ``Gradients`` that decides what it keeps).

    ``overlap``: the weight gradients and the classifier's gradient run on a host thread of the step's
    own while this thread runs the next kernels (``anekit.llama.host_queue``: the same bits, the thread
    gone when the step returns); None: where it pays, on the engine but not on the simulator
    (``overlap_pays``)."""
    if overlap is None:
        overlap = overlap_pays(kernels.backend.name)
    with host_jobs(overlap) as host:
        return _train_step(kernels, params, grads, tokens, targets, timer, loss_scale, weights, host)


def _train_step(
    kernels: Kernels,
    params: Params,
    grads: Params | Gradients,
    tokens: np.ndarray,
    targets: np.ndarray,
    timer: Timer,
    loss_scale: float,
    weights: np.ndarray | None,
    host: HostJobs,  # where the gradients' products go: run inline, or queued beside the kernels
) -> StepResult:
    cfg = kernels.cfg
    eps = cfg.norm_eps
    sink = grads if isinstance(grads, Gradients) else Gradients(grads, kernels)
    x, saved = forward_layers(kernels, params, tokens, timer)

    # -- head on the CPU: final RMSNorm, tied classifier, cross-entropy ------------------------------
    with timer.phase("cpu"):
        final_scale = norm_scale(cfg, params.rms_final)  # (dim,)
        xf = cpu_ops.rmsnorm(x, final_scale, eps)  # (dim, T)
        classifier = params.classifier  # (vocab, dim)
        # The vocab-sized arrays live in buffers kept across steps: fresh ones (tens of MB, beyond the
        # heap's mmap threshold) would be mapped and faulted in again every step. Same products.
        logits = np.matmul(classifier, xf, out=kernels.buffer("logits", (classifier.shape[0], xf.shape[1])))
        loss, dlogits = _loss(kernels, logits, targets, weights)  # dlogits (vocab, T)
        dlogits *= np.float32(loss_scale)  # in place: no second (vocab, T) array
        host.submit("the classifier's gradient", sink.classifier, params, dlogits, xf)  # dlogits: read only
        # The classifier's input gradient contracts over the vocabulary: a float32 sgemm here, as
        # maderix/ANE training/train_large.m does it (no hardware-run kernel reads vocab channels).
        dxf = classifier.T @ dlogits  # (dim, T), float32
        dx, drms = cpu_ops.rmsnorm_bwd(dxf, x, final_scale, eps)
        sink.vector(None, "rms_final", drms)

    # -- backward through the layers -------------------------------------------------------------
    peak = 0.0  # the largest |scaled gradient| into or out of a backward kernel
    for i in reversed(range(cfg.n_layers)):
        x, att, x2, ffn = saved[i]
        w = params.layers[i]
        dffn = dx  # (dim, T): the gradient of W2's output
        if cfg.post_norms:  # Gemma 3: back through post_ffn_norm to W2's output (the tap ffn_pre)
            with timer.phase("cpu"):
                scale = norm_scale(cfg, w.post_ffn_norm)  # type: ignore[arg-type]
                dffn, drms = cpu_ops.rmsnorm_bwd(dx, ffn["ffn_pre"], scale, eps)
                sink.vector(i, "post_ffn_norm", drms)
        with timer.phase("kernels"):
            fb = kernels.run(i, "ffn_bwd", dffn=dffn, h1=ffn["h1"], h3=ffn["h3"])  # dx (wrt x2norm), dh1, dh3
        with timer.phase("cpu"):
            host.submit(f"layer {i} w2", sink.matrix, i, "w2", dffn, ffn["silu_out"])  # (dim, hidden)
            host.submit(f"layer {i} w1", sink.matrix, i, "w1", fb["dh1"], ffn["x2norm"])  # (hidden, dim)
            host.submit(f"layer {i} w3", sink.matrix, i, "w3", fb["dh3"], ffn["x2norm"])
            dnorm, drms = cpu_ops.rmsnorm_bwd(fb["dx"], x2, norm_scale(cfg, w.rms_ffn), eps)
            sink.vector(i, "rms_ffn", drms)
            dx2 = dx + dnorm  # (dim, T): the residual and the FFN branch
            do = dx2  # (dim, T): the gradient of Wo's output
            if cfg.post_norms:  # back through post_att_norm to Wo's output (the tap o_pre)
                scale = norm_scale(cfg, w.post_att_norm)  # type: ignore[arg-type]
                do, drms = cpu_ops.rmsnorm_bwd(dx2, att["o_pre"], scale, eps)
                sink.vector(i, "post_att_norm", drms)
            host.submit(f"layer {i} wo", sink.matrix, i, "wo", do, att["attn_out"])  # (dim, q_dim)
        with timer.phase("kernels"):
            b1 = kernels.run(i, "sdpa_bwd1", q=att["q"], k=att["k"], v=att["v"], do=do)  # dv, probs, dp
            b2 = kernels.run(i, "sdpa_bwd2", probs=b1["probs"], dp=b1["dp"], q=att["q"], k=att["k"])  # dq, dk
        with timer.phase("cpu"):
            dq, dk, dv = b2["dq"], b2["dk"], b1["dv"]  # (q_dim, T), (kv_dim, T) x 2: before RoPE
            if cfg.qk_norm:  # back through Qwen 3's per-head norm to the projections
                qs, ks = norm_scale(cfg, w.q_norm), norm_scale(cfg, w.k_norm)  # type: ignore[arg-type]
                dq, dqn = cpu_ops.head_rmsnorm_bwd(dq, att["q_pre"], qs, eps, cfg.head_dim)
                dk, dkn = cpu_ops.head_rmsnorm_bwd(dk, att["k_pre"], ks, eps, cfg.head_dim)
                sink.vector(i, "q_norm", dqn)  # (head_dim,)
                sink.vector(i, "k_norm", dkn)
            if cfg.qkv_bias:  # a bias's gradient: its projection's, summed over positions
                sink.vector(i, "bq", dq.sum(axis=1, dtype=np.float32))  # (q_dim,)
                sink.vector(i, "bk", dk.sum(axis=1, dtype=np.float32))  # (kv_dim,)
                sink.vector(i, "bv", dv.sum(axis=1, dtype=np.float32))
        with timer.phase("kernels"):
            dxn = kernels.run(i, "qkv_bwd", dq=dq, dk=dk, dv=dv)["dx"]  # (dim, T)
        with timer.phase("cpu"):
            xn = att["xnorm"]
            host.submit(f"layer {i} wq", sink.matrix, i, "wq", dq, xn)  # (q_dim, dim)
            host.submit(f"layer {i} wk", sink.matrix, i, "wk", dk, xn)  # (kv_dim, dim)
            host.submit(f"layer {i} wv", sink.matrix, i, "wv", dv, xn)
            dnorm, drms = cpu_ops.rmsnorm_bwd(dxn, x, norm_scale(cfg, w.rms_att), eps)
            sink.vector(i, "rms_att", drms)
            dx = dx2 + dnorm  # (dim, T)
            normed = (dq, dk) if cfg.qk_norm else ()  # the gradients entering qkv_bwd, when they differ
            post = (
                (dffn, do) if cfg.post_norms else ()
            )  # the gradients entering ffn_bwd / sdpa_bwd1, when they differ
            peak = max(
                peak, _peak(dx2, fb["dx"], fb["dh1"], fb["dh3"], dv, b2["dq"], b2["dk"], *normed, *post, dxn)
            )

    with timer.phase("cpu"):
        if cfg.embed_scale != 1.0:  # the lookup was scaled: so is its gradient
            dx = dx * np.float32(cfg.embed_scale)
        host.drain()  # every product is in: the embedding's rows go onto the classifier's (tied)
        sink.embedding(dx, tokens)
        finite = bool(np.isfinite(dx).all() and np.isfinite(loss))
    return StepResult(float(loss), finite, peak)


def _nth(params: Params, index: int) -> tuple[str, np.ndarray]:
    """The ``index``-th (name, array) of ``params.tensors()``."""
    for i, item in enumerate(params.tensors()):
        if i == index:
            return item
    raise IndexError(f"no tensor {index} in a model of {params.cfg.n_layers} layers")


def _peak(*arrays: np.ndarray) -> float:
    """The largest |value| of the arrays (inf when one holds a NaN): one compiled read of each where the
    loops are in use (``jit.nan_peak``), else numpy's."""
    top = 0.0
    for a in arrays:
        found = jit.nan_peak(a) if a.size else (0, 0.0)
        if found is None:
            m = float(np.max(np.abs(a)))
            found = (0, m) if m == m else (1, m)
        nans, m = found
        top = max(top, float("inf") if nans else m)
    return top


def unscale(grads: Params, factor: float) -> bool:
    """Multiply every gradient by ``factor`` in place; False if any gradient is not finite. One compiled
    pass a tensor where the loops serve (``jit.scale_all_finite``: the same float32 products)."""
    ok = True
    for _, g in grads.tensors():
        finite = jit.scale_all_finite(g, factor)
        if finite is None:
            g *= factor
            finite = bool(np.isfinite(g).all())
        ok = ok and finite
    return ok
