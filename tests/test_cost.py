"""The cost model: work counted from programs, sourced chip figures, calibration error, the CLI."""

from __future__ import annotations

import json
import time

import pytest

from anekit.cli.main import main
from anekit.cost import CHIPS, PUBLISHED, Params, chip, count, error_table, fit, predict, step_kernels
from anekit.cost.calibration import add_program, conv_program
from anekit.kernels.config import PRESETS
from anekit.mil import Builder, print_program, tensor


def test_conv_flops_and_bytes_by_hand() -> None:
    w = count(conv_program(64, 32, depth=3))
    assert w.flops == 3 * (2 * 64 * 64 * 32)  # 3 convs, 64 x 64 MACs per column, 32 columns
    assert w.weight_bytes == 3 * 64 * 64 * 2
    assert w.io_bytes == 2 * (64 * 32 * 2)
    assert w.intermediate_bytes == 2 * (64 * 32 * 2)  # the two conv outputs between convs
    assert w.element_ops == 0 and w.ops == 3


def test_grouped_kernel_conv_flops_by_hand() -> None:
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 8, 5, 5]))
    wt = f.weight(tensor("fp16", [6, 4, 3, 3]), "@model_path/weights/w.bin", 64)
    y = f.conv(x=x, weight=wt, strides=[1, 1], pad_type="valid", pad=[0, 0, 0, 0], dilations=[1, 1], groups=2)
    f.output(y)
    # output [1, 6, 3, 3]: 54 outputs, each 4 input channels x 3 x 3 window = 36 MACs
    assert count(b.build()).flops == 2 * 54 * 36


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


def test_parsed_program_counts_like_built_one() -> None:
    prog = conv_program(32, 16)
    from anekit.mil import parse

    assert count(parse(print_program(prog))) == count(prog)


def test_every_chip_figure_has_a_source() -> None:
    for c in CHIPS.values():
        assert c.family in ("m1", "m2", "m3", "m4")
        for name, fig in c.figures().items():
            assert fig.source.strip(), (c.name, name)
            assert fig.status in ("measured", "rated", "reported", "derived", "assumed")
            assert fig.value > 0
    assert chip("M4 Max") is CHIPS["m4-max"]


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


def test_fit_has_fewer_parameters_than_figures_and_reproduces_them() -> None:
    fitted_on = [f for f in PUBLISHED if not f.held_out]
    assert len(fitted_on) > 2 * len(Params.__dataclass_fields__)
    rows = error_table(fit())
    for r in rows:
        if r.figure.held_out:
            continue
        # M1's forward time is 3.8x M4 Pro's while peak and bandwidth differ 1.7x and 2.3x: two global
        # parameters cannot reach it (stated in the README); every other figure is within 35%.
        bound = 0.55 if r.figure.device.startswith("m1") else 0.35
        assert abs(r.error) <= bound, (r.figure.id, r.error)


def test_held_out_figure_is_reported() -> None:
    held = [r for r in error_table() if r.figure.held_out]
    assert held and all(abs(r.error) <= 0.35 for r in held)


def test_model_terms() -> None:
    w = count(conv_program(768, 256))
    t = predict(w, chip("m4-max"), Params(0.5, 0.1))
    assert t.ms == pytest.approx(0.1 + max(t.compute_ms, t.memory_ms))
    assert t.compute_ms == pytest.approx(2 * 768 * 768 * 256 / (0.5 * 19e12) * 1e3)
    assert t.memory_ms == pytest.approx(w.bytes_moved / 118.88e9 * 1e3)


def test_cli_config_table_fast_and_readable(capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.perf_counter()
    assert main(["cost", "--config", "stories15M", "--chip", "m1"]) == 0
    assert time.perf_counter() - t0 < 2.0
    out = capsys.readouterr().out
    for text in ("sdpa_fwd", "ffn_bwd", "step, engine part", "where the time goes", "not a measurement"):
        assert text in out


def test_cli_json_and_calibration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--config", "stories260K", "--weights", "dynamic", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["chip"] == "m4" and doc["engine_ms"] > 0
    assert {r["bound"] for r in doc["kernels"]} <= {"compute", "memory", "dispatch"}
    assert main(["cost", "--calibration"]) == 0
    out = capsys.readouterr().out
    assert "HELD OUT" in out and "fitted" in out
    assert main(["cost", "--calibration", "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)
    assert any(f["held_out"] for f in cal["figures"])


def test_cli_mil_file_and_dump_dir(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "model.mil").write_text(print_program(conv_program(64, 32)))
    assert main(["cost", str(tmp_path), "--chip", "m2"]) == 0
    assert "k " in capsys.readouterr().out
    assert main(["cost", str(tmp_path / "k" / "model.mil")]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["cost", "--config", "stories15M", "--chip", "m9"],
        ["cost", "--config", "nope"],
        ["cost"],
    ],
)
def test_cli_bad_input_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("anekit: ")


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
