"""The CoreML export of Gemma 3: the family's layer (anekit.models.gemma3) lowered to MIL, with (1 + w)
norms, post-norms, GeGLU with tanh gelu, the query_pre_attn_scalar score scale, sliding layers with a
banded mask and their own RoPE base beside full ones, the sqrt(hidden) embedding scale.

The reference is the CPU forward (``anekit.llama.sample.CpuDecoder``), itself held to the float64 forward
of tests/gemma3_reference.py in tests/test_models_gemma3.py; the package runs in the simulator, prefill
then decode, over a context longer than the window. Its programs are checked by the rule book for every
chip and, where coremltools is installed, loaded by coremltools' milproto loader."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pytest

from anekit.blob import _BlobStream
from anekit.coreml.decoder import PackageDecoder
from anekit.coreml.export import Stage, WeightSink, build_program, stage_weight_bytes
from anekit.coreml.shards import plan_shards
from anekit.hf.config import parse_config
from anekit.llama.params import Params
from anekit.llama.sample import CpuDecoder
from anekit.rules import CHIPS
from anekit.rules.checks import check_program, errors
from tests.coreml_oracle import coremltools, ct_load
from tests.test_coreml_export import stages_of
from tests.test_coreml_export_hf import one_layer_shard_mb
from tests.test_models_gemma3 import CONFIG

TOKENS = [2, 17, 250, 3, 99, 42, 7, 8, 120, 5, 64, 33, 1, 90, 14, 200]
PROMPT = 4


def gemma_params(seed: int = 3, **changes: object) -> Params:
    """The tiny Gemma 3 of tests/test_models_gemma3.py (window 5, 4 layers with both kinds) in a 16-token
    context, llama2.c's initialisation with the q / k projections 10x larger, the output projections (wo,
    w2) 30x larger and every norm weight drawn at random (w = 0 is the identity of a (1 + w) norm).

    The output projections are scaled because Gemma's post-norms normalise the blocks' outputs: at the
    initialisation's scale (|o| ~ 1e-3) x^2 / dim lies below fp16's normal range, which the engine's
    numerics flush to zero (measured here: 16 % of the logits' range in decode at 1x, 2 % at 10x, 0.6 %
    at 30x). A trained model's block outputs are far larger."""
    cfg = parse_config(CONFIG, seq_len=16).cfg.with_(**changes)
    p = Params.init(cfg, seed, tied=True)
    rng = np.random.default_rng(seed + 100)
    for lp in p.layers:
        lp.wq *= 10  # sharp attention: the positions (RoPE, the window) matter to the logits
        lp.wk *= 10
        lp.wo *= 30  # post-norm inputs in fp16's normal range (see above)
        lp.w2 *= 30
        for key in ("rms_att", "rms_ffn", "q_norm", "k_norm", "post_att_norm", "post_ffn_norm"):
            a = getattr(lp, key)
            a[...] = rng.uniform(-0.5, 1.0, a.shape)
    p.rms_final[...] = rng.uniform(-0.5, 1.0, p.rms_final.shape)
    return p


def decoder(params: Params, sharded: bool = False) -> PackageDecoder:
    cfg = params.cfg
    stages = plan_shards(cfg, one_layer_shard_mb(cfg), "none", True) if sharded else [Stage.whole(cfg)]
    return PackageDecoder.from_programs(stages_of(params, stages, "none"))


def run(dec: object, tokens: list[int]) -> np.ndarray:
    """Logits (T - PROMPT + 1, vocab): the prompt's last through prefill, then one decode step a token."""
    got = [dec.forward(tokens[:PROMPT], 0)]  # type: ignore[attr-defined]
    got += [dec.forward([tokens[pos]], pos) for pos in range(PROMPT, len(tokens))]  # type: ignore[attr-defined]
    return np.array(got)


@pytest.fixture(scope="module")
def params() -> Params:
    return gemma_params()


def test_prefill_and_decode_match_the_cpu_forward(params: Params) -> None:
    want = CpuDecoder(params).forward_all(TOKENS, 0)[:, PROMPT - 1 :].T  # (steps, vocab)
    got = run(decoder(params), TOKENS)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, atol=0.025 * scale)  # fp16 activations, as the other exports
    # the window and the local RoPE base move the logits by far more than the tolerance: both are seen
    for change in ({"sliding_window": 16}, {"rope_local_theta": 1e6}):
        moved = CpuDecoder(Params(params.cfg.with_(**change), params.embed, params.layers, params.rms_final))
        assert np.abs(moved.forward_all(TOKENS, 0)[:, PROMPT - 1 :].T - want).max() > 0.05 * scale, change


def test_sharded_equals_whole(params: Params) -> None:
    whole, sharded = decoder(params), decoder(params, sharded=True)
    assert len(sharded.stages) >= 4  # embedding, one shard per layer, head
    np.testing.assert_array_equal(run(sharded, TOKENS), run(whole, TOKENS))


def test_programs_lint_without_errors_for_the_coreml_route(params: Params) -> None:
    cfg = params.cfg
    for stage in [Stage.whole(cfg), *plan_shards(cfg, one_layer_shard_mb(cfg), "none", True)]:
        (_, program, weights), *_ = stages_of(params, [stage])
        for chip in ("any", *CHIPS):
            broken = {f.rule.id for f in errors(check_program(program, chip, weights, route="coreml"))}
            assert not broken, (stage.label, chip, broken)


def test_the_program_has_gemmas_ops(params: Params) -> None:
    (_, program, _), *_ = stages_of(params, [Stage.whole(params.cfg)])
    ops = program.functions["prefill"].ops
    gelus = [op for op in ops if op.op_type == "gelu"]
    assert len(gelus) == params.cfg.n_layers and all(op.op_type != "silu" for op in ops)
    names = {op.outputs[0].name for op in ops}
    assert {"embed_scaled", "l0_post_att_norm_out", "l3_post_ffn_norm_out", "sliding_mask_5"} <= names
    assert {"rope_cos_64", "rope_cos_64_sliding"} <= names  # full and sliding layers' RoPE tables


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_planned_bytes_equal_what_the_sink_writes(params: Params, quant: str) -> None:
    cfg = params.cfg
    for stage in [Stage.whole(cfg), *plan_shards(cfg, one_layer_shard_mb(cfg), quant, True)]:
        sink = WeightSink(_BlobStream(io.BytesIO()).append, quant)
        build_program(params, stage, sink)
        assert sink.nbytes == stage_weight_bytes(cfg, stage, quant, tied=True), (stage.label, quant)


def test_coremltools_loads_the_package(params: Params, tmp_path: Path) -> None:
    coremltools()
    from anekit.coreml.model_export import export_mlpackage

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = export_mlpackage(params, tmp_path / "gemma.mlpackage")
    for path in report.packages:  # type: ignore[attr-defined]
        _, prog = ct_load(path)
        assert sorted(prog.functions) == ["decode", "prefill"], path
