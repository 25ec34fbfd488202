"""The backend conformance suite: every case runs on every backend in ``anekit.runtime.BACKENDS``.

Lifecycle, reusable surfaces, channel-offset taps, several inputs and outputs, BLOBFILE weights, the
compile budget, compile errors, and the numerics of real kernels compared with the simulator (and, for
the simulator, with its fp32 precision and the float64 references). A backend that cannot run here is
skipped with the reason; the ane backend also runs every case over the fake Objective-C runtime
(``ane-fake``), so its own code is exercised on any machine (``tests/backend_harness.py``).
"""

from __future__ import annotations

import functools
import gc
import sys
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.blob import fp16_blob, multi_chunk_blob
from anekit.errors import CompilationFailed, CompileBudgetExhausted, LoadFailed, SurfaceCreationFailed
from anekit.kernels import KernelSpec, ModelConfig, attention_bwd, backward, composable, forward, reference
from anekit.kernels import reference_attention as ref_att
from anekit.mil import tensor
from anekit.runtime import DEFAULT_COMPILE_BUDGET, Backend
from tests import backend_harness as harness
from tests.backend_harness import assert_close, assert_fp16_close, tolerance
from tests.kernel_weights import fp16_exact, random_layer

# The harness's fixtures, bound here so pytest finds them: each case runs once per backend (and stand-in).
target, make_backend, backend = harness.target, harness.make_backend, harness.backend
reference_backend = harness.reference_backend

S = 32  # spatial width of the small test programs
WEIGHT = "@model_path/weights/w.bin"
CONV = {"strides": [1, 1], "pad_type": "valid", "pad": [0, 0, 0, 0], "dilations": [1, 1], "groups": 1}


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _rows(channels: int, seed: int = 0) -> np.ndarray:
    """fp16-exact (channels, S) values of order 1."""
    return fp16_exact(_rng(seed).standard_normal((channels, S)))


def _add_program(channels: int = 8) -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", [1, channels, 1, S]), "y": tensor("fp16", [1, channels, 1, S])})
    def prog(f, x, y):
        return f.add(x=x, y=y, name="z")

    return prog


def _mul_program(channels: int = 8) -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", [1, channels, 1, S]), "y": tensor("fp16", [1, channels, 1, S])})
    def prog(f, x, y):
        return f.mul(x=x, y=y, name="p")

    return prog


def _taps_program() -> mil.Program:
    """x = concat(a (4), b (4)) in; concat(a * b, a + b, b) out: operands and results share surfaces."""

    @mil.program(inputs={"x": tensor("fp16", [1, 8, 1, S])})
    def prog(f, x):
        a = f.slice_by_size(x=x, begin=[0, 0, 0, 0], size=[1, 4, 1, S], name="a")  # (1, 4, 1, S)
        b = f.slice_by_size(x=x, begin=[0, 4, 0, 0], size=[1, 4, 1, S], name="b")  # (1, 4, 1, S)
        ab = f.mul(x=a, y=b, name="ab")
        apb = f.add(x=a, y=b, name="apb")
        bb = f.mul(x=b, y=1.0, name="bb")
        return f.concat(values=(ab, apb, bb), axis=1, interleave=False, name="out")  # (1, 12, 1, S)

    return prog


def _multi_io_program() -> mil.Program:
    """Three inputs and three outputs of different sizes, named against alphabetical order."""

    inputs = {
        "x2": tensor("fp16", [1, 4, 1, S]),
        "x0": tensor("fp16", [1, 2, 1, S]),
        "x1": tensor("fp16", [1, 4, 1, S]),
    }

    @mil.program(inputs=inputs)
    def prog(f, x2, x0, x1):
        z = f.add(x=x2, y=x1, name="z_sum")  # (1, 4, 1, S)
        a = f.mul(x=x0, y=x0, name="a_prod")  # (1, 2, 1, S)
        m = f.concat(values=(x2, x0), axis=1, interleave=False, name="m_cat")  # (1, 6, 1, S)
        return z, a, m

    return prog


def _conv_program(shapes: list[tuple[int, int]], offsets: list[int], c_in: int = 8) -> mil.Program:
    """One 1x1 conv per (out, in) weight, all reading chunks of the weight file ``WEIGHT``."""

    @mil.program(inputs={"x": tensor("fp16", [1, c_in, 1, S])})
    def prog(f, x):
        outs = []
        for i, ((c_out, c), offset) in enumerate(zip(shapes, offsets)):
            w = f.weight(tensor("fp16", [c_out, c, 1, 1]), WEIGHT, offset, name=f"w{i}")
            outs.append(f.conv(x=x, weight=w, name=f"y{i}", **CONV))  # (1, c_out, 1, S)
        return tuple(outs)

    return prog


# -- choosing backends ---------------------------------------------------------------------------


def test_every_known_backend_is_either_available_or_skipped_with_a_reason():
    assert "sim" in harness.BACKEND_NAMES and "ane" in harness.BACKEND_NAMES
    assert set(harness.BACKEND_NAMES) <= set(harness.TARGETS)  # every backend, plus the stand-ins
    assert harness.skip_reason("ane-fake") is None  # the ane backend's code runs here, over the fake
    assert harness.unavailable_reason("sim") is None
    for name in harness.BACKEND_NAMES:
        reason = harness.unavailable_reason(name)
        assert reason is None or name in reason


def _fake_backend_module(monkeypatch, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(runtime.BACKENDS["ane"][0])
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_the_skip_reason_is_the_backends_own_when_it_gives_one(monkeypatch):
    module = _fake_backend_module(monkeypatch, is_available=lambda: False)
    assert harness.skip_reason("ane") == harness.DEFAULT_REASONS["ane"]
    module.unavailable_reason = lambda: "ane: class _ANEClient not found (macOS 15.1)"
    assert harness.skip_reason("ane") == "ane: class _ANEClient not found (macOS 15.1)"


def test_cases_stop_before_the_engines_process_budget_runs_out(monkeypatch):
    _fake_backend_module(monkeypatch, is_available=lambda: True)
    monkeypatch.setitem(harness._created, "ane", [])
    assert harness.skip_reason("ane") is None
    spent = types.SimpleNamespace(compiles_made=harness.PROCESS_COMPILE_LIMIT["ane"] - 5)
    harness._created["ane"].append(spent)
    assert "used 95 of the engine's ~100 compiles" in (harness.skip_reason("ane") or "")
    assert harness.skip_reason("sim") is None  # the simulator has no process budget


def test_the_backend_reports_its_name(backend, target):
    assert backend.name == target.name
    assert backend.compile_count == 0 and backend.compile_budget == DEFAULT_COMPILE_BUDGET


# -- the kernel lifecycle ------------------------------------------------------------------------


def test_compile_load_run_unload(backend):
    k = backend.compile(_add_program())
    assert k.backend is backend and not k.is_loaded
    assert (k.input_names, k.output_names) == (["x", "y"], ["z"])
    assert k.load() is k and k.is_loaded
    x, y = _rows(8, 1), _rows(8, 2)
    k.inputs[0].write(x)
    k.inputs[1].write(y)
    k.run()
    assert_fp16_close(k.outputs[0].read(), x + y)
    k.unload()
    assert not k.is_loaded
    k.unload()  # idempotent
    with pytest.raises(LoadFailed, match="not loaded"):
        k.run()
    k.load()  # an unloaded kernel loads again
    k.run()
    assert_fp16_close(k.outputs[0].read(), x + y)
    k.close()
    k.close()


def test_running_before_loading_is_an_error(backend):
    k = backend.compile(_add_program())
    with pytest.raises(LoadFailed, match="not loaded"):
        k.run()
    k.close()


def test_the_context_manager_loads_and_closes(backend):
    k = backend.compile(_add_program())
    with k as loaded:
        assert loaded is k and k.is_loaded
        out = k(x=np.ones((1, 8, 1, S)), y=np.full((1, 8, 1, S), 2.0))
    assert not k.is_loaded
    np.testing.assert_array_equal(out["z"], 3.0)
    with pytest.raises(LoadFailed, match="closed"):
        k.load()
    k.unload()  # still idempotent after close


def test_calling_a_kernel_with_arrays(backend):
    k = backend.compile(_add_program())
    out = k(x=np.full((1, 8, 1, S), 0.5), y=np.ones((1, 8, 1, S)))  # loads on first use
    assert list(out) == ["z"] and out["z"].dtype == np.float32 and out["z"].shape == (1, 8, 1, S)
    np.testing.assert_array_equal(out["z"], 1.5)
    with pytest.raises(SurfaceCreationFailed, match=r"missing \['y'\]"):
        k(x=np.ones((1, 8, 1, S)))
    with pytest.raises(SurfaceCreationFailed, match=r"input 'x' has shape \[8, 32\]"):
        k(x=np.ones((8, S)), y=np.ones((1, 8, 1, S)))
    k.close()


def test_several_kernels_are_loaded_at_once(backend):
    add, mul = backend.compile(_add_program()), backend.compile(_mul_program())
    x, y = _rows(8, 3), _rows(8, 4)
    with add, mul:
        for step in range(2):
            for k in (add, mul):
                k.inputs[0].write(x + step)
                k.inputs[1].write(y)
            mul.run()
            add.run()
            assert_fp16_close(add.outputs[0].read(), (x + step) + y)
            assert_fp16_close(mul.outputs[0].read(), (x + step) * y)


def test_a_dropped_kernel_is_released(backend):
    k = backend.compile(_add_program())
    k(x=np.ones((1, 8, 1, S)), y=np.ones((1, 8, 1, S)))
    assert k.is_loaded
    dropped = weakref.ref(k)
    del k
    gc.collect()
    assert dropped() is None  # nothing the backend keeps holds on to a loaded kernel
    k2 = backend.compile(_add_program())  # and the engine still works afterwards
    np.testing.assert_array_equal(k2(x=np.ones((1, 8, 1, S)), y=np.ones((1, 8, 1, S)))["z"], 2.0)
    k2.close()


# -- surfaces ------------------------------------------------------------------------------------


def test_surfaces_are_reused_write_run_read_again(backend):
    with backend.compile(_add_program()) as k:
        x_in, y_in, z_out = k.inputs[0], k.inputs[1], k.outputs[0]
        for step in range(4):
            x = _rows(8, 10 + step)
            x_in.write(x)
            y_in.write(np.full((1, 8, 1, S), float(step)))
            k.run()
            assert_fp16_close(z_out.read(), x + step, f"step {step}")
            assert (k.inputs[0], k.outputs[0]) == (x_in, z_out)  # the same surfaces every run


def test_kernel_surfaces_follow_the_surface_api(backend):
    k = backend.compile(_add_program(6))
    s = k.inputs[0]
    assert s.shape == (1, 6, 1, S) and s.dtype.name == "fp16" and s.name == "x"
    assert (s.channels, s.spatial) == (6, S) and s.nbytes >= 6 * S * 2
    assert len({t.id for t in k.inputs + k.outputs}) == 3
    s.write(np.ones((2, S)), ch_offset=3)
    s.write(np.full((1, 1, 1, S), 7.0), ch_offset=0)
    np.testing.assert_array_equal(s.read()[:, 0], [7, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(s.read(3, 2), np.ones((2, S)))
    row = np.zeros((1, S))
    row[0, :3] = [1 / 3, 70000.0, 2049.0]  # fp16 rounding to nearest even, overflow to inf
    s.write(row, ch_offset=5)
    np.testing.assert_array_equal(s.read(5, 1)[0, :3], np.array([1 / 3, np.inf, 2048.0], np.float16))
    with s.view() as raw:
        assert raw.dtype == np.float16 and raw.shape == (1, 6, 1, S)
        raw[0, 1, 0, :] = 5.0  # zero-copy: what is written through the view is what read sees
    np.testing.assert_array_equal(s.read(1, 1), 5.0)
    with pytest.raises(SurfaceCreationFailed, match="outside"):
        s.read(4, 3)
    with pytest.raises(SurfaceCreationFailed, match="spatial elements"):
        s.write(np.ones((2, S + 1)))
    k.close()


def test_writes_through_the_view_are_what_the_kernel_runs_on(backend):
    with backend.compile(_add_program()) as k:
        with k.inputs[0].view() as x, k.inputs[1].view() as y:
            x[...] = 1.5
            y[...] = 0.25
        k.run()
        with k.outputs[0].view() as z:
            np.testing.assert_array_equal(z, 1.75)


def test_channel_offset_taps(backend):
    a, b = _rows(4, 5), _rows(4, 6)
    with backend.compile(_taps_program()) as k:
        (x,), (out,) = k.inputs, k.outputs
        x.write(a, ch_offset=0)
        x.write(b, ch_offset=4)
        k.run()
        assert_fp16_close(out.read(0, 4), a * b, "a * b")
        assert_fp16_close(out.read(4, 4), a + b, "a + b")
        assert_fp16_close(out.read(8, 4), b, "b")
        x.write(a, ch_offset=4)  # rewrite one operand only: the other keeps its channels
        k.run()
        assert_fp16_close(out.read(0, 4), a * a, "a * a")
        assert_fp16_close(out.read(8), a, "a")


def test_several_inputs_and_outputs(backend):
    x2, x0, x1 = _rows(4, 7), _rows(2, 8), _rows(4, 9)
    with backend.compile(_multi_io_program()) as k:
        assert k.input_names == ["x2", "x0", "x1"] and k.output_names == ["z_sum", "a_prod", "m_cat"]
        assert [s.shape for s in k.inputs] == [(1, 4, 1, S), (1, 2, 1, S), (1, 4, 1, S)]
        assert [s.shape for s in k.outputs] == [(1, 4, 1, S), (1, 2, 1, S), (1, 6, 1, S)]
        for step in range(2):
            for surface, value in zip(k.inputs, (x2 + step, x0, x1)):
                surface.write(value)
            k.run()
            z, a, m = (s.read() for s in k.outputs)
            assert_fp16_close(z, x2 + step + x1, "z_sum")
            assert_fp16_close(a, x0 * x0, "a_prod")
            assert_fp16_close(m, np.concatenate([x2 + step, x0]), "m_cat")
        out = k(x1=x1.reshape(1, 4, 1, S), x0=x0.reshape(1, 2, 1, S), x2=x2.reshape(1, 4, 1, S))
        assert list(out) == ["z_sum", "a_prod", "m_cat"]


# -- BLOBFILE weights ----------------------------------------------------------------------------


def _conv_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return w.astype(np.float64) @ x.astype(np.float64)


def test_a_single_weight_blob_as_bytes_and_as_a_file(backend, tmp_path):
    w = fp16_exact(_rng(11).standard_normal((12, 8)) / 3)
    x = _rows(8, 12)
    blob = fp16_blob(w)
    path = tmp_path / "w.bin"
    path.write_bytes(blob)
    prog = _conv_program([(12, 8)], [64])
    for source in (blob, path, str(path)):
        with backend.compile(prog, weights={WEIGHT: source}) as k:
            (y,) = k(x=x.reshape(1, 8, 1, S)).values()
            assert_close(
                y.reshape(12, S), _conv_reference(x, w), 2e-3, f"conv with weights from {source!r:.20}"
            )


def test_a_multi_chunk_weight_file(backend):
    shapes = [(8, 8), (4, 8), (12, 8)]
    ws = [fp16_exact(_rng(20 + i).standard_normal(s) / 3) for i, s in enumerate(shapes)]
    blob, offsets = multi_chunk_blob(ws)
    assert offsets[0] == 64 and len(set(offsets)) == 3
    x = _rows(8, 13)
    with backend.compile(_conv_program(shapes, offsets), weights={WEIGHT: blob}) as k:
        out = k(x=x.reshape(1, 8, 1, S))
        assert list(out) == ["y0", "y1", "y2"]
        for (name, y), w in zip(out.items(), ws):
            assert_close(y.reshape(w.shape[0], S), _conv_reference(x, w), 2e-3, name)


# -- compiling: errors and the budget ------------------------------------------------------------


def test_bad_mil_is_a_compilation_failure(backend):
    with pytest.raises(CompilationFailed, match=r"1:21: expected a function name"):
        backend.compile("program(1.3) { func }")
    bad = mil.to_text(_add_program()).replace(
        "tensor<fp16, [1, 8, 1, 32]> z", "tensor<fp32, [1, 8, 1, 32]> z"
    )
    with pytest.raises(CompilationFailed, match=r"\[add\]"):
        backend.compile(bad)
    with pytest.raises(CompilationFailed, match="no function 'other'"):
        backend.compile(_add_program(), function="other")
    assert backend.compile_count == 3  # failed compiles count


def test_missing_or_bad_weights_are_compilation_failures(backend, tmp_path):
    prog = _conv_program([(12, 8)], [64])
    with pytest.raises(CompilationFailed, match=r"@model_path/weights/w\.bin"):
        backend.compile(prog, weights={})
    with pytest.raises(CompilationFailed, match=r"does not exist"):
        backend.compile(prog, weights={WEIGHT: tmp_path / "absent.bin"})
    small = fp16_blob(np.ones((4, 8)))  # a blob too small for the [12, 8, 1, 1] const
    with pytest.raises(CompilationFailed, match=r"w\.bin"):
        backend.compile(prog, weights={WEIGHT: small})
    assert backend.compile_count == 3


def test_the_compile_budget(make_backend):
    b = make_backend(compile_budget=3)
    assert (b.compile_budget, b.compile_count) == (3, 0)
    b.compile(_add_program()).close()
    with pytest.raises(CompilationFailed):
        b.compile("program(1.3) { bad")  # a failed compile counts too
    b.compile(_mul_program()).close()
    assert b.compile_count == 3
    with pytest.raises(CompileBudgetExhausted, match="budget of 3") as info:
        b.compile(_add_program())
    assert info.value.budget == 3 and b.compile_count == 3


# -- numerics: real kernels ----------------------------------------------------------------------

CFG = ModelConfig(64, 128, 1, 4, 2, 64, S)  # dim, hidden, layers, heads, kv heads (GQA), vocab, seq
MM = (64, 96)  # dynamic matmul: in and out channels


def _f16(taps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: fp16_exact(v) for k, v in taps.items()}


@functools.cache
def _data() -> dict[str, Any]:
    """Weights and fp16-exact operands: each backward kernel is fed its forward kernel's reference taps."""
    w = random_layer(CFG, seed=7)
    rng = _rng(8)
    d, s = CFG.dim, CFG.seq_len
    x = fp16_exact(rng.standard_normal((d, s)))
    att = _f16(reference.sdpa_fwd(CFG, x, w))
    ffn = _f16(reference.ffn_fwd(CFG, x, w))
    do, dffn = fp16_exact(rng.standard_normal((d, s))), fp16_exact(rng.standard_normal((d, s)))
    one = _f16(ref_att.sdpa_bwd1(CFG, att["q"], att["k"], att["v"], do, w))
    two = _f16(ref_att.sdpa_bwd2(CFG, one["probs"], one["dp"], att["q"], att["k"]))
    mm_x = fp16_exact(rng.standard_normal((MM[0], s)))
    mm_w = fp16_exact(rng.standard_normal((MM[1], MM[0])) / np.sqrt(MM[0]))
    return {"w": w, "x": x, "att": att, "ffn": ffn, "do": do, "dffn": dffn, "one": one, "two": two,
            "mm_x": mm_x, "mm_w": mm_w}  # fmt: skip


@dataclass(frozen=True)
class NumericsCase:
    """A generated kernel, its named input parts, and its float64 reference."""

    build: Callable[[dict[str, Any]], KernelSpec]
    parts: Callable[[dict[str, Any]], dict[str, np.ndarray]]
    reference: Callable[[dict[str, Any]], dict[str, np.ndarray]]
    # Dynamic kernels: the weights packed into the input after the activations.
    packed_weights: Callable[[dict[str, Any]], dict[str, np.ndarray]] | None = field(default=None)

    def run(self, backend: Backend) -> dict[str, np.ndarray]:
        data = _data()
        spec = self.build(data)
        with spec.compile(backend) as k:
            if self.packed_weights is not None:
                return spec.run(k, self.packed_weights(data), **self.parts(data))  # type: ignore[call-arg]
            return spec.run(k, **self.parts(data))


NUMERICS = {
    "sdpa_fwd": NumericsCase(
        lambda d: forward.sdpa_fwd(CFG, d["w"]),
        lambda d: {"x": d["x"]},
        lambda d: reference.sdpa_fwd(CFG, d["x"], d["w"]),
    ),
    "ffn_fwd": NumericsCase(
        lambda d: forward.ffn_fwd(CFG, d["w"]),
        lambda d: {"x": d["x"]},
        lambda d: reference.ffn_fwd(CFG, d["x"], d["w"]),
    ),
    "ffn_bwd": NumericsCase(
        lambda d: backward.ffn_bwd(CFG, d["w"]),
        lambda d: {"dffn": d["dffn"], "h1": d["ffn"]["h1"], "h3": d["ffn"]["h3"]},
        lambda d: reference.ffn_bwd(CFG, d["dffn"], d["ffn"]["h1"], d["ffn"]["h3"], d["w"]),
    ),
    "sdpa_bwd1": NumericsCase(
        lambda d: attention_bwd.sdpa_bwd1(CFG, d["w"]),
        lambda d: {"q": d["att"]["q"], "k": d["att"]["k"], "v": d["att"]["v"], "do": d["do"]},
        lambda d: ref_att.sdpa_bwd1(CFG, d["att"]["q"], d["att"]["k"], d["att"]["v"], d["do"], d["w"]),
    ),
    "sdpa_bwd2": NumericsCase(
        lambda d: attention_bwd.sdpa_bwd2(CFG),
        lambda d: {"probs": d["one"]["probs"], "dp": d["one"]["dp"], "q": d["att"]["q"], "k": d["att"]["k"]},
        lambda d: ref_att.sdpa_bwd2(CFG, d["one"]["probs"], d["one"]["dp"], d["att"]["q"], d["att"]["k"]),
    ),
    "qkv_bwd": NumericsCase(
        lambda d: attention_bwd.qkv_bwd(CFG, d["w"]),
        lambda d: {"dq": d["two"]["dq"], "dk": d["two"]["dk"], "dv": d["one"]["dv"]},
        lambda d: ref_att.qkv_bwd(CFG, d["two"]["dq"], d["two"]["dk"], d["one"]["dv"], d["w"]),
    ),
    "dynamic_matmul": NumericsCase(
        lambda d: composable.dynamic_matmul(MM[0], MM[1], CFG.seq_len),
        lambda d: {"x": d["mm_x"]},
        lambda d: {"y": composable.matmul_reference(d["mm_x"], d["mm_w"])},
        packed_weights=lambda d: {"w": d["mm_w"]},
    ),
}


@pytest.mark.parametrize("kernel", NUMERICS)
def test_kernel_numerics_match_the_simulator_and_the_reference(target, backend, reference_backend, kernel):
    case = NUMERICS[kernel]
    got = case.run(backend)
    want = case.run(reference_backend)
    exact = case.reference(_data())
    tol = tolerance(backend.name)
    assert list(got) == list(want) and set(got) == set(exact)
    for tap in got:
        if target.id in harness.SAME_BITS_AS_REFERENCE:
            np.testing.assert_array_equal(got[tap], want[tap], err_msg=f"{kernel}.{tap} on {target.id}")
        assert_close(got[tap], want[tap], tol, f"{kernel}.{tap} on {target.id} vs {reference_backend!r}")
        assert_close(got[tap], exact[tap], tol, f"{kernel}.{tap} on {target.id} vs float64")
