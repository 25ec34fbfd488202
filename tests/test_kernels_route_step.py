"""One training step of each engine-attention route (RMSNorm on the host, RoPE as slices and a concat), in
the simulator with every chip's numerics, against float64 models written in the tests: a llama2.c model
(tests/llama_reference.py: loss and every gradient), a Qwen 3 model of the shape tests/hf_fixtures.py
records and a Gemma 3 one (the loss, and each gradient against float64 finite differences)."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.engine import CHIPS
from anekit.fp16 import round_to_fp16
from anekit.kernels import ModelConfig
from anekit.kernels.catalog import split_kind
from anekit.kernels.route import ROUTES, BadKernelRoute, KernelRoute
from anekit.kernels.route_specs import route_specs
from anekit.llama import Params
from anekit.llama.kernel_sets import first_compiles, make_kernels
from anekit.llama.step import DynamicKernels, Kernels, Timer, train_step, unscale
from anekit.llama.step_host import HostAttentionKernels
from anekit.models import read_args
from tests import hf_fixtures
from tests import test_llama_step as llama_step
from tests import test_llama_step_gemma as gemma_step
from tests import test_llama_step_hf as hf_step
from tests.llama_reference import loss_and_grads

ENGINE_ROUTES = ("dynamic-engine-attention", "dynamic-engine-attention-rope-matmul", "baked-engine-attention")
PROFILES = ("any", *CHIPS)

# Qwen 3's layer (q / k norm, head_dim given apart from hidden_size, GQA, RoPE base 10^6, tied) shrunk to
# a size the float64 finite differences can sweep: q_dim 64 > hidden 32, 2 kv heads.
QWEN3 = read_args(
    hf_fixtures.small(
        "qwen3",
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=2,
        vocab_size=64,
    )
).to_model_config(seq_len=32)


def _step(
    cfg: ModelConfig, params: Params, route: str, chip: str, window: np.ndarray
) -> tuple[float, Params]:
    """One step of ``route`` on the simulator bound to ``chip``: (loss, the unscaled gradients)."""
    kernels = make_kernels(runtime.open("sim", chip=chip), cfg, None, ROUTES[route])
    kernels.compile(params, Timer())
    grads = params.zeros_like()
    scale = 256.0
    result = train_step(kernels, params, grads, window[:-1], window[1:], Timer(), loss_scale=scale)
    kernels.close()
    assert result.finite and not result.overflowed
    assert unscale(grads, 1.0 / scale)
    return result.loss, grads


@pytest.mark.parametrize("chip", PROFILES)
@pytest.mark.parametrize("route", ENGINE_ROUTES)
def test_llama_step_matches_the_float64_model(route, chip):
    cfg, tied = llama_step.CONFIGS["gqa-rope-tied"]
    params = llama_step._params(cfg, tied, seed=3)
    window = np.random.default_rng(4).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    loss, grads = _step(cfg, params, route, chip, window)
    want_loss, want = loss_and_grads(params, window[:-1], window[1:])
    assert abs(loss - want_loss) < 5e-3 * abs(want_loss)
    expected = dict(want.tensors())
    for name, got in grads.tensors():
        ref = expected[name]
        rel = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
        assert rel < 1e-2, f"{name}: {rel:.2e}"  # measured: at most 4.4e-3 (M5), 4e-3 elsewhere


def _check_finite_differences(loss_of, w: dict[str, np.ndarray], grads: Params, seed: int) -> None:
    """Each gradient along itself and along a random half of itself against central differences of the
    float64 loss ``loss_of(weights)``."""
    got = dict(grads.tensors())
    assert set(got) == set(w)  # every parameter has its gradient
    rng, h = np.random.default_rng(seed), 1e-4
    for key, g in got.items():
        g = g.astype(np.float64)
        for u in (g, g * (rng.random(g.shape) < 0.5)):
            u = u / np.linalg.norm(u)
            plus, minus = dict(w), dict(w)
            plus[key], minus[key] = w[key] + h * u, w[key] - h * u
            fd = (loss_of(plus) - loss_of(minus)) / (2 * h)
            an = float(np.sum(g * u))
            assert abs(fd - an) <= 3e-2 * np.linalg.norm(g), f"{key}: fd {fd:.4e}, step {an:.4e}"


@pytest.mark.parametrize("chip", PROFILES)
@pytest.mark.parametrize("route", ENGINE_ROUTES)
def test_qwen3_shaped_step_matches_float64_finite_differences(route, chip):
    cfg = QWEN3
    assert cfg.qk_norm and cfg.q_dim > cfg.dim and cfg.n_kv_heads < cfg.n_heads
    params = hf_step._params(cfg, seed=7)
    window = np.random.default_rng(8).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    tokens, targets = window[:-1], window[1:]
    loss, grads = _step(cfg, params, route, chip, window)
    w = {k: v.astype(np.float64) for k, v in params.tensors()}
    assert abs(loss - hf_step._loss(cfg, w, tokens, targets)) < 5e-3 * loss
    _check_finite_differences(lambda ws: hf_step._loss(cfg, ws, tokens, targets), w, grads, seed=9)


@pytest.mark.parametrize("chip", PROFILES)
@pytest.mark.parametrize("route", ENGINE_ROUTES)
def test_gemma3_shaped_step_matches_float64_finite_differences(route, chip):
    """Gemma 3: (1 + w) norms, the post-norms (on the host in these routes), GeGLU, q / k norm, sliding
    layers with their own RoPE base beside full ones, scaled embeddings, a tied classifier."""
    cfg = gemma_step.CFG
    params = gemma_step._params(cfg, seed=7)
    window = np.random.default_rng(8).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    tokens, targets = window[:-1], window[1:]
    loss, grads = _step(cfg, params, route, chip, window)
    w = {k: v.astype(np.float64) for k, v in params.tensors()}
    assert abs(loss - gemma_step._loss(w, tokens, targets)) < 5e-3 * loss
    assert "layers.0.post_att_norm" in dict(grads.tensors())
    _check_finite_differences(lambda ws: gemma_step._loss(ws, tokens, targets), w, grads, seed=9)


def _rmsnorm64(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean over channels of x^2 + eps) * scale, in float64."""
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=0, keepdims=True) + eps) * scale.astype(np.float64)[:, None]


@pytest.mark.parametrize("route", ENGINE_ROUTES)
def test_the_host_norm_is_the_fp16_value_the_kernel_reads(route):
    """xnorm / x2norm come from the host, rounded to fp16 (what the kernel's fp16 input holds, so the
    weight gradients read the values the kernel multiplied), and are the float64 RMSNorm to fp16's
    precision; Gemma 3's o_pre / ffn_pre are the kernel's outputs and o_out / ffn_out their norms."""
    cfg = gemma_step.CFG
    params = gemma_step._params(cfg, seed=21)
    kernels = make_kernels(runtime.open("sim"), cfg, None, ROUTES[route])
    kernels.compile(params, Timer())
    x = np.random.default_rng(22).standard_normal((cfg.dim, cfg.seq_len)).astype(np.float32) * 3
    layer = params.layers[0]
    att = kernels.run(0, "sdpa_fwd", x=x)
    ffn = kernels.run(0, "ffn_fwd", x=x)
    kernels.close()
    for got, w, post, pre, out in (
        (att["xnorm"], layer.rms_att, layer.post_att_norm, att["o_pre"], att["o_out"]),
        (ffn["x2norm"], layer.rms_ffn, layer.post_ffn_norm, ffn["ffn_pre"], ffn["ffn_out"]),
    ):
        assert np.array_equal(round_to_fp16(got), got)  # fp16 values
        want = _rmsnorm64(x, 1.0 + w, cfg.norm_eps)  # Gemma scales by 1 + w
        assert np.max(np.abs(got - want)) <= 2**-10 * np.max(np.abs(want))
        assert post is not None
        want_out = _rmsnorm64(pre, 1.0 + post, cfg.norm_eps)
        assert np.max(np.abs(out - want_out)) <= 1e-5 * np.max(np.abs(want_out))


def test_a_baked_route_normalises_with_the_scales_its_kernels_were_compiled_with():
    """Baked kernels are compiled once per accumulation batch; the host norm uses the scales of that
    compile even when the weights change before the next one."""
    cfg, tied = llama_step.CONFIGS["gqa-rope-tied"]
    params = llama_step._params(cfg, tied, seed=23)
    kernels = make_kernels(runtime.open("sim"), cfg, "baked", ROUTES["baked-engine-attention"])
    kernels.compile(params, Timer())
    x = np.random.default_rng(24).standard_normal((cfg.dim, cfg.seq_len)).astype(np.float32)
    before = kernels.run(0, "sdpa_fwd", x=x)["xnorm"]
    params.layers[0].rms_att *= 2
    after = kernels.run(0, "sdpa_fwd", x=x)["xnorm"]
    kernels.close()
    assert np.array_equal(before, after)


def test_the_routes_compile_what_their_weight_modes_compile():
    cfg, tied = llama_step.CONFIGS["gqa-rope-tied"]
    params = llama_step._params(cfg, tied, seed=25)
    for route, kind in (("dynamic-engine-attention", DynamicKernels), ("baked-engine-attention", Kernels)):
        backend = runtime.open("sim")
        kernels = make_kernels(backend, cfg, None, ROUTES[route])
        assert type(kernels) is kind and kernels.route == ROUTES[route]
        for _ in range(2):
            kernels.compile(params, Timer())
        batches = 1 if route.startswith("dynamic") else 2
        want = first_compiles(cfg, ROUTES[route].weights) + (batches - 1) * Kernels.compiles_per_batch(cfg)
        assert backend.compile_count == want
        kernels.close()


def test_a_weight_mode_contradicting_the_route_is_refused():
    cfg, _ = llama_step.CONFIGS["gqa-rope-tied"]
    with pytest.raises(BadKernelRoute, match=r"weights 'baked'.*'dynamic'"):
        make_kernels(runtime.open("sim"), cfg, "baked", ROUTES["dynamic-engine-attention"])
    with pytest.raises(BadKernelRoute, match=r"DynamicKernels runs dynamic weights; the route has baked"):
        DynamicKernels(runtime.open("sim"), cfg, ROUTES["baked-engine-attention"])


def test_no_route_is_the_legacy_kernels():
    cfg, _ = llama_step.CONFIGS["gqa-rope-tied"]
    for mode in ("baked", "dynamic"):
        kernels = make_kernels(runtime.open("sim"), cfg, mode)
        assert kernels.route == KernelRoute(mode)  # engine attention, norm on the engine, the swap conv
        kernels.close()


def test_the_host_attention_route_is_its_own_kernel_set():
    cfg, _ = llama_step.CONFIGS["gqa-rope-tied"]
    kernels = make_kernels(runtime.open("sim"), cfg, None, ROUTES["conv-host-attention"])
    assert isinstance(kernels, HostAttentionKernels)
    kernels.close()


@pytest.mark.parametrize("config", ["llama", "gemma3"])
@pytest.mark.parametrize("route", ENGINE_ROUTES)
def test_route_specs_are_the_kernels_the_step_compiles(route, config):
    """``route_specs`` (what ``kernels dump`` and ``lint`` see) gives the programs the step runs, byte for
    byte: the dynamic set once, or layer 0's baked kernels with layer 0's weights; each kind's own (Gemma
    3's layer 0 is a sliding one)."""
    if config == "llama":
        cfg, tied = llama_step.CONFIGS["gqa-rope-tied"]
        params = llama_step._params(cfg, tied, seed=27)
    else:
        cfg = gemma_step.CFG
        params = gemma_step._params(cfg, seed=27)
    kernels = make_kernels(runtime.open("sim"), cfg, None, ROUTES[route])
    kernels.compile(params, Timer())
    compiled = [spec.text() for spec, _ in kernels.bwd2.values()]
    if isinstance(kernels, DynamicKernels):
        compiled += [spec.text() for spec, _ in kernels.dynamic.values()]
        weights = None
    else:
        compiled += [spec.text() for spec in kernels.specs[0].values()]
        weights = params.kernel_weights(0)
    kernels.close()
    specs = route_specs(cfg, ROUTES[route], weights)
    if weights is not None and len(cfg.layer_kinds) > 1:  # one layer: its kind's attention kernels only
        kind = cfg.layer_type(0)
        mine = {n: split_kind(n) for n in specs}  # name -> (cataloged name, kind)
        specs = {
            n: s
            for n, s in specs.items()
            if mine[n][0] not in ("sdpa_fwd", "sdpa_bwd1") or mine[n][1] == kind
        }
    assert sorted(s.text() for s in specs.values()) == sorted(compiled)
