"""The generation kernels lint clean on every chip profile: for m1 .. m5 under each macOS major the engine
layer knows and under every macOS, and for "any", the decode and prefill kernels of the chip's generation
route (``anekit.engine.generation_routes``, cut by ``anekit.generate.plan``: the kernels
``anekit.tools.gen_dump.plan_kernels`` builds, which the dump writes) give no lint error and no warning from
a rule the evidence contests or contradicts (the training routes' test in tests/test_cli_lint.py, for
generation)."""

from __future__ import annotations

import pytest

from anekit.engine.constructs import MACOS_MAJORS
from anekit.engine.generation_routes import CANDIDATES, NoGenerationRoute, asked_route, generation_route
from anekit.generate.plan import generation_plan
from anekit.kernels import ModelConfig, preset
from anekit.kernels.generation import gen_weights
from anekit.llama.params import Params
from anekit.rules import CHIPS, check_program
from anekit.tools.gen_dump import plan_kernels

# The families in small (dim 64: the narrowest tensors with no channel warning), as the kernel tests build
# them: Qwen 3 (a head_dim of its own, q / k norms, biases), Gemma 3 ((1 + w) norms, post-norms, GeGLU,
# sliding layers with their own RoPE base beside a full one).
HF_BASE = ModelConfig(64, 128, 2, 4, 2, 128, 32)
CONFIGS = {
    "stories260K": preset("stories260K"),
    "stories15M": preset("stories15M"),  # the real shapes, from shapes only (no weight files checked)
    # Qwen/Qwen3-0.6B's config.json (28 layers, 16 heads of 128 over 8 kv heads, 151936 tokens: 3 tiles),
    # at the tools' window of 256 positions (anekit.tools.config.HF_SEQ); from shapes only
    "qwen3-0.6B": ModelConfig(
        1024, 3072, 28, 16, 8, 151936, 256, norm_eps=1e-6, rope_theta=1e6, attn_head_dim=128, qk_norm=True,
        name="qwen3-0.6B",
    ),
    "qwen3-like": HF_BASE.with_(attn_head_dim=16, qkv_bias=True, qk_norm=True, name="qwen3-like"),
    "gemma3-like": HF_BASE.with_(
        n_layers=3, attn_head_dim=16, qk_norm=True, norm_offset=1.0, post_norms=True, mlp_act="gelu_tanh",
        embed_scale=8.0, attn_scale=24**-0.5, sliding_window=8, layer_types=("sliding", "full", "sliding"),
        rope_theta=1e6, rope_local_theta=1e4, name="gemma3-like",
    ),
}  # fmt: skip
WEIGHTED = {"stories260K", "qwen3-like", "gemma3-like"}  # small enough to build with weights


def _contested(
    name: str, chip: str, macos: str, route_id: str | None = None
) -> tuple[str, list[tuple[str, str]]]:
    """The route's id and every (kernel, finding) of its decode and prefill kernels that is an error or a
    warning of a contested rule (``name``: a config of CONFIGS; the small ones are built with weights, so
    their weight files' BLOBFILE offsets are checked too); ``route_id``: a candidate asked for by id
    instead of the chip's route."""
    cfg = CONFIGS[name]
    route = generation_route(chip, macos) if route_id is None else asked_route(route_id, chip, macos)
    plan = generation_plan(cfg, route)
    weights = gen_weights(Params.init(cfg, 0)) if name in WEIGHTED else None
    found = []
    for width in plan.widths:
        for k in plan_kernels(cfg, route, plan, width, weights):
            files = k.spec.weight_files() if weights is not None else None
            for f in check_program(k.spec.program, chip, files, macos=macos):
                if f.is_error or f.rule.conflicted:
                    found.append((k.name, f.short()))
    return route.id, found


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("chip", CHIPS)
def test_the_generation_route_of_every_chip_lints_clean_under_every_macos(chip, name):
    routes = set()
    for macos in ("", *MACOS_MAJORS):
        try:
            route_id, contested = _contested(name, chip, macos)
        except NoGenerationRoute:  # no candidate runs under every macOS: each major has its own
            assert macos == "", (chip, macos)
            continue
        routes.add(route_id)
        assert not contested, (name, chip, macos or "every macOS", route_id, contested)
    assert routes, chip


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_legacy_kernels_of_chip_any_lint_clean(name):
    """The simulator with no chip named runs the legacy kernels; under the rules of every chip together."""
    route_id, contested = _contested(name, "any", "")
    assert route_id == "legacy" and not contested, contested


# Candidates no chip gets from the shipped evidence (their in-kernel RMSNorm has no hardware run): a
# report moves the M4 / M5 onto them, so their kernels are linted for those chips here.
REPORT_ONLY = {"baked-fused": ("m4", "m5"), "baked-fused-rope-matmul": ("m3", "m4", "m5")}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("route_id", list(REPORT_ONLY))
def test_the_fused_candidates_lint_clean_on_the_chips_a_report_would_give_them(name, route_id):
    for chip in REPORT_ONLY[route_id]:
        _, contested = _contested(name, chip, "26", route_id)
        assert not contested, (name, chip, route_id, contested)


def test_every_candidate_route_is_some_chip_s_route_or_linted_as_one():
    """The lint tests above reach every candidate's kernels (none is left unchecked)."""
    chosen = set()
    for chip in CHIPS:
        for macos in ("", *MACOS_MAJORS):
            try:
                chosen.add(generation_route(chip, macos).id)
            except NoGenerationRoute:
                continue
    assert chosen | set(REPORT_ONLY) == {c.id for c in CANDIDATES}
    assert not chosen & set(REPORT_ONLY)


@pytest.mark.parametrize("chip, macos", [("m1", "26"), ("m3", "15"), ("m5", "")])
def test_a_generation_dump_lints_clean_with_anekit_lint(tmp_path, capsys, chip, macos):
    """What a user runs: dump a chip's generation kernels, then ``anekit lint`` the folder for that chip."""
    from anekit.cli.main import main

    out = tmp_path / "g"
    on = ["--chip", chip, *(["--macos", macos] if macos else [])]
    assert main(["kernels", "dump", "--config", "stories260K", "--generate", *on, str(out)]) == 0
    capsys.readouterr()
    assert main(["lint", str(out), *on]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith(f"{len(list(out.glob('*/model.mil')))} programs: 0 errors"), summary
