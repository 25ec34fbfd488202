"""Model configurations: presets, derived sizes, and configs the engine cannot run rejected with the rule."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from anekit.blob import BlobFile
from anekit.kernels import ConfigError, ModelConfig, preset
from anekit.kernels.blocks import causal_mask, causal_mask_blob, rope_tables
from tests.conftest import corpus_path


def test_presets():
    big = preset("stories110M")
    assert (big.dim, big.hidden_dim, big.n_layers, big.n_heads, big.seq_len, big.vocab_size) == (
        768,
        2048,
        12,
        12,
        256,
        32000,
    )
    assert big.head_dim == 64 and big.kv_dim == 768 and big.kv_group == 1
    small = preset("stories260K")
    assert (small.n_heads, small.n_kv_heads, small.kv_dim, small.kv_group) == (8, 4, 32, 2)
    with pytest.raises(ConfigError, match="unknown preset 'gpt5'"):
        preset("gpt5")


def test_stories260k_preset_matches_the_checkpoint_header():
    header = struct.unpack("<7i", corpus_path("llama2c", "stories260K.bin").read_bytes()[:28])
    cfg = preset("stories260K")
    assert header == (
        cfg.dim,
        cfg.hidden_dim,
        cfg.n_layers,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.vocab_size,
        cfg.seq_len,
    )


@pytest.mark.parametrize(
    "changes, rule",
    [
        ({"n_heads": 5}, "dim 64 is not divisible by n_heads 5"),
        ({"n_kv_heads": 3}, "n_heads 8 is not divisible by n_kv_heads 3"),
        ({"dim": 72, "n_heads": 8, "n_kv_heads": 8}, "head_dim 9 must be even"),
        ({"dim": 0}, "dim must be a positive integer"),
        ({"norm_eps": 0.0}, "norm_eps must be > 0"),
    ],
)
def test_configs_no_model_can_have_are_rejected_with_the_rule(changes, rule):
    with pytest.raises(ConfigError, match=rule):
        preset("stories260K").with_(**changes)


@pytest.mark.parametrize(
    "changes, rule",
    [
        ({"vocab_size": 200_000}, "vocab_size = 200000 exceeds the engine's 17-bit channel limit 131071"),
        ({"n_heads": 64, "n_kv_heads": 64, "seq_len": 4096, "dim": 128}, "17-bit channel limit"),
        (
            {"seq_len": 40_000, "n_heads": 1, "n_kv_heads": 1},
            "seq_len 40000 exceeds the engine's 15-bit spatial limit 32767",
        ),
    ],
)
def test_configs_the_training_kernels_cannot_run_are_rejected_where_kernels_are_made(changes, rule):
    cfg = preset("stories260K").with_(**changes)  # a model may have this shape: it reads and samples
    with pytest.raises(ConfigError, match=rule):
        cfg.check_kernels()


def test_a_llama2_7b_shape_is_a_model_config_but_not_a_training_kernel_config():
    cfg = ModelConfig(4096, 11008, 32, 32, 32, 32000, 2048, name="llama2-7b")  # llama2.c export.py
    assert cfg.head_dim == 128
    with pytest.raises(ConfigError, match="SDPA backward 1 output"):
        cfg.check_kernels()
    for name in ("stories110M", "stories15M", "stories260K", "default"):
        assert preset(name).check_kernels() is preset(name)


def test_odd_head_dim_is_fine_without_rope():
    cfg = ModelConfig(72, 128, 1, 8, 8, 100, 32, rope=False)
    assert cfg.head_dim == 9


def test_causal_mask_and_its_cached_blob():
    m = causal_mask(4)[0, 0]
    np.testing.assert_array_equal(m != 0, np.triu(np.ones((4, 4), bool), k=1))
    assert m.max() == 0 and m.min() == -65504
    blob = causal_mask_blob(4)
    assert causal_mask_blob(4) is blob  # built once
    with BlobFile(blob) as f:
        np.testing.assert_array_equal(f.read(64, (1, 1, 4, 4), "fp16"), causal_mask(4).astype(np.float16))


def test_rope_tables_equal_the_checkpoints_own_tables():
    """stories260K.bin stores llama2.c's freq_cis_real / imag (seq_len x head_dim/2): our cos / sin must match."""
    data = corpus_path("llama2c", "stories260K.bin").read_bytes()
    cfg = preset("stories260K")
    d, h, kv, layers, v = cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.n_layers, cfg.vocab_size
    floats_before = v * d + layers * (d + d * d + 2 * d * kv + d * d + d + 3 * d * h) + d
    half = cfg.head_dim // 2
    start = 28 + 4 * floats_before
    table = np.frombuffer(data, dtype="<f4", count=2 * cfg.seq_len * half, offset=start)
    real = table[: cfg.seq_len * half].reshape(cfg.seq_len, half)
    imag = table[cfg.seq_len * half :].reshape(cfg.seq_len, half)
    cos, sin = rope_tables(cfg, cfg.head_dim)  # one head: pairs 0..hd/2
    # The file's tables were computed with float32 angles: equal to ours within float32 angle error.
    np.testing.assert_allclose(cos[0, :, 0, :].T, real, atol=1e-5)
    np.testing.assert_allclose(sin[0, :, 0, :].T, imag, atol=1e-5)
