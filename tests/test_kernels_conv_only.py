"""The matmul-free route's kernels: only 1x1 convs, bias adds, the gate and its backward, the taps' concat
(walked op by op), each against float64 numpy in the simulator, and clean under the rule book on every
chip (no error, no finding of a rule with counter-evidence)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import ModelConfig, attention_bwd, backward, preset
from anekit.kernels.conv_only import KERNELS, conv_route_specs
from anekit.kernels.spec import KernelSpec
from anekit.mil.ir import Op, Var
from anekit.rules.lint import lint_program
from tests.test_llama_step_gemma import CFG as GEMMA
from tests.test_llama_step_hf import CONFIGS as HF

CHIPS = ("m1", "m2", "m3", "m4", "m5", "any")
CONFIGS = {
    "llama2c": ModelConfig(32, 64, 2, 4, 2, 64, 32),
    "stories15M": preset("stories15M"),
    "stories110M": preset("stories110M"),
    "qwen3-like": HF["qwen3-like"],  # biases, q / k norm, q_dim 64 != dim 32
    "gemma3-like": GEMMA,  # GeGLU, post-norms, sliding layers
}
# Engine-sized shapes (channels multiples of 64: the toy configs above warn under the contested
# 'tensor.channels-multiple-64', which is about their size, not about the route).
LINT_CONFIGS = {
    "stories15M": preset("stories15M"),
    "stories110M": preset("stories110M"),
    "qwen3-shaped": HF["qwen3-like"].with_(dim=128, hidden_dim=256, attn_head_dim=64, seq_len=64),
    "gemma3-shaped": GEMMA.with_(dim=128, hidden_dim=256, attn_head_dim=64, seq_len=64, sliding_window=16),
}
# A contested rule every conv of a model not 512 channels wide draws on the M3, on every route: its
# evidence splits by macOS version (refused on 15.7.4, a 768-channel model trained on 26.3), a choice of
# the engine layer's route per macOS, not of these kernels.
SHAPE_RULES = {"conv.channels-512-m3"}
# Every op type the route's kernels may hold: the conv, the elementwise ops of a bias add and of the gates
# (SwiGLU: sigmoid, mul; GeGLU: gelu, and tanh / clip in its backward; the SwiGLU backward's sub), the
# channel concat of the taps and the slices of a kernel's input parts (maderix/ANE training/stories_mil.h).
CONV_ONLY_OPS = {
    "const",
    "conv",
    "add",
    "mul",
    "sub",
    "sigmoid",
    "gelu",
    "tanh",
    "clip",
    "concat",
    "slice_by_size",
}


def _ops(spec: KernelSpec) -> list[Op]:
    return spec.program.functions["main"].block.ops


@pytest.mark.parametrize("name", CONFIGS)
def test_every_kernel_is_convs_and_elementwise_ops_only(name):
    specs = conv_route_specs(CONFIGS[name])
    assert tuple(specs) == KERNELS
    for kernel, spec in specs.items():
        types = {op.op_type for op in _ops(spec)}
        assert types <= CONV_ONLY_OPS, f"{kernel}: {sorted(types - CONV_ONLY_OPS)}"
        assert "conv" in types, kernel
        last = _ops(spec)[-1]
        assert last.outputs[0].name == "out" and last.op_type in ("conv", "add", "concat"), kernel
        for op in _ops(spec):
            if op.op_type == "concat":
                axis = op.inputs["axis"]
                assert isinstance(axis, Var) and axis.const is not None, kernel
                assert int(np.asarray(axis.const.value)) == 1, kernel  # the taps join channels


def test_the_backward_kernels_are_the_baked_routes_own():
    for cfg in CONFIGS.values():
        specs = conv_route_specs(cfg)
        assert specs["ffn_bwd"].text() == backward.ffn_bwd(cfg).text()
        assert specs["qkv_bwd"].text() == attention_bwd.qkv_bwd(cfg).text()


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("name", LINT_CONFIGS)
def test_lint_finds_no_error_and_no_contested_rule_on_every_chip(name, chip):
    cfg = LINT_CONFIGS[name]
    assert cfg.q_dim != cfg.dim or name.startswith("stories")
    for kernel, spec in conv_route_specs(cfg).items():
        result = lint_program(spec.program, kernel, chip)
        assert result.errors == 0, list(result.lines())
        contested = [f.short() for f in result.findings if f.rule.conflicted and f.rule.id not in SHAPE_RULES]
        assert not contested, contested


# -- values --------------------------------------------------------------------------------------------


def _weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """fp16-exact weights of one layer in llama2.c's (out, in) layout, biases included."""
    rng = np.random.default_rng(seed)
    d, q, kv, h = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim
    shapes = {
        "wq": (q, d),
        "wk": (kv, d),
        "wv": (kv, d),
        "wo": (d, q),
        "w1": (h, d),
        "w3": (h, d),
        "w2": (d, h),
        "bq": (q,),
        "bk": (kv,),
        "bv": (kv,),
    }
    out = {}
    for key, shape in shapes.items():
        a = rng.standard_normal(shape) / (math.sqrt(shape[1]) if len(shape) == 2 else 2.0)
        out[key] = a.astype(np.float16).astype(np.float32)
    return out


def _act(shape: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float16).astype(np.float32)


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err < 4e-3, f"{what}: {err:.2e}"  # fp16 storage of the result and of the operands


@pytest.mark.parametrize("name", ["llama2c", "qwen3-like", "gemma3-like"])
def test_forward_kernels_compute_the_float64_products(name):
    cfg = CONFIGS[name]
    w = _weights(cfg, seed=1)
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    specs = conv_route_specs(cfg, w)
    backend = runtime.open("sim", chip="m1")
    t = cfg.seq_len

    xn = _act((cfg.dim, t), seed=2)
    got = specs["qkv_fwd"].run(backend, xnorm=xn)
    for key in ("q", "k", "v"):
        want = w64[f"w{key}"] @ xn
        if cfg.qkv_bias:
            want = want + w64[f"b{key}"][:, None]
        _close(got[key], want, key)

    att = _act((cfg.q_dim, t), seed=3)
    _close(specs["wo_fwd"].run(backend, attn=att)["o"], w64["wo"] @ att, "o")

    do = _act((cfg.dim, t), seed=4)
    _close(specs["wo_bwd"].run(backend, do=do)["da"], w64["wo"].T @ do, "da")

    m = _act((cfg.dim, t), seed=5)
    h1, h3 = w64["w1"] @ m, w64["w3"] @ m
    if cfg.mlp_act == "gelu_tanh":
        act = 0.5 * h1 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h1 + 0.044715 * h1**3)))
    else:
        act = h1 / (1.0 + np.exp(-h1))
    gate = act * h3
    got = specs["ffn_fwd"].run(backend, x=m)
    for key, want in (("h1", h1), ("h3", h3), ("silu_out", gate), ("ffn_out", w64["w2"] @ gate)):
        assert got[key].shape == want.shape, key
        err = np.max(np.abs(got[key] - want)) / np.max(np.abs(want))
        assert err < 2e-2, f"{key}: {err:.2e}"  # the gate's activation is a table on the engine
