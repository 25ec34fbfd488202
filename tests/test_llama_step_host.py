"""A whole training step on the matmul-free route (conv kernels on the engine; RMSNorm, RoPE and the
attention core on the host) on every chip profile: the llama2.c step against the independent float64 step,
the Qwen- and Gemma-3-shaped steps against float64 finite differences of the models their step tests
write, the host attention backward against finite differences of a float64 attention written here, and
the compiles one batch makes."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import ModelConfig, forward
from anekit.llama import Params
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import Timer, eval_loss, forward_layers, train_step, unscale
from anekit.llama.step_host import ROUTE, HostAttentionKernels
from tests import test_llama_step as llama
from tests import test_llama_step_gemma as gemma
from tests import test_llama_step_hf as hf
from tests.llama_reference import loss_and_grads

CHIPS = ("m1", "m2", "m3", "m4", "m5", "any")
QWEN = hf.CONFIGS["qwen3-like"]  # q / k biases, q / k norm, q_dim 64 != dim 32, GQA
GEMMA = gemma.CFG  # (1 + w) norms, post-norms, GeGLU, q / k norm, its score scale, a sliding layer
SCALE = 256.0


def _host_step(cfg: ModelConfig, params: Params, tokens, targets, chip: str) -> tuple[float, Params]:
    """One step on the route in the simulator with ``chip``'s numerics; the gradients unscaled."""
    kernels = HostAttentionKernels(runtime.open("sim", chip=chip), cfg)
    kernels.compile(params, Timer())
    grads = params.zeros_like()
    result = train_step(kernels, params, grads, tokens, targets, Timer(), loss_scale=SCALE)
    kernels.close()
    assert result.finite and not result.overflowed
    assert unscale(grads, 1.0 / SCALE)
    return result.loss, grads


def test_the_kernel_set_is_the_routes_and_make_kernels_gives_it():
    assert (ROUTE.weights, ROUTE.attention, ROUTE.norm, ROUTE.rope) == ("baked", "host", "host", "host")
    kernels = make_kernels(runtime.open("sim"), GEMMA, None, ROUTE)
    assert isinstance(kernels, HostAttentionKernels) and kernels.route == ROUTE
    assert kernels.bwd2 == {}  # no SDPA backward 2: its work is the host's


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("name", llama.CONFIGS)
def test_llama2c_step_matches_the_float64_step(name, chip):
    cfg, tied = llama.CONFIGS[name]
    params = llama._params(cfg, tied, seed=3)
    window = np.random.default_rng(4).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    tokens, targets = window[:-1], window[1:]
    loss, grads = _host_step(cfg, params, tokens, targets, chip)
    want_loss, want = loss_and_grads(params, tokens, targets)
    assert abs(loss - want_loss) < 5e-3 * abs(want_loss)
    expected = dict(want.tensors())
    for tensor_name, got in grads.tensors():
        ref = expected[tensor_name]
        rel = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
        assert rel < 1e-2, f"{tensor_name}: {rel:.2e}"  # measured: at most 4e-3


def _finite_differences(loss, w: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
    """Along each gradient g and along g on a random half of its entries, the float64 loss's directional
    derivative equals <g, u> (the step tests' check: a wrong or missing component breaks one of them)."""
    assert set(got) == set(w)
    rng = np.random.default_rng(9)
    h = 1e-4
    for key, g in got.items():
        g = g.astype(np.float64)
        for u in (g, g * (rng.random(g.shape) < 0.5)):
            u = u / np.linalg.norm(u)
            plus, minus = dict(w), dict(w)
            plus[key], minus[key] = w[key] + h * u, w[key] - h * u
            fd = (loss(plus) - loss(minus)) / (2 * h)
            an = float(np.sum(g * u))
            assert abs(fd - an) <= 3e-2 * np.linalg.norm(g), f"{key}: fd {fd:.4e}, step {an:.4e}"


@pytest.mark.parametrize("chip", CHIPS)
def test_qwen_shaped_step_matches_float64_finite_differences(chip):
    params = hf._params(QWEN, seed=7)
    tokens, targets = hf._window(QWEN, seed=8)
    loss, grads = _host_step(QWEN, params, tokens, targets, chip)
    w = {k: v.astype(np.float64) for k, v in params.tensors()}
    want_loss = hf._loss(QWEN, w, tokens, targets)
    assert abs(loss - want_loss) < 5e-3 * want_loss
    _finite_differences(lambda p: hf._loss(QWEN, p, tokens, targets), w, dict(grads.tensors()))


@pytest.mark.parametrize("chip", CHIPS)
def test_gemma_shaped_step_matches_float64_finite_differences(chip):
    params = gemma._params(GEMMA, seed=7)
    tokens, targets = gemma._window(seed=8)
    loss, grads = _host_step(GEMMA, params, tokens, targets, chip)
    w = {k: v.astype(np.float64) for k, v in params.tensors()}
    want_loss = gemma._loss(w, tokens, targets)
    assert abs(loss - want_loss) < 5e-3 * want_loss
    got = dict(grads.tensors())
    assert "layers.0.post_ffn_norm" in got and "layers.1.q_norm" in got
    _finite_differences(lambda p: gemma._loss(p, tokens, targets), w, got)


def test_gemma_shaped_validation_loss_is_the_float64_models():
    params = gemma._params(GEMMA, seed=15)
    tokens, targets = gemma._window(seed=16)
    kernels = HostAttentionKernels(runtime.open("sim"), GEMMA)
    kernels.compile(params, Timer())
    total, count = eval_loss(kernels, params, tokens, targets, None, Timer())
    kernels.close()
    want = gemma._loss({k: v.astype(np.float64) for k, v in params.tensors()}, tokens, targets)
    assert count == GEMMA.seq_len and abs(total / count - want) < 5e-3 * want


@pytest.mark.parametrize(
    "cfg", [llama.CONFIGS["gqa-rope-tied"][0], QWEN, GEMMA], ids=["llama2c", "qwen", "gemma"]
)
def test_forward_taps_are_the_engine_routes(cfg):
    """The step reads the same keys, of the same shapes, as from the engine route's kernels' taps; the
    inputs the kernels read are kept as the kernels read them (fp16)."""
    params = hf._params(cfg, seed=1) if cfg is not GEMMA else gemma._params(cfg, seed=1)
    tokens = np.arange(cfg.seq_len) % cfg.vocab_size
    kernels = HostAttentionKernels(runtime.open("sim"), cfg)
    kernels.compile(params, Timer())
    _, saved = forward_layers(kernels, params, tokens, Timer())
    kernels.close()
    for _, att, _, ffn in saved:
        for taps, layout in ((att, forward.sdpa_fwd_layout(cfg)), (ffn, forward.ffn_fwd_layout(cfg))):
            assert {n: taps[n].shape for n in taps} == {n: (c, cfg.seq_len) for n, c in layout.parts}
        for read in (att["xnorm"], att["attn_out"], ffn["x2norm"]):  # what a kernel read: fp16 values
            np.testing.assert_array_equal(read.astype(np.float16).astype(np.float32), read)


# -- the host attention backward -------------------------------------------------------------------------


def _rope64(x: np.ndarray, hd: int, theta: float) -> np.ndarray:
    """Each head's pairs (2j, 2j + 1) of x (C, T) turned by pos * theta^(-2j / hd), as complex numbers."""
    c, t = x.shape
    turn = np.exp(1j * (theta ** (-np.arange(0, hd, 2) / hd))[:, None] * np.arange(t)[None, :])  # (hd/2, T)
    z = x.reshape(c // hd, hd // 2, 2, t)
    r = (z[:, :, 0] + 1j * z[:, :, 1]) * turn
    return np.stack([r.real, r.imag], axis=2).reshape(c, t)


def _attention64(cfg: ModelConfig, q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int) -> np.ndarray:
    """Grouped-query attention in float64: query head h reads kv head h // group; key j is visible to
    query i iff j <= i (and i - window < j with a window); scores (q . k) * cfg.scores_scale."""
    hd, t = cfg.head_dim, q.shape[1]
    i_pos, j_pos = np.arange(t)[:, None], np.arange(t)[None, :]
    visible = (j_pos <= i_pos) & ((j_pos > i_pos - window) if window else True)
    qh = q.reshape(cfg.n_heads, hd, t)
    kh = np.repeat(k.reshape(cfg.n_kv_heads, hd, t), cfg.kv_group, axis=0)  # (H, hd, T)
    vh = np.repeat(v.reshape(cfg.n_kv_heads, hd, t), cfg.kv_group, axis=0)
    s = np.where(visible, np.einsum("hdi,hdj->hij", qh, kh) * cfg.scores_scale, -np.inf)  # (H, T, T)
    p = np.exp(s - s.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    return np.einsum("hij,hdj->hdi", p, vh).reshape(cfg.q_dim, t)


@pytest.mark.parametrize("layer", [0, 1], ids=["sliding", "full"])
def test_host_attention_backward_matches_finite_differences_of_float64_attention(layer):
    """dq, dk (before RoPE), dv of f = <do, Wo attention(rope(q), rope(k), v)> from sdpa_bwd1 / sdpa_bwd2
    (Wo^T on the engine, the rest on the host) against central differences of f in float64, for Gemma 3's
    sliding layer (window 8, RoPE base 10^4) and full layer (base 10^6): GQA, q_dim != dim, scale 24^-1/2."""
    cfg = GEMMA
    params = gemma._params(cfg, seed=21)
    kernels = HostAttentionKernels(runtime.open("sim", chip="m1"), cfg)
    kernels.compile(params, Timer())
    rng = np.random.default_rng(22)
    t, window, theta = cfg.seq_len, (8, 0)[layer], (1e4, 1e6)[layer]

    def f16(shape: tuple[int, int]) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float16).astype(np.float64)

    q, k, v, do = f16((cfg.q_dim, t)), f16((cfg.kv_dim, t)), f16((cfg.kv_dim, t)), f16((cfg.dim, t))
    wo = params.layers[layer].wo.astype(np.float64)

    def f(q_: np.ndarray, k_: np.ndarray, v_: np.ndarray) -> float:
        hd = cfg.head_dim
        att = _attention64(cfg, _rope64(q_, hd, theta), _rope64(k_, hd, theta), v_, window)
        return float(np.sum(do * (wo @ att)))

    qr = _rope64(q, cfg.head_dim, theta).astype(np.float32)
    kr = _rope64(k, cfg.head_dim, theta).astype(np.float32)
    b1 = kernels.run(layer, "sdpa_bwd1", q=qr, k=kr, v=v.astype(np.float32), do=do.astype(np.float32))
    b2 = kernels.run(layer, "sdpa_bwd2", probs=b1["probs"], dp=b1["dp"], q=qr, k=kr)
    kernels.close()
    grads = {"q": b2["dq"], "k": b2["dk"], "v": b1["dv"]}
    h = 1e-5
    for name, g in grads.items():
        g = g.astype(np.float64)
        # along g itself (a wrong scale shows), g on a random half of its entries, and a random direction
        for u in (g, g * (rng.random(g.shape) < 0.5), rng.standard_normal(g.shape)):
            u = u / np.linalg.norm(u)
            args_plus = {"q_": q, "k_": k, "v_": v}
            args_minus = dict(args_plus)
            args_plus[f"{name}_"] = args_plus[f"{name}_"] + h * u
            args_minus[f"{name}_"] = args_minus[f"{name}_"] - h * u
            fd = (f(**args_plus) - f(**args_minus)) / (2 * h)
            an = float(np.sum(g * u))
            assert abs(fd - an) <= 5e-3 * np.linalg.norm(g), f"d{name}: fd {fd:.5e}, host {an:.5e}"


@pytest.mark.parametrize("layer", [0, 1], ids=["sliding", "full"])
def test_a_hidden_key_gets_no_probability_however_large_the_scores(layer):
    """float32 scores can pass the engine's fp16 mask value (-65504): the host hides keys with -inf."""
    cfg = GEMMA
    kernels = HostAttentionKernels(runtime.open("sim"), cfg)
    kernels.compile(gemma._params(cfg, seed=23), Timer())
    rng = np.random.default_rng(24)
    t, window = cfg.seq_len, (8, 0)[layer]
    q = np.float32(200.0) * np.abs(rng.standard_normal((cfg.q_dim, t))).astype(np.float32)  # scores ~ 10^5
    k = np.float32(200.0) * np.abs(rng.standard_normal((cfg.kv_dim, t))).astype(np.float32)
    v, do = rng.standard_normal((cfg.kv_dim, t)), rng.standard_normal((cfg.dim, t))
    probs = kernels.run(layer, "sdpa_bwd1", q=q, k=k, v=v, do=do)["probs"].reshape(cfg.n_heads, t, t)
    kernels.close()
    i_pos, j_pos = np.arange(t)[:, None], np.arange(t)[None, :]
    visible = (j_pos <= i_pos) & ((j_pos > i_pos - window) if window else True)
    assert np.all(probs[:, ~visible] == 0.0)
    np.testing.assert_allclose(probs.sum(axis=2), 1.0, rtol=1e-5)


# -- compiles --------------------------------------------------------------------------------------------


def test_compile_bakes_every_layers_six_kernels_per_batch_and_nothing_else():
    params = gemma._params(GEMMA, seed=12)
    backend = runtime.open("sim")
    kernels = HostAttentionKernels(backend, GEMMA)
    assert backend.compile_count == 0  # no weightless kernel compiled up front (no SDPA backward 2)
    assert kernels.compiles_needed() == HostAttentionKernels.compiles_per_batch(GEMMA) == 6 * GEMMA.n_layers
    for batch in (1, 2):
        kernels.compile(params, Timer())
        assert backend.compile_count == batch * kernels.compiles_needed()
    tokens, targets = gemma._window(seed=13)
    train_step(kernels, params, params.zeros_like(), tokens, targets, Timer())
    assert backend.compile_count == 2 * kernels.compiles_needed()  # a step compiles nothing
    kernels.close()


@pytest.mark.parametrize("cfg", [llama.CONFIGS["gqa-rope-tied"][0], GEMMA], ids=["llama2c", "gemma"])
def test_the_host_norms_take_the_weights_of_the_last_compile(cfg):
    """Between compiles the kernels hold the weights they were baked with; so do the host's norms (llama2.c's
    scale is the weight itself, Gemma's 1 + w)."""
    params = hf._params(cfg, seed=17) if cfg is not GEMMA else gemma._params(cfg, seed=17)
    tokens = np.random.default_rng(18).integers(0, cfg.vocab_size, cfg.seq_len)
    kernels = HostAttentionKernels(runtime.open("sim"), cfg)
    kernels.compile(params, Timer())
    before, _ = forward_layers(kernels, params, tokens, Timer())
    for w in params.layers:  # an optimizer step, in place
        for key in ("rms_att", "rms_ffn", "q_norm", "post_att_norm", "post_ffn_norm"):
            if getattr(w, key) is not None:
                getattr(w, key)[...] *= np.float32(1.5)
    again, _ = forward_layers(kernels, params, tokens, Timer())
    np.testing.assert_array_equal(again, before)
    kernels.compile(params, Timer())
    after, _ = forward_layers(kernels, params, tokens, Timer())
    kernels.close()
    fresh = HostAttentionKernels(runtime.open("sim"), cfg)
    fresh.compile(params, Timer())
    want, _ = forward_layers(fresh, params, tokens, Timer())
    fresh.close()
    np.testing.assert_array_equal(after, want)
    assert np.abs(after - before).max() > 1e-2 * np.abs(before).max()
