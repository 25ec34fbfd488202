"""The kernels one training step runs on the engine, with how many times each runs.

Mirrors ``anekit.llama.step`` (read it for the data flow). Per layer, forward then backward:

* baked weights: ``sdpa_fwd``, ``ffn_fwd``, ``ffn_bwd``, ``sdpa_bwd1``, ``sdpa_bwd2``, ``qkv_bwd``
  (6 evaluations per layer, one program per layer and kernel, recompiled when the weights change);
* dynamic weights: ``sdpa_fwd_dynamic``, ``ffn_fwd_dynamic``, ``ffn_bwd_w2t_dynamic`` +
  ``ffn_bwd_w13t_dynamic`` (the FFN backward in two), ``wo_t`` (Wo^T @ do as a dynamic matmul) +
  ``sdpa_bwd1`` (compiled with Wo = I), ``sdpa_bwd2``, ``qkv_bwd_dynamic`` (8 evaluations per layer,
  compiled once for every layer).

The head (final RMSNorm, tied classifier, cross-entropy), every RMSNorm backward and every weight
gradient run on the CPU: the step time predicted here is the engine part only. ``host_flops`` states
the CPU's share of the arithmetic, which this model does not time.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.cost.work import Work, count
from anekit.kernels import attention_bwd, backward, dynamic, forward
from anekit.kernels.config import ModelConfig

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


def step_kernels(cfg: ModelConfig, weights: str = "baked") -> list[StepKernel]:
    """Every kernel a training step of ``cfg`` evaluates, in step order (generated from shapes only)."""
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {WEIGHT_MODES}, not {weights!r}")
    n = cfg.n_layers
    if weights == "baked":
        specs = [
            ("sdpa_fwd", forward.sdpa_fwd(cfg, None), "attention", "forward"),
            ("ffn_fwd", forward.ffn_fwd(cfg, None), "ffn", "forward"),
            ("ffn_bwd", backward.ffn_bwd(cfg, None), "ffn", "backward"),
            ("sdpa_bwd1", attention_bwd.sdpa_bwd1(cfg, None), "attention", "backward"),
        ]
    else:
        specs = [
            ("sdpa_fwd_dynamic", dynamic.sdpa_fwd_dynamic(cfg), "attention", "forward"),
            ("ffn_fwd_dynamic", dynamic.ffn_fwd_dynamic(cfg), "ffn", "forward"),
            ("ffn_bwd_w2t_dynamic", dynamic.ffn_bwd_w2t_dynamic(cfg), "ffn", "backward"),
            ("ffn_bwd_w13t_dynamic", dynamic.ffn_bwd_w13t_dynamic(cfg), "ffn", "backward"),
            ("wo_t", dynamic.wo_t_dynamic(cfg), "attention", "backward"),
            ("sdpa_bwd1", attention_bwd.sdpa_bwd1_weightless(cfg), "attention", "backward"),
        ]
    specs.append(("sdpa_bwd2", attention_bwd.sdpa_bwd2(cfg), "attention", "backward"))
    if weights == "baked":
        specs.append(("qkv_bwd", attention_bwd.qkv_bwd(cfg, None), "attention", "backward"))
    else:
        specs.append(("qkv_bwd_dynamic", dynamic.qkv_bwd_dynamic(cfg), "attention", "backward"))
    return [StepKernel(count(spec.program, name), 1, n, kind, d) for name, spec, kind, d in specs]


def host_flops(cfg: ModelConfig) -> float:
    """FLOPs the CPU does per step: the classifier (logits, dlogits @ x^T, classifier^T @ dlogits) and
    every weight gradient dW = dY @ X^T (untimed by this model)."""
    d, kv, h, t = cfg.dim, cfg.kv_dim, cfg.hidden_dim, cfg.seq_len
    classifier = 3 * 2.0 * cfg.vocab_size * d * t
    q = cfg.q_dim
    per_layer = 2.0 * t * (q * d + 2 * kv * d + d * q + 3 * h * d)  # wq, wk, wv, wo, w1, w2, w3
    return classifier + cfg.n_layers * per_layer
