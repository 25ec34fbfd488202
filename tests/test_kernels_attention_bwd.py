"""The attention backward kernels (sdpa_bwd1, sdpa_bwd2, qkv_bwd) against their float64 references, and
the references against central finite differences of the forward reference: GQA, RoPE, presets.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.kernels import LayoutError, ModelConfig, forward, preset, reference
from anekit.kernels import attention_bwd as kernels
from anekit.kernels import reference_attention as ref
from tests.kernel_weights import fp16_exact, random_layer, stories260k_layer

CONFIGS = {
    "gqa-rope": ModelConfig(64, 128, 1, 8, 4, 100, 32),
    "mha-rope": ModelConfig(64, 128, 1, 4, 4, 100, 32),
    "gqa-norope": ModelConfig(48, 96, 1, 6, 2, 100, 32, rope=False),
    "mqa-rope": ModelConfig(32, 64, 1, 4, 1, 100, 32),
}

# Finite differences run in float64 on small shapes (every head, group and position still exercised).
FD_CONFIGS = {
    "gqa-rope": ModelConfig(16, 32, 1, 4, 2, 10, 6),
    "gqa-norope": ModelConfig(16, 32, 1, 4, 2, 10, 6, rope=False),
    "mha-rope": ModelConfig(12, 32, 1, 2, 2, 10, 5),
    "mha-norope": ModelConfig(12, 32, 1, 2, 2, 10, 5, rope=False),
    "mqa-rope": ModelConfig(16, 32, 1, 4, 1, 10, 4),
}

# The kernels compute in fp16 storage with fp32 accumulation: measured errors (max-abs relative to the
# reference's max-abs) are at most 1.1e-3 per kernel and 1.9e-3 through the three chained kernels on the
# ideal machine; the engine's numerics (anekit.engine.numerics: 4-lane MAC tiles rounded toward zero) add
# up to about 3.5e-3 more on the real checkpoint's layer (5.2e-3 measured, profile "any").
TOL = 6e-3


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module")
def sim() -> runtime.Backend:
    return runtime.open("sim")


def _case(cfg: ModelConfig, seed: int = 1, q_gain: float = 1.0) -> tuple[dict, dict, np.ndarray]:
    """fp16-exact weights, the forward reference's taps (rounded to fp16) and a gradient of o_out.

    ``q_gain`` scales Wq: larger gains sharpen the attention towards one-hot rows.
    """
    w = random_layer(cfg, seed=seed)
    w["wq"] = fp16_exact(w["wq"] * q_gain)
    rng = np.random.default_rng(seed + 100)
    x = fp16_exact(rng.standard_normal((cfg.dim, cfg.seq_len)))
    taps = {name: fp16_exact(a) for name, a in reference.sdpa_fwd(cfg, x, w).items()}
    taps["x"] = x
    do = fp16_exact(rng.standard_normal((cfg.dim, cfg.seq_len)))
    return w, taps, do


# -- kernels against their references ------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_sdpa_bwd1_matches_the_reference(sim, name):
    cfg = CONFIGS[name]
    w, t, do = _case(cfg)
    got = kernels.sdpa_bwd1(cfg, w).run(sim, q=t["q"], k=t["k"], v=t["v"], do=do)
    want = ref.sdpa_bwd1(cfg, t["q"], t["k"], t["v"], do, w)
    assert list(got) == ["dv", "probs", "dp"]
    for part in want:
        assert got[part].shape == want[part].shape
        assert _rel(got[part], want[part]) < TOL, part


@pytest.mark.parametrize("name", CONFIGS)
def test_sdpa_bwd1_probs_tap_is_the_forward_probabilities(sim, name):
    cfg = CONFIGS[name]
    w, t, do = _case(cfg)
    probs = kernels.sdpa_bwd1(cfg, w).run(sim, q=t["q"], k=t["k"], v=t["v"], do=do)["probs"]
    _, want = reference.attention(t["q"], t["k"], t["v"], cfg)  # (H, S, S)
    p = probs.reshape(cfg.n_heads, cfg.seq_len, cfg.seq_len)
    assert np.max(np.abs(p - want)) < 2e-3
    upper = np.triu_indices(cfg.seq_len, k=1)  # keys after the query: exactly 0
    assert np.all(p[:, upper[0], upper[1]] == 0)
    assert np.max(np.abs(p.sum(axis=-1) - 1)) < 5e-3


def test_sdpa_bwd1_recomputes_what_the_forward_kernel_attended_with(sim):
    """Fed the forward kernel's own q / k / v taps, the probs tap reproduces its attn_out tap."""
    cfg = CONFIGS["gqa-rope"]
    w, t, do = _case(cfg)
    fwd = forward.sdpa_fwd(cfg, w).run(sim, x=t["x"])
    probs = kernels.sdpa_bwd1(cfg, w).run(sim, q=fwd["q"], k=fwd["k"], v=fwd["v"], do=do)["probs"]
    hd, s = cfg.head_dim, cfg.seq_len
    attn = np.zeros((cfg.dim, s))
    for h in range(cfg.n_heads):
        g = h // cfg.kv_group
        attn[h * hd : (h + 1) * hd] = fwd["v"][g * hd : (g + 1) * hd] @ probs[h * s : (h + 1) * s].T
    assert _rel(attn, fwd["attn_out"]) < TOL


@pytest.mark.parametrize("name", CONFIGS)
def test_sdpa_bwd2_matches_the_reference(sim, name):
    cfg = CONFIGS[name]
    w, t, do = _case(cfg)
    one = {k: fp16_exact(v) for k, v in ref.sdpa_bwd1(cfg, t["q"], t["k"], t["v"], do, w).items()}
    got = kernels.sdpa_bwd2(cfg).run(sim, probs=one["probs"], dp=one["dp"], q=t["q"], k=t["k"])
    want = ref.sdpa_bwd2(cfg, one["probs"], one["dp"], t["q"], t["k"])
    assert list(got) == ["dq", "dk"]
    for part in want:
        assert got[part].shape == want[part].shape
        assert _rel(got[part], want[part]) < TOL, part


@pytest.mark.parametrize("name", CONFIGS)
def test_qkv_bwd_matches_the_reference(sim, name):
    cfg = CONFIGS[name]
    w, _, _ = _case(cfg)
    rng = np.random.default_rng(7)
    d, kv, s = cfg.dim, cfg.kv_dim, cfg.seq_len
    dq, dk, dv = (fp16_exact(rng.standard_normal((c, s))) for c in (d, kv, kv))
    got = kernels.qkv_bwd(cfg, w).run(sim, dq=dq, dk=dk, dv=dv)
    want = ref.qkv_bwd(cfg, dq, dk, dv, w)
    assert list(got) == ["dx"] and got["dx"].shape == (d, s)
    assert _rel(got["dx"], want["dx"]) < 2e-3


def _chain(sim, cfg: ModelConfig, w: dict, t: dict, do: np.ndarray) -> dict[str, np.ndarray]:
    """The three kernels run one after the other, each fed the previous kernels' fp16 outputs."""
    one = kernels.sdpa_bwd1(cfg, w).run(sim, q=t["q"], k=t["k"], v=t["v"], do=do)
    two = kernels.sdpa_bwd2(cfg).run(sim, probs=one["probs"], dp=one["dp"], q=t["q"], k=t["k"])
    dx = kernels.qkv_bwd(cfg, w).run(sim, dq=two["dq"], dk=two["dk"], dv=one["dv"])["dx"]
    return {"dq": two["dq"], "dk": two["dk"], "dv": one["dv"], "dx": dx}


@pytest.mark.parametrize("name", CONFIGS)
def test_the_chained_kernels_match_the_composed_reference(sim, name):
    cfg = CONFIGS[name]
    w, t, do = _case(cfg)
    got = _chain(sim, cfg, w, t, do)
    want = ref.sdpa_bwd(cfg, t["q"], t["k"], t["v"], do, w)
    for part in got:
        assert _rel(got[part], want[part]) < TOL, part


def test_sharp_attention_keeps_its_accuracy(sim):
    """Wq scaled 4x: attention rows near one-hot, where P * (dP - rowsum) cancels the most."""
    cfg = CONFIGS["gqa-rope"]
    w, t, do = _case(cfg, q_gain=4.0)
    got = _chain(sim, cfg, w, t, do)
    want = ref.sdpa_bwd(cfg, t["q"], t["k"], t["v"], do, w)
    assert np.max(want["probs"]) > 0.99
    for part in got:
        assert _rel(got[part], want[part]) < TOL, part


def test_real_checkpoint_layer(sim):
    cfg, w = stories260k_layer(0)
    cfg = cfg.with_(seq_len=64)  # the first 64 positions of the real model (8 heads, 4 kv heads)
    w = {k: fp16_exact(v) for k, v in w.items()}
    x = fp16_exact(w["embed"][np.arange(64) % cfg.vocab_size].T)  # (dim, 64)
    t = {name: fp16_exact(a) for name, a in reference.sdpa_fwd(cfg, x, w).items()}
    do = fp16_exact(np.random.default_rng(3).standard_normal((cfg.dim, 64)))
    got = _chain(sim, cfg, w, t, do)
    want = ref.sdpa_bwd(cfg, t["q"], t["k"], t["v"], do, w)
    for part in got:
        assert _rel(got[part], want[part]) < TOL, part


# -- the references against finite differences of the forward reference --------------------------------


def _rope(cfg: ModelConfig, a: np.ndarray) -> np.ndarray:
    return reference.rope(a, cfg) if cfg.rope else a


def _o_out(cfg: ModelConfig, w: dict, q_pre: np.ndarray, k_pre: np.ndarray, v: np.ndarray) -> np.ndarray:
    """o_out of the forward reference as a function of the projections (q / k before RoPE)."""
    att, _ = reference.attention(_rope(cfg, q_pre), _rope(cfg, k_pre), v, cfg)
    return w["wo"] @ att


def _fd_case(cfg: ModelConfig, seed: int = 5) -> tuple[dict, dict[str, np.ndarray], np.ndarray]:
    """float64 weights (not rounded), the pre-RoPE projections and xnorm, a gradient of o_out."""
    rng = np.random.default_rng(seed)
    w = {k: np.asarray(v, dtype=np.float64) for k, v in random_layer(cfg, seed=seed).items()}
    w["wq"] = w["wq"] * 2.0  # sharper attention than uniform, so the softmax curvature matters
    x = rng.standard_normal((cfg.dim, cfg.seq_len))
    xn = reference.sdpa_fwd(cfg, x, w)["xnorm"]
    pre = {"q": w["wq"] @ xn, "k": w["wk"] @ xn, "v": w["wv"] @ xn, "xnorm": xn, "x": x}
    return w, pre, rng.standard_normal((cfg.dim, cfg.seq_len))


def _loss_of(cfg: ModelConfig, w: dict, pre: dict, do: np.ndarray) -> dict[str, Callable]:
    """L = <do, o_out> as a function of each of q, k, v (pre-RoPE) and xnorm, the others held."""

    def of_q(a):
        return float(np.sum(do * _o_out(cfg, w, a, pre["k"], pre["v"])))

    def of_k(a):
        return float(np.sum(do * _o_out(cfg, w, pre["q"], a, pre["v"])))

    def of_v(a):
        return float(np.sum(do * _o_out(cfg, w, pre["q"], pre["k"], a)))

    def of_xnorm(a):
        return float(np.sum(do * _o_out(cfg, w, w["wq"] @ a, w["wk"] @ a, w["wv"] @ a)))

    return {"dq": (of_q, "q"), "dk": (of_k, "k"), "dv": (of_v, "v"), "dx": (of_xnorm, "xnorm")}


def _analytic(cfg: ModelConfig, w: dict, pre: dict, do: np.ndarray) -> dict[str, np.ndarray]:
    return ref.sdpa_bwd(cfg, _rope(cfg, pre["q"]), _rope(cfg, pre["k"]), pre["v"], do, w)


def test_the_projection_form_is_the_forward_reference():
    """_o_out (what the finite differences differentiate) is reference.sdpa_fwd's o_out."""
    for cfg in FD_CONFIGS.values():
        w, pre, _ = _fd_case(cfg)
        want = reference.sdpa_fwd(cfg, pre["x"], w)["o_out"]
        assert np.max(np.abs(_o_out(cfg, w, pre["q"], pre["k"], pre["v"]) - want)) < 1e-12


@pytest.mark.parametrize("name", FD_CONFIGS)
def test_reference_gradients_match_directional_finite_differences(name):
    cfg = FD_CONFIGS[name]
    w, pre, do = _fd_case(cfg)
    grads = _analytic(cfg, w, pre, do)
    rng = np.random.default_rng(11)
    eps = 1e-5
    for part, (loss, wrt) in _loss_of(cfg, w, pre, do).items():
        for _ in range(3):
            u = rng.standard_normal(pre[wrt].shape)
            fd = (loss(pre[wrt] + eps * u) - loss(pre[wrt] - eps * u)) / (2 * eps)
            exact = float(np.sum(grads[part] * u))
            assert abs(fd - exact) <= 1e-6 * abs(exact), (part, fd, exact)


def test_reference_gradients_match_per_element_finite_differences():
    cfg = ModelConfig(8, 16, 1, 2, 1, 10, 4)  # GQA (2 query heads on 1 kv head) with RoPE
    w, pre, do = _fd_case(cfg, seed=9)
    grads = _analytic(cfg, w, pre, do)
    eps = 1e-5
    for part, (loss, wrt) in _loss_of(cfg, w, pre, do).items():
        fd = np.zeros_like(pre[wrt])
        for idx in np.ndindex(*fd.shape):
            e = np.zeros_like(fd)
            e[idx] = eps
            fd[idx] = (loss(pre[wrt] + e) - loss(pre[wrt] - e)) / (2 * eps)
        assert np.max(np.abs(fd - grads[part])) <= 1e-6 * np.max(np.abs(grads[part])), part


@pytest.mark.parametrize("name", ["gqa-rope", "gqa-norope"])
def test_dx_matches_finite_differences_of_sdpa_fwd_through_its_xnorm_tap(name):
    """Perturb the layer input x: <do, D o_out[u]> = <dx, D xnorm[u]>, both taps of reference.sdpa_fwd."""
    cfg = FD_CONFIGS[name]
    w, pre, do = _fd_case(cfg)
    dx = _analytic(cfg, w, pre, do)["dx"]
    rng = np.random.default_rng(12)
    eps = 1e-5
    for _ in range(3):
        u = rng.standard_normal(pre["x"].shape)
        plus = reference.sdpa_fwd(cfg, pre["x"] + eps * u, w)
        minus = reference.sdpa_fwd(cfg, pre["x"] - eps * u, w)
        d_out = (plus["o_out"] - minus["o_out"]) / (2 * eps)
        d_xnorm = (plus["xnorm"] - minus["xnorm"]) / (2 * eps)
        lhs, rhs = float(np.sum(do * d_out)), float(np.sum(dx * d_xnorm))
        assert abs(lhs - rhs) <= 1e-6 * abs(rhs), (lhs, rhs)


def test_gqa_is_multi_head_attention_on_replicated_kv_heads():
    """GQA's gradients are those of MHA on k / v (and Wk / Wv) replicated per query head, with the
    replicas' dk / dv summed back into their kv head."""
    cfg = FD_CONFIGS["gqa-rope"]  # 4 query heads on 2 kv heads
    mha = cfg.with_(n_kv_heads=cfg.n_heads)
    w, pre, do = _fd_case(cfg)
    hd, group = cfg.head_dim, cfg.kv_group

    def replicate(a: np.ndarray) -> np.ndarray:  # (kv_dim, ...) -> (dim, ...): kv head h // group
        return np.concatenate([a[(h // group) * hd : (h // group + 1) * hd] for h in range(cfg.n_heads)])

    def fold(a: np.ndarray) -> np.ndarray:  # (dim, S) -> (kv_dim, S): sum of each group's replicas
        return a.reshape(cfg.n_kv_heads, group, hd, -1).sum(axis=1).reshape(cfg.kv_dim, -1)

    q, k = _rope(cfg, pre["q"]), _rope(cfg, pre["k"])
    got = ref.sdpa_bwd(cfg, q, k, pre["v"], do, w)
    w_mha = dict(w, wk=replicate(w["wk"]), wv=replicate(w["wv"]))
    want = ref.sdpa_bwd(mha, q, replicate(k), replicate(pre["v"]), do, w_mha)
    for part in ("dq", "dx", "probs", "dp"):
        assert np.max(np.abs(got[part] - want[part])) < 1e-12, part
    for part in ("dk", "dv"):
        assert np.max(np.abs(got[part] - fold(want[part]))) < 1e-12, part


# -- programs, layouts, weights ---------------------------------------------------------------------------

GENERATORS = {"sdpa_bwd1": kernels.sdpa_bwd1, "sdpa_bwd2": kernels.sdpa_bwd2, "qkv_bwd": kernels.qkv_bwd}


@pytest.mark.parametrize("name", ["stories15M", "stories110M", "stories260K"])
@pytest.mark.parametrize("kernel", GENERATORS)
def test_presets_generate_programs_whose_shapes_verify(name, kernel):
    cfg = preset(name)
    spec = GENERATORS[kernel](cfg)
    mil.verify(mil.parse(spec.text()))
    d, kv, scores = cfg.dim, cfg.kv_dim, cfg.n_heads * cfg.seq_len
    channels = {
        "sdpa_bwd1": (2 * d + 2 * kv, kv + 2 * scores),
        "sdpa_bwd2": (2 * scores + d + kv, d + kv),
        "qkv_bwd": (d + 2 * kv, d),
    }[kernel]
    assert (spec.inputs.channels, spec.outputs.channels) == channels


def test_layouts():
    cfg = CONFIGS["gqa-rope"]  # dim 64, kv_dim 32, 8 heads, seq 32: 256 score channels
    one_in, one_out = kernels.sdpa_bwd1_layouts(cfg)
    assert one_in.parts == (("q", 64), ("k", 32), ("v", 32), ("do", 64))
    assert one_out.parts == (("dv", 32), ("probs", 256), ("dp", 256))
    two_in, two_out = kernels.sdpa_bwd2_layouts(cfg)
    assert two_in.parts == (("probs", 256), ("dp", 256), ("q", 64), ("k", 32))
    assert two_out.parts == (("dq", 64), ("dk", 32))
    three_in, three_out = kernels.qkv_bwd_layouts(cfg)
    assert three_in.parts == (("dq", 64), ("dk", 32), ("dv", 32)) and three_out.parts == (("dx", 64),)
    assert one_out.range("dp") == (288, 256) and two_in.range("k") == (576, 32)


def test_weight_data():
    cfg = CONFIGS["gqa-rope"]
    # sdpa_bwd2 bakes no model weight: only RoPE's pair swap and tables (one set per channel count),
    # or nothing at all without RoPE
    assert [n for n, _, _ in kernels.sdpa_bwd2(cfg).weights.entries] == [
        "rope_swap_64",
        "rope_cos_64",
        "rope_sin_64",
        "rope_swap_32",
        "rope_cos_32",
        "rope_sin_32",
    ]
    assert kernels.sdpa_bwd2(cfg.with_(rope=False)).weight_files() == {}
    for gen in (kernels.sdpa_bwd1, kernels.qkv_bwd):
        with pytest.raises(LayoutError, match="generated from shapes only"):
            gen(cfg).weight_files()


def test_weights_of_the_wrong_shape_are_rejected():
    cfg = CONFIGS["gqa-rope"]
    w = random_layer(cfg)
    with pytest.raises(LayoutError, match=r"weight 'wk' has shape \[64, 32\], expected \[32, 64\]"):
        kernels.qkv_bwd(cfg, dict(w, wk=w["wk"].T))
    with pytest.raises(LayoutError, match="weight 'wv' was not given"):
        kernels.qkv_bwd(cfg, {"wq": w["wq"], "wk": w["wk"]})
    with pytest.raises(LayoutError, match=r"weight 'wo' has shape \[64, 32\]"):
        kernels.sdpa_bwd1(cfg, dict(w, wo=w["wo"][:, :32]))
