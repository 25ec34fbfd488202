"""The whole training step in the cost model: the host's figures per device, the host's part counted by
hand, the schedule beside the engine, and `anekit cost`'s step lines and JSON keys."""

from __future__ import annotations

import json

import pytest

from anekit.cli.main import main
from anekit.cost import fitted
from anekit.cost.host_step import (
    BESIDE,
    ENGINE,
    HOST,
    WAIT,
    Task,
    compile_ms,
    predict_step,
    schedule,
    step_tasks,
    trained_parameters,
)
from anekit.cost.step import host_flops
from anekit.engine.chips import DEVICES
from anekit.engine.evidence import STATUSES
from anekit.engine.host import compile_figure, host_figures
from anekit.engine.performance import PERFORMANCE, performance
from anekit.errors import AnekitError
from anekit.kernels.config import PRESETS, ModelConfig, preset
from anekit.llama.params import Params

# dim 64, hidden 128, 2 layers, 4 heads (kv 4), vocab 96, 64 tokens: every count below by hand
SMALL = ModelConfig(64, 128, 2, 4, 4, 96, 64, name="small")


# -- the host's figures ------------------------------------------------------------------------------------


def test_every_device_has_host_figures_with_sources() -> None:
    for name, perf in PERFORMANCE.items():
        f = host_figures(perf)
        c = compile_figure(perf)
        for fig in (f.stream, f.gemm, c):
            assert fig.value > 0 and fig.source.strip() and fig.status in STATUSES, (name, fig)
        assert f.stream.value <= perf.dram.value  # the CPU streams no faster than the DRAM
        measured = {"m1", "m1-max", "m4"}  # the devices a matrix rate was published for
        assert (f.gemm.status == "measured") == (name in measured), (name, f.gemm.status)
        assert c.status in ("derived", "assumed")


def test_host_figures_are_the_published_values() -> None:
    """The values against the sources' own numbers: the guide's M1 (1.9 TFLOP/s), amx-benchmarks' M1 Max
    (1312.8 GFLOPS/k at k = 2), LIBXSMM's M4 (1755.19 GFLOPS); Orion's GPT-2 decode (124439808 fp32
    weights in 3.5 ms) capped by each device's DRAM; maderix's compile per restart over 72 kernels."""
    gemm = {"m1": 1.9, "m1-max": 1312.8 * 2 / 1e3, "m4": 1755.19 / 1e3}
    for name, tflops in gemm.items():
        assert host_figures(performance(name)).gemm.value == pytest.approx(tflops, rel=1e-4)
    orion = 124439808 * 4 / 3.5e-3 / 1e9
    assert host_figures(performance("m4-max")).stream.value == pytest.approx(orion)
    assert host_figures(performance("m4")).stream.value == 120.0  # the M4's DRAM, below Orion's rate
    (torch,) = host_figures(performance("m1")).gemm.also  # another M1 figure, near the guide's
    assert "1.7 TFLOPS" in torch.observed and torch.status == "reported"
    assert compile_figure(performance("m4")).value == pytest.approx(7600 / 72)
    assert compile_figure(performance("m4-pro")).value == pytest.approx(3500 / 72)


# -- the host's part, counted by hand -------------------------------------------------------------------


def test_host_flops_by_hand() -> None:
    """Classifier: logits, dW and dx, 3 x 2 x 96 x 64 x 64; per layer dW of Wq, Wk, Wv, Wo (64 x 64) and
    W1, W2, W3 (128 x 64), 2 x 64 tokens each; two layers."""
    classifier = 3 * 2 * 96 * 64 * 64
    per_layer = 2 * 64 * (4 * 64 * 64 + 3 * 128 * 64)
    expected = classifier + 2 * per_layer
    assert expected == 12_845_056
    for weights in ("baked", "dynamic"):
        tasks = step_tasks(SMALL, weights, trained_parameters(SMALL))
        assert sum(t.flops for t in tasks) == expected
    assert host_flops(SMALL) == expected


def test_parameters_and_optimizer_bytes_by_hand() -> None:
    """The parameter count against real arrays, and stories110M's by hand; AdamW's 32 bytes each."""
    assert trained_parameters(SMALL) == Params.init(SMALL).count()
    embed = 32000 * 768
    layer = 4 * 768 * 768 + 3 * 768 * 2048 + 2 * 768
    n110 = embed + 12 * layer + 768
    assert trained_parameters(preset("stories110M")) == n110 == 109_529_856
    assert trained_parameters(SMALL, tied=False) == trained_parameters(SMALL) + 96 * 64
    tasks = step_tasks(SMALL, "baked", 1000)
    (adamw,) = [t for t in tasks if t.group == "optimizer"]
    assert adamw.bytes == 1000 * (4 + 16 + 12)  # the norm's read of g; AdamW's 4 reads, 3 writes


def test_weight_writes_by_hand() -> None:
    """Dynamic weights: every weight segment of every kernel input, fp16, once per layer a step. Per layer
    (elements): sdpa_fwd Wq, Wk, Wv, Wo (4 x 64 x 64) + rms_att over 64 columns (64 x 64); ffn_fwd W1, W3,
    W2 (3 x 64 x 128) + rms_ffn (64 x 64); ffn_bwd_w2t W2 (64 x 128); ffn_bwd_w13t W1, W3 (2 x 128 x 64);
    wo_t Wo (64 x 64); qkv_bwd Wq; Wk; Wv (192 x 64)."""
    per_layer = (4 * 64 * 64 + 64 * 64) + (3 * 64 * 128 + 64 * 64) + 64 * 128 + 2 * 128 * 64 + 64 * 64
    per_layer += 192 * 64
    assert per_layer == 90_112
    (writes,) = [t for t in step_tasks(SMALL, "dynamic", 1) if t.group == "weight writes"]
    assert writes.bytes == 2 * 2 * per_layer
    assert not [t for t in step_tasks(SMALL, "baked", 1) if t.group == "weight writes"]


def test_conversions_and_head_bytes_by_hand() -> None:
    """The baked sdpa_fwd converts x (64 x 64) in and its six taps (o_out, q, k, v, attn_out, xnorm) out,
    6 bytes an element; the cross-entropy makes 10 passes over the (96, 64) float32 logits."""
    tasks = step_tasks(SMALL, "baked", 1)
    (conv,) = [t for t in tasks if t.name == "sdpa_fwd 0 conversions"]
    assert conv.bytes == 6 * (64 * 64 + 6 * 64 * 64)
    (ce,) = [t for t in tasks if t.name == "cross-entropy"]
    assert ce.bytes == 10 * 96 * 64 * 4
    # queued beside the engine: every weight gradient (the classifier's too), nothing else
    beside = sorted(t.name for t in tasks if t.where == BESIDE)
    per_layer = ("dW1", "dW2", "dW3", "dWk", "dWo", "dWq", "dWv")
    assert beside == sorted([f"{w} {i}" for w in per_layer for i in range(2)] + ["dW classifier"])
    on_path = {t.name for t in tasks if t.where == HOST}
    assert {"logits", "cross-entropy", "dx classifier", "AdamW"} <= on_path
    engine = [t.name for t in tasks if t.where == ENGINE]
    assert len(engine) == 2 * 6  # six kernels a layer, baked
    assert len([t for t in step_tasks(SMALL, "dynamic", 1) if t.where == ENGINE]) == 2 * 8


def test_each_host_part_is_flops_at_the_rate_plus_bytes_at_the_stream() -> None:
    perf, params = performance("m4"), fitted()
    st = predict_step(preset("stories15M"), "dynamic", perf, params, 1000)
    rate, stream = 1755.19e9, 120e9  # the M4's figures, as published
    for t in st.tasks:
        if t.where in (HOST, BESIDE):
            assert t.ms == pytest.approx((t.flops / rate + t.bytes / stream) * 1e3), t.name


def test_accumulation_shares_the_update_and_defers_the_wait() -> None:
    one = step_tasks(SMALL, "dynamic", 1000)
    ten = step_tasks(SMALL, "dynamic", 1000, accum=10)
    shared = {t.group: t.bytes for t in ten if t.group in ("optimizer", "weight writes")}
    assert shared["optimizer"] == 1000 * 32 / 10
    assert shared["weight writes"] == 2 * 2 * 90_112 / 10
    assert [t.where for t in one].count(WAIT) == 1 and WAIT not in [t.where for t in ten]
    for bad in (0, -1, 2.5):
        with pytest.raises(AnekitError, match=r"\[cost\] accum must be an integer >= 1"):
            step_tasks(SMALL, "dynamic", 1000, accum=bad)  # type: ignore[arg-type]


# -- the schedule ---------------------------------------------------------------------------------------


def _t(where: str, ms: float) -> Task:
    return Task(where, where, where, ms=ms)


def test_schedule_by_hand() -> None:
    """engine 2, queued 5 (2..7), engine 1 (2..3), host 1 (3..4), queued 1 (7..8), wait (8), host 2: 10."""
    tasks = [
        _t(ENGINE, 2),
        _t(BESIDE, 5),
        _t(ENGINE, 1),
        _t(HOST, 1),
        _t(BESIDE, 1),
        _t(WAIT, 0),
        _t(HOST, 2),
    ]
    assert schedule(tasks) == (10.0, 8.0)
    # a queue shorter than the engine's next kernels is hidden whole
    assert schedule([_t(ENGINE, 1), _t(BESIDE, 2), _t(ENGINE, 3), _t(WAIT, 0), _t(HOST, 1)]) == (5.0, 3.0)
    # with no wait the queue still ends the step
    assert schedule([_t(BESIDE, 4), _t(ENGINE, 1)]) == (4.0, 4.0)
    with pytest.raises(ValueError, match="where must be"):
        schedule([_t("elsewhere", 1)])


def test_step_is_between_its_bounds_and_hides_only_queued_work() -> None:
    params = fitted()
    for name in ("stories15M", "stories110M"):
        cfg = preset(name)
        for weights in ("baked", "dynamic"):
            st = predict_step(cfg, weights, performance("m4"), params, trained_parameters(cfg))
            on_path = st.host_ms - st.beside_ms
            assert max(st.engine_ms + on_path, st.beside_ms) <= st.step_ms + 1e-9
            assert st.step_ms <= st.engine_ms + st.host_ms + 1e-9
            assert 0 < st.overlapped_ms <= st.beside_ms + 1e-9
    cfg = preset("stories110M")
    assert compile_ms(cfg, "dynamic", performance("m4")) == 0
    assert compile_ms(cfg, "baked", performance("m4")) == pytest.approx(5 * 12 * 7600 / 72)


# -- the command line -----------------------------------------------------------------------------------

STEP_KEYS = {"engine_ms", "host_ms", "overlapped_ms", "step_ms", "host_parts", "host_figures", "chip"}


def test_cli_every_preset_and_device_prints_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    for model in PRESETS:
        for weights in ("baked", "dynamic"):
            for name in DEVICES:
                argv = ["cost", "--config", model, "--chip", name, "--weights", weights, "--json"]
                assert main(argv) == 0
                doc = json.loads(capsys.readouterr().out)
                step = doc["step"]
                assert set(step) >= STEP_KEYS and step["chip"] == name and step["weights"] == weights
                assert doc["step_ms"] == step["step_ms"] > 0 and doc["host_ms"] > 0
                assert doc["engine_ms"] == pytest.approx(step["engine_ms"])  # one device: the same kernels
                assert doc["overlapped_ms"] == pytest.approx(
                    doc["engine_ms"] + doc["host_ms"] - doc["step_ms"]
                )
                assert (step["compile_ms_per_update"] > 0) == (weights == "baked")
            argv = [
                "cost",
                "--config",
                model,
                "--chip",
                "m5",
                "--weights",
                weights,
                "--route",
                "e5rt",
                "--json",
            ]
            assert main(argv) == 0
            doc = json.loads(capsys.readouterr().out)
            assert doc["engine_ms"] == pytest.approx(doc["step"]["engine_ms"])  # the step's kernels on e5rt
            assert main(["cost", "--config", model, "--chip", "m4", "--weights", weights]) == 0
            out = capsys.readouterr().out
            assert "host part (m4)" in out and "step: " in out and "overlapped" in out
            assert ("compile: " in out) == (weights == "baked")


def test_cli_chip_any_takes_the_slowest_step(capsys: pytest.CaptureFixture[str]) -> None:
    steps = {}
    for name in DEVICES:
        assert main(["cost", "--config", "stories15M", "--chip", name, "--json"]) == 0
        steps[name] = json.loads(capsys.readouterr().out)["step_ms"]
    assert main(["cost", "--config", "stories15M", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    slowest = max(steps, key=lambda n: steps[n])
    assert doc["step"]["chip"] == slowest and doc["step_ms"] == steps[slowest]
    assert {n: d["step_ms"] for n, d in doc["step_by_device"].items()} == steps
    assert main(["cost", "--config", "stories15M"]) == 0
    out = capsys.readouterr().out
    assert f"host part ({slowest}, the device whose step is slowest)" in out
    for name in DEVICES:
        assert any(line.split()[:1] == [name] and f"{steps[name]:.2f}" in line for line in out.splitlines())


def test_calibration_prints_the_whole_step_beside_each_published_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["cost", "--calibration", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["context_whole_step"]
    assert rows and all(r["accumulated"] == 10 and r["predicted_step_ms"] > 0 for r in rows)
    assert main(["cost", "--calibration"]) == 0
    out = capsys.readouterr().out
    for r in rows:
        assert f"{r['published_ms_per_step']:.1f} ms published" in out
        assert f"whole step {r['predicted_step_ms']:.1f} ms" in out


def test_cli_program_has_no_step_and_bad_weights_is_one_line(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    assert main(["kernels", "dump", "--config", "stories260K", str(tmp_path / "d")]) == 0
    capsys.readouterr()
    assert main(["cost", str(tmp_path / "d"), "--chip", "m4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "step" not in doc and "step_ms" not in doc
    with pytest.raises(SystemExit) as info:
        main(["cost", "--config", "stories15M", "--weights", "nope"])
    assert info.value.code == 2
    assert "argument --weights: invalid choice: 'nope'" in capsys.readouterr().err.strip().splitlines()[-1]
