"""The SDPA forward kernel against its float64 reference: GQA, RoPE, presets, a real checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.kernels import LayoutError, ModelConfig, forward, preset, reference
from tests.kernel_weights import fp16_exact, random_layer, stories260k_layer

CONFIGS = {
    "gqa-rope": ModelConfig(64, 128, 1, 8, 4, 100, 32),
    "mha-rope": ModelConfig(64, 128, 1, 4, 4, 100, 32),
    "gqa-norope": ModelConfig(48, 96, 1, 6, 2, 100, 32, rope=False),
    "mqa-rope": ModelConfig(32, 64, 1, 4, 1, 100, 32),
}


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("name", CONFIGS)
def test_sdpa_fwd_matches_the_reference(name):
    cfg = CONFIGS[name]
    w = random_layer(cfg, seed=1)
    x = fp16_exact(np.random.default_rng(2).standard_normal((cfg.dim, cfg.seq_len)))
    got = forward.sdpa_fwd(cfg, w).run(runtime.open("sim"), x=x)
    want = reference.sdpa_fwd(cfg, x, w)
    assert list(got) == ["o_out", "q", "k", "v", "attn_out", "xnorm"]
    for tap in want:
        assert got[tap].shape == want[tap].shape
        assert _rel(got[tap], want[tap]) < 5e-3, tap


def test_layout_of_the_taps():
    cfg = CONFIGS["gqa-rope"]
    layout = forward.sdpa_fwd_layout(cfg)
    assert layout.parts == (("o_out", 64), ("q", 64), ("k", 32), ("v", 32), ("attn_out", 64), ("xnorm", 64))
    assert layout.range("v") == (160, 32) and layout.channels == 320


def test_real_checkpoint_layer_computes_what_it_was_trained_to():
    cfg, w = stories260k_layer(0)
    cfg = cfg.with_(seq_len=64)  # a shorter window of the same model: the first 64 positions
    x = fp16_exact(w["embed"][np.arange(64) % cfg.vocab_size].T)  # (dim, 64): token embeddings
    w16 = {k: fp16_exact(v) for k, v in w.items()}
    got = forward.sdpa_fwd(cfg, w16).run(runtime.open("sim"), x=x)
    want = reference.sdpa_fwd(cfg, x, w16)
    for tap in want:
        assert _rel(got[tap], want[tap]) < 1e-2, tap


@pytest.mark.parametrize("name", ["stories15M", "stories110M", "stories260K"])
def test_presets_generate_programs_whose_shapes_verify(name):
    spec = forward.sdpa_fwd(preset(name))
    mil.verify(mil.parse(spec.text()))
    cfg = preset(name)
    assert spec.inputs.channels == cfg.dim and spec.outputs.channels == 4 * cfg.dim + 2 * cfg.kv_dim


def test_weights_of_the_wrong_shape_are_rejected():
    cfg = CONFIGS["gqa-rope"]
    w = random_layer(cfg)
    w["wk"] = w["wk"].T
    with pytest.raises(LayoutError, match=r"weight 'wk' has shape \[64, 32\], expected \[32, 64\]"):
        forward.sdpa_fwd(cfg, w)
    with pytest.raises(LayoutError, match="weight 'wq' was not given"):
        forward.sdpa_fwd(cfg, {"rms_att": w["rms_att"]})


def test_shape_only_kernels_have_no_weight_data():
    spec = forward.sdpa_fwd(CONFIGS["gqa-rope"])
    with pytest.raises(LayoutError, match="generated from shapes only"):
        spec.weight_files()


def test_the_causal_mask_is_one_cached_blob_shared_by_kernels():
    cfg = CONFIGS["gqa-rope"]
    a, b = forward.sdpa_fwd(cfg), forward.sdpa_fwd(cfg, random_layer(cfg))
    path = "@model_path/weights/mask.bin"
    assert a.shared_files[path] is b.shared_files[path]  # built once per sequence length
    assert "mask.bin" in a.text() and path in b.weight_files()
