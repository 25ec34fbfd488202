"""The Neural Engine backend and its objc layer, driven through a fake objc runtime (no Mac needed).

Every call path of anekit.runtime.ane is exercised against tests/fake_objc.py: the exact message
sequence of compile / load / run / unload, the marshalling of MIL text, weight dictionaries and
surfaces, reference counting (nothing left alive), each scripted NSError becoming the right anekit
exception, missing classes and selectors, the real-time path and the chaining opt-in with its
fallback. The fake engine runs the simulator's plan on the IOSurfaces it is given, so results are
compared with the simulator bit for bit.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.blob import build_blob_bytes
from anekit.errors import (
    AneRuntimeError,
    ClassNotFound,
    CompilationFailed,
    CompileBudgetExhausted,
    DescriptorCreationFailed,
    EvalFailed,
    LoadFailed,
    ModelCreationFailed,
    SurfaceCreationFailed,
    UnloadFailed,
)
from anekit.mil import tensor
from anekit.mil.parser import parse_program
from anekit.runtime import ane, objc
from anekit.runtime.ane import AneBackend, AneSurface
from tests.fake_objc import ANE_DOMAIN, FakeObjC

COMPILE = "-[_ANEInMemoryModel compileWithQoS:options:error:]"
LOAD = "-[_ANEInMemoryModel loadWithQoS:options:error:]"
EVALUATE = "-[_ANEInMemoryModel evaluateWithQoS:options:request:error:]"
UNLOAD = "-[_ANEInMemoryModel unloadWithQoS:error:]"
REALTIME = "-[_ANEClient evaluateRealTimeWithModel:options:request:error:]"
REQUEST = "+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:]"
COMPILE_SEQUENCE = [
    "+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]",
    "+[_ANEInMemoryModel inMemoryModelWithDescriptor:]",
    "-[_ANEInMemoryModel hexStringIdentifier]",
    COMPILE,
]


@pytest.fixture
def tmpdir_ns(tmp_path: Path) -> Path:
    path = tmp_path / "T"
    path.mkdir()
    return path


@pytest.fixture
def fake(tmpdir_ns: Path):
    f = FakeObjC(tmpdir_ns)
    yield f
    assert f.errors == [], "the fake saw calls that crash, leak or break a rule on a real system"


@pytest.fixture
def backend(fake: FakeObjC, monkeypatch: pytest.MonkeyPatch) -> AneBackend:
    monkeypatch.setattr(ane, "LOAD_RETRY_DELAY", 0.0)
    return AneBackend(runtime=fake.runtime())


def _since(fake: FakeObjC, mark: int, prefix: str = "_ANE") -> list[str]:
    return [c.name for c in fake.calls[mark:] if c.kind == "msg" and (c.cls or "").startswith(prefix)]


def _add_program(shape=(1, 4, 1, 3)) -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", shape), "y": tensor("fp16", shape)})
    def prog(f, x, y):
        return f.add(x=x, y=y, name="z")

    return prog


def _scale_program(factor: float, shape=(1, 4, 1, 3)) -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", shape)})
    def prog(f, x):
        return f.mul(x=x, y=np.float16(factor), name="y")

    return prog


def _conv_program() -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, 2])})
    def prog(f, x):
        w = f.weight(tensor("fp16", [4, 4, 1, 1]), "@model_path/weights/w.bin", 64, name="wq")
        return f.conv(x=x, weight=w, name="y")

    return prog


def _multi_io_program() -> mil.Program:
    """Inputs declared big then small, outputs small then big: the engine sees them reordered."""

    @mil.program(inputs={"big": tensor("fp16", [1, 8, 1, 4]), "small": tensor("fp16", [1, 2, 1, 4])})
    def prog(f, big, small):
        s = f.add(x=small, y=small, name="s")
        t = f.mul(x=big, y=big, name="t")
        return s, t

    return prog


WEIGHTS = np.arange(16, dtype=np.float32).reshape(4, 4, 1, 1) / 8
BLOB = build_blob_bytes([(WEIGHTS, "fp16")])[0]


def _rand(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- importing and availability here ----------------------------------------------------------------------


IMPORT_CHECK = """
import ctypes, platform, sys

def no_dlopen(*args, **kwargs):
    raise AssertionError("a library was loaded")

ctypes.CDLL = no_dlopen
import anekit.runtime.ane as ane
from anekit import runtime
from anekit.runtime.objc import ObjCRuntime

ObjCRuntime()  # constructing the real runtime loads nothing either
if platform.system() != "Darwin":
    assert ane.is_available() is False
    assert ane.unavailable_reason().startswith("ane needs macOS on Apple silicon; this is ")
    assert "ane" not in runtime.available()
    assert "not tried" in ane.probe().framework
    try:
        ane.AneBackend()
    except ane.ClassNotFound as e:
        assert "needs macOS on Apple silicon" in str(e), e
    else:
        raise AssertionError("AneBackend() worked off a Mac")
print("ok")
"""


def test_importing_the_backend_loads_nothing_and_it_is_unavailable_off_a_mac():
    src = str(Path(ane.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_probe_reports_classes_and_selectors(fake):
    report = ane.probe(fake.runtime())
    assert report.available and report.framework.startswith("loaded")
    assert all(report.classes[name] for name in ane.CLASSES)
    assert report.messages[str(ane.MODEL_COMPILE)] and not report.messages[str(ane.MODEL_UUID)]
    text = "\n".join(report.lines())
    assert "MISSING -[_ANEInMemoryModel getUUID]" in text and "macOS 15.1 (fake)" in text
    broken = FakeObjC(fake.tmpdir, framework_loads=False)
    assert ane.probe(broken.runtime()).framework.startswith("did not load")


# -- the message sequence --------------------------------------------------------------------------------


def test_compile_load_run_unload_send_exactly_these_messages(fake, backend):
    k = backend.compile(_add_program())
    surface_objects = ["+[_ANEIOSurfaceObject objectWithIOSurface:]"] * 3
    assert fake.sent() == [*COMPILE_SEQUENCE, *surface_objects, REQUEST]
    assert fake.called("IOSurfaceCreate") == ["IOSurfaceCreate"] * 3
    mark = len(fake.calls)
    k.load()
    for _ in range(3):  # surfaces and the request are reused: nothing is rebuilt per run
        k.run()
    k.unload()
    k.unload()
    assert _since(fake, mark) == [LOAD, EVALUATE, EVALUATE, EVALUATE, UNLOAD]
    assert fake.called("IOSurfaceCreate") == ["IOSurfaceCreate"] * 3

    (compile_call,) = fake.find(COMPILE)
    assert compile_call.types == ("u4", "ptr", "ptr") and compile_call.values[:2] == (21, {})
    load_call, unload_call = fake.find(LOAD)[0], fake.find(UNLOAD)[0]
    assert load_call.values[:2] == (21, {}) and unload_call.values[0] == 21
    evaluate = fake.find(EVALUATE)[0]
    assert evaluate.types == ("u4", "ptr", "ptr", "ptr") and evaluate.values[:3] == (21, {}, "<_ANERequest>")
    (request,) = fake.find(REQUEST)
    surface_object = "<_ANEIOSurfaceObject>"
    assert request.values == ([surface_object] * 2, [0, 1], [surface_object], [0], None, None, 0)
    k.close()
    assert fake.live_objects() == []
    retained = [c.args[0] for c in fake.calls if c.name == "objc_retain"]
    released = [c.args[0] for c in fake.calls if c.name == "objc_release"]
    assert len(retained) == 3 and sorted(retained) == sorted(released)  # model, options, request
    pushed, popped = fake.called("objc_autoreleasePoolPush"), fake.called("objc_autoreleasePoolPop")
    assert len(pushed) == len(popped) > 0


def test_the_mil_text_and_weights_are_marshalled_and_written_before_compiling(fake, backend, tmpdir_ns):
    k = backend.compile(_conv_program(), weights={"@model_path/weights/w.bin": BLOB})
    (desc,) = fake.find("+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]")
    assert desc.types == ("ptr", "ptr", "ptr")
    text, weights, options = desc.values
    assert weights == {"@model_path/weights/w.bin": {"offset": 0, "data": BLOB}} and options is None
    assert parse_program(text.decode()).functions["main"] == k.layout.fn  # the engine's function, as MIL
    (model,) = fake.of_class("_ANEInMemoryModel")
    folder = tmpdir_ns / model.value["hex"]
    assert (folder / "model.mil").read_bytes() == text
    assert (folder / "weights" / "w.bin").read_bytes() == BLOB  # the fake checks this at compile time too
    x = _rand((1, 4, 1, 2))
    expected = runtime.open("sim").compile(_conv_program(), weights={"weights/w.bin": BLOB})(x=x)["y"]
    np.testing.assert_array_equal(k(x=x)["y"], expected)
    k.close()
    assert not folder.exists() and fake.live_objects() == []


@pytest.mark.parametrize("key", ["weights/w.bin", "@model_path/weights/w.bin"])
def test_weight_names_and_file_sources(fake, backend, tmp_path, key):
    path = tmp_path / "w.bin"
    path.write_bytes(BLOB)
    for source in (BLOB, bytearray(BLOB), memoryview(BLOB), str(path), path):
        k = backend.compile(_conv_program(), weights={key: source})
        assert fake.find("modelWithMILText:weights:optionsPlist:")[-1].values[1] == {
            "@model_path/weights/w.bin": {"offset": 0, "data": BLOB}
        }
        k.close()


@pytest.mark.parametrize("key", ["../w.bin", "@model_path/../w.bin", "/etc/w.bin", "model.mil", ""])
def test_weight_names_outside_the_model_directory_are_rejected(fake, backend, key):
    with pytest.raises(CompilationFailed, match="must be a path inside the model directory"):
        backend.compile(_conv_program(), weights={key: BLOB})
    assert fake.sent() == []


def test_missing_unfit_or_repeated_weights_are_rejected_before_any_message(fake, backend, tmp_path):
    with pytest.raises(CompilationFailed, match=r"missing\.bin does not exist"):
        backend.compile(_conv_program(), weights={"weights/w.bin": tmp_path / "missing.bin"})
    with pytest.raises(CompilationFailed, match="given twice"):
        backend.compile(_conv_program(), weights={"weights/w.bin": BLOB, "@model_path/weights/w.bin": BLOB})
    with pytest.raises(
        CompilationFailed, match=r"const 'wq' refers to weight file '@model_path/weights/w\.bin'"
    ):
        backend.compile(_conv_program(), weights={"weights/other.bin": BLOB})
    small = build_blob_bytes([(np.ones((2, 2)), "fp16")])[0]
    with pytest.raises(CompilationFailed, match=r"const 'wq' \(tensor<fp16, \[4, 4, 1, 1\]>\) at offset 64"):
        backend.compile(_conv_program(), weights={"weights/w.bin": small})
    assert fake.sent() == []


def test_a_program_the_engine_rejects_is_a_compilation_failure(fake, backend):
    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, 2])})
    def prog(f, x):
        w = f.weight(tensor("fp16", [4, 4, 1, 1]), "@model_path/weights/w.bin", 64, name="wq")
        return f.conv(x=x, weight=w, name="y")

    prog.main.ops[-1].op_type = "conv_that_the_engine_does_not_know"
    with pytest.raises(CompilationFailed, match="InvalidMILProgram") as info:
        AneBackend(runtime=fake.runtime())._compile(prog, prog.main, {"weights/w.bin": BLOB})
    assert info.value.domain == ANE_DOMAIN and info.value.code == 1
    assert fake.live_objects() == []


def test_results_match_the_simulator(fake, backend):
    x, y = _rand((1, 4, 1, 3), 1), _rand((1, 4, 1, 3), 2)
    sim = runtime.open("sim").compile(_add_program())(x=x, y=y)
    with backend.compile(_add_program()) as k:
        np.testing.assert_array_equal(k(x=x, y=y)["z"], sim["z"])
        k.inputs[0].write(np.ones((4, 3)))
        k.inputs[1].write(np.full((1, 4, 1, 3), 2.0))
        k.run()
        np.testing.assert_array_equal(k.outputs[0].read(), 3.0)
    assert fake.constraint_violations == []


def test_identical_programs_share_a_temporary_directory_until_the_last_is_released(fake, backend, tmpdir_ns):
    a, b = backend.compile(_add_program()), backend.compile(_add_program())
    models = fake.of_class("_ANEInMemoryModel")
    assert models[0].value["hex"] == models[1].value["hex"]
    folder = tmpdir_ns / models[0].value["hex"]
    a.close()
    assert (folder / "model.mil").is_file()
    b.close()
    assert not folder.exists()


# -- surfaces ---------------------------------------------------------------------------------------------


def test_surfaces_are_iosurfaces_behind_the_same_api(fake, backend):
    k = backend.compile(_add_program((1, 6, 1, 4)))
    s = k.inputs[0]
    assert isinstance(s, AneSurface)
    fake_surface = fake.surfaces[s.ref].value
    assert s.id == fake_surface.surface_id and (s.channels, s.spatial, s.nbytes) == (6, 4, 48)
    assert s.alloc_size == ane.MIN_SURFACE_BYTES
    props = fake.find("IOSurfaceCreate")[0].values[0]
    assert list(props) == list(objc.IOSURFACE_KEYS)
    assert props == {
        "IOSurfaceWidth": s.alloc_size,
        "IOSurfaceHeight": 1,
        "IOSurfaceBytesPerElement": 1,
        "IOSurfaceBytesPerRow": s.alloc_size,
        "IOSurfaceAllocSize": s.alloc_size,
        "IOSurfacePixelFormat": 0,
    }
    mark = len(fake.calls)
    s.write(np.ones((2, 4)), ch_offset=3)
    s.write(np.full((1, 1, 1, 4), 7.0), ch_offset=0)
    got = s.read()
    np.testing.assert_array_equal(got[:, 0], [7, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(s.read(3, 2), np.ones((2, 4)))
    locks = [c.args[1] for c in fake.calls[mark:] if c.name == "IOSurfaceLock"]
    unlocks = [c.args[1] for c in fake.calls[mark:] if c.name == "IOSurfaceUnlock"]
    assert locks == unlocks == [0, 0, 1, 1]  # writes lock read-write, reads read-only
    with s.view() as buf:  # zero-copy: the array is the surface memory
        assert buf.__array_interface__["data"][0] == ctypes.addressof(fake_surface.memory)
        buf[0, 1, 0, 2] = 5.0
    np.testing.assert_array_equal(fake_surface.array(np.float16, (1, 6, 1, 4))[0, 1, 0, 2], 5.0)
    with pytest.raises(SurfaceCreationFailed, match=r"outside 0\.\.6"):
        s.read(5, 2)
    k.close()
    with pytest.raises(SurfaceCreationFailed, match="released"):
        s.read()


def test_allocations_meet_the_reported_size_alignment_and_ordering_rules():
    assert ane._allocations([10, 10, 10], ascending=True) == [49152, 49280, 49408]
    assert ane._allocations([10, 10], ascending=False) == [49280, 49152]
    assert ane._allocations([100_001, 60_000], ascending=False) == [100_096, 60_032]
    assert ane._allocations([100_001, 60_000], ascending=True) == [100_096, 100_224]


@pytest.mark.parametrize("io_order", ["size", "declared"])
def test_several_inputs_and_outputs_bind_in_the_engine_order(fake, io_order):
    backend = AneBackend(runtime=fake.runtime(), io_order=io_order)
    k = backend.compile(_multi_io_program())
    if io_order == "size":
        assert (k.layout.inputs, k.layout.outputs) == ((1, 0), (1, 0))
    else:
        assert (k.layout.inputs, k.layout.outputs) == ((0, 1), (0, 1))
    main = parse_program(fake.find("modelWithMILText:weights:optionsPlist:")[0].values[0].decode()).main
    assert [v.name for v in main.inputs] == [["big", "small"][i] for i in k.layout.inputs]
    assert [v.name for v in main.outputs] == [["s", "t"][j] for j in k.layout.outputs]
    assert [s.name for s in k.inputs] == ["big", "small"] and [s.name for s in k.outputs] == ["s", "t"]
    arrays = {"big": _rand((1, 8, 1, 4), 3), "small": _rand((1, 2, 1, 4), 4)}
    expected = runtime.open("sim").compile(_multi_io_program())(**arrays)
    got = k(**arrays)
    for name in ("s", "t"):
        np.testing.assert_array_equal(got[name], expected[name])
    assert fake.constraint_violations == []
    k.close()


def test_without_the_padding_the_reported_engine_gives_zeros(fake, monkeypatch):
    monkeypatch.setattr(ane, "MIN_SURFACE_BYTES", 64)  # what the engine is reported to reject
    k = AneBackend(runtime=fake.runtime()).compile(_multi_io_program())
    out = k(big=np.ones((1, 8, 1, 4)), small=np.ones((1, 2, 1, 4)))
    assert not out["s"].any() and not out["t"].any()
    assert "input surface of 128 bytes" in fake.constraint_violations
    k.close()


def test_outputs_that_repeat_an_input_or_an_output_are_copied_on_the_host(fake, backend):
    @mil.program(inputs={"x": tensor("fp16", [1, 2, 1, 3])})
    def prog(f, x):
        z = f.add(x=x, y=x, name="z")
        return x, z, z

    k = backend.compile(prog)
    assert k.layout.outputs == (1,) and k.layout.host_copies == (("input", 0, 0), ("output", 1, 2))
    assert len(fake.find(REQUEST)[0].values[2]) == 1
    x = _rand((1, 2, 1, 3))
    out = k(x=x)
    np.testing.assert_array_equal(out["x"], x.astype(np.float16))
    np.testing.assert_array_equal(out["z"], (x.astype(np.float16) * 2).astype(np.float16))
    assert [s.name for s in k.outputs] == ["x", "z", "z"]
    np.testing.assert_array_equal(k.outputs[2].read(), k.outputs[1].read())

    @mil.program(inputs={"x": tensor("fp16", [1, 2, 1, 3])})
    def passthrough(f, x):
        return x

    with pytest.raises(CompilationFailed, match="at least one computed output"):
        backend.compile(passthrough)


def test_symbolic_shapes_are_rejected_before_any_message(fake, backend):
    text = "program(1.3)\n{\n    func main<ios18>(tensor<fp16, [1, C, 1, 3]> x) {\n"
    text += "        tensor<fp16, [1, C, 1, 3]> y = relu(x = x);\n    } -> (y);\n}\n"
    with pytest.raises(CompilationFailed, match="static shapes"):
        backend.compile(text)
    assert fake.sent() == []


# -- lifecycle: unload, close, garbage collection, budget -------------------------------------------------


def test_close_unloads_releases_everything_and_removes_the_directory(fake, backend, tmpdir_ns):
    k = backend.compile(_add_program()).load()
    mark = len(fake.calls)
    k.close()
    k.close()
    assert _since(fake, mark) == [UNLOAD]
    assert fake.live_objects() == [] and list(tmpdir_ns.iterdir()) == []
    assert fake.called("CFRelease") == ["CFRelease"] * 3
    with pytest.raises(LoadFailed, match="closed"):
        k.load()


def test_garbage_collection_unloads_and_releases(fake, backend, tmpdir_ns):
    k = backend.compile(_add_program()).load()
    k.run()
    del k
    gc.collect()
    assert fake.sent()[-1] == UNLOAD
    assert fake.live_objects() == [] and list(tmpdir_ns.iterdir()) == []


def test_an_unloaded_kernel_does_not_run(fake, backend):
    k = backend.compile(_add_program())
    with pytest.raises(LoadFailed, match="not loaded"):
        k.run()
    assert EVALUATE not in fake.sent()
    k.close()


def test_compiles_count_against_the_budget(fake):
    backend = AneBackend(runtime=fake.runtime(), compile_budget=2)
    backend.compile(_add_program()).close()
    fake.fail("compileWithQoS:options:error:")
    with pytest.raises(CompilationFailed):
        backend.compile(_add_program())
    assert backend.compile_count == 2
    mark = len(fake.calls)
    with pytest.raises(CompileBudgetExhausted):
        backend.compile(_add_program())
    assert fake.calls[mark:] == []


# -- errors -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "error", "call"),
    [
        ("compileWithQoS:options:error:", CompilationFailed, COMPILE),
        ("evaluateWithQoS:options:request:error:", EvalFailed, EVALUATE),
        ("unloadWithQoS:error:", UnloadFailed, UNLOAD),
    ],
)
def test_each_nserror_becomes_the_lifecycle_exception(fake, backend, tmpdir_ns, selector, error, call):
    fake.fail(selector, code=11, description="ANECCompile() FAILED")
    kernels = []
    with pytest.raises(error) as info:
        kernels.append(backend.compile(_add_program()))
        kernels[0].load()
        kernels[0].run()
        kernels[0].unload()
    e = info.value
    assert (e.domain, e.code, e.description) == (ANE_DOMAIN, 11, "ANECCompile() FAILED")
    assert str(e) == (
        f"[ane] kernel 'main': {call} failed: ANECCompile() FAILED "
        f"(NSError domain {ANE_DOMAIN}, code 11; macOS 15.1 (fake))"
    )
    kernels.clear()
    del info, e
    gc.collect()
    assert fake.live_objects() == [] and list(tmpdir_ns.iterdir()) == []


def test_load_is_retried_once_then_fails_with_the_nserror(fake, backend):
    k = backend.compile(_add_program())
    fake.fail("loadWithQoS:options:error:", code=1)
    k.load()
    assert fake.sent().count(LOAD) == 2 and k.is_loaded
    k.unload()
    fake.fail("loadWithQoS:options:error:", code=1)
    fake.fail("loadWithQoS:options:error:", code=2, description="program load failure")
    with pytest.raises(LoadFailed, match="program load failure") as info:
        k.load()
    assert (info.value.code, info.value.domain) == (2, ANE_DOMAIN) and not k.is_loaded
    k.close()
    assert fake.live_objects() == []


def test_a_failure_without_an_nserror_says_so(fake, backend):
    fake.script("compileWithQoS:options:error:", ("fail-no-error",))
    with pytest.raises(CompilationFailed, match="failed without an NSError") as info:
        backend.compile(_add_program())
    assert (info.value.domain, info.value.code, info.value.description) == (None, None, None)
    assert fake.live_objects() == []


def test_an_unload_failure_raises_but_close_still_releases(fake, backend, tmpdir_ns):
    k = backend.compile(_add_program()).load()
    fake.fail("unloadWithQoS:error:", code=7)
    with pytest.raises(UnloadFailed, match="code 7"):
        k.close()
    k.close()  # the second close finishes the job (the model is still loaded: unload is tried again)
    assert fake.sent()[-2:] == [UNLOAD, UNLOAD]
    assert fake.live_objects() == [] and list(tmpdir_ns.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "error", "match"),
    [
        (
            "modelWithMILText:weights:optionsPlist:",
            DescriptorCreationFailed,
            "modelWithMILText.* returned nil",
        ),
        ("inMemoryModelWithDescriptor:", ModelCreationFailed, "inMemoryModelWithDescriptor:\\] returned nil"),
        ("IOSurfaceCreate", SurfaceCreationFailed, "IOSurfaceCreate of 49152 bytes failed"),
        ("objectWithIOSurface:", SurfaceCreationFailed, "objectWithIOSurface:\\] returned nil"),
        (ane.REQUEST.selector, SurfaceCreationFailed, "procedureIndex:\\] returned nil"),
    ],
)
def test_nil_results_raise_and_release_what_was_built(fake, backend, tmpdir_ns, name, error, match):
    fake.return_nil(name)
    with pytest.raises(error, match=match):
        backend.compile(_add_program())
    gc.collect()
    assert fake.live_objects() == [] and list(tmpdir_ns.iterdir()) == []


@pytest.mark.parametrize("cls", ane.CLASSES)
def test_a_missing_class_is_named_with_the_macos_version(fake, cls):
    fake.remove_class(cls)
    with pytest.raises(ClassNotFound, match=rf"class {cls} is not registered \(macOS 15\.1 \(fake\)\)"):
        AneBackend(runtime=fake.runtime())
    assert fake.sent() == []


@pytest.mark.parametrize("message", ane.REQUIRED, ids=lambda m: m.selector.split(":")[0])
def test_a_missing_selector_is_named_before_anything_is_sent(fake, message):
    fake.remove_method(message.cls, "+" if message.class_method else "-", message.selector)
    with pytest.raises(ClassNotFound) as info:
        AneBackend(runtime=fake.runtime())
    assert f"{message} is not implemented (macOS 15.1 (fake))" in str(info.value)
    assert fake.sent() == []


def test_a_framework_that_does_not_load_is_reported(tmpdir_ns):
    fake = FakeObjC(tmpdir_ns, framework_loads=False)
    with pytest.raises(ClassNotFound, match=r"cannot load .*AppleNeuralEngine"):
        AneBackend(runtime=fake.runtime())


# -- real-time evaluation ---------------------------------------------------------------------------------


def test_realtime_evaluation_is_used_when_asked(fake):
    backend = AneBackend(runtime=fake.runtime(), realtime=True)
    assert backend.realtime and fake.sent()[0] == "+[_ANEClient sharedConnection]"
    x, y = _rand((1, 4, 1, 3)), _rand((1, 4, 1, 3), 1)
    with backend.compile(_add_program()) as k:
        mark = len(fake.calls)
        np.testing.assert_array_equal(
            k(x=x, y=y)["z"], runtime.open("sim").compile(_add_program())(x=x, y=y)["z"]
        )
        assert _since(fake, mark) == [REALTIME]
        call = fake.find(REALTIME)[0]
        assert call.types == ("ptr", "ptr", "ptr", "ptr") and call.values[:3] == (
            "<_ANEInMemoryModel>",
            {},
            "<_ANERequest>",
        )
    assert fake.live_objects() == []


def test_a_failed_realtime_call_falls_back_to_the_standard_one(fake):
    backend = AneBackend(runtime=fake.runtime(), realtime=True)
    k = backend.compile(_add_program()).load()
    fake.fail("evaluateRealTimeWithModel:options:request:error:", code=9, description="no real-time task")
    mark = len(fake.calls)
    k.run()
    k.run()
    assert _since(fake, mark) == [REALTIME, EVALUATE, EVALUATE]
    assert "no real-time task" in k.realtime_failure
    k.close()


def test_realtime_is_unavailable_without_the_client(fake):
    fake.remove_class("_ANEClient")
    backend = AneBackend(runtime=fake.runtime(), realtime=True)
    assert not backend.realtime and "class _ANEClient" in backend.realtime_unavailable
    with backend.compile(_add_program()) as k:
        k.run()
    assert REALTIME not in fake.sent() and EVALUATE in fake.sent()


# -- chaining ---------------------------------------------------------------------------------------------

CHAIN_MESSAGES = (
    "+[_ANEBuffer",
    "+[_ANEIOSurfaceOutputSets",
    "+[_ANEChainingRequest",
    "-[_ANEChainingRequest",
    "-[_ANEClient prepareChaining",
    "-[_ANEClient enqueueSets",
    "-[_ANEClient buffersReady",
)


def _chain_sent(fake: FakeObjC, mark: int = 0) -> list[str]:
    return [name for name in _since(fake, mark) if name.startswith(CHAIN_MESSAGES)]


def _two_stage(backend: AneBackend):
    k1 = backend.compile(_add_program()).load()  # z = x + y
    k2 = backend.compile(_scale_program(2.0)).load()  # y = 2 x
    return k1, k2, backend.chain([k1, k2])


def _check_chain_result(k1, k2, chain) -> None:
    x, y = _rand((1, 4, 1, 3), 5), _rand((1, 4, 1, 3), 6)
    k1.inputs[0].write(x)
    k1.inputs[1].write(y)
    chain.run()
    z = (x.astype(np.float16) + y.astype(np.float16)).astype(np.float16)
    np.testing.assert_array_equal(k2.outputs[0].read(), (z * np.float16(2)).reshape(4, 3))


def test_without_the_opt_in_a_chain_runs_sequentially(fake, backend):
    k1, k2, chain = _two_stage(backend)
    _check_chain_result(k1, k2, chain)
    assert not chain.chained and chain.failure == "chaining was not requested"
    assert _chain_sent(fake) == []


def test_chaining_stops_before_the_missing_getuuid_would_crash(fake):
    backend = AneBackend(runtime=fake.runtime(), chaining=True)
    k1, k2, chain = _two_stage(backend)
    _check_chain_result(k1, k2, chain)
    assert not chain.chained and "-[_ANEInMemoryModel getUUID] is not implemented" in chain.failure
    assert _chain_sent(fake) == []


def test_a_failed_prepare_is_detected_and_the_chain_runs_sequentially(fake):
    fake.restore_method("_ANEInMemoryModel", "-", "getUUID")
    backend = AneBackend(runtime=fake.runtime(), chaining=True)
    k1, k2, chain = _two_stage(backend)
    _check_chain_result(k1, k2, chain)
    assert not chain.chained
    assert "ANEProgramChainingPrepare() Failed" in chain.failure and "code 15" in chain.failure
    assert _chain_sent(fake) == [
        "+[_ANEBuffer bufferWithIOSurfaceObject:symbolIndex:source:]",
        "+[_ANEBuffer bufferWithIOSurfaceObject:symbolIndex:source:]",
        "+[_ANEBuffer bufferWithIOSurfaceObject:symbolIndex:source:]",
        "+[_ANEIOSurfaceOutputSets objectWithstatsSurRef:outputBuffer:]",
        str(ane.CHAINING_REQUEST),
        "-[_ANEChainingRequest validate]",
        "-[_ANEClient prepareChainingWithModel:options:chainingReq:qos:error:]",
    ]
    (request,) = fake.find(ane.CHAINING_REQUEST.selector)
    assert request.values[2:] == (None, None, None, [], 0, 0, 0)
    mark = len(fake.calls)
    chain.run()  # the failure is remembered: no second attempt
    assert _chain_sent(fake, mark) == [] and _since(fake, mark) == [EVALUATE, EVALUATE]
    chain.close()
    k1.close()
    k2.close()
    assert fake.live_objects() == []


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (lambda f: f.remove_class("_ANEChainingRequest"), "class _ANEChainingRequest is not available"),
        (lambda f: f.script("validate", ("no",)), "validate\\] returned NO"),
    ],
)
def test_other_chaining_failures_are_detected(fake, script, reason):
    fake.restore_method("_ANEInMemoryModel", "-", "getUUID")
    script(fake)
    backend = AneBackend(runtime=fake.runtime(), chaining=True)
    k1, k2, chain = _two_stage(backend)
    _check_chain_result(k1, k2, chain)
    assert not chain.chained and re.search(reason, chain.failure)


def test_a_prepared_chain_is_verified_then_runs_on_the_engine(fake):
    fake.restore_method("_ANEInMemoryModel", "-", "getUUID")
    fake.defaults["prepareChainingWithModel:options:chainingReq:qos:error:"] = ("ok",)
    backend = AneBackend(runtime=fake.runtime(), chaining=True)
    k1, k2, chain = _two_stage(backend)
    _check_chain_result(k1, k2, chain)  # chained, then checked against a sequential run
    assert chain.chained and chain.failure is None
    mark = len(fake.calls)
    _check_chain_result(k1, k2, chain)
    assert EVALUATE not in _since(fake, mark)
    assert (
        _chain_sent(fake, mark)
        == [
            "-[_ANEClient enqueueSetsWithModel:outputSet:options:qos:error:]",
            "-[_ANEClient buffersReadyWithModel:inputBuffers:options:qos:error:]",
        ]
        * 2
    )
    # The second stage reads the first stage's output surface directly.
    buffers = fake.of_class("_ANEBuffer")
    assert buffers[3].value["surface"] == k1.outputs[0].ref
    fake.fail("buffersReadyWithModel:inputBuffers:options:qos:error:", code=4)
    _check_chain_result(k1, k2, chain)  # a failed chained run falls back for good
    assert not chain.chained and "code 4" in chain.failure
    chain.close()
    k1.close()
    k2.close()
    assert fake.live_objects() == []


def test_a_chained_run_that_disagrees_with_the_sequential_run_is_abandoned(fake):
    fake.restore_method("_ANEInMemoryModel", "-", "getUUID")
    fake.defaults["prepareChainingWithModel:options:chainingReq:qos:error:"] = ("ok",)
    fake.defaults["buffersReadyWithModel:inputBuffers:options:qos:error:"] = ("skip",)
    backend = AneBackend(runtime=fake.runtime(), chaining=True)
    k1, k2, chain = _two_stage(backend)
    _check_chain_result(k1, k2, chain)
    assert not chain.chained and "differ from a sequential run" in chain.failure


def test_chain_links_are_checked(fake, backend):
    k1 = backend.compile(_add_program())
    k2 = backend.compile(_scale_program(2.0, (1, 2, 1, 3)))
    with pytest.raises(AneRuntimeError, match="cannot feed"):
        backend.chain([k1, k2])
    with pytest.raises(AneRuntimeError, match="later kernel"):
        backend.chain([k1, k2], links=[(k1.outputs[0], k1.inputs[0])])
    with pytest.raises(LoadFailed, match="not loaded"):
        backend.chain([k1]).run()


# -- the objc layer ---------------------------------------------------------------------------------------


def test_bridging_round_trips_and_the_pool_releases_temporaries(fake):
    rt = fake.runtime()
    with rt.autorelease_pool():
        value = {"a": [1, 2.5, "s", b"\x00\x01"], "b": {}, "c": "héllo"}
        obj = rt.bridge(value)
        assert fake.render(obj) == value
        assert rt.to_str(rt.string("héllo")) == "héllo"
        kept = rt.retain(rt.string("kept"))
    assert [o.value for o in fake.live_objects()] == ["kept"]
    rt.release(kept)
    assert fake.live_objects() == []
    with pytest.raises(TypeError, match="cannot bridge NoneType"):
        rt.bridge(None)


def test_messages_are_declared_with_checked_type_codes():
    m = objc.msg("+[NSNumber numberWithLongLong:]", "@ q")
    assert (m.cls, m.selector, m.returns, m.args, m.class_method) == (
        "NSNumber",
        "numberWithLongLong:",
        "@",
        ("q",),
        True,
    )
    assert str(m) == "+[NSNumber numberWithLongLong:]"
    with pytest.raises(ValueError, match="takes 1 arguments"):
        objc.msg("+[NSNumber numberWithLongLong:]", "@")
    with pytest.raises(ValueError, match="unknown argument type code"):
        objc.msg("-[A b:]", "@ x")
    with pytest.raises(ValueError, match="malformed"):
        objc.msg("[A b]", "@")


def test_the_fake_catches_a_wrong_prototype(fake):
    rt = fake.runtime()
    wrong = objc.msg("+[NSNumber numberWithLongLong:]", "@ I")  # NSNumber takes a long long
    with rt.autorelease_pool():
        rt.send(wrong, 3)
    assert any("called through prototype" in e for e in fake.errors)
    fake.errors.clear()


def test_missing_classes_selectors_and_functions_are_class_not_found(fake):
    rt = fake.runtime()
    with pytest.raises(ClassNotFound, match="class NSNope not found"):
        rt.cls("NSNope")
    with pytest.raises(ClassNotFound, match=r"-\[NSString nope\] is not implemented"):
        rt.send(objc.msg("-[NSString nope]", "@"), to=1)
    objc.C_FUNCTIONS["IOSurfaceNope"] = objc.CFunction("IOSurface", "IOSurfaceNope", "v")
    try:
        with pytest.raises(ClassNotFound, match="function IOSurfaceNope not found in IOSurface"):
            rt.call("IOSurfaceNope")
    finally:
        del objc.C_FUNCTIONS["IOSurfaceNope"]


def test_nserror_exception_without_an_error():
    rt = objc.ObjCRuntime(FakeObjC(os.devnull), os_version="macOS 99")
    e = rt.nserror_exception(None, LoadFailed, "[x] load")
    assert isinstance(e, LoadFailed) and str(e) == "[x] load failed without an NSError (macOS 99)"
    assert (e.domain, e.code, e.description) == (None, None, None)
