"""The kernels one training step runs on the engine, with how many times each runs.

Mirrors ``anekit.llama.step`` (read it for the data flow). Per layer, forward then backward:

* baked weights: ``sdpa_fwd``, ``ffn_fwd``, ``ffn_bwd``, ``sdpa_bwd1``, ``sdpa_bwd2``, ``qkv_bwd``
  (6 evaluations per layer, one program per layer and kernel, recompiled when the weights change);
* dynamic weights: ``sdpa_fwd_dynamic``, ``ffn_fwd_dynamic``, ``ffn_bwd_w2t_dynamic`` +
  ``ffn_bwd_w13t_dynamic`` (the FFN backward in two), ``wo_t`` (Wo^T @ do as a dynamic matmul) +
  ``sdpa_bwd1`` (compiled with Wo = I), ``sdpa_bwd2``, ``qkv_bwd_dynamic`` (8 evaluations per layer,
  compiled once for every layer).

A model with sliding layers (Gemma 3) runs each attention kernel of its sliding layers in that kind's
program (the banded mask, the local RoPE tables): the step prices it as a kernel of its own over those
layers.

The head (final RMSNorm, tied classifier, cross-entropy), every RMSNorm backward and every weight
gradient run on the CPU: the kernels here are the engine part only. ``host_flops`` states the CPU's
share of the arithmetic; ``anekit.cost.host_step`` times the host's part and the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from anekit.cost.work import Work, count
from anekit.kernels import catalog
from anekit.kernels.config import ModelConfig
from anekit.kernels.spec import KernelSpec

WEIGHT_MODES = ("baked", "dynamic")


@dataclass(frozen=True)
class StepKernel:
    """One kernel of the step: its work, evaluations per step, and its kind (attention / ffn)."""

    work: Work
    per_layer: int
    layers: int
    kind: str
    direction: str  # forward / backward

    @property
    def calls(self) -> int:
        return self.per_layer * self.layers


# (name in the step table, the layer kind it serves, the kernel, its generated spec)
StepProgram = tuple[str, str, StepKernel, KernelSpec]


def step_kernels(cfg: ModelConfig, weights: str = "baked") -> list[StepKernel]:
    """Every kernel a training step of ``cfg`` evaluates, in step order (generated from shapes only).

    A kernel whose program depends on the layer kind (``catalog.BY_KIND``: the attention mask and RoPE
    tables) is priced per kind, over the layers of that kind: "sdpa_fwd" for the full layers,
    "sdpa_fwd_sliding" for Gemma 3's sliding ones (``catalog.with_kinds``'s names); a kind no layer has
    is left out (Llama: every kernel once, over every layer)."""
    return [k for _, _, k, _ in step_programs(cfg, weights)]


@cache
def step_programs(
    cfg: ModelConfig, weights: str = "baked"
) -> tuple[tuple[str, str, StepKernel, KernelSpec], ...]:
    """``step_kernels`` with each kernel's name in the step tables below, the layer kind it serves
    ("full" for a kernel every layer shares) and its generated spec (its surfaces' layouts), in step
    order."""
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {WEIGHT_MODES}, not {weights!r}")
    kinds = {k: sum(cfg.layer_type(i) == k for i in range(cfg.n_layers)) for k in cfg.layer_kinds}
    names = BAKED_STEP if weights == "baked" else DYNAMIC_STEP
    out = []
    for name, catalog_name, part, direction in names:
        for kind, layers in kinds.items() if catalog_name in catalog.BY_KIND else [("full", cfg.n_layers)]:
            label = name if kind == "full" else f"{name}_{kind}"
            generated = f"{catalog_name}_{kind}" if kind != "full" else catalog_name
            spec = catalog.build(generated, cfg, None)
            out.append((name, kind, StepKernel(count(spec.program, label), 1, layers, part, direction), spec))
    return tuple(out)


# (name in the step, the catalog's kernel, part of the layer, direction), in step order.
BAKED_STEP = (
    ("sdpa_fwd", "sdpa_fwd", "attention", "forward"),
    ("ffn_fwd", "ffn_fwd", "ffn", "forward"),
    ("ffn_bwd", "ffn_bwd", "ffn", "backward"),
    ("sdpa_bwd1", "sdpa_bwd1", "attention", "backward"),
    ("sdpa_bwd2", "sdpa_bwd2", "attention", "backward"),
    ("qkv_bwd", "qkv_bwd", "attention", "backward"),
)
DYNAMIC_STEP = (
    ("sdpa_fwd_dynamic", "sdpa_fwd_dynamic", "attention", "forward"),
    ("ffn_fwd_dynamic", "ffn_fwd_dynamic", "ffn", "forward"),
    ("ffn_bwd_w2t_dynamic", "ffn_bwd_w2t_dynamic", "ffn", "backward"),
    ("ffn_bwd_w13t_dynamic", "ffn_bwd_w13t_dynamic", "ffn", "backward"),
    ("wo_t", "wo_t_dynamic", "attention", "backward"),
    ("sdpa_bwd1", "sdpa_bwd1_weightless", "attention", "backward"),
    ("sdpa_bwd2", "sdpa_bwd2", "attention", "backward"),
    ("qkv_bwd_dynamic", "qkv_bwd_dynamic", "attention", "backward"),
)


def host_flops(cfg: ModelConfig) -> float:
    """FLOPs the CPU does per step: the classifier (logits, dlogits @ x^T, classifier^T @ dlogits) and
    every weight gradient dW = dY @ X^T (untimed by this model)."""
    d, kv, h, t = cfg.dim, cfg.kv_dim, cfg.hidden_dim, cfg.seq_len
    classifier = 3 * 2.0 * cfg.vocab_size * d * t
    q = cfg.q_dim
    per_layer = 2.0 * t * (q * d + 2 * kv * d + d * q + 3 * h * d)  # wq, wk, wv, wo, w1, w2, w3
    return classifier + cfg.n_layers * per_layer
