"""The permutation-matmul RoPE route (dynamic-engine-attention-rope-matmul): the rotate-half matrix as
rustane's sdpaFwd defines it since pull request #9, the matmul RoPE against a float64 rotation (forward and
inverse) on every chip profile, the route's kernels (no slice or concat, one matmul by the permutation per
rotation), one training step against the float64 reference step, and the rule book's verdict on the M3."""

from __future__ import annotations

import numpy as np
import pytest

from anekit.engine import CHIPS
from anekit.engine.training_routes import training_route
from anekit.kernels import catalog
from anekit.kernels.blocks import rotate_half_matrix
from anekit.kernels.config import preset
from anekit.kernels.route import ROUTES, KernelRoute
from anekit.kernels.route_specs import route_specs
from anekit.kernels.spec import KernelSpec
from anekit.mil.ir import Op
from anekit.rules import check_program
from anekit.rules.lint import lint_program
from tests import test_llama_step as llama_step
from tests import test_llama_step_gemma as gemma_step
from tests.test_kernels_route_step import QWEN3

ROUTE = "dynamic-engine-attention-rope-matmul"
PROFILES = ("any", *CHIPS)
LLAMA = llama_step.CONFIGS["gqa-rope-tied"][0]
CONFIGS = {"llama": LLAMA, "stories15M": preset("stories15M"), "qwen3": QWEN3, "gemma3": gemma_step.CFG}


def _ops(spec: KernelSpec) -> list[Op]:
    return list(spec.program.functions["main"].block.ops)


def test_the_route_is_dynamic_weights_engine_attention_and_the_matmul_rope():
    assert ROUTES[ROUTE] == KernelRoute("dynamic", "engine", "host", "matmul")


def test_the_rotate_half_matrix_is_rustanes():
    """rustane sdpa_fwd.rs rope_permutation_matrix: P[2i + 1, 2i] = -1, P[2i, 2i + 1] = 1, zeros elsewhere;
    a row (a0, b0, a1, b1, ...) times P is (-b0, a0, -b1, a1, ...)."""
    hd = 8
    want = np.zeros((hd, hd))
    for i in range(hd // 2):
        want[2 * i + 1, 2 * i] = -1.0
        want[2 * i, 2 * i + 1] = 1.0
    assert np.array_equal(rotate_half_matrix(hd), want)
    row = np.arange(1.0, hd + 1)
    assert np.array_equal(row @ rotate_half_matrix(hd), [-2, 1, -4, 3, -6, 5, -8, 7])


@pytest.mark.parametrize("config", CONFIGS)
def test_the_route_kernels_rotate_by_one_matmul_with_the_permutation_and_no_slice_or_concat(config):
    """rustane pull request #9: 'replaces the width-axis reshape/slice/concat pattern which fails on M3
    Ultra's ANE'. The SDPA forward rotates q and k, sdpa_bwd2 rotates dq and dk back, each by one matmul
    with the constant P; no kernel has a conv (the weights are dynamic), a concat but the output's or a
    slice of the heads."""
    cfg = CONFIGS[config]
    for name, spec in route_specs(cfg, ROUTES[ROUTE]).items():
        ops = _ops(spec)
        perm = [op for op in ops if op.op_type == "matmul" and op.inputs["y"].name == "rope_perm"]
        if name.startswith(("sdpa_fwd", "sdpa_bwd2")):
            assert len(perm) == 2, name  # q and k, or dq and dk
            shape = next(op for op in ops if op.outputs[0].name == "rope_perm").outputs[0].type.shape
            assert shape == (1, 1, cfg.head_dim, cfg.head_dim)
        else:
            assert not perm, name
        assert not [op for op in ops if op.op_type == "conv"], name
        assert not [op for op in ops if op.op_type == "concat" and op.outputs[0].name != "out"], name
        assert not [op for op in ops if "rope" in op.outputs[0].name and op.op_type == "slice_by_size"], name


@pytest.mark.parametrize("macos", ["15", "26", ""])
@pytest.mark.parametrize("config", ["stories15M", "stories110M"])
def test_the_route_kernels_lint_clean_on_the_m3(config, macos):
    """On the M3 under 15, 26 and every macOS: no error and no warning from a rule the evidence contests or
    contradicts, at a preset's sizes (the 768-channel stories110M among them: no conv, so nothing of the M3's
    512-channel limit under macOS 15)."""
    cfg = preset(config)
    for name, spec in route_specs(cfg, ROUTES[ROUTE]).items():
        found = check_program(spec.program, "m3", macos=macos)
        bad = [f.short() for f in found if f.is_error or f.rule.conflicted]
        assert not bad, (macos or "every macOS", name, bad)


@pytest.mark.parametrize("chip", PROFILES)
def test_the_rule_book_finds_no_error_in_the_route_kernels(chip):
    for config, cfg in CONFIGS.items():
        weights = catalog.random_weights(cfg) if config == "stories15M" else None
        for name, spec in route_specs(cfg, ROUTES[ROUTE], weights).items():
            files = spec.weight_files() if spec.weights.complete else None
            result = lint_program(spec.program, name, chip, files)
            assert result.errors == 0, [str(f) for f in result.findings if f.is_error]


def test_the_conv_routes_kernels_are_what_the_m3_refuses_under_macos_15():
    """Why the M3 takes no conv route under 15 or every macOS: the rule book errs on the conv kernels'
    widths there (conv.channels-512-m3) and not under 26."""
    cfg = preset("stories15M")
    for name, spec in route_specs(cfg, ROUTES["conv-host-attention"]).items():
        assert [f for f in check_program(spec.program, "m3", macos="15") if f.is_error], name
        assert not [f for f in check_program(spec.program, "m3", macos="26") if f.is_error], name


def test_the_engine_layer_gives_the_route_to_the_m3_where_the_slice_rope_was_refused():
    assert training_route("m3", "26").id == ROUTE
    assert training_route("m3").id == ROUTE  # off a Mac: the route for every macOS
    assert "rope.permutation-matmul" in training_route("m3", "26").constructs
