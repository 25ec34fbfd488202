"""Parameters of a llama2.c-style model, in llama2.c's layout, and containers shaped like them.

Every matrix is float32 (out, in) as llama2.c stores it: wq (dim, dim), wk / wv (kv_dim, dim), wo
(dim, dim), w1 / w3 (hidden, dim), w2 (dim, hidden); vectors rms_att / rms_ffn (dim,) per layer;
embed (vocab, dim); rms_final (dim,); wcls (vocab, dim) or None when the classifier is tied to embed.
Gradients and Adam moments use the same container (``zeros_like``), so optimizer code walks one list.

Models imported from Hugging Face may carry more per layer (``EXTRA_FIELDS``, present exactly when the
config says so): q / k / v biases (Qwen 2) and the per-head q / k RMSNorm weights (Qwen 3). With an
``attn_head_dim`` of its own, wq is (q_dim, dim) and wo (dim, q_dim), q_dim = n_heads x head_dim.

The arrays may be read-only views of a model file mapped into memory (``map_file``): sampling, inspecting
and exporting then read weights from the page cache as they use them, so a model larger than RAM works,
and only training, which updates weights in place, needs writable copies.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from anekit import addrspace, pages
from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig

LAYER_FIELDS = ("rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3")
# Hugging Face models only (see the docstring); post_att_norm / post_ffn_norm are Gemma 3's post-norms.
EXTRA_FIELDS = ("bq", "bk", "bv", "q_norm", "k_norm", "post_att_norm", "post_ffn_norm")


def map_file(path: str | os.PathLike, what: str) -> np.ndarray:
    """The bytes of a file as a read-only uint8 array backed by a shared read-only map of it (an empty
    array for an empty file).

    Nothing is read until it is used, and what is read stays in the page cache: it is not the process's
    private memory (what ``ulimit -d`` / ``prlimit --data`` limits), and the kernel drops it when RAM
    runs short. Mapping allocates nothing, so a reader checks the header's counts against the size before
    it makes arrays of the map; the map lives as long as any array made from it. ``what`` starts the
    error message (``"[llama2c] model file"``).
    """
    size = 0
    try:
        with open(os.fspath(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return np.zeros(0, np.uint8)  # nothing to map: the reader says what is missing
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        if getattr(e, "errno", None) == errno.ENOMEM:  # the address space is limited (RLIMIT_AS): in words
            addrspace.check(size, what.partition("]")[0].lstrip("["), f"mapping {path} whole")
        raise AnekitError(f"{what} {path} cannot be mapped: {e}") from e
    return np.frombuffer(mapped, np.uint8)


@dataclass
class LayerParams:
    """One transformer layer's weights."""

    rms_att: np.ndarray  # (dim,)
    wq: np.ndarray  # (dim, dim)
    wk: np.ndarray  # (kv_dim, dim)
    wv: np.ndarray  # (kv_dim, dim)
    wo: np.ndarray  # (dim, dim)
    rms_ffn: np.ndarray  # (dim,)
    w1: np.ndarray  # (hidden, dim)
    w2: np.ndarray  # (dim, hidden)
    w3: np.ndarray  # (hidden, dim)
    bq: np.ndarray | None = None  # (q_dim,) when cfg.qkv_bias
    bk: np.ndarray | None = None  # (kv_dim,)
    bv: np.ndarray | None = None  # (kv_dim,)
    q_norm: np.ndarray | None = None  # (head_dim,) when cfg.qk_norm
    k_norm: np.ndarray | None = None  # (head_dim,)
    post_att_norm: np.ndarray | None = None  # (dim,) when cfg.post_norms: the attention output's RMSNorm
    post_ffn_norm: np.ndarray | None = None  # (dim,) when cfg.post_norms: the FFN output's RMSNorm

    def as_dict(self) -> dict[str, np.ndarray]:
        """Every array of the layer: llama2.c's nine, then the extras it has."""
        out = {k: getattr(self, k) for k in LAYER_FIELDS}
        out.update({k: v for k in EXTRA_FIELDS if (v := getattr(self, k)) is not None})
        return out


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every array of one layer of ``cfg`` (the extras it has included)."""
    d, q, kv, h = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim
    shapes = {
        "rms_att": (d,), "wq": (q, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, q),
        "rms_ffn": (d,), "w1": (h, d), "w2": (d, h), "w3": (h, d),
    }  # fmt: skip
    if cfg.qkv_bias:
        shapes.update(bq=(q,), bk=(kv,), bv=(kv,))
    if cfg.qk_norm:
        shapes.update(q_norm=(cfg.head_dim,), k_norm=(cfg.head_dim,))
    if cfg.post_norms:
        shapes.update(post_att_norm=(d,), post_ffn_norm=(d,))
    return shapes


INIT_PIECE = 1 << 20  # values drawn from one random stream by Params.init


def _fill_normal(draws: list[tuple[np.ndarray, float]], seed: int) -> None:
    """Fill each array with normal(0, std) values: row blocks of at most INIT_PIECE values, block k from
    the k-th child stream of ``seed``, on every core (numpy's generators release the GIL while filling)."""
    pieces = []
    for a, std in draws:
        flat = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)  # (rows, row length) view
        rows = max(1, INIT_PIECE // max(1, flat.shape[1]))
        pieces += [(flat[r : r + rows], std) for r in range(0, flat.shape[0], rows)]
    streams = np.random.SeedSequence(seed).spawn(len(pieces))

    def fill(k: int) -> None:
        block, std = pieces[k]
        np.random.Generator(np.random.PCG64(streams[k])).standard_normal(out=block, dtype=np.float32)
        block *= np.float32(std)

    from anekit.threads import cores

    workers = min(cores(), len(pieces))
    if workers < 2 or sum(p.size for p, _ in pieces) < 2 * INIT_PIECE:
        for k in range(len(pieces)):
            fill(k)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="anekit-init") as pool:
        list(pool.map(fill, range(len(pieces))))


@dataclass
class Params:
    """All weights of a model (or a gradient / moment buffer of the same shapes)."""

    cfg: ModelConfig
    embed: np.ndarray  # (vocab, dim)
    layers: list[LayerParams]
    rms_final: np.ndarray  # (dim,)
    wcls: np.ndarray | None = field(default=None)  # (vocab, dim); None: tied to embed

    @property
    def tied(self) -> bool:
        """Whether the classifier is the embedding (no wcls)."""
        return self.wcls is None

    @property
    def classifier(self) -> np.ndarray:
        """The output projection (vocab, dim): wcls, or embed when tied."""
        return self.embed if self.wcls is None else self.wcls

    def kernel_weights(self, layer: int) -> dict[str, np.ndarray]:
        """What the kernel generators take: one layer's weights plus the head's."""
        w = self.layers[layer].as_dict()
        w["embed"] = self.classifier
        w["rms_final"] = self.rms_final
        return w

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every array with a stable name, in llama2.c's file order (embed, per-field layers, head)."""
        yield "embed", self.embed
        for key in LAYER_FIELDS + EXTRA_FIELDS:
            for i, layer in enumerate(self.layers):
                if (value := getattr(layer, key)) is not None:
                    yield f"layers.{i}.{key}", value
        yield "rms_final", self.rms_final
        if self.wcls is not None:
            yield "wcls", self.wcls

    def zeros_like(self) -> Params:
        """A container of zeros with the same shapes and dtypes (gradients, Adam moments), as plain
        C-ordered arrays. Their memory comes already zeroed from the system (``np.zeros_like`` would write
        every zero itself: 0.2 s of stories15M's start-up for its two Adam moments), its pages mapped at
        once (``anekit.pages``: a step writes every one of them, and a page fault apiece costs 6-7x as
        much on the machines measured)."""

        def zeros(a: np.ndarray) -> np.ndarray:
            return pages.zeros(a.shape, a.dtype)

        layers = [LayerParams(**{k: zeros(v) for k, v in lp.as_dict().items()}) for lp in self.layers]
        wcls = None if self.wcls is None else zeros(self.wcls)
        return Params(self.cfg, zeros(self.embed), layers, zeros(self.rms_final), wcls)

    def copy(self) -> Params:
        layers = [LayerParams(**{k: v.copy() for k, v in lp.as_dict().items()}) for lp in self.layers]
        wcls = None if self.wcls is None else self.wcls.copy()
        return Params(self.cfg, self.embed.copy(), layers, self.rms_final.copy(), wcls)

    def count(self) -> int:
        return sum(a.size for _, a in self.tensors())

    @staticmethod
    def init(cfg: ModelConfig, seed: int = 0, tied: bool = True) -> Params:
        """llama2.c model.py's initialisation: normal(0, 0.02), output projections (wo, w2) scaled by
        1/sqrt(2 * n_layers), RMSNorm scales one (zero where the norm scales by 1 + w: ``cfg.norm_offset``).

        The values are drawn in float32 and scaled in place, in pieces of at most ``INIT_PIECE`` values,
        each from its own stream of ``seed`` (``SeedSequence.spawn``): the pieces are filled on every core
        and the weights are the same whatever the number of cores. (Drawn in float64 on one thread and cast
        down, stories15M's took 0.34 s of a run's start-up; now about 0.08 s on two cores.)"""
        out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
        draws: list[tuple[np.ndarray, float]] = []  # (array to fill, its standard deviation), in order

        def normal(shape: tuple[int, ...], std: float = 0.02) -> np.ndarray:
            a = np.empty(shape, np.float32)
            draws.append((a, std))
            return a

        shapes = layer_shapes(cfg)
        layers = []
        for _ in range(cfg.n_layers):
            w = {}
            for key, shape in shapes.items():
                if key.startswith("rms") or key.endswith("_norm"):
                    w[key] = np.full(shape, 1 - cfg.norm_offset, np.float32)
                elif key.startswith("b"):
                    w[key] = np.zeros(shape, np.float32)
                else:
                    w[key] = normal(shape, out_std if key in ("wo", "w2") else 0.02)
            layers.append(LayerParams(**w))
        embed = normal((cfg.vocab_size, cfg.dim))
        wcls = None if tied else normal((cfg.vocab_size, cfg.dim))
        _fill_normal(draws, seed)
        return Params(cfg, embed, layers, np.full(cfg.dim, 1 - cfg.norm_offset, np.float32), wcls)
