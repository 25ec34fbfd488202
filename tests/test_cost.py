"""The cost model: work counted from programs, sourced device figures, the fit and its held-out error, the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest

from anekit.cli.main import main
from anekit.cost import (
    DEVICES,
    PUBLISHED,
    Params,
    UnknownChip,
    chip,
    count,
    error_table,
    fit,
    fitted,
    predict,
    predicted,
    step_kernels,
    summary,
)
from anekit.cost.calibration import FIGURE, FIT, HELD_OUT
from anekit.cost.model import GROUP, WINOGRAD, layer_macs, terms
from anekit.cost.workloads import add_program, attention_program, conv_program, gemm_program
from anekit.engine.chips import GENERATIONS
from anekit.engine.evidence import STATUSES
from anekit.engine.performance import PERFORMANCE
from anekit.kernels.config import PRESETS
from anekit.mil import Builder, parse, print_program, tensor

# -- work ------------------------------------------------------------------------------------------------


def test_conv_flops_and_bytes_by_hand() -> None:
    w = count(conv_program(64, 32, depth=3))
    assert w.flops == 3 * (2 * 64 * 64 * 32)  # 3 convs, 64 x 64 MACs per column, 32 columns
    assert w.weight_bytes == 3 * 64 * 64 * 2
    assert w.io_bytes == 2 * (64 * 32 * 2)
    assert w.intermediate_bytes == 2 * (64 * 32 * 2)  # the two conv outputs between convs
    assert w.element_ops == 0 and w.ops == 3
    assert [layer.intermediates for layer in w.layers] == [(4096.0,), (4096.0,), ()]
    assert all(layer.weight_bytes == 64 * 64 * 2 and layer.kernel == (1, 1) for layer in w.layers)


def test_grouped_kernel_conv_flops_by_hand() -> None:
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 8, 5, 5]))
    wt = f.weight(tensor("fp16", [6, 4, 3, 3]), "@model_path/weights/w.bin", 64)
    y = f.conv(x=x, weight=wt, strides=[1, 1], pad_type="valid", pad=[0, 0, 0, 0], dilations=[1, 1], groups=2)
    f.output(y)
    w = count(b.build())
    # output [1, 6, 3, 3]: 54 outputs, each 4 input channels x 3 x 3 window = 36 MACs
    assert w.flops == 2 * 54 * 36
    assert not w.layers[0].winograd  # grouped: not the Winograd path


def test_matmul_flops_by_hand_with_transpose() -> None:
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 2, 7, 5]))
    y = f.input("y", tensor("fp16", [1, 2, 7, 3]))
    f.output(f.matmul(x=x, y=y, transpose_x=True, transpose_y=False))  # (5 x 7) @ (7 x 3), batch 2
    w = count(b.build())
    assert w.flops == 2 * 2 * 5 * 3 * 7
    assert w.weight_bytes == 0


def test_elementwise_and_softmax_are_element_ops() -> None:
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 4, 1, 10]))
    f.output(f.softmax(x=f.add(x=x, y=x), axis=1))
    w = count(b.build())
    assert w.flops == 0
    assert w.element_ops == 40 + 5 * 40
    assert count(add_program(256, 64)).element_ops == 256 * 64


def test_workloads_count_as_their_sources_state() -> None:
    assert count(gemm_program(64, 256, 256)).flops == 2 * 64 * 256 * 256  # ANEForge "GEMM floor"
    attn = count(attention_program(197, 768, 12))  # ANEForge's note: "1.049 GFLOP"
    assert round(attn.flops / 1e9, 3) == 1.049
    stack = count(conv_program(256, 32, 16, height=32, kernel=3, relu=True))
    assert stack.flops == 16 * 2 * 256 * 256 * 9 * 32 * 32
    assert all(layer.winograd for layer in stack.layers if layer.op == "conv")


def test_parsed_program_counts_like_built_one() -> None:
    for prog in (conv_program(32, 16), conv_program(16, 8, 2, height=8, kernel=3)):
        assert count(parse(print_program(prog))) == count(prog)


def test_step_kernels_follow_the_training_step() -> None:
    cfg = PRESETS["stories110M"]
    baked = step_kernels(cfg, "baked")
    assert sum(k.calls for k in baked) == 6 * 12  # maderix/ANE train_large: 72 evaluations per step
    dyn = step_kernels(cfg, "dynamic")
    assert sum(k.calls for k in dyn) == 8 * 12
    # Forward FLOPs per layer: Q, K, V, O, W1, W3, W2 projections, attention (Q K^T and P V: 2 x 2 T^2 d),
    # and RoPE's pair swap of q and k, which the kernel does as a d x d permutation conv each.
    d, h, t = cfg.dim, cfg.hidden_dim, cfg.seq_len
    projections = 2 * t * (4 * d * d + 3 * d * h)
    attention = 2 * 2 * t * t * d
    rope = 2 * (2 * t * d * d)
    fwd = sum(k.work.flops * k.per_layer for k in baked if k.direction == "forward")
    assert fwd == projections + attention + rope


# -- figures ---------------------------------------------------------------------------------------------


def test_every_device_has_every_figure_with_evidence() -> None:
    assert set(PERFORMANCE) == set(DEVICES)
    generations = {d.generation for d in DEVICES.values()}
    assert generations == set(GENERATIONS)  # m1 .. m5
    for name, perf in PERFORMANCE.items():
        assert chip(name) is perf
        for label, fig in perf.figures().items():
            ev = fig.evidence
            assert fig.value > 0 and fig.unit, (name, label)
            assert ev.source.strip() and ev.observed.strip(), (name, label)
            assert ev.status in STATUSES and ev.status != "unknown", (name, label)
            assert ev.chips == (perf.device.generation,), (name, label)
            if ev.status == "assumed":  # a stand-in names whose figure it is
                assert "'s" in ev.observed or "stands in" in ev.observed, (name, label, ev.observed)
    assert chip("M4 Max") is PERFORMANCE["m4-max"]


def test_fp16_peak_is_an_fp16_rate_not_int8_tops() -> None:
    m4 = chip("m4").fp16_peak
    assert m4.value == 18.6 and m4.status == "measured"  # Apple's 38 TOPS is INT8: kept as other evidence
    assert any(e.status == "rated" and "INT8" in e.observed for e in m4.also)
    assert chip("m1").working_set.value == 2.0 and chip("m5").working_set.value == 4.72
    assert chip("m1").dispatch_floor.value == 0.23 and chip("m5").dispatch_floor.value < 0.11
    # variants differ where the memory system does
    assert chip("m4-pro").weight_stream.value > 1.5 * chip("m4").weight_stream.value
    assert chip("m1-max").cores.value == 2 * chip("m1").cores.value


@pytest.mark.parametrize("name", ["nope", "m6", "", "m4 ultra"])
def test_unknown_chip_is_one_line(name: str) -> None:
    with pytest.raises(UnknownChip) as info:
        chip(name)
    msg = info.value.one_line()
    assert msg.startswith("[cost] unknown chip") and "\n" not in str(info.value) and "m5-max" in msg


# -- the model -------------------------------------------------------------------------------------------


def test_model_terms_by_hand() -> None:
    w = count(conv_program(768, 256))
    perf = chip("m4-max")
    p = Params(0.5, 0.25, 0.8)
    t = predict(w, perf, p)
    passes = math.ceil(768 / GROUP)
    compute = 2 * 768 * 768 * 256 * passes * GROUP / 768 / (0.5 * 18.6e12) * 1e3
    assert t.compute_ms == pytest.approx(compute)
    assert t.memory_ms == pytest.approx(w.weight_bytes / (0.25 * 118.88e9) * 1e3)
    assert t.surface_ms == pytest.approx(w.io_bytes / (0.25 * 118.88e9) * 1e3)
    assert t.ms == pytest.approx(0.095 + t.surface_ms + max(t.compute_ms, t.memory_ms))
    e5rt = predict(w, perf, p, "e5rt")
    assert e5rt.surface_ms == pytest.approx(w.io_bytes / (0.8 * 10e9) * 1e3)  # the M1's e5rt rate stands in


def test_channel_groups_and_winograd() -> None:
    one_pass = count(conv_program(192, 32)).layers[0]
    two_passes = count(conv_program(256, 32)).layers[0]
    assert layer_macs(one_pass) == one_pass.flops
    assert layer_macs(two_passes) == two_passes.flops * (2 * GROUP) / 256
    wino = count(conv_program(64, 16, height=16, kernel=3)).layers[0]
    assert wino.winograd and layer_macs(wino) == wino.flops / WINOGRAD


def test_spills_only_past_the_working_set() -> None:
    small = count(conv_program(256, 1024, 2))  # 0.5 MB between the convs
    big = count(conv_program(512, 4096, 2))  # 4 MB between the convs
    assert terms(small, chip("m1")).spills == 0
    assert terms(big, chip("m1")).spills > 0  # 2 MB working set
    assert terms(big, chip("m5")).spills == 0  # 4.72 MB working set


def test_guide_m1_convolutions_are_not_all_dispatch_bound() -> None:
    params = fitted()
    convs = [m for m in PUBLISHED if m.id.startswith("guide-") and m.id.endswith(("-28", "-32", "-16", "-8"))]
    convs = [m for m in convs if "c64" not in m.id]
    assert len(convs) == 4
    bounds = {predict(m.workload()[0][0], chip(m.device), params, m.route).bound for m in convs}
    assert bounds - {"dispatch"}, bounds


# -- the measurements, the fit, the held-out error -----------------------------------------------------


def test_measurements_are_sourced_and_split() -> None:
    ids = [m.id for m in PUBLISHED]
    assert len(ids) == len(set(ids))
    for m in PUBLISHED:
        assert m.device in DEVICES and m.route in ("direct", "e5rt") and m.ms > 0
        assert m.source.strip() and m.quote.strip()
        assert m.workload(), m.id
    fitted_on = [m for m in PUBLISHED if m.role == FIT]
    held = [m for m in PUBLISHED if m.role == HELD_OUT]
    # The split: fitted on the M1 generation's e5rt timings; held out: other generations, the direct route.
    assert {DEVICES[m.device].generation for m in fitted_on} == {"m1"}
    assert {m.route for m in fitted_on} == {"e5rt"}
    assert {DEVICES[m.device].generation for m in held} >= {"m1", "m2", "m3", "m4", "m5"}
    assert {m.route for m in held} == {"direct", "e5rt"}
    assert all(m.explanation for m in PUBLISHED if m.role == FIGURE)
    assert len(fitted_on) > 5 * len(dataclasses.fields(Params))


def test_fit_recovers_known_parameters_on_synthetic_data() -> None:
    known = Params(0.7, 0.4, 0.6)
    recovered = fit(measured=lambda m: predicted(m, known))
    for a, b in zip(dataclasses.astuple(recovered), dataclasses.astuple(known)):
        assert a == pytest.approx(b, rel=1e-3)


def test_held_out_error_meets_the_bar() -> None:
    s = summary(error_table())
    assert s.held_out >= 30
    assert s.median_error <= 0.25, s.median_error
    assert s.within_30 >= 2 / 3, s.within_30
    assert s.worst.measurement.role == HELD_OUT and s.worst.measurement.explanation
    assert abs(s.worst.error) == max(abs(r.error) for r in error_table() if r.measurement.role == HELD_OUT)


# -- the command line ------------------------------------------------------------------------------------


def test_cli_config_table_fast_and_readable(capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.perf_counter()
    assert main(["cost", "--config", "stories15M", "--chip", "m1"]) == 0
    assert time.perf_counter() - t0 < 2.0
    out = capsys.readouterr().out
    for text in ("sdpa_fwd", "ffn_bwd", "step, engine part", "where the time goes", "not a measurement"):
        assert text in out


def test_cli_every_device(capsys: pytest.CaptureFixture[str]) -> None:
    for name in DEVICES:
        assert main(["cost", "--config", "stories15M", "--chip", name, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["chip"] == name and doc["engine_ms"] > 0
        assert all(f["source"] for f in doc["chip_figures"].values())
    assert main(["cost", "--config", "stories15M", "--chip", "m5", "--route", "e5rt"]) == 0
    assert "e5rt route" in capsys.readouterr().out


def test_cli_json_and_calibration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--config", "stories260K", "--weights", "dynamic", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["chip"] == "any" and doc["engine_ms"] > 0  # the default, as lint's
    assert {r["bound"] for r in doc["kernels"]} <= {"compute", "memory", "dispatch"}
    assert main(["cost", "--calibration"]) == 0
    out = capsys.readouterr().out
    for text in ("HELD OUT", "fitted", "median |error|", "within 30%", "worst held out", "split:"):
        assert text in out
    assert all(m.id in out for m in PUBLISHED)
    assert main(["cost", "--calibration", "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)
    s = summary(error_table())
    assert cal["held_out"]["median_abs_error"] == pytest.approx(s.median_error)
    assert cal["held_out"]["within_30_percent"] == pytest.approx(s.within_30)
    assert cal["held_out"]["worst"]["explanation"]
    assert len(cal["measurements"]) == len(PUBLISHED)
    assert set(cal["fitted"]) == {"compute_efficiency", "dram_efficiency", "surface_efficiency"}
    assert {r["role"] for r in cal["measurements"]} == {FIT, FIGURE, HELD_OUT}


def test_cli_mil_file_and_dump_dir(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "model.mil").write_text(print_program(conv_program(64, 32)))
    assert main(["cost", str(tmp_path), "--chip", "m2"]) == 0
    assert "k " in capsys.readouterr().out
    assert main(["cost", str(tmp_path / "k" / "model.mil")]) == 0


@pytest.mark.parametrize(
    ("argv", "status", "says"),
    [
        (["cost", "--config", "stories15M", "--chip", "m9"], 2, "argument --chip: unknown chip 'm9'"),
        (["cost", "--config", "stories15M", "--chip", "nope"], 2, "argument --chip: unknown chip 'nope'"),
        (["cost", "--config", "nope"], 2, "argument --config: unknown preset 'nope'"),
        (["cost"], 1, "anekit: [cost] name one of"),
    ],
)
def test_cli_bad_input_one_line(
    argv: list[str], status: int, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unknown names are usage errors (exit 2, argparse's usage line then one error line); a missing
    target is anekit's own one-line error (exit 1)."""
    if status == 2:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
    else:
        assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and (status == 2 or len(err) == 1)  # a usage error opens with the usage lines


def test_cli_bad_files(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.mil"
    bad.write_text("this is not MIL")
    empty = tmp_path / "empty"
    empty.mkdir()
    binary = tmp_path / "blob.mil"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    for path in (bad, empty, binary, tmp_path / "missing.mil"):
        assert main(["cost", str(path)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("anekit: "), (path, err)


def test_cost_refuses_a_dump_with_a_kernel_lost_and_a_cyclic_program(tmp_path, capsys) -> None:
    """A kernels dump whose kernel folder lost its model.mil is one error naming it (not a total without
    it); a program whose op reads its own result is refused, not timed."""
    dump = tmp_path / "dump"
    assert main(["kernels", "dump", "--config", "stories260K", str(dump)]) == 0
    capsys.readouterr()
    lost = sorted(p for p in dump.iterdir() if p.is_dir())[0]
    (lost / "model.mil").unlink()
    assert main(["cost", str(dump)]) == 1
    err = capsys.readouterr().err
    assert f"kernel folder(s) {lost.name} hold no model.mil" in err and len(err.splitlines()) == 1
    cyclic = tmp_path / "c.mil"
    cyclic.write_text(
        "program(1.3)\n{\n    func main<ios18>(tensor<fp16, [1, 64, 1, 32]> x) {\n"
        '        tensor<fp16, [1, 64, 1, 32]> y = add(x = x, y = y)[name = string("y")];\n'
        "    } -> (y);\n}\n"
    )
    assert main(["cost", str(cyclic)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("anekit: [cost]") and "not a MIL program" in err and len(err.splitlines()) == 1


def test_cli_chip_any_is_the_default_and_takes_each_kernels_slowest_device(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--chip any (the default, as lint's): per kernel, the largest of the per-device predictions, each
    device's taken from its own `--chip NAME` run."""
    per_device = {}
    for name in DEVICES:
        assert main(["cost", "--config", "stories260K", "--chip", name, "--json"]) == 0
        per_device[name] = {r["name"]: r["ms"] for r in json.loads(capsys.readouterr().out)["kernels"]}
    assert main(["cost", "--config", "stories260K", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["chip"] == "any" and set(doc["chip_figures"]) == set(DEVICES)
    for row in doc["kernels"]:
        slowest = max(per_device, key=lambda d: per_device[d][row["name"]])
        assert row["ms"] == per_device[slowest][row["name"]] and row["chip"] == slowest
    assert main(["cost", "--config", "stories260K", "--chip", "any"]) == 0
    out = capsys.readouterr().out
    assert "on any chip (per kernel, the slowest device, direct route)" in out.splitlines()[0]
    assert "slowest device per kernel: " in out


def test_cli_calibration_with_a_program_prints_both(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """`cost --calibration FILE`: the program's prediction and the calibration, in text and in JSON."""
    assert main(["kernels", "dump", "--config", "stories260K", str(tmp_path / "d")]) == 0
    program = sorted((tmp_path / "d").glob("*/model.mil"))[0]
    capsys.readouterr()
    assert main(["cost", "--calibration", str(program)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{program} on any chip") and "fitted (least squares" in out
    assert main(["cost", "--calibration", str(program), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["what"] == str(program) and "calibration" in doc
