"""The simulator kernel's surface I/O fast path against the plain one, bit for bit.

``SimKernel.__call__`` rounds float32 inputs once, encodes the fp16 values straight into the input
surfaces and hands the plan the float32 values; outputs are encoded without numpy's cast and returned
without decoding. The oracle is the plain protocol: numpy's cast into the fp16 input surfaces, the plan on
those surfaces, numpy's cast of each result into its output surface and back to float32. Returned values
and both sides' surface contents must match bit for bit (NaN payloads included: NaN takes numpy's path).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import attention_bwd, catalog, dynamic, forward, preset
from anekit.runtime.sim import SimKernel

pytestmark = pytest.mark.usefixtures("fp16_path")  # every test with and without the jit


def plain_call(kernel: SimKernel, arrays: dict[str, Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(input surface contents, output surface contents) of the plain protocol, as fp16 arrays."""
    with np.errstate(all="ignore"):
        ins = [np.asarray(arrays[n]).astype(s.dtype.np) for s, n in zip(kernel.inputs, kernel.input_names)]
        outs = kernel.plan.run([x.copy() for x in ins])
        return ins, [np.asarray(v).reshape(s.shape).astype(s.dtype.np) for s, v in zip(kernel.outputs, outs)]


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16 if a.dtype == np.float16 else np.uint32)


def _specs() -> list[Any]:
    cfg = preset("default")
    w = catalog.random_weights(cfg)
    return [forward.ffn_fwd(cfg, w), attention_bwd.sdpa_bwd2(cfg), dynamic.sdpa_fwd_dynamic(cfg)]


def _inputs(kernel: SimKernel, rng: np.random.Generator, case: str) -> dict[str, Any]:
    arrays: dict[str, Any] = {}
    for s, name in zip(kernel.inputs, kernel.input_names):
        a = rng.standard_normal(s.shape).astype(np.float32)
        if case == "tiny":  # subnormal halves and values that round to zero, both signs
            a *= np.float32(1e-6)
        elif case == "zeros":
            a[..., ::3] = 0.0
            a[..., 1::5] = -0.0
        elif case == "specials":  # numpy's path for NaN (payloads), inf and overflow
            flat = a.reshape(-1)
            flat[::97] = np.nan
            flat[5::101] = np.inf
            flat[7::103] = -7e4
            flat.view(np.uint32)[11::107] = 0x7F800123
        elif case == "non-contiguous":
            a = np.asfortranarray(a)
        elif case == "float64":  # rounded once from float64 by numpy, never through float32
            a = a.astype(np.float64) * (1 + 2.0**-30)
        arrays[name] = a
    return arrays


@pytest.mark.parametrize("case", ["normal", "tiny", "zeros", "specials", "non-contiguous", "float64"])
@pytest.mark.parametrize("index", range(3))
def test_call_equals_the_plain_protocol(index: int, case: str) -> None:
    kernel = _specs()[index].compile(runtime.open("sim", compile_budget=10**6))
    assert isinstance(kernel, SimKernel)
    arrays = _inputs(kernel, np.random.default_rng(index), case)
    want_in, want_out = plain_call(kernel, arrays)
    with np.errstate(over="ignore"):  # numpy's cast of overflowing inputs warns
        got = kernel(**arrays)
    for surface, want in zip(kernel.inputs, want_in):
        with surface.view() as buf:
            np.testing.assert_array_equal(bits(buf), bits(want))
    for surface, name, want in zip(kernel.outputs, kernel.output_names, want_out):
        with surface.view() as buf:
            np.testing.assert_array_equal(bits(buf), bits(want))
        assert got[name].dtype == np.float32 and got[name].flags.c_contiguous
        np.testing.assert_array_equal(bits(got[name]), bits(want.astype(np.float32)))


def test_run_after_call_reads_the_surfaces() -> None:
    """Nothing of a call is kept: run() alone reads what is in the input surfaces now."""
    kernel = _specs()[0].compile(runtime.open("sim", compile_budget=10**6))
    rng = np.random.default_rng(7)
    first = _inputs(kernel, rng, "normal")
    kernel(**first)
    second = _inputs(kernel, rng, "normal")
    for surface, name in zip(kernel.inputs, kernel.input_names):
        surface.write(second[name])
    kernel.run()
    _, want_out = plain_call(kernel, second)
    for surface, want in zip(kernel.outputs, want_out):
        with surface.view() as buf:
            np.testing.assert_array_equal(bits(buf), bits(want))
    assert not kernel._written and not kernel._results


def test_returned_arrays_are_the_callers() -> None:
    """Each call returns fresh arrays: changing one changes neither the surfaces nor the next result."""
    kernel = _specs()[0].compile(runtime.open("sim", compile_budget=10**6))
    arrays = _inputs(kernel, np.random.default_rng(3), "normal")
    first = kernel(**arrays)
    name = kernel.output_names[0]
    keep = first[name].copy()
    first[name][...] = 0.0
    with kernel.outputs[0].view() as buf:
        np.testing.assert_array_equal(buf.astype(np.float32), keep)
    np.testing.assert_array_equal(kernel(**arrays)[name], keep)


@pytest.mark.parametrize("precision", ["ane", "fp32"])
def test_outputs_handed_out_without_a_copy_are_the_callers_alone(precision: str) -> None:
    """A fresh result is handed over as it is; a constant, an input passed through or an output given twice
    is copied, so writing into a returned array never changes the kernel's next results."""
    from anekit import mil
    from anekit.mil import tensor

    b = mil.Builder()
    f = b.function()
    x = f.input("x", tensor("fp16", (1, 64, 1, 64)))
    table = np.arange(64 * 64, dtype=np.float16).reshape(1, 64, 1, 64)
    fresh = f.op("add", x=x, y=x)
    f.output(
        fresh, f.const(table, name="table"), f.op("reshape", x=x, shape=np.array([1, 64, 1, 64], np.int32))
    )
    kernel = runtime.open("sim", strict=False, precision=precision).compile(b.build())
    xs = np.random.default_rng(3).standard_normal((1, 64, 1, 64)).astype(np.float32)
    first = kernel(x=xs)
    for out in first.values():
        out[...] = -7.0
    doubled, constant, passed = kernel(x=xs).values()
    want = np.float16(xs).astype(np.float32) if precision == "ane" else xs
    np.testing.assert_array_equal(doubled, 2 * want)
    np.testing.assert_array_equal(constant, table.astype(np.float32))
    np.testing.assert_array_equal(passed, want)
