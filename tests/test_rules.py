"""The rule book and its checks: every rule sourced, each check fires on a program breaking its rule and
stays silent on the same program written the way hardware-run code writes it; the strict simulator."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.blob import build_blob_bytes
from anekit.errors import AnekitError, CompilationFailed
from anekit.mil import tensor
from anekit.rules import (
    CHIPS,
    RULES,
    Rule,
    UnknownRule,
    check_program,
    check_surface_plan,
    check_weight_names,
    errors,
    rule,
)
from anekit.rules.checks import iter_rules_checked

X = tensor("fp16", [1, 64, 1, 32])  # the smallest shape with hardware precedent


def _ids(findings, severity=None) -> set[str]:
    return {f.rule.id for f in findings if severity is None or f.severity == severity}


# -- the book ------------------------------------------------------------------------------------


def test_every_rule_has_a_source_a_scope_a_severity_a_status_and_chips():
    for r in RULES.values():
        assert r.source.strip() and r.statement.strip()
        assert r.severity in ("error", "warn") and r.status in ("measured", "reported", "seed law")
        assert set(r.chips) <= set(CHIPS)


def test_a_rule_without_a_source_does_not_go_in():
    with pytest.raises(ValueError, match="no source"):
        Rule("x.y", "statement", "op", "error", "measured", "  ")
    with pytest.raises(ValueError, match="severity"):
        Rule("x.y", "statement", "op", "fatal", "measured", "somewhere")


def test_rules_are_looked_up_by_id_and_unknown_ids_are_named():
    assert rule("surface.uniform-input-size").status == "measured"
    with pytest.raises(UnknownRule, match="no rule 'nope'"):
        rule("nope")


def test_the_rane_conflict_is_recorded_and_decided():
    r = rule("op.rane-rejected")
    assert "reduce_sum" in r.evidence and "accepted" in r.evidence


def test_every_checked_rule_is_in_the_book():
    assert set(iter_rules_checked()) <= set(RULES)


# -- op and tensor checks: broken vs. fixed ---------------------------------------------------------


def _prog(body, inputs=None) -> mil.Program:
    return mil.program(inputs=inputs or {"x": X})(body)


CASES = {
    # rule id: (a program breaking it, the same computation written as hardware-run code writes it)
    "op.gelu": (lambda f, x: f.gelu(x=x), lambda f, x: f.tanh(x=x)),
    "op.rane-rejected": (
        lambda f, x: f.mul(x=x, y=f.reduce_mean(x=x, axes=[1], keep_dims=True)),
        lambda f, x: f.mul(x=x, y=f.mul(x=f.reduce_sum(x=x, axes=[1], keep_dims=True), y=1 / 64)),
    ),
    "op.sqrt-after-reduce": (
        lambda f, x: f.mul(x=x, y=f.sqrt(x=f.add(x=f.reduce_sum(x=x, axes=[1], keep_dims=True), y=1.0))),
        lambda f, x: f.mul(
            x=x, y=f.pow(x=f.add(x=f.reduce_sum(x=x, axes=[1], keep_dims=True), y=1.0), y=0.5)
        ),
    ),
    "op.identity-output": (lambda f, x: f.identity(x=f.relu(x=x)), lambda f, x: f.relu(x=x)),
    "op.reshape-noop": (
        lambda f, x: f.relu(x=f.reshape(x=x, shape=[1, 64, 1, 32])),
        lambda f, x: f.relu(x=x),
    ),
    "op.concat-axis": (
        lambda f, x: f.reshape(
            x=f.concat(values=(f.reshape(x=x, shape=[1, 32, 2, 32]),) * 2, axis=2, interleave=False),
            shape=[1, 128, 1, 32],
        ),
        lambda f, x: f.concat(values=(x, x), axis=1, interleave=False),
    ),
    "op.softmax-axis-size": (
        lambda f, x: f.softmax(x=f.slice_by_size(x=x, begin=[0, 0, 0, 0], size=[1, 48, 1, 32]), axis=1),
        lambda f, x: f.softmax(x=x, axis=1),
    ),
    "numerics.fp16-sum-of-squares": (
        lambda f, x: f.mul(x=x, y=f.reduce_sum(x=f.mul(x=x, y=x), axes=[1], keep_dims=True)),
        lambda f, x: f.mul(
            x=x,
            y=f.reduce_sum(x=f.mul(x=f.mul(x=x, y=0.125), y=f.mul(x=x, y=0.125)), axes=[1], keep_dims=True),
        ),
    ),
}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_a_check_fires_on_the_broken_form_and_not_on_the_fixed_one(rule_id):
    broken, fixed = CASES[rule_id]
    assert rule_id in _ids(check_program(_prog(broken)))
    assert rule_id not in _ids(check_program(_prog(fixed)))


def test_the_square_must_be_of_the_same_value_scaled_enough():
    # x * 0.25 squared over 64 channels: 0.25^2 * 64 = 4 > 1, so a large RMS still overflows.
    under_scaled = _prog(
        lambda f, x: f.reduce_sum(
            x=f.mul(x=f.mul(x=x, y=0.25), y=f.mul(x=x, y=0.25)), axes=[1], keep_dims=True
        )
    )
    assert "numerics.fp16-sum-of-squares" in _ids(check_program(under_scaled))


def test_why_the_sum_of_squares_rule_exists_fp16_overflow_zeroes_the_norm():
    """The broken RMSNorm in the (non-strict) simulator normalises RMS-20 activations to zeros over 768
    channels, while the pre-scaled one matches float64; this is the failure the rule prevents."""
    xt = tensor("fp16", [1, 768, 1, 32])

    def norm(f, x, scale):
        xs = f.mul(x=x, y=scale)
        ms = f.reduce_sum(x=f.mul(x=xs, y=xs), axes=[1], keep_dims=True)
        if scale == 1.0:
            ms = f.mul(x=ms, y=1 / 768)
        return f.mul(x=x, y=f.pow(x=f.add(x=ms, y=1e-5), y=-0.5))

    x = np.random.default_rng(0).standard_normal((1, 768, 1, 32)) * 20
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-5)
    sim = runtime.open("sim", strict=False)
    broken = sim.compile(_prog(lambda f, x: norm(f, x, 1.0), {"x": xt}))(x=x)
    fixed = sim.compile(_prog(lambda f, x: norm(f, x, 768**-0.5), {"x": xt}))(x=x)
    assert np.all(next(iter(broken.values())) == 0)
    np.testing.assert_allclose(next(iter(fixed.values())), want, atol=2e-2, rtol=2e-2)


def test_io_shapes_rank_width_and_row_size():
    def ids(shape):
        return _ids(check_program(_prog(lambda f, x: f.relu(x=x), {"x": tensor("fp16", shape)})))

    assert "io.rank4-batch1" in ids([64, 32])
    assert "io.rank4-batch1" in ids([2, 64, 1, 32])
    assert "surface.spatial-multiple-16" in ids([1, 64, 1, 40])
    assert "surface.min-row-bytes" in ids([1, 64, 1, 16])
    assert "surface.min-bytes" in ids([1, 64, 1, 32])  # 4 KB: a warning (Orion's ~48 KB minimum)
    assert not errors(check_program(_prog(lambda f, x: f.relu(x=x), {"x": tensor("fp16", [1, 64, 1, 32])})))
    assert "surface.max-bytes" in ids([1, 4096, 1, 4096])


def test_conv_input_channels():
    def conv(channels):
        xt = tensor("fp16", [1, channels, 1, 32])
        return _prog(
            lambda f, x: f.conv(x=x, weight=f.const(np.zeros((16, channels, 1, 1), np.float16))), {"x": xt}
        )

    assert not _ids(check_program(conv(2048))) & {
        "conv.input-channels-unproven",
        "conv.input-channels-refused",
    }
    assert "conv.input-channels-unproven" in _ids(check_program(conv(2304)), "warn")
    assert "conv.input-channels-refused" in _ids(check_program(conv(32000)), "error")


def test_a_large_operand_is_never_the_transposed_one():
    wt = tensor("fp16", [1, 1, 256, 256])
    transposed = _prog(lambda f, x, w: f.matmul(x=w, y=w, transpose_x=True), {"x": X, "w": wt})
    plain = _prog(lambda f, x, w: f.matmul(x=w, y=w), {"x": X, "w": wt})
    head = tensor("fp16", [1, 4, 64, 32])
    scores = _prog(lambda f, x, q: f.matmul(x=q, y=q, transpose_y=True), {"x": X, "q": head})
    assert "op.transposed-weight-matmul" in _ids(check_program(transposed))
    assert "op.transposed-weight-matmul" not in _ids(check_program(plain))
    assert "op.transposed-weight-matmul" not in _ids(check_program(scores))  # head-sized: fine


def test_chip_specific_rules_are_errors_on_their_chips_and_warnings_for_any():
    prog = _prog(lambda f, x: f.cast(x=f.relu(x=x), dtype="fp32"))
    assert "op.cast-m1-m2" in _ids(check_program(prog, chip="m1"), "error")
    assert "op.cast-m1-m2" in _ids(check_program(prog, chip="any"), "warn")
    assert "op.cast-m1-m2" not in _ids(check_program(prog, chip="m4"))
    with pytest.raises(AnekitError, match="unknown chip 'm9'"):
        check_program(prog, chip="m9")


def test_blobfile_offsets_point_at_metadata_records():
    data, offsets = build_blob_bytes([(np.eye(64, dtype=np.float32).reshape(64, 64, 1, 1), "fp16")] * 2)
    path = "@model_path/weights/w.bin"

    def prog(offset):
        return _prog(
            lambda f, x: f.conv(x=x, weight=f.weight(tensor("fp16", [64, 64, 1, 1]), path, offset, name="w"))
        )

    assert not errors(check_program(prog(offsets[1]), weights={path: data}))
    assert "weights.one-blob-per-file-m1" in _ids(check_program(prog(offsets[1]), chip="m1"), "error")
    bad = check_program(prog(offsets[0] + 64), weights={path: data})  # aligned, but the data, not a record
    assert "weights.blobfile-offset" in _ids(bad, "error")
    assert any(f.rule.id == "weights.blobfile-offset" and "not a metadata record" in f.message for f in bad)
    assert "weights.blobfile-offset" in _ids(check_program(prog(100)))  # not 64-aligned, no file needed


def test_weight_names_colliding_with_framework_files():
    found = check_weight_names(["@model_path/weights/w.bin", "@model_path/net.plist", "@model_path/data"])
    assert [f.where for f in found] == ["weight '@model_path/net.plist'", "weight '@model_path/data'"]
    assert all(f.rule.id == "weights.reserved-name" for f in found)


def test_surface_plans_need_equal_sizes_and_alphabetical_binding():
    """Orion measured both (docs/ane_constraints.md §2, §3, §12, §13): anekit's old plan (ascending input
    sizes, descending outputs, bound in size order) breaks all three rules."""
    old = check_surface_plan([("x", 4096), ("mask", 8192)], [("out", 8192), ("aux", 4096)])
    assert _ids(old) == {
        "surface.uniform-input-size",
        "surface.uniform-output-size",
        "surface.bind-alphabetical",
    }
    assert check_surface_plan([("mask", 8192), ("x", 8192)], [("aux", 8192), ("out", 8192)]) == []


# -- the strict simulator -------------------------------------------------------------------------


def test_the_simulator_is_strict_by_default_and_names_the_rule(monkeypatch):
    monkeypatch.delenv("ANEKIT_STRICT", raising=False)
    prog = _prog(lambda f, x: f.gelu(x=x))
    with pytest.raises(CompilationFailed, match=r"op\.gelu error main: gelu"):
        runtime.open("sim").compile(prog)
    assert runtime.open("sim", strict=False).compile(prog)(x=np.zeros((1, 64, 1, 32)))
    monkeypatch.setenv("ANEKIT_STRICT", "0")
    assert runtime.open("sim").compile(prog)(x=np.zeros((1, 64, 1, 32)))


def test_strict_compiles_count_against_the_budget_and_warnings_do_not_refuse(monkeypatch):
    monkeypatch.delenv("ANEKIT_STRICT", raising=False)
    sim = runtime.open("sim")
    with pytest.raises(CompilationFailed):
        sim.compile(_prog(lambda f, x: f.gelu(x=x)))
    assert sim.compile_count == 1
    warned = _prog(lambda f, x: f.identity(x=f.relu(x=x)))  # a warning only
    assert sim.compile(warned)(x=np.ones((1, 64, 1, 32)))


def test_the_strict_simulator_checks_for_its_chip(monkeypatch):
    monkeypatch.delenv("ANEKIT_STRICT", raising=False)
    prog = _prog(lambda f, x: f.cast(x=f.relu(x=x), dtype="fp32"))
    assert runtime.open("sim", chip="m4").compile(prog)
    with pytest.raises(CompilationFailed, match=r"op\.cast-m1-m2"):
        runtime.open("sim", chip="m1").compile(prog)


def test_what_the_older_dialect_cannot_express_is_an_error_on_m1_and_m2():
    qt = tensor("fp16", [1, 4, 32, 32])
    prog = _prog(lambda f, x, q: f.scaled_dot_product_attention(query=q, key=q, value=q), {"x": X, "q": qt})
    m1 = [f for f in check_program(prog, chip="m1") if f.rule.id == "dialect.m1-m2"]
    assert m1 and m1[0].is_error and "scaled_dot_product_attention" in m1[0].message
    assert "dialect.m1-m2" not in _ids(check_program(prog, chip="m4"))
    assert "dialect.m1-m2" in _ids(check_program(prog, chip="any"), "warn")


def test_rules_hold_on_their_route():
    """A decode step's [1, C, 1, 1] I/O breaks the direct route's surface rules (caller-made IOSurfaces)
    but not a CoreML package's, whose buffers CoreML allocates; op rules hold on both."""
    one = tensor("fp16", [1, 64, 1, 1])
    prog = _prog(lambda f, x: f.relu(x=x), {"x": one})
    assert "surface.min-row-bytes" in _ids(check_program(prog), "error")
    assert not errors(check_program(prog, route="coreml"))
    squares = _prog(lambda f, x: f.reduce_sum(x=f.mul(x=x, y=x), axes=[1], keep_dims=True))
    assert "numerics.fp16-sum-of-squares" in _ids(check_program(squares, route="coreml"), "error")
    with pytest.raises(AnekitError, match="unknown route 'tpu'"):
        check_program(prog, route="tpu")
