"""The Neural Engine backend and its objc layer, driven through a fake objc runtime (no Mac needed).

Every call path of anekit.runtime.ane is exercised against tests/fake_objc.py: the exact message
sequence of compile / load / run / unload, the marshalling of MIL text, weight dictionaries and
surfaces, reference counting (nothing left alive), each scripted NSError becoming the right anekit
exception, missing classes and selectors, the real-time variants and the chaining opt-in with its
fallback (the per-process behaviour — compile budget, directory identity, pacing, the loaded-program
ceiling, the refresh, what the chip decides — is in tests/test_runtime_ane_process.py). The fake engine runs the simulator's plan on the IOSurfaces it is given, so results are
compared with the simulator bit for bit.

The fake enforces the engine rules hardware-run projects published (see its docstring); the tests
under "the engine rules the fake enforces" state each rule with its source and show the backend's old
behaviour (size-ordered surfaces, declaration-order binding, one request kept across reloads) failing,
and the current backend passing. Shapes are
[1, C, 1, S] with S = 32: rows of 64 bytes, the smallest with hardware precedent.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
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
from anekit.runtime import ane
from anekit.runtime.ane import AneBackend, AneSurface, binding, lifecycle, memory, objc
from anekit.runtime.base import PROCESS_COMPILES
from tests.fake_objc import ANE_DOMAIN, STATUS_0X1D, FakeObjC

COMPILE = "-[_ANEInMemoryModel compileWithQoS:options:error:]"
LOAD = "-[_ANEInMemoryModel loadWithQoS:options:error:]"
EVALUATE = "-[_ANEInMemoryModel evaluateWithQoS:options:request:error:]"
UNLOAD = "-[_ANEInMemoryModel unloadWithQoS:error:]"
REALTIME = "-[_ANEClient evaluateRealTimeWithModel:options:request:error:]"
REQUEST = "+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:]"
SURFACE_OBJECT = "+[_ANEIOSurfaceObject objectWithIOSurface:]"
RT_BEGIN = "-[_ANEClient beginRealTimeTask]"
RT_END = "-[_ANEClient endRealTimeTask]"
RT_LOAD = "-[_ANEClient loadRealTimeModel:options:qos:error:]"
RT_UNLOAD = "-[_ANEClient unloadRealTimeModel:options:qos:error:]"
S = 32  # spatial width: rows of 64 bytes in fp16, the smallest with hardware precedent
COMPILE_SEQUENCE = [
    "+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]",
    "+[_ANEInMemoryModel inMemoryModelWithDescriptor:]",
    "-[_ANEInMemoryModel hexStringIdentifier]",
    COMPILE,
]


@pytest.fixture
def backend(fake: FakeObjC, monkeypatch: pytest.MonkeyPatch) -> AneBackend:
    monkeypatch.setattr(lifecycle, "LOAD_RETRY_DELAY", 0.0)
    return AneBackend(runtime=fake.runtime(), dialect="ios18")  # one compile per program: no dialect trial


def _since(fake: FakeObjC, mark: int, prefix: str = "_ANE") -> list[str]:
    return [c.name for c in fake.calls[mark:] if c.kind == "msg" and (c.cls or "").startswith(prefix)]


def _add_program(shape=(1, 4, 1, S)) -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", shape), "y": tensor("fp16", shape)})
    def prog(f, x, y):
        return f.add(x=x, y=y, name="z")

    return prog


def _scale_program(factor: float, shape=(1, 4, 1, S)) -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", shape)})
    def prog(f, x):
        return f.mul(x=x, y=np.float16(factor), name="y")

    return prog


def _conv_program() -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, S])})
    def prog(f, x):
        w = f.weight(tensor("fp16", [4, 4, 1, 1]), "@model_path/weights/w.bin", 64, name="wq")
        return f.conv(x=x, weight=w, name="y")

    return prog


def _multi_io_program() -> mil.Program:
    """Inputs and outputs declared against alphabetical order, of different sizes, and asymmetric: an
    input or output bound to the wrong parameter changes the numbers."""

    @mil.program(inputs={"x": tensor("fp16", [1, 8, 1, S]), "b": tensor("fp16", [1, 2, 1, S])})
    def prog(f, x, b):
        t = f.mul(x=x, y=x, name="t")  # (1, 8, 1, S)
        s = f.add(x=b, y=1.0, name="s")  # (1, 2, 1, S)
        return t, s

    return prog


MULTI_SHAPES = {"x": (1, 8, 1, S), "b": (1, 2, 1, S)}


WEIGHTS = np.arange(16, dtype=np.float32).reshape(4, 4, 1, 1) / 8
BLOB = build_blob_bytes([(WEIGHTS, "fp16")])[0]
# The name the engine gets for weights/w.bin holding BLOB: the digest of its bytes in the file name (rule
# descriptor.hex-id-weights, tests/test_runtime_ane_process.py).
BLOB_NAME = f"weights/w-{hashlib.sha256(BLOB).hexdigest()[:16]}.bin"


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
from anekit.runtime.ane.objc import ObjCRuntime

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
    src = str(Path(ane.__file__).resolve().parents[3])  # the package: src/anekit/runtime/ane/__init__.py
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
    assert fake.sent() == COMPILE_SEQUENCE
    assert fake.called("IOSurfaceCreate") == ["IOSurfaceCreate"] * 3
    mark = len(fake.calls)
    k.load()
    for _ in range(3):  # surfaces and the request are reused between load and unload
        k.run()
    k.unload()
    k.unload()
    # The request is built after the load (maderix/ANE training/ane_runtime.h) and dropped at unload.
    built = [SURFACE_OBJECT] * 3 + [REQUEST]
    assert _since(fake, mark) == [LOAD, *built, EVALUATE, EVALUATE, EVALUATE, UNLOAD]
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
    assert weights == {f"@model_path/{BLOB_NAME}": {"offset": 0, "data": BLOB}} and options is None
    assert parse_program(text.decode()).functions["main"] == k.layout.fn  # the engine's function, as MIL
    (model,) = fake.of_class("_ANEInMemoryModel")
    folder = tmpdir_ns / model.value["hex"]
    assert (folder / "model.mil").read_bytes() == text
    assert (folder / BLOB_NAME).read_bytes() == BLOB  # the fake checks this at compile time too
    assert f'"@model_path/{BLOB_NAME}"' in text.decode()
    x = _rand((1, 4, 1, S))
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
            f"@model_path/{BLOB_NAME}": {"offset": 0, "data": BLOB}
        }
        k.close()


@pytest.mark.parametrize("key", ["../w.bin", "@model_path/../w.bin", "/etc/w.bin", ""])
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
    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, S])})
    def prog(f, x):
        w = f.weight(tensor("fp16", [4, 4, 1, 1]), "@model_path/weights/w.bin", 64, name="wq")
        return f.conv(x=x, weight=w, name="y")

    prog.main.ops[-1].op_type = "conv_that_the_engine_does_not_know"
    with pytest.raises(CompilationFailed, match="InvalidMILProgram") as info:
        AneBackend(runtime=fake.runtime())._compile(prog, prog.main, {"weights/w.bin": BLOB})
    assert info.value.domain == ANE_DOMAIN and info.value.code == 1
    assert fake.live_objects() == []


def test_results_match_the_simulator(fake, backend):
    x, y = _rand((1, 4, 1, S), 1), _rand((1, 4, 1, S), 2)
    sim = runtime.open("sim").compile(_add_program())(x=x, y=y)
    with backend.compile(_add_program()) as k:
        np.testing.assert_array_equal(k(x=x, y=y)["z"], sim["z"])
        k.inputs[0].write(np.ones((4, S)))
        k.inputs[1].write(np.full((1, 4, 1, S), 2.0))
        k.run()
        np.testing.assert_array_equal(k.outputs[0].read(), 3.0)
    assert fake.refusals == []


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
    k = backend.compile(_add_program((1, 6, 1, S)))
    s = k.inputs[0]
    assert isinstance(s, AneSurface)
    fake_surface = fake.surfaces[s.ref].value
    assert s.id == fake_surface.surface_id and (s.channels, s.spatial, s.nbytes) == (6, S, 6 * S * 2)
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
    s.write(np.ones((2, S)), ch_offset=3)
    s.write(np.full((1, 1, 1, S), 7.0), ch_offset=0)
    got = s.read()
    np.testing.assert_array_equal(got[:, 0], [7, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(s.read(3, 2), np.ones((2, S)))
    locks = [c.args[1] for c in fake.calls[mark:] if c.name == "IOSurfaceLock"]
    unlocks = [c.args[1] for c in fake.calls[mark:] if c.name == "IOSurfaceUnlock"]
    assert locks == unlocks == [0, 0, 1, 1]  # writes lock read-write, reads read-only
    with s.view() as buf:  # zero-copy: the array is the surface memory, packed at its start
        assert buf.__array_interface__["data"][0] == ctypes.addressof(fake_surface.memory)
        buf[0, 1, 0, 2] = 5.0
    np.testing.assert_array_equal(fake_surface.array(np.float16, (1, 6, 1, S))[0, 1, 0, 2], 5.0)
    with pytest.raises(SurfaceCreationFailed, match=r"outside 0\.\.6"):
        s.read(5, 2)
    k.close()
    with pytest.raises(SurfaceCreationFailed, match="released"):
        s.read()


def test_one_allocation_size_per_direction():
    """Orion docs/ane_constraints.md §12 (inputs) and §2 (outputs): the largest tensor of a direction
    decides; at least the ~48 KB of Orion §4; a multiple of 128 bytes."""
    assert ane.uniform_allocation([10, 10, 10]) == 49152
    assert ane.uniform_allocation([100_001, 60_000]) == 100_096
    assert ane.uniform_allocation([]) == 49152


def test_every_surface_of_a_direction_has_the_same_size(fake, backend):
    big = 64 * 1024  # channels of the big input / output: 64 * 1024 * 2 bytes > the 48 KB floor

    @mil.program(inputs={"x": tensor("fp16", [1, big // S, 1, S]), "b": tensor("fp16", [1, 2, 1, S])})
    def prog(f, x, b):
        return f.mul(x=x, y=2.0, name="t"), f.add(x=b, y=1.0, name="s")

    k = backend.compile(prog)
    assert {s.alloc_size for s in k.inputs} == {big * 2}
    assert {s.alloc_size for s in k.outputs} == {big * 2}
    k.close()


def test_several_inputs_and_outputs_bind_in_alphabetical_order(fake, backend):
    """Orion docs/ane_constraints.md §3, §13: surfaces bind to MIL parameters in alphabetical order of
    their names. The engine's function declares them sorted; the kernel keeps the program's order."""
    k = backend.compile(_multi_io_program())
    assert (k.layout.inputs, k.layout.outputs) == ((1, 0), (1, 0))  # b before x, s before t
    main = parse_program(fake.find("modelWithMILText:weights:optionsPlist:")[0].values[0].decode()).main
    assert [v.name for v in main.inputs] == ["b", "x"] and [v.name for v in main.outputs] == ["s", "t"]
    assert [s.name for s in k.inputs] == ["x", "b"] and [s.name for s in k.outputs] == ["t", "s"]
    arrays = {name: _rand(shape, i) for i, (name, shape) in enumerate(MULTI_SHAPES.items())}
    expected = runtime.open("sim").compile(_multi_io_program())(**arrays)
    got = k(**arrays)
    assert list(got) == ["t", "s"]
    for name in ("s", "t"):
        np.testing.assert_array_equal(got[name], expected[name])
    (request,) = fake.find(REQUEST)
    assert request.values[1] == [0, 1] and request.values[3] == [0, 1]
    assert fake.refusals == []
    k.close()


# -- the engine rules the fake enforces, shown failing the way the old backend did --------------------------


def test_the_fake_refuses_inputs_of_different_allocation_sizes(fake, backend, monkeypatch):
    """Rule surface.uniform-input-size — mechramc/Orion docs/ane_constraints.md §12: input surfaces of
    different allocation sizes fail at eval with "ANEProgramProcessRequestDirect() Failed with
    status=0x1d". The old backend padded inputs to strictly ascending sizes: through the fake it fails."""
    from anekit.runtime.ane import kernel as kernel_module

    real = kernel_module.AneSurface
    sizes = iter([49152, 49280])  # what the old "ascending sizes" allocation gave two inputs

    def ascending(rt, shape, dtype, name, alloc):
        return real(rt, shape, dtype, name, next(sizes, alloc))

    monkeypatch.setattr(kernel_module, "AneSurface", ascending)
    k = backend.compile(_add_program()).load()
    with pytest.raises(EvalFailed, match="status=0x1d") as info:
        k.run()
    assert info.value.description == STATUS_0X1D
    assert fake.refusals == ["input surfaces of different allocation sizes [49152, 49280]"]
    k.close()


def test_the_fake_refuses_outputs_of_different_allocation_sizes(fake, backend, monkeypatch):
    """Rule surface.uniform-output-size — mechramc/Orion docs/ane_constraints.md §2: output surfaces of
    different allocation sizes fail with status 0x1d (the old backend made them strictly descending)."""
    from anekit.runtime.ane import kernel as kernel_module

    real = kernel_module.AneSurface

    def by_size(rt, shape, dtype, name, alloc):  # outputs as the old backend sized them: descending
        return real(rt, shape, dtype, name, alloc + (128 if name == "s" else 0))

    monkeypatch.setattr(kernel_module, "AneSurface", by_size)
    k = backend.compile(_multi_io_program()).load()
    assert len({s.alloc_size for s in k.outputs}) == 2
    with pytest.raises(EvalFailed, match="status=0x1d"):
        k(**{name: np.ones(shape) for name, shape in MULTI_SHAPES.items()})
    assert "output surfaces of different allocation sizes" in fake.refusals[-1]
    k.close()


def test_binding_in_declaration_order_gives_wrong_numbers(fake, monkeypatch):
    """Rule surface.bind-alphabetical — mechramc/Orion docs/ane_constraints.md §13 (all 6 permutations
    of 3 inputs tried: only alphabetical order is right) and §3: binding in declaration order
    is not an error, the numbers are silently wrong. The fake binds alphabetically, so a backend that
    binds in declaration order (as the old one did with io_order="declared") computes garbage."""
    monkeypatch.setattr(binding, "binding_order", lambda names: list(range(len(names))))
    with pytest.raises(CompilationFailed, match=r"surface\.bind-alphabetical error input surfaces"):
        AneBackend(runtime=fake.runtime()).compile(_multi_io_program())  # the backend's own plan check
    k = AneBackend(runtime=fake.runtime(), strict=False).compile(_multi_io_program())
    arrays = {name: _rand(shape, i) for i, (name, shape) in enumerate(MULTI_SHAPES.items())}
    expected = runtime.open("sim").compile(_multi_io_program())(**arrays)
    got = k(**arrays)  # x (8 channels) read as b (2 channels) and the other way round
    assert not np.array_equal(got["s"], expected["s"]) and not np.array_equal(got["t"], expected["t"])
    assert fake.refusals == []  # silent, as on the engine
    k.close()


def test_rows_under_64_bytes_are_refused_by_the_fake_and_by_the_backend(fake, monkeypatch):
    """Rule surface.min-row-bytes: rows (the last dimension) under 64 bytes were measured failing on the
    in-memory route on M3 (Espresso, statusType 0x9), M4 (Orion §4, status 0x1d) and M5 (m0at: silent
    zeros). The M5 backend refuses them at compile naming the tensor (an error where it was measured and
    not contradicted); a width that is not a multiple of 16 is only reported (a warning); with the check
    off, the fake refuses the eval."""
    backend = AneBackend(runtime=fake.runtime(), chip="m5", dialect="ios18")
    with pytest.raises(
        CompilationFailed, match=r"surface\.min-row-bytes error main: input 'x' .*rows of 6 bytes"
    ):
        backend.compile(_add_program((1, 4, 1, 3)))
    assert fake.sent() == []
    backend.compile(_add_program((1, 4, 1, 40))).close()  # a warning only: it compiles
    mark = len(fake.calls)
    backend.strict = False  # send it anyway, as a user exploring the engine may
    k = backend.compile(_add_program((1, 4, 1, 3))).load()
    with pytest.raises(EvalFailed, match="status=0x1d"):
        k.run()
    assert fake.refusals == ["'x' has rows of 6 bytes"] and len(fake.calls) > mark
    k.close()


def test_a_request_built_before_the_latest_load_is_refused(fake, backend):
    """Rule process.request-per-load — maderix/ANE training/ane_runtime.h builds the _ANERequest after
    the load, and nothing public reuses one across an unload/reload. The old backend built one request
    at compile and kept it for good: through the fake, a request older than the load fails."""
    k = backend.compile(_add_program()).load()
    k.run()
    rt = backend.runtime
    stale = rt.retain(k._engine.request)
    k.unload()
    k.load()
    assert len(fake.find(REQUEST)) == 2  # one request per load
    fresh, k._engine.request = k._engine.request, stale
    with pytest.raises(EvalFailed, match="built before the model's latest load"):
        k.run()
    k._engine.request = fresh
    k.run()  # the request of this load is accepted
    rt.release(stale)
    k.close()


def test_the_engine_reads_packed_data_at_the_start_of_a_larger_surface(fake, backend):
    """Rule surface.packed-data — mechramc/Orion docs/ane_constraints.md §14: the engine reads the first
    C*S values of the surface as the packed [1, C, 1, S] tensor; surfaces are larger than tensors."""
    k = backend.compile(_add_program()).load()
    x = _rand((1, 4, 1, S), 1)
    k.inputs[0].write(x)
    k.inputs[1].write(np.zeros((4, S)))
    k.run()
    raw = fake.surfaces[k.outputs[0].ref].value
    assert raw.alloc_size > 4 * S * 2
    packed = np.frombuffer(raw.memory, dtype=np.float16, count=4 * S).reshape(4, S)
    np.testing.assert_array_equal(packed, x.reshape(4, S).astype(np.float16))
    assert not np.frombuffer(raw.memory, dtype=np.float16)[4 * S :].any()
    k.close()


def test_the_descriptor_gets_nsdata_and_a_dictionary(fake, backend):
    """Rules descriptor.mil-text-nsdata (Orion §9: an NSString crashes) and descriptor.empty-weights-dict
    (Orion §11: nil crashes, even without weights): the fake records either as a crash."""
    backend.compile(_add_program()).close()
    (desc,) = fake.find("modelWithMILText:weights:optionsPlist:")
    assert isinstance(desc.values[0], bytes) and desc.values[1] == {}
    rt = fake.runtime()
    with rt.autorelease_pool():
        assert (
            rt.send(ane.api.DESCRIPTOR_WITH_MIL, rt.string("program(1.3) {}"), rt.dictionary({}), None)
            is None
        )
        assert rt.send(ane.api.DESCRIPTOR_WITH_MIL, rt.data(b"program(1.3) {}"), None, None) is None
    assert [e.split(":")[0] for e in fake.errors] == ["modelWithMILText"] * 2
    assert "NSString, not NSData" in fake.errors[0] and "nil weights dictionary" in fake.errors[1]
    fake.errors.clear()


def test_weight_names_that_collide_with_framework_files_are_refused(fake, backend):
    """Rule weights.reserved-name: model.mil is the MIL text, net.plist and data are written by the
    compiler into the model directory (mechramc/Orion core/ane_runtime.m orion_program_patch_weights)."""
    for key in ("model.mil", "@model_path/net.plist", "data", "@model_path/Data/w.bin", "NET.PLIST"):
        with pytest.raises(CompilationFailed, match=r"weights\.reserved-name") as info:
            backend.compile(_conv_program(), weights={key: BLOB})
        assert f"weight '{key}'" in str(info.value)
    assert fake.sent() == []


def test_outputs_that_repeat_an_input_or_an_output_are_copied_on_the_host(fake, backend):
    @mil.program(inputs={"x": tensor("fp16", [1, 2, 1, S])})
    def prog(f, x):
        z = f.add(x=x, y=x, name="z")
        return x, z, z

    k = backend.compile(prog)
    assert k.layout.outputs == (1,) and k.layout.host_copies == (("input", 0, 0), ("output", 1, 2))
    x = _rand((1, 2, 1, S))
    out = k(x=x)
    np.testing.assert_array_equal(out["x"], x.astype(np.float16))
    np.testing.assert_array_equal(out["z"], (x.astype(np.float16) * 2).astype(np.float16))
    assert [s.name for s in k.outputs] == ["x", "z", "z"]
    np.testing.assert_array_equal(k.outputs[2].read(), k.outputs[1].read())
    assert len(fake.find(REQUEST)[0].values[2]) == 1  # one output surface goes to the engine

    @mil.program(inputs={"x": tensor("fp16", [1, 2, 1, S])})
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
    assert e.user_info == "{ NSLocalizedDescription = ANECCompile() FAILED; }" and e.underlying is None
    assert str(e) == (
        f"[ane] kernel 'main': {call} failed: ANECCompile() FAILED (NSError domain {ANE_DOMAIN}, code 11; "
        "userInfo { NSLocalizedDescription = ANECCompile() FAILED; }; macOS 15.1 (fake))"
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
    kernels = []
    with pytest.raises(error, match=match):  # the request and its surface objects are built by load
        kernels.append(backend.compile(_add_program()))
        kernels[0].load()
    if kernels:
        assert not kernels[0].is_loaded and LOAD in fake.sent() and UNLOAD in fake.sent()
        kernels.pop().close()
    gc.collect()
    assert fake.live_objects() == [] and list(tmpdir_ns.iterdir()) == []


def test_an_nserror_carries_its_user_info_and_underlying_error(fake, backend):
    """The one NSError conversion (anekit.runtime.ane.objc) keeps description, code, domain, the rendered
    userInfo and the NSUnderlyingErrorKey chain."""
    k = backend.compile(_add_program())
    for _ in range(2):  # the load and its retry
        fake.fail(
            "loadWithQoS:options:error:",
            code=1,
            description="load failed",
            underlying=("com.apple.ane.driver", 0x1D, "program load failure"),
        )
    with pytest.raises(LoadFailed) as info:
        k.load()
    e = info.value
    under = e.underlying
    assert (under.domain, under.code, under.description) == (
        "com.apple.ane.driver",
        0x1D,
        "program load failure",
    )
    assert e.nserror.underlying == under
    assert "NSUnderlyingError = Error Domain=com.apple.ane.driver Code=29" in e.user_info
    assert "underlying: program load failure (NSError domain com.apple.ane.driver, code 29" in str(e)
    k.close()


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


def _realtime_calls(fake: FakeObjC, mark: int = 0) -> list[tuple[str, object]]:
    """(message, the model it was handed) of every real-time evaluation since ``mark``."""
    return [(c.name, c.values[0]) for c in fake.calls[mark:] if c.name == REALTIME]


def test_realtime_first_hands_the_in_memory_model_itself_as_maderix_measured(fake):
    """maderix/ANE commit 99ba013 (training/ane_runtime.h ane_eval_rt, docs/ANE_CHAINING_RESEARCH.md, M4
    Max): -[_ANEClient evaluateRealTimeWithModel:options:request:error:] given the _ANEInMemoryModel itself
    and an empty options dictionary, no real-time load or task: 1.74x-1.88x the standard call at 64x32. It
    is the variant tried first; what worked is remembered for the next process."""
    backend = AneBackend(runtime=fake.runtime(), realtime=True)
    assert backend.realtime and backend.realtime_paths.order == ("in-memory-model", "model-property")
    x, y = _rand((1, 4, 1, S)), _rand((1, 4, 1, S), 1)
    with backend.compile(_add_program()) as k:
        assert RT_BEGIN not in fake.sent() and RT_LOAD not in fake.sent()  # nothing real-time at load
        mark = len(fake.calls)
        np.testing.assert_array_equal(
            k(x=x, y=y)["z"], runtime.open("sim").compile(_add_program())(x=x, y=y)["z"]
        )
        assert _since(fake, mark) == [REALTIME]
        call = fake.find(REALTIME)[0]
        assert call.types == ("ptr", "ptr", "ptr", "ptr")
        assert call.values[:3] == ("<_ANEInMemoryModel>", {}, "<_ANERequest>")
        assert k.realtime_variant == "in-memory-model" and k.realtime_failure is None
        mark = len(fake.calls)
    assert _since(fake, mark) == [UNLOAD]
    assert fake.realtime_tasks == 0 and fake.live_objects() == []
    [outcome] = [o for o in memory.Memory().entries() if o.trial == "realtime"]
    assert outcome.value == "in-memory-model" and [a.value for a in outcome.attempts] == ["in-memory-model"]


def test_when_the_in_memory_model_is_refused_the_model_property_variant_follows(fake):
    """The variant bridge code writes (christopherkarani/Espresso Sources/ANEInterop/ane_interop.m): the
    model's ``model`` property (an _ANEModel), beginRealTimeTask + loadRealTimeModel:options:qos:error:,
    evaluated with the same _ANEModel, unloadRealTimeModel + endRealTimeTask before the normal unload. Once
    it works, every kernel of the backend uses it without trying the first variant again."""
    backend = AneBackend(runtime=fake.runtime(), realtime=True)
    k = backend.compile(_add_program()).load()
    fake.fail("evaluateRealTimeWithModel:options:request:error:", code=9, description="no real-time")
    mark = len(fake.calls)
    k.run()
    model_rt = [REALTIME, "-[_ANEInMemoryModel model]", RT_BEGIN, RT_LOAD, REALTIME]
    assert _since(fake, mark) == model_rt
    assert [m for _, m in _realtime_calls(fake, mark)] == ["<_ANEInMemoryModel>", "<_ANEModel>"]
    assert fake.find(RT_LOAD)[0].values[:3] == ("<_ANEModel>", {}, 21)
    assert k.realtime_variant == "model-property" and fake.realtime_tasks == 1
    other = backend.compile(_add_program()).load()
    mark = len(fake.calls)
    other.run()
    assert _since(fake, mark) == ["-[_ANEInMemoryModel model]", RT_BEGIN, RT_LOAD, REALTIME]
    mark = len(fake.calls)
    k.close()
    other.close()
    assert _since(fake, mark) == [RT_UNLOAD, RT_END, UNLOAD] * 2
    assert fake.realtime_tasks == 0 and fake.live_objects() == []
    [outcome] = [o for o in memory.Memory().entries() if o.trial == "realtime"]
    assert outcome.value == "model-property"
    assert [a.value for a in outcome.attempts] == ["in-memory-model", "model-property"]
    assert "no real-time" in outcome.attempts[0].error


def test_an_m3_whose_realtime_load_returns_no_silently_ends_on_the_standard_call(tmpdir_ns):
    """christopherkarani/Espresso AGENTS.md (M3 Max, macOS 15): "loadRealTimeModel: returns NO with no
    error. Silent entitlement gate." The fake's M3 does that; with the first variant refused as well the
    backend ends the task and uses the standard call for good — and the next process does not try again."""
    fake = FakeObjC(tmpdir_ns, chip="m3", macos="15.4")
    backend = AneBackend(runtime=fake.runtime(), realtime=True)
    k = backend.compile(_add_program()).load()
    fake.fail("evaluateRealTimeWithModel:options:request:error:", code=9, description="no real-time")
    mark = len(fake.calls)
    k.run()
    assert _since(fake, mark) == [REALTIME, "-[_ANEInMemoryModel model]", RT_BEGIN, RT_LOAD, RT_END, EVALUATE]
    assert k.realtime_variant == "standard" and fake.realtime_tasks == 0
    mark = len(fake.calls)
    k.run()
    assert _since(fake, mark) == [EVALUATE]
    k.close()
    [outcome] = [o for o in memory.Memory().entries() if o.trial == "realtime"]
    assert outcome.value == "standard" and "without an NSError" in outcome.attempts[1].error
    PROCESS_COMPILES.reset()  # the next process
    again = AneBackend(runtime=fake.runtime(), realtime=True)
    assert not again.realtime and "remembered" in again.realtime_unavailable
    with again.compile(_add_program()) as k2:
        mark = len(fake.calls)
        k2.run()
        assert _since(fake, mark) == [EVALUATE]
    assert fake.errors == []


def test_the_next_process_starts_with_the_variant_that_worked(fake):
    first = AneBackend(runtime=fake.runtime(), realtime=True)
    with first.compile(_add_program()) as k:
        fake.fail("evaluateRealTimeWithModel:options:request:error:", code=9)
        k.run()
        assert k.realtime_variant == "model-property"
    second = AneBackend(runtime=fake.runtime(), realtime=True)
    assert second.realtime_paths.order == ("model-property", "in-memory-model")
    with second.compile(_add_program()) as k:
        mark = len(fake.calls)
        k.run()
        assert [m for _, m in _realtime_calls(fake, mark)] == ["<_ANEModel>"]


def test_a_realtime_call_that_fails_after_working_leaves_that_kernel_on_the_standard_call(fake):
    backend = AneBackend(runtime=fake.runtime(), realtime=True)
    k = backend.compile(_add_program()).load()
    k.run()  # the in-memory model works
    fake.fail("evaluateRealTimeWithModel:options:request:error:", code=9, description="no real-time task")
    mark = len(fake.calls)
    k.run()
    k.run()
    assert _since(fake, mark) == [REALTIME, EVALUATE, EVALUATE]
    assert "no real-time task" in k.realtime_failure and backend.realtime_paths.chosen == "in-memory-model"
    other = backend.compile(_add_program()).load()
    mark = len(fake.calls)
    other.run()  # the other kernels keep the variant
    assert _since(fake, mark) == [REALTIME]
    k.close()
    other.close()
    assert fake.realtime_tasks == 0


def test_the_fake_refuses_an_ane_model_that_was_not_loaded_for_real_time(fake, backend):
    rt = backend.runtime
    k = backend.compile(_add_program()).load()
    with rt.autorelease_pool(), pytest.raises(EvalFailed, match="not loaded for real time"):
        client = rt.send(ane.api.CLIENT_SHARED)
        rt.send_checked(
            ane.CLIENT_EVALUATE_REALTIME,
            rt.send(ane.MODEL_ANE_MODEL, to=k._engine.model),
            k._engine.options,
            k._engine.request,
            to=client,
            fails=EvalFailed,
            what="real-time call without the real-time load",
        )
    k.close()


def test_realtime_is_unavailable_without_the_client(fake):
    fake.remove_class("_ANEClient")
    backend = AneBackend(runtime=fake.runtime(), realtime=True)
    assert not backend.realtime and "class _ANEClient" in backend.realtime_unavailable
    with backend.compile(_add_program()) as k:
        k.run()
    assert REALTIME not in fake.sent() and EVALUATE in fake.sent()


def test_without_the_model_property_only_the_in_memory_variant_is_tried(fake):
    fake.remove_method("_ANEInMemoryModel", "-", "model")
    backend = AneBackend(runtime=fake.runtime(), realtime=True)
    assert backend.realtime and backend.realtime_paths.order == ("in-memory-model",)
    with backend.compile(_add_program()) as k:
        fake.fail("evaluateRealTimeWithModel:options:request:error:", code=9)
        k.run()
        assert k.realtime_variant == "standard"
    assert "-[_ANEInMemoryModel model]" not in fake.sent()


# -- threads ----------------------------------------------------------------------------------------------


def test_one_kernel_shared_between_threads_is_serialised(fake, backend):
    """Each kernel holds its own lock around load / run / unload / close and kernel(**arrays)."""
    import threading

    k = backend.compile(_add_program()).load()
    x = _rand((1, 4, 1, S))
    want = (x.astype(np.float16) * 2).astype(np.float32)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                np.testing.assert_array_equal(k(x=x, y=x)["z"], want)
                k.unload()
                k.load()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and fake.refusals == []
    k.close()


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
    x, y = _rand((1, 4, 1, S), 5), _rand((1, 4, 1, S), 6)
    k1.inputs[0].write(x)
    k1.inputs[1].write(y)
    chain.run()
    z = (x.astype(np.float16) + y.astype(np.float16)).astype(np.float16)
    np.testing.assert_array_equal(k2.outputs[0].read(), (z * np.float16(2)).reshape(4, S))


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
    k2 = backend.compile(_scale_program(2.0, (1, 2, 1, S)))
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


def test_the_backend_writes_a_fixed_dialect_and_enforces_its_chips_rules(fake):
    """dialect="ios16" sends program(1.0) / <ios16> with no string scalars; the M1 backend refuses a
    program the M1's rules refuse before any message, and the M4 backend compiles it."""
    m1 = AneBackend(runtime=fake.runtime(), chip="m1", dialect="ios16")
    m1.compile(_add_program()).close()
    text = fake.find("modelWithMILText:weights:optionsPlist:")[-1].values[0].decode()
    assert text.startswith("program(1.0)") and "func main<ios16>" in text and 'string("' not in text
    assert m1.dialect == "ios16"

    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, S])})
    def sine(f, x):
        return f.sin(x=f.relu(x=x), name="y")

    sent = len(fake.find("modelWithMILText:weights:optionsPlist:"))
    with pytest.raises(CompilationFailed, match=r"op\.from-m3 error main: sin 'y'"):
        m1.compile(sine)
    assert len(fake.find("modelWithMILText:weights:optionsPlist:")) == sent  # refused before the framework
    m4 = AneBackend(runtime=fake.runtime(), chip="m4", dialect="ios18")
    m4.compile(sine).close()
    text = fake.find("modelWithMILText:weights:optionsPlist:")[-1].values[0].decode()
    assert text.startswith("program(1.3)") and "func main<ios18>" in text


def _sent_versions(fake: FakeObjC, mark: int) -> list[str]:
    texts = [c.values[0].decode() for c in fake.find("modelWithMILText:weights:optionsPlist:")[mark:]]
    return [t.split(")", 1)[0] + ")" for t in texts]


def test_the_dialect_is_tried_in_the_evidence_order(tmpdir_ns):
    """An M1 under macOS 26 whose compiler refuses program(1.3) (maderix/ANE pull request #6): the trial
    puts ios16 first there (the one hardware run under macOS 26), so the first compile succeeds."""
    fake = FakeObjC(tmpdir_ns, os_version="macOS 26.3 (fake)", refuses_program=("1.3",))
    backend = AneBackend(runtime=fake.runtime(), chip="m1")
    assert backend.dialect_order() == ("ios16", "ios18")
    backend.compile(_add_program()).close()
    assert _sent_versions(fake, 0) == ["program(1.0)"] and backend.compile_count == 1
    assert fake.errors == []


def test_a_refused_dialect_falls_back_and_the_next_process_starts_with_what_compiled(tmpdir_ns):
    """An M1 under macOS 15 is expected to take program(1.3); a compiler that refuses it costs one failed
    compile, the backend falls back to program(1.0), remembers it, and a new backend (a new process)
    compiles program(1.0) first. Every attempt counts against the compile budget."""
    fake = FakeObjC(tmpdir_ns, os_version="macOS 15.4 (fake)", refuses_program=("1.3",))
    first = AneBackend(runtime=fake.runtime(), chip="m1")
    assert first.dialect_order() == ("ios18", "ios16")
    first.compile(_add_program()).close()
    assert _sent_versions(fake, 0) == ["program(1.3)", "program(1.0)"]
    assert first.compile_count == 2 and first.dialect == "ios16"
    [outcome] = list(memory.Memory().entries())
    assert (outcome.trial, outcome.chip, outcome.value) == ("dialect", "m1", "ios16")
    assert outcome.macos == "macOS 15.4 (fake)"
    assert [a.value for a in outcome.attempts] == ["ios18", "ios16"]
    assert "InvalidMILProgram" in outcome.attempts[0].error
    mark = len(fake.find("modelWithMILText:weights:optionsPlist:"))
    PROCESS_COMPILES.reset()  # the next process
    second = AneBackend(runtime=fake.runtime(), chip="m1")
    assert second.preferred_dialect() == "ios16"
    second.compile(_add_program()).close()
    assert _sent_versions(fake, mark) == ["program(1.0)"] and second.compile_count == 1
    assert fake.errors == []


def test_when_every_dialect_fails_the_first_failure_is_raised_naming_the_others(tmpdir_ns):
    fake = FakeObjC(tmpdir_ns, refuses_program=("1.3", "1.0"))
    backend = AneBackend(runtime=fake.runtime(), chip="m4")
    with pytest.raises(CompilationFailed, match=r"program\(1\.3\).*also tried ios16") as info:
        backend.compile(_add_program())
    assert info.value.domain == ANE_DOMAIN and backend.compile_count == 2
    assert list(memory.Memory().entries()) == []  # nothing compiled: nothing remembered
    assert fake.live_objects() == []


def test_a_foreign_or_broken_memory_file_is_ignored_and_rewritten(tmpdir_ns):
    path = memory.default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    for junk in (b"\xff\xfe not json", b'{"version": 1, "outcomes": [{"trial": 3}]}', b"[]"):
        path.write_bytes(junk)
        mem = memory.Memory()
        assert mem.recall("dialect", "m1", "macOS 15") is None and "ignored" in (mem.problem or "")
    fake = FakeObjC(tmpdir_ns, refuses_program=("1.3",))
    AneBackend(runtime=fake.runtime(), chip="m2").compile(_add_program()).close()
    assert [o.value for o in memory.Memory().entries()] == ["ios16"]


def test_the_memory_can_be_turned_off(tmpdir_ns, monkeypatch):
    monkeypatch.setenv("ANEKIT_TRIALS", "0")
    fake = FakeObjC(tmpdir_ns, refuses_program=("1.3",))
    AneBackend(runtime=fake.runtime(), chip="m2").compile(_add_program()).close()
    assert not memory.default_path().exists()


def test_a_memory_file_nested_too_deep_is_ignored_not_a_crash():
    path = memory.default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[" * 100_000 + "]" * 100_000)
    mem = memory.Memory()
    assert mem.recall("dialect", "m1", "macOS 15") is None and "ignored" in (mem.problem or "")


def test_a_program_that_fails_every_way_does_not_count_against_the_realtime_variants(fake, backend):
    """When the standard call fails too, the variants' failures were the program's: nothing is remembered
    and the variants are tried again on the next evaluation."""
    rt_backend = AneBackend(runtime=fake.runtime(), realtime=True)
    k = rt_backend.compile(_add_program()).load()
    for selector in ("evaluateRealTimeWithModel:options:request:error:",) * 2 + (
        "evaluateWithQoS:options:request:error:",
    ):
        fake.fail(selector, code=0x1D, description=STATUS_0X1D)
    with pytest.raises(EvalFailed, match="status=0x1d"):
        k.run()
    assert [o for o in memory.Memory().entries() if o.trial == "realtime"] == []
    assert rt_backend.realtime_paths.chosen is None and rt_backend.realtime_paths.attempts == []
    mark = len(fake.calls)
    k.run()  # the program runs now: the first variant is tried again, and works
    assert _since(fake, mark) == [REALTIME] and k.realtime_variant == "in-memory-model"
    fake.refusals.clear()
    k.close()
