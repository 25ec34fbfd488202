"""The CoreML export of Hugging Face variants: q / k / v biases (Qwen 2), the per-head q / k RMSNorm before
RoPE (Qwen 3), heads x head_dim = q_dim != dim, Llama 3's rope scaling.

The reference is ``anekit.llama.sample.CpuDecoder`` (the CPU forward that implements these variants in
float32 numpy), independent of the exporter; the package runs in the simulator, prefill then decode.
Every norm scale and bias is drawn at random so that dropping one would move the logits (checked against
the same reference with the variant removed). Packages on disk go through coremltools' milproto loader,
whole and sharded, in every quantization; the shard planner's byte count is checked against the
weight files written.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pytest

from anekit.blob import ALIGNMENT, HEADER_SIZE, METADATA_SIZE, BlobFile, _BlobStream
from anekit.coreml.decoder import PackageDecoder
from anekit.coreml.export import WEIGHT_PATH, Stage, WeightSink, build_program, stage_weight_bytes
from anekit.coreml.manifest import WEIGHT_FILE
from anekit.coreml.quantize import QUANT_MODES
from anekit.coreml.shards import MB, SHARDS_FILE, model_config, plan_shards, read_manifest
from anekit.kernels.config import ModelConfig, RopeScaling
from anekit.llama.params import LayerParams, Params
from anekit.llama.sample import CpuDecoder
from anekit.rules import CHIPS
from anekit.rules.checks import check_program, errors
from tests.coreml_oracle import coremltools, ct_load
from tests.test_coreml_export import stages_of

BASE = ModelConfig(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, seq_len=16)
CFGS = {
    # Qwen 3 in small: 4 heads of 16 (q_dim 64 != dim 32), biases and the q / k norm, and Llama 3's scaling
    "qwen3-like": BASE.with_(
        attn_head_dim=16, qkv_bias=True, qk_norm=True, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8)
    ),
    "bias": BASE.with_(qkv_bias=True),  # Qwen 2
    "qk-norm": BASE.with_(qk_norm=True),
    "head-dim": BASE.with_(attn_head_dim=4),  # q_dim 16 < dim 32
    "rope-scaling": BASE.with_(rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8)),  # Llama 3
}
TOKENS = [1, 17, 5, 42, 9, 30, 2, 11, 60, 3]
PROMPT = 4


def hf_params(cfg: ModelConfig, seed: int = 3, tied: bool = False) -> Params:
    """llama2.c's initialisation, q / k projections 10x larger, every norm scale and bias drawn at random
    so each one matters."""
    p = Params.init(cfg, seed, tied)
    rng = np.random.default_rng(seed + 100)
    for lp in p.layers:
        lp.wq *= 10  # sharp attention: the positions (RoPE, its scaling) matter to the logits
        lp.wk *= 10
        for key in ("rms_att", "rms_ffn", "q_norm", "k_norm"):
            if (a := getattr(lp, key)) is not None:
                a[...] = rng.uniform(0.5, 2.0, a.shape)
        for key in ("bq", "bk", "bv"):
            if (a := getattr(lp, key)) is not None:
                a[...] = rng.normal(0.0, 0.5, a.shape)
    p.rms_final[...] = rng.uniform(0.5, 2.0, p.rms_final.shape)
    return p


def variants(cfg: ModelConfig) -> list[str]:
    """The variants of ``cfg`` a model without them could still run (a head size of its own cannot go)."""
    present = {"bias": cfg.qkv_bias, "qk-norm": cfg.qk_norm, "rope-scaling": cfg.rope_scaling is not None}
    return [name for name, has in present.items() if has]


def without_variant(p: Params, name: str) -> Params:
    """The same weights with the variant ``name`` removed: what an exporter that ignored it would compute."""
    if name == "rope-scaling":
        return Params(p.cfg.with_(rope_scaling=None), p.embed, p.layers, p.rms_final, p.wcls)
    drop = {"bias": ("bq", "bk", "bv"), "qk-norm": ("q_norm", "k_norm")}[name]
    flag = {"bias": "qkv_bias", "qk-norm": "qk_norm"}[name]  # the family reads the config, not the weights
    layers = [LayerParams(**{k: v for k, v in lp.as_dict().items() if k not in drop}) for lp in p.layers]
    return Params(p.cfg.with_(**{flag: False}), p.embed, layers, p.rms_final, p.wcls)


def one_layer_shard_mb(cfg: ModelConfig) -> float:
    """A --shard-mb that holds one layer but not two: every layer in a shard of its own."""
    one, two = (stage_weight_bytes(cfg, Stage(False, layers, False)) for layers in ((0,), (0, 1)))
    return (one + two) / 2 / MB


def decoder(params: Params, quant: str = "none", sharded: bool = False) -> PackageDecoder:
    cfg = params.cfg
    stages = plan_shards(cfg, one_layer_shard_mb(cfg), quant, False) if sharded else [Stage.whole(cfg)]
    return PackageDecoder.from_programs(stages_of(params, stages, quant))


def run(dec: object, tokens: list[int]) -> np.ndarray:
    """Logits (T - PROMPT + 1, vocab): the prompt's last through prefill, then one decode step a token."""
    got = [dec.forward(tokens[:PROMPT], 0)]  # type: ignore[attr-defined]
    got += [dec.forward([tokens[pos]], pos) for pos in range(PROMPT, len(tokens))]  # type: ignore[attr-defined]
    return np.array(got)


def greedy(dec: object, steps: int) -> list[int]:
    """Greedy tokens after the prompt: prefill, then each argmax fed back through decode."""
    ids = list(TOKENS[:PROMPT])
    logits = dec.forward(ids, 0)  # type: ignore[attr-defined]
    for _ in range(steps):
        ids.append(int(np.argmax(logits)))
        logits = dec.forward([ids[-1]], len(ids) - 1)  # type: ignore[attr-defined]
    return ids[PROMPT:]


def _weight_file(package: Path) -> Path:
    return package / "Data" / "com.apple.CoreML" / "weights" / WEIGHT_FILE


def _export(params: Params, out: Path, quant: str = "none", shard_mb: float | None = None) -> object:
    from anekit.coreml.model_export import export_mlpackage

    coremltools()  # the package writer needs coremltools' protobuf classes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # int4-block warns that it leaves the engine
        return export_mlpackage(params, out, quant=quant, shard_mb=shard_mb)


@pytest.fixture(scope="module", params=list(CFGS))
def model(request: pytest.FixtureRequest) -> tuple[str, Params]:
    return request.param, hf_params(CFGS[request.param])


# -- the forward --------------------------------------------------------------------------------------


def test_prefill_and_decode_match_the_cpu_forward(model: tuple[str, Params]) -> None:
    name, params = model
    want = CpuDecoder(params).forward_all(TOKENS, 0)[:, PROMPT - 1 :].T  # (steps, vocab)
    got = run(decoder(params), TOKENS)
    scale = np.abs(want).max()
    # fp16 activations and weights with the engine's numerics, as tests/test_coreml_export.py's tolerance
    np.testing.assert_allclose(got, want, atol=0.025 * scale)
    for variant in variants(params.cfg):  # each moves the logits by twice the tolerance or more: it is seen
        plain = CpuDecoder(without_variant(params, variant)).forward_all(TOKENS, 0)[:, PROMPT - 1 :].T
        assert np.abs(plain - want).max() > 0.05 * scale, (name, variant)  # measured 7.6 % to 127 %


def test_greedy_tokens_follow_the_cpu_forward_with_fp16_weights(model: tuple[str, Params]) -> None:
    """The package stores fp16 weights: the CPU forward on the weights rounded to fp16 picks the same greedy
    tokens to the end of the context, or up to a near tie of its own: its top two logits closer than the
    logits' tolerance (2.5 % of the largest), where fp16 activations may pick either (measured: two of these
    five random models reach one, 1.6 % and 0.9 % apart, after 9 and 11 agreeing tokens)."""
    _, params = model
    p16 = params.copy()
    for _, a in p16.tensors():
        a[...] = a.astype(np.float16).astype(np.float32)
    steps = params.cfg.seq_len - PROMPT
    got, want = greedy(decoder(params), steps), greedy(CpuDecoder(p16), steps)
    if got != want:
        first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        logits = CpuDecoder(p16).forward_all(TOKENS[:PROMPT] + want[:first], 0)[:, -1]  # (vocab,)
        top2 = np.sort(logits)[-2:]
        assert top2[1] - top2[0] < 0.025 * np.abs(logits).max(), (first, got, want)
        assert got[first] == np.argsort(logits)[-2]  # the package took the runner-up of the tie


def test_sharded_equals_whole(model: tuple[str, Params]) -> None:
    _, params = model
    whole, sharded = decoder(params), decoder(params, sharded=True)
    assert len(sharded.stages) >= 4  # embedding, one shard per layer, head
    np.testing.assert_array_equal(run(sharded, TOKENS), run(whole, TOKENS))


def test_int8_stays_close_to_the_cpu_forward(model: tuple[str, Params]) -> None:
    """int8 per tensor on the projections (biases and norm scales stay fp16, as the RMSNorm scales)."""
    _, params = model
    want = CpuDecoder(params).forward_all(TOKENS, 0)[:, PROMPT - 1 :].T
    got = run(decoder(params, "int8"), TOKENS)
    np.testing.assert_allclose(got, want, atol=0.1 * np.abs(want).max())
    (_, program, _), *_ = stages_of(params, [Stage.whole(params.cfg)], "int8")
    dq = [op for op in program.functions["prefill"].ops if op.op_type == "constexpr_blockwise_shift_scale"]
    assert len(dq) == params.cfg.n_layers * 7 + 1  # the seven projections a layer, and the classifier


def test_programs_lint_without_errors_for_the_coreml_route() -> None:
    cfg = CFGS["qwen3-like"]
    params = hf_params(cfg)
    for stage in [Stage.whole(cfg), *plan_shards(cfg, one_layer_shard_mb(cfg), "none", False)]:
        (_, program, weights), *_ = stages_of(params, [stage])
        for chip in ("any", *CHIPS):
            broken = {f.rule.id for f in errors(check_program(program, chip, weights, route="coreml"))}
            assert not broken, (stage.label, chip, broken)


def test_the_rope_tables_are_the_scaled_ones() -> None:
    """The package's cos table is ``llama.sample.rope_tables``' (Llama 3's scaling in it), in fp16."""
    from anekit.llama.sample import rope_tables

    cfg = CFGS["qwen3-like"]
    (_, program, weights), *_ = stages_of(hf_params(cfg), [Stage.whole(cfg)])
    (op,) = [op for op in program.functions["prefill"].ops if op.outputs[0].name == f"rope_cos_{cfg.q_dim}"]
    offset = op.attributes["val"].value.offset  # type: ignore[union-attr]
    blob = BlobFile(weights[WEIGHT_PATH])
    try:
        entry = next(e for e in blob.entries if e.metadata_offset == offset)
        table = np.frombuffer(bytes(blob.raw(entry.metadata_offset)), np.float16)
    finally:
        blob.close()
    cos = rope_tables(cfg, cfg.seq_len)[0]  # (hd/2, S)
    pair = (np.arange(cfg.q_dim) % cfg.head_dim) // 2
    np.testing.assert_array_equal(table.reshape(cfg.q_dim, cfg.seq_len), cos[pair].astype(np.float16))
    unscaled = rope_tables(cfg.with_(rope_scaling=None), cfg.seq_len)[0]
    assert not np.allclose(cos, unscaled, atol=1e-2)


# -- the shard planner --------------------------------------------------------------------------------


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_planned_bytes_equal_what_the_sink_writes(quant: str) -> None:
    """``stage_weight_bytes`` counts q_dim-sized wq / wo, the biases and the q / k norm scales: for weights
    with no two blobs alike it is exactly what the stage writes, for every stage of a sharded plan."""
    cfg = CFGS["qwen3-like"]
    params = hf_params(cfg)
    for stage in [Stage.whole(cfg), *plan_shards(cfg, one_layer_shard_mb(cfg), quant, False)]:
        sink = WeightSink(_BlobStream(io.BytesIO()).append, quant)
        build_program(params, stage, sink)
        assert sink.nbytes == stage_weight_bytes(cfg, stage, quant, tied=False), (stage.label, quant)


# -- packages on disk ---------------------------------------------------------------------------------


def _assert_coremltools_loads(packages: list[Path]) -> None:
    for path in packages:
        _, prog = ct_load(path)  # AssertionError "Mismatch between var types" on any disagreement
        assert sorted(prog.functions) == ["decode", "prefill"], path


@pytest.mark.parametrize("quant", QUANT_MODES)
@pytest.mark.parametrize("name", list(CFGS))
def test_coremltools_loads_whole_and_sharded_exports(tmp_path: Path, name: str, quant: str) -> None:
    params = hf_params(CFGS[name])
    whole = _export(params, tmp_path / "m.mlpackage", quant)
    shards = _export(params, tmp_path / "shards", quant, one_layer_shard_mb(params.cfg))
    assert len(shards.packages) >= 3  # type: ignore[attr-defined]
    _assert_coremltools_loads(whole.packages + shards.packages)  # type: ignore[attr-defined]


def test_exports_on_disk_run_as_the_cpu_forward_and_weigh_what_was_planned(tmp_path: Path) -> None:
    """A Qwen 3-like model on disk: whole and sharded packages give the same logits, near the CPU forward;
    each weight.bin is the planned bytes plus the blob headers (one file header, one record a blob, data
    aligned to 64 bytes); shards.json gives back the model's configuration, rope scaling included."""
    cfg = CFGS["qwen3-like"]
    params = hf_params(cfg)
    whole = _export(params, tmp_path / "m.mlpackage")
    shards = _export(params, tmp_path / "shards", shard_mb=one_layer_shard_mb(cfg))
    for report in (whole, shards):
        for package, planned in zip(report.packages, report.weight_bytes):  # type: ignore[attr-defined]
            path = _weight_file(package)
            blob = BlobFile(path)
            n = len(blob.entries)
            blob.close()
            size = path.stat().st_size
            assert planned <= size <= planned + HEADER_SIZE + n * (METADATA_SIZE + ALIGNMENT), package.name
    stages = plan_shards(cfg, one_layer_shard_mb(cfg), "none", False)
    assert shards.weight_bytes == [stage_weight_bytes(cfg, s, "none", False) for s in stages]  # type: ignore[attr-defined]
    assert model_config(read_manifest(tmp_path / "shards" / SHARDS_FILE)) == cfg
    want = CpuDecoder(params).forward_all(TOKENS, 0)[:, PROMPT - 1 :].T
    got = run(PackageDecoder.open(tmp_path / "m.mlpackage"), TOKENS)
    np.testing.assert_allclose(got, want, atol=0.025 * np.abs(want).max())
    np.testing.assert_array_equal(run(PackageDecoder.open(tmp_path / "shards"), TOKENS), got)
