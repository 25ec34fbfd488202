"""The macOS backend's per-process behaviour, driven through the fake objc runtime: the compile budget
shared by every backend object of a process, and what identifies a model's temporary directory.

Each behaviour is a rule a hardware-run project measured (its source in the test's docstring); the fake
(tests/fake_objc.py) models it from that source, so a backend that breaks the rule fails here.
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.blob import build_blob_bytes
from anekit.errors import CompilationFailed, CompileBudgetExhausted, LoadFailed
from anekit.mil import tensor
from anekit.runtime.ane import ANE_FRAMEWORK, AneBackend, lifecycle, pacing, residency
from anekit.runtime.ane import backend as ane_backend
from anekit.runtime.base import PROCESS_COMPILES
from tests.fake_objc import FakeObjC

S = 32  # rows of 64 bytes in fp16, the smallest with hardware precedent


def _backend(fake: FakeObjC, **options) -> AneBackend:
    return AneBackend(runtime=fake.runtime(), dialect="ios18", **options)


def _add_program() -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, S]), "y": tensor("fp16", [1, 4, 1, S])})
    def prog(f, x, y):
        return f.add(x=x, y=y, name="z")

    return prog


def _scale_program(factor: float) -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, S])})
    def prog(f, x):
        return f.mul(x=x, y=np.float16(factor), name="y")

    return prog


def _names(fake: FakeObjC, mark: int) -> list[str]:
    return [c.name for c in fake.calls[mark:] if c.kind == "msg" and (c.cls or "").startswith("_ANE")]


def _conv_program() -> mil.Program:
    """The same MIL text for every layer: only the bytes of weights/w.bin differ (a baked kernel)."""

    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, S])})
    def prog(f, x):
        w = f.weight(tensor("fp16", [4, 4, 1, 1]), "@model_path/weights/w.bin", 64, name="wq")
        return f.conv(x=x, weight=w, name="y")

    return prog


def _blob(scale: float) -> bytes:
    w = np.arange(16, dtype=np.float32).reshape(4, 4, 1, 1) / 8 * scale
    return build_blob_bytes([(w, "fp16")])[0]


def _conv_reference(x: np.ndarray, blob: bytes) -> np.ndarray:
    sim = runtime.open("sim", compile_budget=10**6)
    return sim.compile(_conv_program(), weights={"weights/w.bin": blob})(x=x)["y"]


# -- the compile budget is one per process -----------------------------------------------------------------


def test_every_backend_object_of_a_process_draws_on_one_compile_budget(fake):
    """Rule process.compile-budget: mechramc/Orion docs/ane_constraints.md §5 measured about 119 compiles
    per PROCESS (first documented by maderix/ANE), and both count them in one process-wide counter (Orion
    core/ane_runtime.m g_compile_count, maderix/ANE training/stories_config.h g_compile_count against
    MAX_COMPILES). A second backend object does not get a fresh budget."""
    first = _backend(fake)
    for _ in range(3):
        first.compile(_add_program()).close()
    second = _backend(fake, compile_budget=4)
    assert second.compile_count == 3 == PROCESS_COMPILES.count
    second.compile(_add_program()).close()
    assert (first.compile_count, second.compile_count) == (4, 4)
    assert (first.compiles_made, second.compiles_made) == (3, 1)
    mark = len(fake.calls)
    with pytest.raises(CompileBudgetExhausted, match="budget of 4"):
        second.compile(_add_program())
    assert fake.calls[mark:] == []  # refused before anything reached the framework


def test_the_process_count_resets_only_when_asked_and_the_simulator_keeps_its_own(fake):
    _backend(fake).compile(_add_program()).close()
    assert _backend(fake).compile_count == 1
    PROCESS_COMPILES.reset()  # what a re-executed process starts with
    assert _backend(fake).compile_count == 0
    sim = runtime.open("sim")
    sim.compile(_add_program())
    assert (sim.compile_count, runtime.open("sim").compile_count, PROCESS_COMPILES.count) == (1, 0, 0)


# -- a model's directory: the identifier follows the MIL text and the weight names -------------------------


def _two_layers(backend: AneBackend):
    a, b = _blob(1.0), _blob(-3.0)
    ka = backend.compile(_conv_program(), weights={"weights/w.bin": a})  # layer j
    kb = backend.compile(_conv_program(), weights={"weights/w.bin": b})  # layer j + 1, compiled next
    return a, b, ka, kb


def test_the_fake_gives_equal_text_and_weight_names_one_identifier(fake, tmpdir_ns):
    """mechramc/Orion core/ane_runtime.m orion_program_patch_weights: two models with the same MIL text and
    the same weight-dictionary keys have the same hexStringIdentifier ("same MIL text + weight dict keys"),
    whatever the weight bytes; loading without compiling reads the compiled files of that directory. The
    fake does exactly that."""
    rt = fake.runtime()
    rt.load_framework(ANE_FRAMEWORK)
    text = b"program(1.3) {}"
    ids = []
    with rt.autorelease_pool():
        for blob in (b"one", b"two"):
            weights_dict = rt.dictionary({"@model_path/weights/w.bin": {"offset": 0, "data": blob}})
            desc = rt.send(lifecycle.DESCRIPTOR_WITH_MIL, rt.data(text), weights_dict, None)
            model = rt.send(lifecycle.MODEL_WITH_DESCRIPTOR, desc)
            ids.append(rt.to_str(rt.send(lifecycle.MODEL_HEX_ID, to=model)))
        renamed = rt.dictionary({"@model_path/weights/v.bin": {"offset": 0, "data": b"one"}})
        desc = rt.send(lifecycle.DESCRIPTOR_WITH_MIL, rt.data(text), renamed, None)
        model = rt.send(lifecycle.MODEL_WITH_DESCRIPTOR, desc)
        other = rt.to_str(rt.send(lifecycle.MODEL_HEX_ID, to=model))
    assert ids[0] == ids[1] != other


def test_without_the_guard_layer_j_reloaded_after_layer_j_plus_1_runs_its_weights(fake, monkeypatch):
    """The collision the fake models: with the weight files named as the program names them, layers j and
    j + 1 share one directory; compiling j + 1 rewrites its compiled files, and loading j afterwards runs
    j + 1's weights: wrong numbers, silently, as on the engine."""
    monkeypatch.setattr(ane_backend, "content_names", lambda files: {rel: rel for rel in files})
    monkeypatch.setattr(lifecycle.TEMP_DIRS, "check_content", False)
    a, b, ka, kb = _two_layers(_backend(fake))
    assert ka._engine.tmpdir == kb._engine.tmpdir
    x = np.random.default_rng(0).standard_normal((1, 4, 1, S)).astype(np.float32)
    got = ka(x=x)["y"]
    np.testing.assert_array_equal(got, _conv_reference(x, b))  # layer j computed with j + 1's weights
    assert not np.array_equal(got, _conv_reference(x, a))
    ka.close()
    kb.close()


def test_the_weight_bytes_name_the_files_so_every_layer_has_its_own_directory(fake, tmpdir_ns):
    """The guard (rule descriptor.hex-id-weights): each weight file's name carries the digest of its bytes,
    in the weight dictionary and in the BLOBFILE paths, so the identifier follows the bytes too."""
    a, b, ka, kb = _two_layers(_backend(fake))
    assert ka._engine.tmpdir != kb._engine.tmpdir
    sent = [c.values[1] for c in fake.find("modelWithMILText:weights:optionsPlist:")]
    names = [next(iter(w)) for w in sent]
    assert names[0] != names[1] and all(n.startswith("@model_path/weights/w-") for n in names)
    text = fake.find("modelWithMILText:weights:optionsPlist:")[0].values[0].decode()
    assert names[0] in text and "weights/w.bin" not in text
    x = np.random.default_rng(0).standard_normal((1, 4, 1, S)).astype(np.float32)
    np.testing.assert_array_equal(ka(x=x)["y"], _conv_reference(x, a))
    np.testing.assert_array_equal(kb(x=x)["y"], _conv_reference(x, b))
    ka.unload()
    ka.load()  # reloaded after j + 1 was compiled and run: still its own weights
    np.testing.assert_array_equal(ka(x=x)["y"], _conv_reference(x, a))
    ka.close()
    kb.close()
    assert list(tmpdir_ns.iterdir()) == []


def test_a_directory_held_by_another_program_is_never_rewritten(fake, monkeypatch):
    """The second line of the guard: if the identifier ever ignored the weight names too, a compile that
    would rewrite the directory of a live kernel with other content is refused, naming the rule."""
    monkeypatch.setattr(ane_backend, "content_names", lambda files: {rel: rel for rel in files})
    backend = _backend(fake)
    ka = backend.compile(_conv_program(), weights={"weights/w.bin": _blob(1.0)})
    with pytest.raises(CompilationFailed, match=r"descriptor\.hex-id-weights"):
        backend.compile(_conv_program(), weights={"weights/w.bin": _blob(-3.0)})
    same = backend.compile(_conv_program(), weights={"weights/w.bin": _blob(1.0)})  # identical: shared
    assert same._engine.tmpdir == ka._engine.tmpdir
    ka.close()
    same.close()


# -- what the chip and the macOS release decide ----------------------------------------------------------


def _matmul_program() -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", [1, 1, S, S])})
    def prog(f, x):
        return f.matmul(x=x, y=x, transpose_x=False, transpose_y=True, name="y")

    return prog


@pytest.mark.parametrize("chip", ["m1", "m2"])
def test_matmul_is_refused_on_m1_and_m2_under_macos_26_and_compiles_under_15(tmpdir_ns, chip):
    """maderix/ANE commit 709b602 (M1 Pro, macOS 26.3): "matmul and scaled_dot_product_attention ops still
    fail on M1/M2"; maderix/ANE benchmarks/community_results.json: M1 Pro / Max trained with
    training/stories_mil.h (matmul attention) on macOS 15. The fake refuses it there; the backend surfaces
    CompilationFailed with the engine's NSError, and reports the chip and macOS it runs on."""
    fake = FakeObjC(tmpdir_ns, chip=chip, macos="26.3")
    backend = AneBackend(runtime=fake.runtime())
    assert (backend.chip, backend.macos) == (chip, "26.3")
    with pytest.raises(CompilationFailed, match=r"ANECCompile\(\) FAILED: matmul") as info:
        backend.compile(_matmul_program())
    assert info.value.code == 1
    backend.compile(_add_program()).close()  # what has no matmul compiles
    assert fake.errors == [] and fake.live_objects() == []
    old = FakeObjC(tmpdir_ns, chip=chip, macos="15.4")
    on_15 = AneBackend(runtime=old.runtime())
    assert (on_15.chip, on_15.macos) == (chip, "15.4")
    x = np.random.default_rng(1).standard_normal((1, 1, S, S)).astype(np.float32)
    want = runtime.open("sim", chip=chip).compile(_matmul_program())(x=x)["y"]
    with on_15.compile(_matmul_program()) as k:
        np.testing.assert_array_equal(k(x=x)["y"], want)


def test_matmul_compiles_on_m4_under_macos_26(tmpdir_ns):
    fake = FakeObjC(tmpdir_ns, chip="m4", macos="26.3")
    backend = AneBackend(runtime=fake.runtime())
    assert (backend.chip, backend.macos) == ("m4", "26.3")
    backend.compile(_matmul_program()).close()
    assert fake.errors == []


# -- a pause after a failed compile ----------------------------------------------------------------------


def test_the_compile_after_a_failed_one_waits_one_restart_interval(fake):
    """sbryngelson/ane-guide part-5-practice/19-pitfalls-and-limits.md, "Pacing compiles after a failure":
    a failed compile restarts the shared compile service; "wait at least one restart interval, roughly 15
    seconds, before the next compile". The pacer's clock is virtual here: nothing sleeps."""
    clock = pacing.PACER.clock
    assert pacing.FAILED_COMPILE_PAUSE == 15.0
    backend = _backend(fake)
    backend.compile(_add_program()).close()
    assert clock.slept == []  # no failure yet: no pause
    fake.fail("compileWithQoS:options:error:", code=11, description="ANECCompile() FAILED")
    with pytest.raises(CompilationFailed):
        backend.compile(_add_program())
    clock.advance(4.0)  # the host moves on: the next compile waits only what is left
    _backend(fake).compile(_add_program()).close()  # any backend object: the service is the process's
    assert clock.slept == [11.0]
    backend.compile(_add_program()).close()
    assert clock.slept == [11.0]  # one pause per failure


def test_compiles_refused_on_the_host_or_long_after_a_failure_are_not_paced(fake):
    clock = pacing.PACER.clock
    backend = _backend(fake)
    with pytest.raises(CompilationFailed, match="not given"):  # refused before the framework: not paced
        backend.compile(_conv_program(), weights={"weights/other.bin": _blob(1.0)})
    fake.fail("compileWithQoS:options:error:")
    with pytest.raises(CompilationFailed):
        backend.compile(_add_program())
    clock.advance(pacing.FAILED_COMPILE_PAUSE + 1)
    backend.compile(_add_program()).close()
    assert clock.slept == []


def test_the_dialect_fallback_waits_between_its_attempts(tmpdir_ns):
    """An M1 under macOS 15 whose compiler refuses program(1.3): the program(1.0) retry is paced too."""
    clock = pacing.PACER.clock
    fake = FakeObjC(tmpdir_ns, chip="m1", macos="15.4", refuses_program=("1.3",))
    AneBackend(runtime=fake.runtime()).compile(_add_program()).close()
    assert clock.slept == [pacing.FAILED_COMPILE_PAUSE]


# -- the loaded-program ceiling and the periodic refresh ----------------------------------------------------


def test_loading_past_the_ceiling_unloads_the_least_recently_used_kernel(tmpdir_ns, monkeypatch):
    """sbryngelson/ane-guide part-4-workloads/14-llm-case-study.md: "The loaded-program cap is near 128
    programs per process: the next load fails with `GetANEFModel: must re-compile`". The fake refuses the
    load past its cap; the backend keeps the process under its own ceiling by unloading the least recently
    used kernel, which reloads itself before its next run (scaled down here: a cap of 4, anekit keeps 3)."""
    fake = FakeObjC(tmpdir_ns, max_loaded=4)
    monkeypatch.setattr(residency, "RESIDENCY", residency.Residency(max_loaded=3))
    backend = _backend(fake)
    factors = [1.0, 2.0, -1.0, 0.5, 3.0]
    kernels = [backend.compile(_scale_program(f)).load() for f in factors]  # five loads, three kept
    assert residency.RESIDENCY.loaded == 3 and residency.RESIDENCY.evictions == 2
    assert all(k.is_loaded for k in kernels)  # as their users see them
    assert [k._engine.loaded for k in kernels] == [False, False, True, True, True]
    x = np.random.default_rng(2).standard_normal((1, 4, 1, S)).astype(np.float32)
    for k, f in zip(kernels, factors):  # each runs its own program, reloaded where it was unloaded
        want = (x.astype(np.float16) * np.float16(f)).astype(np.float32)
        np.testing.assert_array_equal(k(x=x)["y"], want)
    assert residency.RESIDENCY.loaded == 3 and fake.errors == []
    for k in kernels:
        k.close()
    assert residency.RESIDENCY.loaded == 0 and fake.live_objects() == []


def test_without_the_ceiling_the_fake_refuses_the_load_past_its_cap(tmpdir_ns, monkeypatch):
    fake = FakeObjC(tmpdir_ns, max_loaded=4)
    monkeypatch.setattr(residency, "RESIDENCY", residency.Residency(max_loaded=10**6))
    backend = _backend(fake)
    kernels = [backend.compile(_scale_program(f)).load() for f in (1.0, 2.0, 3.0, 4.0)]
    with pytest.raises(LoadFailed, match="GetANEFModel: must re-compile"):
        backend.compile(_scale_program(5.0)).load()
    for k in kernels:
        k.close()


def test_a_full_residency_whose_kernels_are_all_busy_refuses_naming_the_ceiling(fake, monkeypatch):
    import threading

    monkeypatch.setattr(residency, "RESIDENCY", residency.Residency(max_loaded=1))
    backend = _backend(fake)
    busy = backend.compile(_scale_program(1.0)).load()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with busy.lock:
            held.set()
            release.wait(10)

    worker = threading.Thread(target=hold)
    worker.start()
    held.wait(10)
    try:
        with pytest.raises(LoadFailed, match=r"process\.loaded-program-ceiling"):
            backend.compile(_scale_program(2.0)).load()
    finally:
        release.set()
        worker.join()
    busy.close()


def test_every_loaded_kernel_is_refreshed_after_each_interval_of_process_evaluations(fake, monkeypatch):
    """ncdrone/rustane pull request #9 (M3 Ultra, macOS 26.3.1): throughput degrades after ~100K cumulative
    evaluations; a periodic refresh of the kernels resets it. The fake counts evaluations made after
    ``degrade_after`` since a program's last load; the backend reloads each kernel once per interval of the
    process's evaluations (scaled down: 5)."""
    assert residency.REFRESH_EVALUATIONS == 100_000
    fake.degrade_after = 5
    monkeypatch.setattr(residency, "RESIDENCY", residency.Residency(refresh_every=5))
    backend = _backend(fake)
    a, b = backend.compile(_scale_program(2.0)).load(), backend.compile(_scale_program(3.0)).load()
    x = np.ones((1, 4, 1, S), dtype=np.float32)
    mark = len(fake.calls)
    for _ in range(6):  # 12 evaluations: two refresh intervals pass
        np.testing.assert_array_equal(a(x=x)["y"], 2.0)
        np.testing.assert_array_equal(b(x=x)["y"], 3.0)
    assert fake.degraded == 0
    loads = [
        n for n in _names(fake, mark) if n.endswith(("loadWithQoS:options:error:]", "unloadWithQoS:error:]"))
    ]
    assert len(loads) == 8 and residency.RESIDENCY.refreshes == 4  # each kernel, at 5 and at 10
    a.close()
    b.close()


def test_without_the_refresh_the_fake_counts_degraded_evaluations(fake, monkeypatch):
    fake.degrade_after = 5
    monkeypatch.setattr(residency, "RESIDENCY", residency.Residency(refresh_every=0))
    k = _backend(fake).compile(_scale_program(2.0)).load()
    for _ in range(8):
        k(x=np.ones((1, 4, 1, S), dtype=np.float32))
    assert fake.degraded == 3
    k.close()


# -- a baked training step over the fake: the per-layer kernels keep their own weights -----------------------


def _baked_steps(backend, steps: int = 2) -> list[tuple[float, dict[str, np.ndarray]]]:
    """``steps`` training steps of the same batch with the same weights, baked kernels."""
    from anekit.kernels import ModelConfig
    from anekit.llama import Params
    from anekit.llama.kernel_sets import make_kernels
    from anekit.llama.step import Timer, train_step

    cfg = ModelConfig(32, 64, 2, 4, 2, 64, 32)  # two layers: the same MIL text, different weight bytes
    params = Params.init(cfg, seed=3, tied=True)
    window = np.random.default_rng(4).integers(0, cfg.vocab_size, cfg.seq_len + 1)
    kernels = make_kernels(backend, cfg, "baked")
    kernels.compile(params, Timer())  # each kernel loaded as it is compiled, as maderix/ANE does
    results = []
    for _ in range(steps):
        grads = params.zeros_like()
        loss = train_step(kernels, params, grads, window[:-1], window[1:], Timer(), loss_scale=64.0).loss
        results.append((loss, dict(grads.tensors())))
    kernels.close()
    return results


@pytest.fixture
def reloading(monkeypatch):
    """A refresh before every evaluation: every kernel is reloaded after every layer was compiled."""
    monkeypatch.setattr(residency, "RESIDENCY", residency.Residency(refresh_every=1))


def test_a_baked_training_step_over_the_fake_matches_the_simulator_after_reloads(fake, reloading):
    (want_loss, want), _ = _baked_steps(runtime.open("sim", compile_budget=10**6))
    for loss, grads in _baked_steps(_backend(fake)):
        assert loss == want_loss
        for name, g in grads.items():
            np.testing.assert_array_equal(g, want[name], err_msg=name)
    assert residency.RESIDENCY.refreshes > 0 and fake.errors == []


def test_without_the_guard_a_reloaded_baked_step_runs_the_last_layers_weights(fake, reloading, monkeypatch):
    monkeypatch.setattr(ane_backend, "content_names", lambda files: {rel: rel for rel in files})
    monkeypatch.setattr(lifecycle.TEMP_DIRS, "check_content", False)
    (want_loss, _), _ = _baked_steps(runtime.open("sim", compile_budget=10**6))
    first, second = _baked_steps(_backend(fake))
    assert first[0] != want_loss or second[0] != want_loss


def test_on_an_m1_under_macos_26_the_matmul_kernels_are_refused_and_its_route_has_none(tmpdir_ns):
    """What the backend reports is what the engine layer's route choice takes: on the fake M1 under macOS
    26.3 the legacy kernels (matmul attention) fail to compile, as maderix/ANE 709b602 measured, and the
    training route for that chip and macOS uses no matmul."""
    from anekit.engine.training_routes import training_route
    from anekit.kernels import ModelConfig
    from anekit.llama import Params
    from anekit.llama.kernel_sets import make_kernels
    from anekit.llama.step import Timer

    fake = FakeObjC(tmpdir_ns, chip="m1", macos="26.3")
    backend = AneBackend(runtime=fake.runtime())
    route = training_route(backend.chip, backend.macos)
    assert not any(c.startswith("matmul") for c in route.constructs), route.constructs
    cfg = ModelConfig(32, 64, 2, 4, 2, 64, 32)
    with pytest.raises(CompilationFailed, match=r"ANECCompile\(\) FAILED: matmul"):  # the shared SDPA kernel
        make_kernels(backend, cfg, "baked").compile(Params.init(cfg, seed=3, tied=True), Timer())
    assert fake.errors == []


def test_every_backend_says_what_it_runs_on_for_the_route_choice(fake):
    from anekit.engine.training_routes import training_route

    sim = runtime.open("sim", chip="m2")
    assert (sim.chip, sim.macos) == ("m2", "")
    assert training_route(sim.chip, sim.macos).attention == "host"  # m2 under every macOS major
    ane = _backend(fake)
    assert (ane.chip, ane.macos) == ("any", "15.1")  # the fake names no chip; its macOS is 15.1
