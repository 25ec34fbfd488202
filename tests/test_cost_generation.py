"""The generation cost model (``anekit cost --generate``): hand-computed kernel and host times from the
published figures, the plan's shape (capacity, tiles, dispatches per token), every preset and Hugging Face
shape priced, bad input in one line, and every published generation figure beside its prediction."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from anekit.cli.main import main
from anekit.cost import Params, Work, count
from anekit.cost import gen_work as gw
from anekit.cost.calibration import FIGURE, HELD_OUT, TOLERANCE, generation_rows
from anekit.cost.gen_pipelines import (
    GPT2_124M,
    GPT2_PARAMS,
    GPT2_SPLIT,
    QWEN25_05B,
    QWEN25_SPLIT,
    TINYLLAMA,
    TINYLLAMA_HYBRID,
    host_weights_ms,
    hybrid_dispatches,
    hybrid_step,
)
from anekit.cost.generation import (
    Dispatch,
    GenerationCostError,
    HostStep,
    counted,
    dispatch_of,
    predict_generation,
    predict_phase,
)
from anekit.cost.work import Layer
from anekit.cost.workloads import conv_program
from anekit.engine.generation_routes import NoGenerationRoute
from anekit.engine.performance import performance
from anekit.errors import AnekitError
from anekit.kernels.config import PRESETS
from anekit.kernels.conv_only import qkv_fwd, wo_fwd
from anekit.kernels.forward import ffn_fwd
from anekit.kernels.generation import kernel_set, layers_kernel
from anekit.kernels.route import KernelRoute
from anekit.mil.ir import Program
from tests.hf_fixtures import SHAPES

UNIT = Params(1.0, 1.0, 1.0)


def _conv_work(out: int, inp: int, width: int, io: float) -> Work:
    layer = Layer("conv", 2.0 * out * inp * width, 0.0, out * inp * 2.0, out, (1, 1), False, ())
    return Work("w", layer.flops, 0.0, io, layer.weight_bytes, 0.0, 0.0, 1, (layer,))


def test_one_kernel_by_hand_on_the_m1() -> None:
    # A 2048 -> 2048 1x1 conv over 32 columns on the M1, every efficiency 1: the guide's 0.23 ms floor, the
    # surfaces and the weights at ANEMLL's 60.87 GB/s stream, the compute at 8.1 TFLOP/s in 11 groups of 192.
    io = (2048 + 2048) * 32 * 2.0
    floor, stream, peak = 0.23, 60.87e9, 8.1e12
    weights_ms = 2048 * 2048 * 2.0 / stream * 1e3
    compute_ms = 2.0 * 2048 * 2048 * 32 * (11 * 192 / 2048) / peak * 1e3
    expected = floor + io / stream * 1e3 + max(weights_ms, compute_ms)
    phase = predict_phase([Dispatch(_conv_work(2048, 2048, 32, io), runs=3)], [], performance("m1"), UNIT)
    assert phase.rows[0][1] == pytest.approx(expected, rel=1e-12)
    assert phase.engine_ms == pytest.approx(3 * expected, rel=1e-12)
    assert phase.dispatches == 3
    assert phase.rows[0][2] == (
        "dispatch" if floor >= max(weights_ms, compute_ms) + io / stream * 1e3 else "memory"
    )


def test_a_counted_program_is_priced_like_its_work() -> None:
    program = conv_program(256, 64)
    counted = dispatch_of(program, runs=2)
    assert counted.work.weight_bytes == 256 * 256 * 2 and counted.runs == 2
    assert dispatch_of(program, weight_bytes=1e6).work.weight_bytes == 1e6


def test_host_time_is_the_slower_of_its_bytes_and_its_flops() -> None:
    # The M1's host: Orion's M4 Max stream (124439808 fp32 weights in 3.5 ms) capped at the M1's 68 GB/s,
    # and the guide's 1.9 TFLOP/s matmul.
    stream = min(124439808 * 4 / 3.5e-3, 68e9)
    assert stream == 68e9
    step = HostStep("attention", 1.9e9, 68e6)  # 1 ms either way
    phase = predict_phase([], [step], performance("m1"), UNIT)
    assert phase.host_ms == pytest.approx(1.0, rel=1e-12)
    bytes_bound = HostStep("cache writes", 0.0, 6.8e6)
    assert predict_phase([], [bytes_bound], performance("m1"), UNIT).host_ms == pytest.approx(0.1)
    assert host_weights_ms(GPT2_PARAMS, "m4-max") == pytest.approx(3.5, rel=1e-12)


def test_decode_rate_is_the_inverse_of_the_token_time() -> None:
    cfg = PRESETS["stories15M"]
    cost = predict_generation(cfg, "m4", UNIT, 64)
    assert cost.decode_tokens_per_s == pytest.approx(1000.0 / (cost.decode.engine_ms + cost.decode.host_ms))
    # the engine part: the sum of every kernel's evaluations
    assert cost.decode.engine_ms == pytest.approx(sum(d.runs * ms for d, ms, _ in cost.decode.rows))


@pytest.mark.parametrize(
    ("chip", "route", "dispatches"),
    [
        ("m1", "conv-host-attention", 3 * 12 + 1),  # qkv, wo, ffn per layer + one head tile
        ("m2-max", "conv-host-attention", 3 * 12 + 1),
        ("m4", "baked-fused", 1 + 1),  # every layer in one kernel (170 MB of weights) + the head
        ("m5", "baked-fused", 1 + 1),
    ],
)
def test_routes_and_dispatches_per_token(chip: str, route: str, dispatches: int) -> None:
    cost = predict_generation(PRESETS["stories110M"], chip, UNIT, 100)
    assert cost.route.id == route and cost.decode.dispatches == dispatches
    assert all(d.source == "program" for d, _, _ in cost.decode.rows)  # every kernel built and counted
    # the programs' own weights: 12 layers of wq, wk, wv, wo (768 x 768) and w1, w2, w3 (768 x 2048), and
    # the 32000 x 768 classifier, fp16
    weights = sum(d.runs * d.work.weight_bytes for d, _, _ in cost.decode.rows)
    assert weights == pytest.approx(2 * (12 * (4 * 768 * 768 + 3 * 768 * 2048) + 32000 * 768), rel=1e-3)


def test_a_chip_with_no_generation_route_is_refused_naming_it() -> None:
    with pytest.raises(NoGenerationRoute, match="no generation route on m3"):
        predict_generation(PRESETS["stories15M"], "m3", UNIT, 10)


def test_prefill_runs_the_prompt_in_chunks() -> None:
    cfg = PRESETS["stories110M"]  # seq_len 256: capacity 384 at width 128, 480 at width 32
    one = predict_generation(cfg, "m4", UNIT, 128)
    two = predict_generation(cfg, "m4", UNIT, 129)
    assert (one.chunks, two.chunks) == (1, 2)
    assert (one.plan.prefill_capacity, one.plan.capacity) == (384, 480)
    assert two.prefill_ms == pytest.approx(one.prefill_ms + one.prefill_chunk.engine_ms, rel=0.01)


def test_host_attention_grows_with_the_position_on_the_m1() -> None:
    cfg = PRESETS["stories110M"]
    early, late = (predict_generation(cfg, "m1", UNIT, p) for p in (8, 200))
    assert late.decode.host_ms > early.decode.host_ms
    assert late.decode.engine_ms == pytest.approx(early.decode.engine_ms)


def test_prompt_past_the_context_is_refused_naming_it() -> None:
    with pytest.raises(GenerationCostError, match="between 1 and 255"):
        predict_generation(PRESETS["stories110M"], "m4", UNIT, 256)


def _doc(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["cost", *args, "--generate", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _both(doc: dict) -> None:
    assert math.isfinite(doc["prefill_ms"]) and doc["prefill_ms"] > 0
    assert math.isfinite(doc["decode_tokens_per_s"]) and doc["decode_tokens_per_s"] > 0
    assert doc["dispatches_per_token"] == sum(k["runs"] for k in doc["decode"]["kernels"])


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("chip", ["m1", "m2", "m4", "m5-max", "any"])
def test_every_preset_prints_both_figures(capsys: pytest.CaptureFixture[str], name: str, chip: str) -> None:
    _both(_doc(capsys, "--config", name, "--chip", chip))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_hugging_face_shape_from_its_config_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, shape: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SHAPES[shape]))
    prompt = min(300, SHAPES[shape]["max_position_embeddings"] // 2)
    for chip in ("m1", "m4", "any"):
        doc = _doc(capsys, "--config", str(tmp_path), "--chip", chip, "--prompt", str(prompt))
        _both(doc)
        assert doc["prompt"] == prompt and doc["prefill_chunks"] == math.ceil(prompt / doc["prefill_width"])
        tiles = [k for k in doc["decode"]["kernels"] if k["kind"] == "head"]
        assert len(tiles) == math.ceil(SHAPES[shape]["vocab_size"] / 65536)


def test_text_report_names_both_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--config", "stories15M", "--chip", "m4", "--generate", "--prompt", "64"]) == 0
    out = capsys.readouterr().out
    assert "prefill_ms:" in out and "decode_tokens_per_s:" in out and "baked-fused" in out


def test_directory_without_config_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["cost", "--config", str(tmp_path), "--generate"]) != 0
    err = capsys.readouterr().err
    assert "without config.json" in err and str(tmp_path) in err and len(err.strip().splitlines()) == 1


def test_bad_config_names_the_field(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = dict(SHAPES["smollm2"])
    del bad["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(bad))
    assert main(["cost", "--config", str(tmp_path), "--generate"]) != 0
    err = capsys.readouterr().err
    assert "hidden_size" in err and len(err.strip().splitlines()) == 1


def test_prompt_too_long_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--config", "stories15M", "--chip", "m4", "--generate", "--prompt", "999"]) != 0
    err = capsys.readouterr().err
    assert "--prompt 999" in err and "255" in err and len(err.strip().splitlines()) == 1


def test_every_generation_figure_with_its_source_and_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--generate", "--calibration", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["figures"]
    ids = {r["id"] for r in rows}
    held = [r for r in rows if r["role"] == HELD_OUT]
    assert doc["summary"]["held_out"] == len(held)
    assert doc["summary"]["within_tolerance"] == sum(r["within_tolerance"] for r in held)
    assert {"guide-tinyllama-hybrid-decode", "guide-batched-prefill", "orion-gpt2-decode-m4-max"} <= ids
    for r in rows:
        assert r["source"] and r["quote"] and r["chip"] and r["role"] in (FIGURE, HELD_OUT)
        low, high = (r["measured"], r["measured"]) if isinstance(r["measured"], float) else r["measured"]
        expected = (
            1.0 if low <= r["predicted"] <= high else r["predicted"] / (low if r["predicted"] < low else high)
        )
        assert r["ratio"] == pytest.approx(expected)
        assert r["within_tolerance"] == (abs(expected - 1) <= TOLERANCE)


def test_figures_fix_what_they_set_and_held_out_ones_are_reported_honestly() -> None:
    rows = {r.measurement.id: r for r in generation_rows(Params(0.577, 0.291, 0.752))}
    assert rows["guide-dispatch-floor"].predicted == pytest.approx(0.23, rel=0.02)
    assert rows["guide-dispatches-per-stack"].predicted == 2 * 22 + 1
    assert rows["orion-gpt2-cpu-decode-m4-max"].predicted == pytest.approx(3.5)
    # the M1-fitted DRAM efficiency leaves TinyLlama's hybrid weight-bound far below the measured 35 tok/s:
    # reported as held out and outside the tolerance, not tuned away
    tiny = rows["guide-tinyllama-hybrid-decode"]
    assert tiny.measurement.role == HELD_OUT and not tiny.within and tiny.measurement.explanation


def test_generate_flags_need_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--config", "stories15M", "--prompt", "8"]) != 0
    assert "--prompt" in capsys.readouterr().err
    assert main(["cost", "--generate"]) != 0
    assert "--config" in capsys.readouterr().err
    assert main(["cost", "--config", "stories15M", "--generate", "--route", "e5rt"]) != 0
    assert "--route e5rt" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["stories15M", "stories110M"])
@pytest.mark.parametrize(("width", "capacity"), [(32, 480), (128, 384)])
def test_shapes_count_agrees_with_the_programs(name: str, width: int, capacity: int) -> None:
    # What stands in for a kernel a builder refuses: the same FLOPs and surfaces as the built program,
    # the weights but the norms' vectors, the element ops within a quarter.
    cfg = PRESETS[name]
    route = KernelRoute("baked", "engine", "engine", "slice")
    program = count(layers_kernel(cfg, 0, cfg.n_layers, width=width, capacity=capacity, route=route).program)
    shapes = gw.fused_layers_work(cfg, 0, cfg.n_layers, width, capacity)
    assert program.flops == shapes.flops and program.io_bytes == shapes.io_bytes
    assert program.weight_bytes == pytest.approx(shapes.weight_bytes, rel=0.01)
    assert program.element_ops == pytest.approx(shapes.element_ops, rel=0.25)
    cw = cfg.with_(seq_len=width)
    built = (qkv_fwd(cw), wo_fwd(cw), ffn_fwd(cw, None, norm="host"))
    for spec, shaped in zip(built, gw.conv_route_works(cfg, width)):
        counted = count(spec.program)
        assert (counted.flops, counted.weight_bytes, counted.io_bytes) == (
            shaped.flops,
            shaped.weight_bytes,
            shaped.io_bytes,
        )


def test_a_kernel_the_builder_refuses_is_counted_from_its_shapes_and_says_so() -> None:
    def refused() -> Program:
        raise AnekitError("[ffn_fwd] conv 'ffn' reads 9999 input channels: split it\nmore")

    shapes = gw.conv_route_works(PRESETS["stories15M"], 32)[2]
    d = counted("gen_ffn_w32", refused, lambda: shapes, 6, "projection")
    assert d.source == "shapes: [ffn_fwd] conv 'ffn' reads 9999 input channels: split it"
    assert (d.work.flops, d.work.weight_bytes, d.runs) == (shapes.flops, shapes.weight_bytes, 6)


def test_every_kernel_of_a_qwen3_shape_is_built(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SHAPES["qwen3"]))  # W2 reads 3072 channels: split
    for chip in ("m1", "m4"):
        doc = _doc(capsys, "--config", str(tmp_path), "--chip", chip, "--prompt", "16")
        assert {k["counted_from"] for k in doc["decode"]["kernels"]} == {"program"}


def test_published_pipelines_by_hand() -> None:
    # Orion's GPT-2: two kernels a layer (24 a token), Wo and the 50257 x 768 classifier in fp32 on the host
    dispatches, steps = hybrid_step(GPT2_124M, GPT2_SPLIT, 1, 0)
    assert sum(d.runs for d in dispatches) == 24
    host = {s.name: s for s in steps}
    assert host["fp32 projections"].bytes == (12 * 768 * 768 + 50257 * 768) * 4
    assert hybrid_dispatches(TINYLLAMA, TINYLLAMA_HYBRID) == 2 * 22 + 1
    assert hybrid_dispatches(QWEN25_05B, QWEN25_SPLIT) == 7 * 24 + 3  # 151936 tokens in 3 tiles


@pytest.mark.parametrize("chip", ["m1", "m4"])
def test_the_priced_kernels_are_the_drivers(chip: str) -> None:
    # the same kernels, names and weights as anekit.kernels.generation.kernel_set builds for the plan
    cost = predict_generation(PRESETS["stories110M"], chip, UNIT, 64)
    plan, w = cost.plan, cost.plan.decode_width
    built = kernel_set(
        PRESETS["stories110M"],
        KernelRoute(*cost.route.kernel_route),
        width=w,
        capacity=plan.capacity,
        groups=plan.groups,
        tiles=plan.tiles,
    )
    priced = {d.work.name: d for d, _, _ in cost.decode.rows}
    expected = {
        re.sub(r"_\d+_w", "_w", n) if n.startswith(("gen_qkv", "gen_wo", "gen_ffn")) else n for n in built
    }
    assert set(priced) == expected
    total = sum(d.runs * d.work.weight_bytes for d in priced.values())
    assert total == pytest.approx(sum(k.weight_bytes for k in built.values()), rel=1e-3)
