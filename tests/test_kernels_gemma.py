"""Gemma 3's engine kernels: the banded mask of sliding layers, the GeGLU backward against float64 math,
every kernel (baked, dynamic, each layer kind's) verified and lint-clean for every chip, a dump that the
linter reads back, and the cost model over the config."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.cli.kernels_cmd import write_kernels
from anekit.cli.main import main
from anekit.cost import DEVICES, chip, fitted, predict, step_kernels
from anekit.kernels import ModelConfig, backward, catalog
from anekit.kernels.blocks import MASK_VALUE, causal_mask
from anekit.llama import Params
from anekit.rules import CHIPS, check_program, errors

CFG = ModelConfig(
    64,
    128,
    3,
    4,
    1,
    96,
    64,
    norm_eps=1e-6,
    rope_theta=1e6,
    attn_head_dim=32,
    qk_norm=True,
    norm_offset=1.0,
    post_norms=True,
    mlp_act="gelu_tanh",
    embed_scale=8.0,
    attn_scale=32**-0.5,
    sliding_window=16,
    layer_types=("sliding", "sliding", "full"),
    rope_local_theta=1e4,
    name="gemma3-small",
)
NAMES = [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS, *catalog.DYNAMIC_KERNELS, *catalog.DYNAMIC_HELPERS]


def test_the_sliding_mask_is_the_band_of_the_last_window_positions():
    seq, window = 12, 4
    got = causal_mask(seq, window)[0, 0]
    for i in range(seq):
        for j in range(seq):
            visible = i - window < j <= i  # key j seen by query i, itself included
            assert got[i, j] == (0.0 if visible else MASK_VALUE), (i, j)
    assert (causal_mask(seq)[0, 0] == np.where(np.tril(np.ones((seq, seq))) > 0, 0.0, MASK_VALUE)).all()


def test_geglu_backward_kernel_matches_float64_derivatives():
    """ffn_bwd with GeGLU over pre-activations h1 in [-12, 12] (past the clip at 8 on both sides)."""
    cfg = ModelConfig(32, 64, 1, 2, 2, 16, 64, mlp_act="gelu_tanh")
    rng = np.random.default_rng(0)
    w = {k: (rng.standard_normal(s) / math.sqrt(s[-1])).astype(np.float32) for k, s in
         (("w1", (64, 32)), ("w2", (32, 64)), ("w3", (64, 32)))}  # fmt: skip
    h1 = np.linspace(-12, 12, 64 * 64).reshape(64, 64).astype(np.float16).astype(np.float32)
    h3 = rng.uniform(-2, 2, (64, 64)).astype(np.float16).astype(np.float32)
    dffn = rng.standard_normal((32, 64)).astype(np.float16).astype(np.float32)
    got = backward.ffn_bwd(cfg, w).run(runtime.open("sim"), dffn=dffn, h1=h1, h3=h3)
    x = h1.astype(np.float64)
    c = math.sqrt(2 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    gelu = 0.5 * x * (1 + t)
    slope = 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * c * (1 + 3 * 0.044715 * x**2)
    g = w["w2"].T.astype(np.float64) @ dffn  # (hidden, T)
    want_dh1, want_dh3 = g * h3 * slope, g * gelu
    for key, want in (("dh1", want_dh1), ("dh3", want_dh3)):
        assert np.abs(got[key] - want).max() < 2e-2 * np.abs(want).max(), key
    want_dx = w["w1"].T @ want_dh1 + w["w3"].T @ want_dh3
    assert np.abs(got["dx"] - want_dx).max() < 2e-2 * np.abs(want_dx).max()
    # Far out (x^2 overflows fp16 from 256, x^3 from 40) the slope is exactly 1 or 0: no inf, no NaN, on
    # the chips' numerics (where an indeterminate 0 * inf gives +0) and on IEEE fp16 alike.
    big = np.resize(np.array([-60000, -1000, -300, -50, 50, 300, 1000, 60000], np.float32), (64, 64))
    gh3 = g * h3
    for backend in (runtime.open("sim"), runtime.open("sim", numerics="ieee")):
        far = backward.ffn_bwd(cfg, w).run(backend, dffn=dffn, h1=big, h3=h3)
        assert np.abs(far["dh1"] - gh3 * (big > 0)).max() < 1e-2 * np.abs(gh3).max()


def test_each_kind_has_its_own_attention_kernels():
    names = catalog.with_kinds(CFG, NAMES)
    assert [n for n in names if n.endswith("_sliding")] == [f"{n}_sliding" for n in catalog.BY_KIND]
    assert catalog.with_kinds(CFG.with_(layer_types=(), sliding_window=0), NAMES) == NAMES
    full, sliding = (catalog.build(n, CFG, None) for n in ("sdpa_fwd", "sdpa_fwd_sliding"))
    assert set(full.shared_files) == {"@model_path/weights/mask.bin"}
    assert set(sliding.shared_files) == {"@model_path/weights/mask_window16.bin"}
    assert full.text() != sliding.text()  # the RoPE tables differ too (their own base)


@pytest.mark.parametrize("name", catalog.with_kinds(CFG, NAMES))
def test_every_kernel_verifies_and_lints_clean_for_every_chip(name):
    spec = catalog.build(name, CFG, Params.init(CFG, seed=1).kernel_weights(0))
    mil.verify(spec.program)
    for target in ("any", *CHIPS):
        broken = errors(check_program(spec.program, chip=target))
        assert not broken, (name, target, [str(f) for f in broken])


def test_a_dump_of_the_kernels_lints_without_errors(tmp_path, capsys):
    names = catalog.with_kinds(CFG, NAMES)
    write_kernels(tmp_path / "dump", names, CFG, Params.init(CFG, seed=2).kernel_weights(0))
    assert len(list((tmp_path / "dump").rglob("*.mil"))) == len(names)
    for target in ("any", *CHIPS):
        assert main(["lint", str(tmp_path / "dump"), "--errors-only", "--chip", target]) == 0, target
    assert f"{len(names)} programs: 0 errors" in capsys.readouterr().out


@pytest.mark.parametrize("weights", ["baked", "dynamic"])
def test_the_cost_model_prices_every_kernel_of_the_step(weights):
    kernels = step_kernels(CFG, weights)
    assert sum(k.calls for k in kernels) == (6 if weights == "baked" else 8) * CFG.n_layers
    params = fitted()
    for device in DEVICES:
        perf = chip(device)
        times = [predict(k.work, perf, params).ms * k.calls for k in kernels]
        assert all(math.isfinite(t) and t > 0 for t in times), device
