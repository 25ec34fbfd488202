"""The engine's forward kernels are a lowering of the model family's blocks: a change to the family's
layer is a change to the kernels, baked and packed, and the lowering refuses a plan its kernel does not
bake."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import ModelConfig, dynamic, forward
from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.mil_blocks import MilBlocks
from anekit.kernels.source import Baked
from anekit.kernels.spec import Layout, LayoutError
from anekit.llama import Params
from anekit.models.blocks import LayerPlan, Rope
from anekit.models.llama import Llama

CFG = ModelConfig(32, 48, 2, 4, 2, 64, 32)


class Doubled(Llama):
    """Llama whose attention and MLP blocks return twice their output."""

    def attention(self, b, x, plan):
        return b.scale(super().attention(b, x, plan), 2.0, name="doubled")

    def mlp(self, b, x, plan):
        return b.scale(super().mlp(b, x, plan), 2.0, name="doubled")


def _outputs(weights, x):
    """o_out and ffn_out of the baked and the packed kernels for input x (dim, S)."""
    sim = runtime.open("sim")
    return {
        "sdpa baked": forward.sdpa_fwd(CFG, weights).run(sim, x=x)["o_out"],
        "ffn baked": forward.ffn_fwd(CFG, weights).run(sim, x=x)["ffn_out"],
        "sdpa packed": dynamic.sdpa_fwd_dynamic(CFG).run(sim, weights, x=x)["o_out"],
        "ffn packed": dynamic.ffn_fwd_dynamic(CFG).run(sim, weights, x=x)["ffn_out"],
    }


def test_the_kernels_follow_the_familys_blocks(monkeypatch):
    weights = Params.init(CFG, seed=1).kernel_weights(0)
    x = np.random.default_rng(2).standard_normal((CFG.dim, CFG.seq_len)).astype(np.float32)
    before = _outputs(weights, x)
    monkeypatch.setattr(forward, "model_for", lambda cfg: Doubled(cfg))
    after = _outputs(weights, x)
    for key, value in before.items():
        assert np.abs(value).max() > 0
        np.testing.assert_allclose(after[key], 2 * value, rtol=2e-3, atol=1e-6, err_msg=key)


def test_the_lowering_refuses_a_plan_its_kernel_does_not_bake():
    def blocks() -> MilBlocks:
        return MilBlocks(
            Baked(KernelBuilder("sdpa_fwd", CFG, Layout.of([("x", CFG.dim)], CFG.seq_len), None))
        )

    model = Llama(CFG)
    for plan in (
        LayerPlan(0, "full", 8, Rope(CFG.rope_theta), CFG.scores_scale),  # a window the mask lacks
        LayerPlan(0, "full", 0, Rope(CFG.rope_theta), 0.5),  # another score scale
        LayerPlan(0, "full", 0, Rope(500.0), CFG.scores_scale),  # RoPE tables of another base
    ):
        b = blocks()
        with pytest.raises(LayoutError, match=r"\[sdpa_fwd\] (attention|RoPE)"):
            model.attention(b, b.kb.part("x"), plan)
    b = blocks()
    with pytest.raises(LayoutError, match=r"offset 1\.0"):
        b.rms_norm(b.kb.part("x"), "rms_att", offset=1.0, name="att_norm")


def test_a_block_result_after_its_tap_moves_the_tap_to_the_pre_norm_name():
    kb = KernelBuilder("t", CFG, Layout.of([("x", 4)], CFG.seq_len), None)
    a, b = kb.part("x"), kb.f.mul(x=kb.part("x"), y=2.0, name="b")
    assert forward.block_taps({"o_out": a}, b, "o_out", "o_pre") == {"o_out": b, "o_pre": a}
    assert forward.block_taps({"o_out": a}, a, "o_out", "o_pre") == {"o_out": a}
