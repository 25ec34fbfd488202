"""The rule book and its checks: every rule sourced, each check fires on a program breaking its rule and
stays silent on the same program written the way hardware-run code writes it; the strict simulator."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.blob import build_blob_bytes
from anekit.engine.evidence import Evidence
from anekit.errors import AnekitError, CompilationFailed
from anekit.mil import tensor
from anekit.rules import (
    CHIPS,
    ROUTES,
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


def test_every_rule_rests_on_sourced_evidence_and_states_what_breaking_it_does():
    for r in RULES.values():
        assert r.statement.strip() and r.support, r.id
        assert all(e.source.strip() and e.observed.strip() for e in r.evidence), r.id
        assert r.consequence in ("refused", "wrong numbers", "hazard", "falls back", "slow", "no precedent")
        assert set(r.chips) <= set(CHIPS) and set(r.routes) <= set(ROUTES)
        if r.conflicted:
            assert r.decision.strip(), f"{r.id}: evidence on both sides needs a recorded decision"


def test_a_rule_without_evidence_or_a_source_does_not_go_in():
    with pytest.raises(ValueError, match="no supporting evidence"):
        Rule("x.y", "statement", "op", "refused", ())
    with pytest.raises(ValueError, match="no source"):
        Evidence("  ", "measured", "it failed")
    with pytest.raises(ValueError, match="consequence"):
        Rule("x.y", "statement", "op", "fatal", (Evidence("somewhere", "measured", "it failed"),))
    contradicted = (
        Evidence("a", "measured", "it failed"),
        Evidence("b", "measured", "it ran", refutes=True),
    )
    with pytest.raises(ValueError, match="no decision"):
        Rule("x.y", "statement", "op", "refused", contradicted)


def test_rules_are_looked_up_by_id_and_unknown_ids_are_named():
    assert rule("surface.uniform-input-size").status == "measured"
    with pytest.raises(UnknownRule, match="no rule 'nope'"):
        rule("nope")


def test_the_reduce_mean_reports_are_overruled_where_the_book_measured_it():
    r = rule("op.reduce-mean-rsqrt")
    assert "rane" in r.source and r.conflicted and "reduce_sum" in r.decision
    assert {r.severity_on(c) for c in ("m1", "m2", "m5")} == {None}  # measured native there
    assert r.severity_on("m4") == "warn"  # only reports speak for M4


def test_every_checked_rule_is_in_the_book():
    assert set(iter_rules_checked()) <= set(RULES)


# -- op and tensor checks: broken vs. fixed ---------------------------------------------------------


def _prog(body, inputs=None) -> mil.Program:
    return mil.program(inputs=inputs or {"x": X})(body)


CASES = {
    # rule id: (chip, a program breaking it, the same computation written as hardware-run code writes it)
    "op.gelu-mode": ("m4", lambda f, x: f.gelu(x=x), lambda f, x: f.gelu(x=x, mode="EXACT")),
    "op.concat-interleave": (
        "m4",
        lambda f, x: f.concat(values=(x, x), axis=1),
        lambda f, x: f.concat(values=(x, x), axis=1, interleave=False),
    ),
    "op.reduce-mean-rsqrt": (
        "m4",
        lambda f, x: f.mul(x=x, y=f.reduce_mean(x=x, axes=[1], keep_dims=True)),
        lambda f, x: f.mul(x=x, y=f.mul(x=f.reduce_sum(x=x, axes=[1], keep_dims=True), y=1 / 64)),
    ),
    "op.sqrt-after-reduce": (
        "m4",
        lambda f, x: f.mul(x=x, y=f.sqrt(x=f.add(x=f.reduce_sum(x=x, axes=[1], keep_dims=True), y=1.0))),
        lambda f, x: f.mul(
            x=x, y=f.pow(x=f.add(x=f.reduce_sum(x=x, axes=[1], keep_dims=True), y=1.0), y=0.5)
        ),
    ),
    "op.identity-output": ("m3", lambda f, x: f.identity(x=f.relu(x=x)), lambda f, x: f.relu(x=x)),
    "op.reshape-noop": (
        "any",
        lambda f, x: f.relu(x=f.reshape(x=x, shape=[1, 64, 1, 32])),
        lambda f, x: f.relu(x=x),
    ),
    "op.concat-axis": (
        "any",
        lambda f, x: f.reshape(
            x=f.concat(values=(f.reshape(x=x, shape=[1, 32, 2, 32]),) * 2, axis=2, interleave=False),
            shape=[1, 128, 1, 32],
        ),
        lambda f, x: f.concat(values=(x, x), axis=1, interleave=False),
    ),
    "op.softmax-axis-size": (
        "m1",
        lambda f, x: f.softmax(x=f.slice_by_size(x=x, begin=[0, 0, 0, 0], size=[1, 48, 1, 32]), axis=1),
        lambda f, x: f.softmax(x=x, axis=1),
    ),
    "numerics.fp16-sum-of-squares": (
        "any",
        lambda f, x: f.mul(x=x, y=f.reduce_sum(x=f.mul(x=x, y=x), axes=[1, 3], keep_dims=True)),
        lambda f, x: f.mul(
            x=x,
            y=f.reduce_sum(
                x=f.mul(x=f.mul(x=x, y=1 / 48), y=f.mul(x=x, y=1 / 48)), axes=[1, 3], keep_dims=True
            ),
        ),
    ),
    "op.no-engine-path": (
        "any",
        lambda f, x: f.tan(x=x),
        lambda f, x: f.real_div(x=f.sin(x=x), y=f.cos(x=x)),
    ),
    "op.from-m3": ("m2", lambda f, x: f.sin(x=x), lambda f, x: f.atan(x=x)),
    "op.curated-path-only": (
        "m1",
        lambda f, x: f.cumsum(x=x, axis=3),
        lambda f, x: f.matmul(x=x, y=f.const(np.triu(np.ones((1, 1, 32, 32), np.float16)))),
    ),
    "op.identity-alone": ("m5", lambda f, x: f.identity(x=x), lambda f, x: f.relu(x=x)),
}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_a_check_fires_on_the_broken_form_and_not_on_the_fixed_one(rule_id):
    chip, broken, fixed = CASES[rule_id]
    assert rule_id in _ids(check_program(_prog(broken), chip))
    assert rule_id not in _ids(check_program(_prog(fixed), chip))


def test_the_square_must_be_of_the_same_value_scaled_enough():
    # x * 0.25 squared over 64 x 32 terms: 0.25^2 * 2048 = 128 > 1, so a large RMS still overflows.
    under_scaled = _prog(
        lambda f, x: f.reduce_sum(
            x=f.mul(x=f.mul(x=x, y=0.25), y=f.mul(x=x, y=0.25)), axes=[1, 3], keep_dims=True
        )
    )
    assert "numerics.fp16-sum-of-squares" in _ids(check_program(under_scaled))
    few = _prog(lambda f, x: f.reduce_sum(x=f.mul(x=x, y=x), axes=[1], keep_dims=True))  # 64 terms
    assert "numerics.fp16-sum-of-squares" not in _ids(check_program(few))


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
    def ids(shape, chip="any", route="direct", severity=None):
        prog = _prog(lambda f, x: f.relu(x=x), {"x": tensor("fp16", shape)})
        return _ids(check_program(prog, chip, route=route), severity)

    assert "io.rank4-batch1" in ids([64, 32])
    assert "io.rank4-batch1" in ids([2, 64, 1, 32])
    assert "surface.spatial-multiple-16" in ids([1, 64, 1, 40], severity="warn")  # reported only
    assert "surface.min-row-bytes" in ids([1, 64, 1, 16], severity="error")  # measured on M3, M4, M5
    assert not ids([1, 64, 1, 32], "m1")  # 4 KB: ran on M1 Pro and M4 Max (no minimum surface size)
    assert "tensor.channels-multiple-64" in ids([1, 32, 1, 32], "m3", severity="warn")
    assert "tensor.channels-multiple-64" not in ids([1, 32, 1, 32], "m4")  # 12 channels ran on an M4
    assert not errors(check_program(_prog(lambda f, x: f.relu(x=x), {"x": tensor("fp16", [1, 64, 1, 32])})))
    assert "surface.global-over-16mb" in ids([1, 4096, 1, 4096], "m5")
    for shape in ([4, 4], [1, 4, 1, 4], [64, 32]):  # the e5rt runtime's buffers: no surface rule applies
        assert not ids(shape, "m1", "e5rt"), shape


def test_conv_input_channels_and_kernel_width():
    def conv(channels, kernel=(1, 1), chip="any"):
        xt = tensor("fp16", [1, channels, 1, 32])
        w = np.zeros((16, channels, *kernel), np.float16)
        return check_program(_prog(lambda f, x: f.conv(x=x, weight=f.const(w)), {"x": xt}), chip)

    assert not _ids(conv(14336)) & {"conv.input-channels-unproven", "conv.input-channels-refused"}
    assert "conv.input-channels-unproven" in _ids(conv(14400), "warn")
    assert "conv.input-channels-refused" in _ids(conv(32000, chip="m4"), "warn")  # reported only
    assert "extent.conv-kernel-width" in _ids(conv(64, (1, 14), "m1"), "error")  # M1 measured: 13
    assert "extent.conv-kernel-width" not in _ids(conv(64, (1, 13), "m1"))
    assert "extent.conv-kernel-width" in _ids(conv(64, (1, 16), "m5"), "error")  # M5 measured: 15
    assert "extent.conv-kernel-width" not in _ids(conv(64, (1, 16), "m2"))  # the table's 16
    assert "extent.conv-kernel-width" in _ids(conv(64, (1, 14)), "warn")  # an error on m1 only


def test_extents_per_chip():
    def ids(shape, chip, op=lambda f, x: f.relu(x=x)):
        return _ids(check_program(_prog(op, {"x": tensor("fp16", shape)}), chip, route="e5rt"), "error")

    assert "extent.spatial" in ids([1, 64, 1, 16385], "m3")
    assert "extent.spatial" not in ids([1, 64, 1, 16384], "m3")
    assert "extent.spatial" not in ids([1, 64, 1, 16385], "m4")  # 65536 from the A16
    assert "extent.spatial" in ids([1, 64, 1, 65537], "m5")
    assert "extent.channels" in ids([1, 65537, 1, 1], "m1")
    assert "extent.rank" in ids([1, 1, 2, 2, 2, 2], "m4")
    assert "extent.rank" not in ids([1, 2, 2, 2, 2], "m4")
    argmax = lambda f, x: f.reduce_argmax(x=x, axis=3, keep_dims=True)  # noqa: E731
    assert "extent.arg-axis" in ids([1, 1, 1, 2049], "m2", argmax)
    assert "extent.arg-axis" not in ids([1, 1, 1, 2048], "m2", argmax)
    wide = _prog(lambda f, x: f.relu(x=x), {"x": tensor("fp16", [1, 64, 1, 20000])})
    found = [f for f in check_program(wide, "any", route="e5rt") if f.rule.id == "extent.spatial"]
    assert found and all(f.severity == "warn" and "an error on m1, m2, m3" in f.message for f in found)


def test_op_tables_from_the_device_matrix():
    sine = _prog(lambda f, x: f.sin(x=x))
    assert "op.from-m3" in _ids(check_program(sine, "m1"), "error")
    assert "op.from-m3" not in _ids(check_program(sine, "m3"))
    assert "op.from-m3" in _ids(check_program(sine, "any"), "warn")
    prod = _prog(lambda f, x: f.reduce_prod(x=x, axes=[1], keep_dims=True))
    for chip in ("any", *CHIPS):
        assert "op.no-engine-path" in _ids(check_program(prod, chip), "error")
        assert "op.no-engine-path" in _ids(check_program(prod, chip, route="e5rt"), "error")
    coreml = check_program(prod, "m4", route="coreml")  # CoreML places it on the CPU instead
    assert "op.off-engine" in _ids(coreml, "warn") and not errors(coreml)
    upsample = _prog(
        lambda f, x: f.upsample_nearest_neighbor(x=x, scale_factor_height=2, scale_factor_width=2)
    )
    assert "op.m1-software-fallback" in _ids(check_program(upsample, "m1"), "warn")
    assert "op.m1-software-fallback" not in _ids(check_program(upsample, "m2"))
    lone = _prog(lambda f, x: f.slice_by_index(x=x, begin=[0, 0, 0, 0], end=[1, 32, 1, 32]))
    assert "op.bridge-only" in _ids(check_program(lone, "m1"), "warn")
    in_graph = _prog(lambda f, x: f.relu(x=f.slice_by_index(x=x, begin=[0, 0, 0, 0], end=[1, 32, 1, 32])))
    assert "op.bridge-only" not in _ids(check_program(in_graph, "m1"))


def test_measured_quirks_of_one_generation():
    square = _prog(
        lambda f, x: f.sigmoid(x=f.square(x=x)), {"x": tensor("fp16", [1, 64, 1, 96])}
    )  # 96 % 128 > 64
    assert "op.square-activation-width-m5" in _ids(check_program(square, "m5", route="e5rt"), "error")
    assert "op.square-activation-width-m5" not in _ids(check_program(square, "m4", route="e5rt"))
    narrow = _prog(lambda f, x: f.sigmoid(x=f.square(x=x)), {"x": tensor("fp16", [1, 64, 1, 64])})
    assert "op.square-activation-width-m5" not in _ids(check_program(narrow, "m5", route="e5rt"))

    def layer_norm(gamma, beta):
        return _prog(
            lambda f, x: f.layer_norm(
                x=x,
                axes=[1],
                gamma=f.const(np.full(64, gamma, np.float16)),
                beta=f.const(np.full(64, beta, np.float16)),
            )
        )

    assert "op.layer-norm-one-affine" in _ids(check_program(layer_norm(1.5, 0.0), "m1"), "error")
    assert "op.layer-norm-one-affine" in _ids(check_program(layer_norm(1.0, 0.5), "m2"), "error")
    assert "op.layer-norm-one-affine" not in _ids(check_program(layer_norm(1.5, 0.5), "m1"))
    assert "op.layer-norm-one-affine" not in _ids(check_program(layer_norm(1.0, 0.0), "m1"))
    assert "op.layer-norm-one-affine" not in _ids(check_program(layer_norm(1.5, 0.0), "m5"))


def test_a_large_operand_is_never_the_transposed_one():
    wt = tensor("fp16", [1, 1, 256, 256])
    transposed = _prog(lambda f, x, w: f.matmul(x=w, y=w, transpose_x=True), {"x": X, "w": wt})
    plain = _prog(lambda f, x, w: f.matmul(x=w, y=w), {"x": X, "w": wt})
    head = tensor("fp16", [1, 4, 64, 32])
    scores = _prog(lambda f, x, q: f.matmul(x=q, y=q, transpose_y=True), {"x": X, "q": head})
    assert "op.transposed-weight-matmul" in _ids(check_program(transposed))
    assert "op.transposed-weight-matmul" not in _ids(check_program(plain))
    assert "op.transposed-weight-matmul" not in _ids(check_program(scores))  # head-sized: fine


def test_chip_specific_rules_follow_the_evidence_of_each_chip():
    """op.cast-m1-m2 was measured both ways on the M1 (maderix pull request #6 vs the book): a warning
    there; nothing on the M4, where no source speaks of it; left out for "any" (a warning on some chip
    only)."""
    prog = _prog(lambda f, x: f.cast(x=f.relu(x=x), dtype="fp32"))
    assert "op.cast-m1-m2" in _ids(check_program(prog, chip="m1"), "warn")
    assert "op.cast-m1-m2" not in _ids(check_program(prog, chip="m4"))
    assert "op.cast-m1-m2" not in _ids(check_program(prog, chip="any"))
    to_int = _prog(lambda f, x: f.cast(x=f.relu(x=x), dtype="int32"))
    assert "op.cast-int32-m1" in _ids(check_program(to_int, chip="m1"), "error")
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
    prog = _prog(lambda f, x: f.tan(x=x))
    with pytest.raises(CompilationFailed, match=r"op\.no-engine-path error main: tan"):
        runtime.open("sim").compile(prog)
    assert runtime.open("sim", strict=False).compile(prog)(x=np.zeros((1, 64, 1, 32)))
    monkeypatch.setenv("ANEKIT_STRICT", "0")
    assert runtime.open("sim").compile(prog)(x=np.zeros((1, 64, 1, 32)))


def test_strict_compiles_count_against_the_budget_and_warnings_do_not_refuse(monkeypatch):
    monkeypatch.delenv("ANEKIT_STRICT", raising=False)
    sim = runtime.open("sim")
    with pytest.raises(CompilationFailed):
        sim.compile(_prog(lambda f, x: f.tan(x=x)))
    assert sim.compile_count == 1
    warned = _prog(lambda f, x: f.gelu(x=x))  # no mode: an error on M4 only, a warning for "any"
    assert sim.compile(warned)(x=np.ones((1, 64, 1, 32)))


def test_the_strict_simulator_checks_for_its_chip_and_route(monkeypatch):
    monkeypatch.delenv("ANEKIT_STRICT", raising=False)
    prog = _prog(lambda f, x: f.gelu(x=x))
    assert runtime.open("sim", chip="m1").compile(prog)  # the book measured gelu native on the M1
    with pytest.raises(CompilationFailed, match=r"chip m4, route direct(.|\n)*op\.gelu-mode"):
        runtime.open("sim", chip="m4").compile(prog)
    small = _prog(lambda f, x: f.relu(x=x), {"x": tensor("fp16", [1, 4, 1, 4])})
    with pytest.raises(CompilationFailed, match=r"surface\.min-row-bytes"):
        runtime.open("sim", chip="m5").compile(small)
    assert runtime.open("sim", chip="m5", route="e5rt").compile(small)
    with pytest.raises(AnekitError, match="unknown route 'tpu'"):
        runtime.open("sim", route="tpu")


def test_what_the_older_dialect_cannot_express_is_a_warning_on_m1_and_m2():
    """Split by macOS version (program(1.3) ran on macOS 15, program(1.0) was needed on macOS 26): the
    backend tries both; lint warns where the older form cannot be written."""
    qt = tensor("fp16", [1, 4, 32, 32])
    prog = _prog(lambda f, x, q: f.scaled_dot_product_attention(query=q, key=q, value=q), {"x": X, "q": qt})
    m1 = [f for f in check_program(prog, chip="m1") if f.rule.id == "dialect.m1-m2"]
    assert m1 and not m1[0].is_error and "scaled_dot_product_attention" in m1[0].message
    assert "dialect.m1-m2" not in _ids(check_program(prog, chip="m4"))


def test_rules_hold_on_their_route():
    """A decode step's [1, C, 1, 1] I/O breaks the direct route's surface rules (caller-made IOSurfaces)
    but not a CoreML package's, whose buffers CoreML allocates; numeric hazards hold on every route."""
    one = tensor("fp16", [1, 64, 1, 1])
    prog = _prog(lambda f, x: f.relu(x=x), {"x": one})
    assert "surface.min-row-bytes" in _ids(check_program(prog), "error")
    assert not errors(check_program(prog, route="coreml"))
    squares = _prog(lambda f, x: f.reduce_sum(x=f.mul(x=x, y=x), axes=[1, 3], keep_dims=True))
    for route in ROUTES:
        assert "numerics.fp16-sum-of-squares" in _ids(check_program(squares, route=route), "warn")
    with pytest.raises(AnekitError, match="unknown route 'tpu'"):
        check_program(prog, route="tpu")


def test_a_finding_says_its_chip_route_and_verdict():
    prog = _prog(lambda f, x: f.sin(x=x))
    [finding] = [f for f in check_program(prog, "m2") if f.rule.id == "op.from-m3"]
    assert finding.chip == "m2" and finding.route == "direct"
    assert "chip m2, route direct: error on m1, m2" in str(finding)
    doc = finding.as_dict()
    assert doc["chip"] == "m2" and doc["route"] == "direct" and doc["verdict"] == "error on m1, m2"


def test_the_strict_refusal_names_the_cli_flag_that_runs_it_anyway(tmp_path, capsys):
    from anekit.cli.main import main

    path = tmp_path / "t.mil"
    path.write_text(mil.to_text(_prog(lambda f, x: f.tan(x=x))), encoding="utf-8")
    assert main(["run", str(path), "--random", "0"]) == 1
    assert "`anekit run --no-strict`" in capsys.readouterr().err
    assert main(["run", str(path), "--random", "0", "--no-strict"]) == 0


# -- the macOS dimension -------------------------------------------------------------------------------


def test_matmul_on_m1_m2_is_refused_under_macos_26_and_not_under_15():
    """maderix pull request #6 measured matmul failing on an M1 Pro under macOS 26.3 on the in-memory
    route; M1 Pro / Max trained with matmul attention under macOS 15; the book's e5rt run weighs on e5rt."""
    scores = tensor("fp16", [1, 4, 64, 32])
    prog = _prog(lambda f, x, q: f.matmul(x=q, y=q, transpose_y=True), {"x": X, "q": scores})
    for chip in ("m1", "m2"):
        assert "op.matmul-sdpa-m1" in _ids(check_program(prog, chip, macos="26"), "error"), chip
        assert "op.matmul-sdpa-m1" in _ids(check_program(prog, chip, macos="26.3.1"), "error"), chip
        assert "op.matmul-sdpa-m1" not in _ids(check_program(prog, chip, macos="15")), chip
        assert "op.matmul-sdpa-m1" in _ids(check_program(prog, chip), "warn"), chip  # both sides count
        assert "op.matmul-sdpa-m1" not in _ids(check_program(prog, chip, route="e5rt", macos="26")), chip
    for chip in ("m3", "m4", "m5"):
        assert "op.matmul-sdpa-m1" not in _ids(check_program(prog, chip, macos="26")), chip
    r = rule("op.matmul-sdpa-m1")
    assert r.verdict("direct", "26") == "error on m1, m2" and r.verdict("direct", "15") == "-"
    assert r.verdict("direct") == "warn on m1, m2" and r.verdict("e5rt") == "-"
    assert "e5rt route only" in r.decision


def test_a_finding_judged_for_a_macos_version_says_so():
    scores = tensor("fp16", [1, 4, 64, 32])
    prog = _prog(lambda f, x, q: f.matmul(x=q, y=q, transpose_y=True), {"x": X, "q": scores})
    [finding] = [f for f in check_program(prog, "m1", macos="26") if f.rule.id == "op.matmul-sdpa-m1"]
    assert finding.macos == "26" and finding.is_error
    assert "chip m1, route direct, macOS 26: error on m1, m2" in str(finding)
    assert finding.as_dict()["macos"] == "26" and finding.as_dict()["verdict"] == "error on m1, m2"
    with pytest.raises(AnekitError, match=r"macOS version 'Tahoe' is not a version number"):
        check_program(prog, "m1", macos="Tahoe")


# -- the gate: single ops a hardware sweep refused or ran -------------------------------------------------

ALONE = tensor("fp16", [1, 64, 1, 64])  # the single-op programs' shape (tests/engine_corpus)


def _alone(body) -> mil.Program:
    return _prog(body, {"x": ALONE})


@pytest.mark.parametrize("route", ["direct", "e5rt"])
def test_cumsum_alone_is_refused_on_every_chip_and_its_triangular_matmul_is_not(route):
    """ANEForge's census: the MIL cumsum op is unimplemented on the backend (M5), the curated path runs the
    prefix sum as x @ U (U upper-triangular ones); the book's M1 'native' is that curated path."""
    scan = _alone(lambda f, x: f.cumsum(x=x, axis=3))
    for chip in ("any", *CHIPS):
        assert "op.curated-path-only" in _ids(check_program(scan, chip, route=route), "error"), chip
    upper = np.triu(np.ones((64, 64), np.float16))
    as_matmul = _alone(lambda f, x: f.matmul(x=x, y=f.const(upper.reshape(1, 1, 64, 64))))
    for chip in CHIPS:
        assert "op.curated-path-only" not in _ids(check_program(as_matmul, chip, route=route)), chip
    assert "op.curated-path-only" not in _ids(check_program(scan, "m4", route="coreml"))
    r = rule("op.curated-path-only")
    assert "capabilities.json" in r.source and any("curated runtime path" in e.observed for e in r.evidence)


@pytest.mark.parametrize("route", ["direct", "e5rt"])
def test_identity_alone_is_flagged_where_the_sweep_refused_it(route):
    """ANEForge's M5 sweep refused identity alone, the book's one-op run on the M1 (and its measured M5
    column) ran it: a warning on the M5 naming both, nothing on the M1 and M2; after a computing op the
    alone rule is silent."""
    alone = _alone(lambda f, x: f.identity(x=x))
    found = {chip: check_program(alone, chip, route=route) for chip in CHIPS}
    assert "op.identity-alone" in _ids(found["m5"], "warn") and not errors(found["m5"])
    for chip in ("m3", "m4"):
        assert "op.identity-alone" in _ids(found[chip], "warn"), chip
    for chip in ("m1", "m2"):
        assert "op.identity-alone" not in _ids(found[chip]), chip
    after = _alone(lambda f, x: f.identity(x=f.relu(x=x)))
    for chip in CHIPS:
        assert "op.identity-alone" not in _ids(check_program(after, chip, route=route)), chip
    r = rule("op.identity-alone")
    assert r.conflicted and "compile-walled" in r.source and "04-capability-surface.md" in r.source


@pytest.mark.parametrize("route", ["direct", "e5rt"])
@pytest.mark.parametrize("op", ["sin", "cos"])
def test_sin_and_cos_alone_are_accepted_where_they_ran_and_refused_where_they_did_not(op, route):
    """ANEForge's M5 sweep compiled and ran sin and cos alone; the M1 and M2 refuse them (the book's
    one-op confirmation on the M1, ANEForge's catalog 'REJECTED on M1/A14 - silicon-measured')."""
    alone = _alone(lambda f, x: getattr(f, op)(x=x))
    for chip in ("m1", "m2"):
        assert "op.from-m3" in _ids(check_program(alone, chip, route=route), "error"), chip
    for chip in ("m3", "m4", "m5"):
        assert not check_program(alone, chip, route=route), chip  # no finding at all
    r = rule("op.from-m3")
    assert "entries 'sin', 'cos'" in r.decision and "REJECTED on M1/A14" in str(r.evidence)


# -- the corpus judged under the macOS versions its cases were observed under ----------------------------

# contested case -> its contested rule's severity under the case's macOS, by hand: pull request #6's matmul
# failure (26.3) stands alone under 26 (the M1 runs were under 15, the book's on e5rt); its cast failures
# stay contested (the book's cast run names no version, so it counts under 26 too).
UNDER_ITS_MACOS = {
    "maderix-pr6-sdpa5-no-mask-ios16": "error",
    "maderix-pr6-weight-reload-64ch-cast": "warn",
    "maderix-weight-reload-64ch-on-m1": "warn",
}


def _corpus():
    from tests.engine_corpus.known_good import KNOWN_GOOD
    from tests.engine_corpus.known_refused import KNOWN_CONTESTED

    return KNOWN_GOOD, KNOWN_CONTESTED


def test_a_contested_case_is_judged_under_the_macos_it_was_observed_under():
    _, contested = _corpus()
    with_macos = {c.name: c for c in contested if c.macos}
    assert set(with_macos) == set(UNDER_ITS_MACOS)
    for name, want in UNDER_ITS_MACOS.items():
        c = with_macos[name]
        program = mil.verify(mil.parse(c.mil))
        for chip in c.chips:
            found = check_program(program, chip, c.weights, c.route, c.macos)
            assert {f.severity for f in found if f.rule.id in c.contested} == {want}, (name, chip)


def test_a_known_good_program_breaks_no_error_rule_under_its_macos():
    """M1 Pro / Max trained with matmul attention under macOS 15: no error there; the same kernel under
    macOS 26 is what pull request #6 saw fail (an error), which anekit's M1 route under 26 avoids."""
    good, _ = _corpus()
    with_macos = [c for c in good if c.macos]
    assert [c.name for c in with_macos] == ["maderix-stories-sdpa-fwd-taps-m1-macos15"]
    for c in with_macos:
        program = mil.verify(mil.parse(c.mil))
        for chip in c.chips:
            for version in c.macos.split(","):
                found = check_program(program, chip, c.weights, c.route, version.strip())
                assert not errors(found) and "op.matmul-sdpa-m1" not in _ids(found), (c.name, chip, version)
            under_26 = check_program(program, chip, c.weights, c.route, "26")
            assert "op.matmul-sdpa-m1" in _ids(under_26, "error")


def test_the_m3_channel_rule_splits_by_macos():
    """M3 Pro and M3 Ultra under macOS 15.7.4: only 512-channel convs compiled; the M3 Ultra under macOS
    26.3 ran 256 / 384-channel inmem_peak convs and trained with 768-channel ones."""
    w = np.zeros((64, 64, 1, 1), np.float16)
    conv = _prog(lambda f, x: f.conv(x=x, weight=f.const(w)))
    assert "conv.channels-512-m3" in _ids(check_program(conv, "m3", macos="15"), "error")
    assert "conv.channels-512-m3" not in _ids(check_program(conv, "m3", macos="26"))
    assert "conv.channels-512-m3" in _ids(check_program(conv, "m3"), "warn")
    assert "conv.channels-512-m3" not in _ids(check_program(conv, "m4", macos="15"))
