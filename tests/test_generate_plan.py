"""The generation plan: widths, capacities, layer groups under the weight ceiling, vocabulary tiles under
the channel limit, the kernel count against the loaded-program ceiling — checked over every small case
against the limits written out here, and on Qwen3-0.6B's shape (151936 tokens: 3 tiles)."""

from __future__ import annotations

import itertools

import pytest

from anekit.engine.generation_routes import ROUTE_IDS, UnknownGenerationRoute, generation_route
from anekit.generate.plan import PlanRefused, generation_plan, layer_bytes
from anekit.models.config import ModelConfig

CHANNEL_LIMIT = 65536  # extent.channels
GIB2 = 2**31  # program.weight-ceiling
LOADED = 120  # process.loaded-program-ceiling, as anekit keeps it


def _cfg(layers: int = 4, vocab: int = 512, seq: int = 256, dim: int = 64, **kw: object) -> ModelConfig:
    return ModelConfig(
        dim=dim,
        hidden_dim=2 * dim,
        n_layers=layers,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=vocab,
        seq_len=seq,
        **kw,
    )


QWEN3_06B = ModelConfig(
    dim=1024,
    hidden_dim=3072,
    n_layers=28,
    n_heads=16,
    n_kv_heads=8,
    vocab_size=151936,
    seq_len=4096,
    attn_head_dim=128,
    qk_norm=True,
    rope_theta=1e6,
    norm_eps=1e-6,
)


def _fp16_layer(cfg: ModelConfig) -> int:
    """The layer's fp16 values, written out separately: the plan counts them plus 64-byte records."""
    d, h, q, kv = cfg.dim, cfg.hidden_dim, cfg.q_dim, cfg.kv_dim
    return 2 * (q * d + 2 * kv * d + d * q + 3 * h * d + 2 * d + (2 * cfg.head_dim if cfg.qk_norm else 0))


@pytest.mark.parametrize(
    "layers,per_kernel,vocab,seq,route",
    list(itertools.product((1, 2, 3, 5, 8), (1, 2, 3, 7), (16, 100, 4096), (40, 256, 1000), ROUTE_IDS)),
)
def test_every_small_case_keeps_every_limit(layers, per_kernel, vocab, seq, route):
    cfg = _cfg(layers, vocab, seq)
    per = layer_bytes(cfg)
    assert _fp16_layer(cfg) < per < _fp16_layer(cfg) + 64 * 20  # values plus a record per tensor
    ceiling = per * per_kernel + per // 2  # room for per_kernel layers, not one more
    plan = generation_plan(cfg, route, weight_ceiling=ceiling)
    # the groups cover the layers in order, without gaps
    assert plan.groups[0][0] == 0 and plan.groups[-1][1] == layers
    assert all(a[1] == b[0] for a, b in zip(plan.groups, plan.groups[1:]))
    fused = route in ("baked-fused", "baked-fused-rope-matmul", "legacy")
    for (a, b), nbytes in zip(plan.groups, plan.group_bytes):
        assert nbytes <= ceiling
        assert b - a == (min(per_kernel, layers - a) if fused else 1)  # as many as fit, when fused
    # tiles: equal, covering, under the channel limit and the ceiling
    assert plan.tiles[0][0] == 0 and plan.tiles[-1][1] == vocab
    sizes = [b - a for a, b in plan.tiles]
    assert max(sizes) - min(sizes) <= len(sizes) and max(sizes) <= CHANNEL_LIMIT
    assert all(2 * s * cfg.dim < ceiling for s in sizes)
    if route == "dynamic-engine-attention":  # the rows in the input's columns after W: 16384 columns at most
        assert max(sizes) + -(-plan.prefill_width // 64) * 64 <= 16384
    # widths and capacities: the softmax axis a power of two, the context fits
    assert plan.decode_width == 32 and plan.prefill_width % 16 == 0 and plan.prefill_width >= 32
    for w in plan.widths:
        cap = plan.capacity_for(w)
        slots = cap + w
        assert slots & (slots - 1) == 0 and cap >= seq and slots // 2 < seq + w
    per_set = len(plan.groups) * {"dynamic-engine-attention": 2, "conv-host-attention": 3}.get(route, 1)
    assert plan.kernel_count == (per_set + len(plan.tiles)) * len(plan.widths) <= LOADED
    assert len(plan.weight_bytes) == per_set + len(plan.tiles)


def test_qwen3_0_6b_has_three_tiles_and_fits_one_kernel_under_two_gib():
    plan = generation_plan(QWEN3_06B, generation_route("m4", "26"))
    assert plan.route == "baked-fused" and plan.chip == "m4"
    assert plan.tiles == ((0, 50646), (50646, 101292), (101292, 151936))
    assert len(plan.groups) == 1 and plan.group_bytes[0] < GIB2  # 28 layers, ~0.9 GB of fp16 weights
    assert plan.kernel_count == 2 * (1 + 3)
    dynamic = generation_plan(QWEN3_06B, "dynamic-engine-attention")  # tiles of at most 16384 - 128 rows
    assert len(dynamic.tiles) == 10 and dynamic.widths == (32,) and dynamic.kernel_count == 28 * 2 + 10
    # on the host-attention route: 3 convs a layer, so two sets would be 174 kernels: one set at width 32
    conv = generation_plan(QWEN3_06B, "conv-host-attention")
    assert conv.widths == (32,) and conv.kernel_count == 28 * 3 + 3
    with pytest.raises(PlanRefused) as e:
        generation_plan(QWEN3_06B, "conv-host-attention", prefill_width=128)
    assert (
        "174 kernels" in str(e.value)
        and "120" in str(e.value)
        and "process.loaded-program-ceiling" in str(e.value)
    )


def test_a_heavy_model_is_segmented_and_a_heavier_layer_refused():
    cfg = _cfg(layers=6)
    per = layer_bytes(cfg)
    plan = generation_plan(cfg, "baked-fused", weight_ceiling=2 * per)
    assert plan.groups == ((0, 2), (2, 4), (4, 6))
    with pytest.raises(PlanRefused) as e:
        generation_plan(cfg, "baked-fused", weight_ceiling=per - 1)
    assert "program.weight-ceiling" in str(e.value) and "\n" not in str(e.value)
    # weights in the input surface are not baked: a dynamic route still runs a layer a kernel set
    assert generation_plan(cfg, "dynamic-engine-attention", weight_ceiling=per - 1).groups[0] == (0, 1)


def test_too_many_kernels_are_refused_naming_the_limit():
    cfg = _cfg(layers=45)
    with pytest.raises(PlanRefused) as e:
        generation_plan(cfg, "conv-host-attention")  # 135 + 1 kernels even in one set
    assert "136 kernels" in str(e.value) and "120" in str(e.value)


def test_bad_widths_contexts_and_routes_are_one_line():
    cfg = _cfg()
    for width in (16, 40, 100):
        with pytest.raises(PlanRefused) as e:
            generation_plan(cfg, "baked-fused", prefill_width=width)
        assert "multiple of 16" in str(e.value)
    with pytest.raises(PlanRefused) as e:
        generation_plan(_cfg(seq=16384), generation_route("m1", "26"))
    assert "extent.spatial" in str(e.value) and "16384" in str(e.value)
    assert generation_plan(_cfg(seq=16384), generation_route("m4", "26")).capacity == 32768 - 32
    with pytest.raises(UnknownGenerationRoute):
        generation_plan(cfg, "fastest")
    with pytest.raises(PlanRefused):
        generation_plan(cfg, "baked-fused", weight_ceiling=0)
