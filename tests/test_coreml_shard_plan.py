"""The shard planner's byte count (``stage_weight_bytes``) against the weights' own sizes: a stage's planned
bytes must cover every tensor it stores, FFN included, so a shard never exceeds --shard-mb (law 4)."""

from __future__ import annotations

import numpy as np
import pytest

from anekit.coreml.export import Stage, stage_weight_bytes
from anekit.coreml.shards import plan_shards
from anekit.kernels.config import ModelConfig
from anekit.llama.params import layer_shapes

CFGS = [
    ModelConfig(64, 172, 4, 8, 4, 512, 64, name="gqa"),  # hidden_dim not a multiple of dim: FFN counted apart
    ModelConfig(288, 768, 6, 6, 6, 32000, 256, name="stories15M"),
    # Qwen 3's shape in small: q_dim 128 != dim 64, q / k / v biases and the per-head q / k norm scales
    ModelConfig(64, 96, 3, 8, 4, 256, 32, attn_head_dim=16, qkv_bias=True, qk_norm=True, name="qwen3-like"),
]


@pytest.mark.parametrize("cfg", CFGS, ids=[c.name for c in CFGS])
def test_each_planned_layer_counts_exactly_its_weights_in_fp16(cfg):
    """One more layer in a stage adds exactly that layer's tensors (wq wk wv wo w1 w2 w3, two RMSNorm
    scales, and the biases and q / k norm scales a Hugging Face model has) at 2 bytes each: the per-layer
    count is the weights' sum, neither more nor less."""
    per_layer = 2 * sum(int(np.prod(s)) for s in layer_shapes(cfg).values())
    one = stage_weight_bytes(cfg, Stage(False, (0,), False))
    two = stage_weight_bytes(cfg, Stage(False, (0, 1), False))
    assert two - one == per_layer
    ffn = 2 * sum(int(np.prod(layer_shapes(cfg)[k])) for k in ("w1", "w2", "w3"))
    assert one >= ffn + 2 * sum(int(np.prod(layer_shapes(cfg)[k])) for k in ("wq", "wk", "wv", "wo"))


@pytest.mark.parametrize("cfg", CFGS, ids=[c.name for c in CFGS])
def test_the_planned_bytes_of_the_whole_model_cover_every_weight(cfg):
    tensors = 2 * (cfg.n_layers * sum(int(np.prod(s)) for s in layer_shapes(cfg).values()) + cfg.dim)
    tensors += 2 * cfg.vocab_size * cfg.dim  # the tied embedding / classifier, stored once
    whole = stage_weight_bytes(cfg, Stage.whole(cfg))
    assert whole >= tensors
    stages = plan_shards(cfg, 1e6)  # a limit it never reaches: the plan still counts every layer once
    assert sum(len(s.layers) for s in stages) == cfg.n_layers
