"""A run's training route: the chip's, chosen from the evidence, carried by the run, taken by its kernels.

Issue 30's "done when", end to end: on the fake M1 under macOS 26.3, which refuses matmul as maderix/ANE
709b602 measured, the legacy kernels fail to compile and anekit trains on the route the backend's chip
and macOS get; ``--chip C`` off a Mac names C's route (every macOS), the run record keeps it, a resume
keeps it, an explicit weight mode picks the route of that mode only where its constructs have a precedent.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import anekit
from anekit import runtime
from anekit.engine import training_routes
from anekit.engine.evidence import Evidence
from anekit.engine.training_routes import training_route
from anekit.errors import AnekitError, CompilationFailed
from anekit.kernels import ModelConfig
from anekit.kernels.route import ROUTES, kernel_route
from anekit.llama import Params
from anekit.llama.checkpoint import open_checkpoint
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import Timer, train_step
from anekit.runtime.ane import AneBackend
from anekit.training.options import TrainOptions
from anekit.training.route_choice import chosen_route, with_weights
from anekit.training.run import Run
from tests.fake_objc import FakeObjC

CFG = ModelConfig(64, 128, 2, 4, 2, 64, 32)  # rows of 64 bytes and more: shapes the fake's rules accept


def test_the_kernels_and_the_engine_name_the_same_routes_with_the_same_choices():
    for cand in training_routes.CANDIDATES:
        k = ROUTES[cand.id]
        assert (k.weights, k.attention, k.norm, k.rope) == (
            cand.weights,
            cand.attention,
            cand.norm,
            cand.rope,
        )
    assert set(ROUTES) == set(training_routes.ROUTE_IDS)


def test_on_the_fake_m1_under_macos_26_anekit_trains_on_the_route_without_matmul(tmp_path):
    """The fake refuses matmul on an M1 under macOS 26 (maderix/ANE 709b602, M1 Pro, 26.3): the legacy
    kernels fail to compile; the route chosen for what the backend reports compiles, and a step on it
    gives the loss the simulator's same route gives."""
    folder = tmp_path / "T"
    folder.mkdir()
    fake = FakeObjC(folder, chip="m1", macos="26.3")
    backend = AneBackend(runtime=fake.runtime())
    params = Params.init(CFG, seed=3, tied=True)
    with pytest.raises(CompilationFailed, match="matmul"):
        make_kernels(backend, CFG, "dynamic").compile(params, Timer())
    route = chosen_route(backend, {})
    assert route is not None and route.id == "conv-host-attention" and route.macos == "26"
    tokens = np.arange(CFG.seq_len) % CFG.vocab_size
    targets = (tokens + 1) % CFG.vocab_size
    losses = []
    for b in (backend, runtime.open("sim", chip="m1")):
        kernels = make_kernels(b, CFG, None, kernel_route(route.id))
        kernels.compile(params, Timer())
        grads = params.zeros_like()
        losses.append(train_step(kernels, params, grads, tokens, targets, Timer()).loss)
        kernels.close()
    assert np.isfinite(losses[0]) and abs(losses[0] - losses[1]) < 1e-6, losses
    assert fake.errors == []


def test_the_route_a_backend_gets():
    sim = runtime.open("sim")
    assert chosen_route(sim, {}) is None  # the simulator with no chip named: the legacy kernels
    assert chosen_route(sim, {"chip": "any"}) is None  # no route has a precedent on every chip
    assert chosen_route(sim, {"chip": "m1"}).id == "conv-host-attention"  # type: ignore[union-attr]
    assert chosen_route(sim, {"chip": "m4"}).id == "dynamic-engine-attention"  # type: ignore[union-attr]
    mac = SimpleNamespace(name="ane", chip="m3", macos="26.3")
    got = chosen_route(mac, {})
    assert got is not None and (got.id, got.macos) == ("dynamic-engine-attention-rope-matmul", "26")


def test_an_explicit_weight_mode_picks_the_same_attention_where_it_has_a_precedent():
    m4 = training_route("m4")
    assert with_weights(m4, None) == with_weights(m4, "dynamic") == "dynamic-engine-attention"
    assert with_weights(m4, "baked") == "baked-engine-attention"  # baked convs ran on the M4
    with pytest.raises(AnekitError, match="runs baked weights only"):
        with_weights(training_route("m1"), "dynamic")
    with pytest.raises(AnekitError, match="no precedent"):  # the M3's convs: 512 channels only under 15
        with_weights(training_route("m3", "15"), "baked")


def _stored_route(out: Path) -> str:
    """The route the run record of ``out``'s checkpoint names."""
    run = open_checkpoint(out / "ckpt.bin").run
    assert run is not None
    return str(run["train"]["route"])


def test_a_run_keeps_its_route_through_the_record_and_a_resume(tmp_path):
    """A run on the M1's route (baked convs, recompiled every step) stops when its compile budget runs out
    and resumes, with no chip named, on the same route; naming another route on resume is refused."""
    out = tmp_path / "run"
    first = anekit.train(out, quiet=True, steps=3, accum=1, numerics={"chip": "m1"}, compile_budget=30)
    assert (first.reason, first.step) == ("budget", 1)  # 4 layers x 6 kernels a step: 24 of 30
    assert _stored_route(out) == "conv-host-attention"
    with pytest.raises(AnekitError, match="route"):
        anekit.train(out, quiet=True, resume=True, route="dynamic-engine-attention")
    again = anekit.train(out, quiet=True, resume=True)
    assert again.reason == "done" and again.step == 3
    assert _stored_route(out) == "conv-host-attention"


def test_a_new_run_takes_the_chips_route_and_refuses_a_contradicting_weight_mode(tmp_path):
    run = Run(TrainOptions(out=tmp_path / "a", steps=1, numerics={"chip": "m1"}))
    assert (run.tc.route, run.tc.weights) == ("conv-host-attention", "baked")
    run.close()
    run = Run(TrainOptions(out=tmp_path / "b", steps=1))
    assert run.tc.route == ""  # legacy kernels
    run.close()
    with pytest.raises(AnekitError, match="weights"):
        Run(TrainOptions(out=tmp_path / "c", steps=1, weights="dynamic", numerics={"chip": "m2"}))


def test_a_report_shipped_with_anekit_moves_the_route_without_a_code_change(monkeypatch):
    """A measured run of every engine-attention construct on an M1 under 26 (a report placed among the
    shipped ones) gives that chip and macOS an engine-attention route; the record alone gives the conv
    route."""
    assert training_route("m1", "26").id == "conv-host-attention"
    src = "anekit doctor report M1 macOS 26.3 (hand-made)"
    ran = {
        c: (Evidence(src, "measured", f"{c} ran", ("m1",), ("direct",), "26"),)
        for c in (
            "matmul.dynamic-weights",
            "matmul.activations",
            "softmax.scores",
            "rope.slice-concat",
            "gate.silu",
        )
    }
    monkeypatch.setattr(training_routes, "shipped_evidence", lambda: ran)
    training_routes.shipped.cache_clear()
    try:
        assert training_route("m1", "26").id == "dynamic-engine-attention"
        assert training_route("m1", "26", extra={}).id == "conv-host-attention"  # explicit: no shipped ones
    finally:
        training_routes.shipped.cache_clear()
