"""The runtime protocol over the simulator: lifecycle, surfaces, compile budget, numerics, errors.

These tests exercise the runtime's mechanics on tiny programs (shapes the engine would refuse), so the
simulator runs non-strict here; what strictness refuses is tested in test_rules.py.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.errors import (
    AnekitError,
    CompilationFailed,
    CompileBudgetExhausted,
    LoadFailed,
    SurfaceCreationFailed,
)
from anekit.mil import tensor
from anekit.runtime.base import Surface


@pytest.fixture(autouse=True)
def _not_strict(monkeypatch):
    monkeypatch.setenv("ANEKIT_STRICT", "0")


def _add_program(shape=(1, 4, 1, 3), dtype="fp16") -> mil.Program:
    @mil.program(inputs={"x": tensor(dtype, shape), "y": tensor(dtype, shape)})
    def prog(f, x, y):
        return f.add(x=x, y=y, name="z")

    return prog


def _sum_program(n: int) -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", [1, n, 1, 1])})
    def prog(f, x):
        return f.reduce_sum(x=x, axes=[1], keep_dims=True, name="s")

    return prog


# -- choosing a backend --------------------------------------------------------------------------


def test_open_gives_the_simulator_here_and_honours_the_environment(monkeypatch):
    monkeypatch.delenv("ANEKIT_BACKEND", raising=False)
    assert "sim" in runtime.available()
    assert runtime.open().name in runtime.available()
    monkeypatch.setenv("ANEKIT_BACKEND", "sim")
    assert runtime.open().name == "sim"


def test_open_rejects_unknown_and_unavailable_backends():
    with pytest.raises(AnekitError, match="unknown backend 'tpu'"):
        runtime.open("tpu")
    if "ane" not in runtime.available():
        with pytest.raises(AnekitError, match="'ane' is not available"):
            runtime.open("ane")


def test_simulator_options():
    assert runtime.open("sim", precision="fp32").precision == "fp32"
    with pytest.raises(ValueError, match="precision"):
        runtime.open("sim", precision="fp8")


# -- lifecycle -----------------------------------------------------------------------------------


def test_kernel_runs_on_its_surfaces_and_reuses_them():
    k = runtime.open("sim").compile(_add_program())
    with k:
        for step in range(3):
            x = np.full((4, 3), float(step))
            k.inputs[0].write(x)
            k.inputs[1].write(np.ones((1, 4, 1, 3)))
            k.run()
            np.testing.assert_array_equal(k.outputs[0].read(), x + 1)


def test_kernel_call_with_numpy_arrays():
    k = runtime.open("sim").compile(_add_program())
    out = k(x=np.ones((1, 4, 1, 3)), y=np.full((1, 4, 1, 3), 2.0))
    assert list(out) == ["z"] and out["z"].dtype == np.float32
    np.testing.assert_array_equal(out["z"], 3.0)
    with pytest.raises(SurfaceCreationFailed, match="missing \\['y'\\]"):
        k(x=np.ones((1, 4, 1, 3)))
    with pytest.raises(SurfaceCreationFailed, match="input 'x' has shape \\[4, 3\\]"):
        k(x=np.ones((4, 3)), y=np.ones((1, 4, 1, 3)))


def test_running_an_unloaded_kernel_raises():
    k = runtime.open("sim").compile(_add_program())
    with pytest.raises(LoadFailed, match="not loaded"):
        k.run()
    k.load()
    k.run()
    k.unload()
    k.unload()  # idempotent
    with pytest.raises(LoadFailed, match="not loaded"):
        k.run()


def test_a_closed_kernel_cannot_be_loaded_again():
    k = runtime.open("sim").compile(_add_program())
    with k:
        assert k.is_loaded
    assert not k.is_loaded
    with pytest.raises(LoadFailed, match="closed"):
        k.load()


class _Resource:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_resources_are_released_on_close_and_at_garbage_collection():
    backend = runtime.open("sim")
    k = backend.compile(_add_program())
    r1 = _Resource()
    k._owned.append(r1)
    k.close()
    k.close()
    assert r1.closed == 1
    k2 = backend.compile(_add_program())
    r2 = _Resource()
    k2._owned.append(r2)
    del k2
    gc.collect()
    assert r2.closed == 1


# -- the compile budget --------------------------------------------------------------------------


def test_compiles_are_counted_and_the_budget_enforced():
    backend = runtime.open("sim", compile_budget=3)
    assert backend.compile_budget == 3 and backend.compile_count == 0
    backend.compile(_add_program())
    with pytest.raises(CompilationFailed):
        backend.compile("program(1.3) { bad")  # a failed compile counts too
    backend.compile(_add_program())
    assert backend.compile_count == 3
    with pytest.raises(CompileBudgetExhausted, match="budget of 3"):
        backend.compile(_add_program())
    assert backend.compile_count == 3


def test_default_budget_is_the_engines():
    assert runtime.open("sim").compile_budget == 100


# -- compiling -----------------------------------------------------------------------------------


def test_compiles_text_and_reports_syntax_and_type_errors():
    backend = runtime.open("sim")
    k = backend.compile(mil.to_text(_add_program()))
    np.testing.assert_array_equal(k(x=np.ones((1, 4, 1, 3)), y=np.ones((1, 4, 1, 3)))["z"], 2.0)
    with pytest.raises(CompilationFailed, match=r"1:21: expected a function name"):
        backend.compile("program(1.3) { func }")
    bad = mil.to_text(_add_program()).replace("tensor<fp16, [1, 4, 1, 3]> z", "tensor<fp32, [1, 4, 1, 3]> z")
    with pytest.raises(CompilationFailed, match=r"\[add\]"):
        backend.compile(bad)


def test_choosing_a_function():
    text = (
        "program(1.3)\n{\n    func main<ios18>(fp32 x) {\n        fp32 y = exp(x = x);\n    } -> (y);\n"
        "    func other<ios18>(fp32 x) {\n        fp32 y = relu(x = x);\n    } -> (y);\n}\n"
    )
    backend = runtime.open("sim")
    assert backend.compile(text, function="other")(x=np.float32(-1))["y"] == 0
    with pytest.raises(CompilationFailed, match="no function 'missing'"):
        backend.compile(text, function="missing")


def test_a_blobfile_const_without_its_weight_file_names_the_const():
    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, 2])})
    def prog(f, x):
        w = f.weight(tensor("fp16", [4, 4, 1, 1]), "@model_path/weights/w.bin", 64, name="wq")
        return f.conv(x=x, weight=w)

    with pytest.raises(
        CompilationFailed, match=r"const 'wq' refers to weight file '@model_path/weights/w\.bin'"
    ):
        runtime.open("sim").compile(prog, weights={})


# -- surfaces ------------------------------------------------------------------------------------


def test_surfaces_read_and_write_channel_ranges():
    s = Surface((1, 6, 1, 4), "fp16", "taps")
    assert (s.channels, s.spatial, s.nbytes) == (6, 4, 48)
    s.write(np.ones((2, 4)), ch_offset=3)
    s.write(np.full((1, 1, 1, 4), 7.0), ch_offset=0)
    got = s.read()
    np.testing.assert_array_equal(got[:, 0], [7, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(s.read(3, 2), np.ones((2, 4)))
    with s.view() as raw:
        assert raw.dtype == np.float16 and raw.shape == (1, 6, 1, 4)


def test_surface_writes_round_to_fp16():
    s = Surface((1, 1, 1, 3), "fp16")
    s.write(np.array([[1 / 3, 70000.0, 2049.0]]))
    np.testing.assert_array_equal(s.read()[0], np.array([1 / 3, np.inf, 2048.0], dtype=np.float16))


def test_surface_ids_are_unique():
    assert len({Surface((1, 1, 1, 1)).id for _ in range(10)}) == 10


@pytest.mark.parametrize(
    "array, offset, message",
    [
        (np.ones((2, 5)), 0, "rows have 5 spatial elements, expected 4"),
        (np.ones((7, 4)), 0, "channels 0..7 are outside 0..6"),
        (np.ones((2, 4)), 5, "channels 5..7 are outside 0..6"),
        (np.ones((2, 2, 2)), 0, "cannot write an array of shape \\[2, 2, 2\\]"),
    ],
)
def test_surface_writes_of_the_wrong_shape_are_clear_errors(array, offset, message):
    s = Surface((1, 6, 1, 4), "fp16", "taps")
    with pytest.raises(SurfaceCreationFailed, match=message):
        s.write(array, ch_offset=offset)


def test_surface_reads_outside_are_clear_errors():
    s = Surface((1, 6, 1, 4))
    with pytest.raises(SurfaceCreationFailed, match="outside"):
        s.read(4, 3)


def test_surfaces_need_static_non_string_shapes():
    with pytest.raises(SurfaceCreationFailed):
        Surface((1, 0, 1, 4))
    with pytest.raises(SurfaceCreationFailed, match="string"):
        Surface((1,), "string")


# -- numerics (DESIGN.md) ------------------------------------------------------------------------


def test_fp16_values_are_rounded_and_overflow_between_ops():
    k = runtime.open("sim").compile(_add_program((1, 3)))
    out = k(x=np.array([[2048.0, 60000.0, 0.1]]), y=np.array([[1.0, 60000.0, 0.2]]))["z"]
    # 2049 is not an fp16 value (ties to even: 2048); 120000 overflows to inf; 0.1 + 0.2 rounds to fp16.
    np.testing.assert_array_equal(
        out[0], np.array([2048.0, np.inf, np.float16(np.float16(0.1) + np.float16(0.2))])
    )


def test_fp32_precision_keeps_float32_values():
    k = runtime.open("sim", precision="fp32").compile(_add_program((1, 3)))
    out = k(x=np.array([[2048.0, 60000.0, 1.0]]), y=np.array([[1.0, 60000.0, 0.5]]))["z"]
    np.testing.assert_array_equal(out[0], [2049.0, 120000.0, 1.5])


def test_reductions_accumulate_in_fp32():
    # 4096 ones: an fp16 accumulator would stall at 2048; fp32 accumulation gives 4096 exactly.
    k = runtime.open("sim").compile(_sum_program(4096))
    assert k(x=np.ones((1, 4096, 1, 1)))["s"].item() == 4096.0


def test_several_inputs_and_outputs_and_integer_outputs():
    @mil.program(inputs={"x": tensor("fp16", [2, 3]), "y": tensor("fp16", [2, 3])})
    def prog(f, x, y):
        return (
            f.greater(x=x, y=y, name="gt"),
            f.reduce_argmax(x=x, axis=1, name="am"),
            f.sub(x=x, y=y, name="d"),
        )

    k = runtime.open("sim").compile(prog)
    x = np.array([[1.0, 5.0, 2.0], [0.0, -1.0, 3.0]])
    y = np.ones((2, 3))
    out = k(x=x, y=y)
    assert list(out) == ["gt", "am", "d"]
    np.testing.assert_array_equal(out["gt"], x > y)
    np.testing.assert_array_equal(out["am"], [1, 2])
    np.testing.assert_array_equal(out["d"], x - y)


def test_constants_are_folded_at_compile_time():
    @mil.program(inputs={"x": tensor("fp16", [1, 4])})
    def prog(f, x):
        c = f.exp(x=f.const(np.zeros((1, 4), np.float16)))  # constant: folded
        return f.add(x=x, y=c)

    k = runtime.open("sim").compile(prog)
    assert len(k.plan.steps) == 1
    np.testing.assert_array_equal(k(x=np.ones((1, 4)))["add_0"], 2.0)


def test_tensor_buffer_programs_run():
    text = """program(1.3)
{
    func main<ios18>(tensor_buffer<fp16, shape=[1, 2, 1, 3], strides=[6, 3, 3, 1], interleave_factors=[1, 1, 1, 1]> x) {
            tensor<fp16, [1, 2, 1, 3]> t = tensor_buffer_to_tensor<ios17>(input = x);
            tensor<fp16, [1, 2, 1, 3]> r = relu(x = t);
            tensor_buffer<fp16, shape=[1, 2, 1, 3], strides=[6, 3, 3, 1], interleave_factors=[1, 1, 1, 1]> y = tensor_to_tensor_buffer<ios17>(input = r, interleave_factors = tensor<uint8, [4]>([1, 1, 1, 1]), strides = tensor<int64, [4]>([6, 3, 3, 1]));
        } -> (y);
}
"""
    x = np.array([-1.0, 2.0, -3.0, 4.0, 0.5, -0.5]).reshape(1, 2, 1, 3)
    out = runtime.open("sim").compile(text)(x=x)["y"]
    np.testing.assert_array_equal(out, np.maximum(x, 0))
