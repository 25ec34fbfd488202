"""The plan's pre-bound runners (runtime.sim.fast) against the plain ``run_step``: every simulator test case
and every cataloged kernel, one step at a time, each stored value equal in bits, dtype, shape and layout."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from anekit import runtime
from anekit.errors import EvalFailed
from anekit.kernels import catalog, composable, preset
from anekit.runtime.sim import Plan, SimKernel, run_step
from tests.sim_cases import SimCase, all_cases
from tests.test_sim_fast_plan import initial_env
from tests.test_sim_ops import NOT_RUNNABLE_ALONE, _build

pytestmark = pytest.mark.usefixtures("fp16_path")  # every test with and without the jit

CASES = [c for c in all_cases() if c.op not in NOT_RUNNABLE_ALONE]
KERNELS = [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS, *catalog.DYNAMIC_KERNELS]


def _layout(a: Any) -> tuple[Any, ...]:
    """Everything about a stored value that a later op may depend on, its bytes included (NaN payloads too)."""
    assert type(a) is np.ndarray, type(a)
    f = a.flags
    data = a.tobytes(order="A") if a.dtype != object else repr(a.tolist()).encode()
    return (a.dtype, a.shape, a.strides, f.c_contiguous, f.f_contiguous, f.owndata, f.writeable, data)


def assert_runners_match_run_step(plan: Plan, inputs: list[np.ndarray]) -> int:
    """Walk the plan both ways from the same inputs, comparing each step's stored outputs; the number of
    steps that have a fast runner."""
    template = initial_env(plan, inputs)
    plain, fast = template.copy(), [v.copy() if isinstance(v, np.ndarray) else v for v in template]
    n_fast = 0
    with np.errstate(all="ignore"):
        for step, runner in zip(plan.steps, plan.runners):
            n_fast += runner.__module__ == "anekit.runtime.sim.fast"
            for slot, value in zip(step.out_slots, run_step(step, plain)):
                plain[slot] = value
            runner(fast)
            for slot in step.out_slots:
                if slot in plan.elided:  # fused into its one reader, which follows: never made
                    assert fast[slot] is None and slot not in plan.output_slots
                    continue
                assert _layout(fast[slot]) == _layout(plain[slot]), f"{step.op.op_type} ({step.op.where()})"
    return n_fast


def _plain_run(plan: Plan, inputs: list[np.ndarray]) -> list[np.ndarray]:
    env = initial_env(plan, inputs)
    with np.errstate(all="ignore"):
        for step in plan.steps:
            for slot, value in zip(step.out_slots, run_step(step, env)):
                env[slot] = value
    return [env[s] for s in plan.output_slots]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_sim_case_runs_the_same_both_ways(case: SimCase) -> None:
    prog, feeds = _build(case)
    kernel = runtime.open("sim", numerics="ieee", strict=False).compile(prog)
    assert isinstance(kernel, SimKernel)
    assert_runners_match_run_step(kernel.plan, [feeds[n] for n in kernel.input_names])


@pytest.mark.parametrize("precision", ["ane", "fp32"])
@pytest.mark.parametrize("scale", [1.0, 3e4, 1e-6])
@pytest.mark.parametrize("name", [*KERNELS, "dynamic_matmul"])
def test_every_kernel_runs_the_same_both_ways(name: str, scale: float, precision: str) -> None:
    """Large scales overflow to inf and NaN, tiny ones reach the subnormal halves."""
    cfg = preset("default")
    if name == "dynamic_matmul":
        spec = composable.dynamic_matmul(cfg.dim, cfg.dim, cfg.seq_len)
    else:
        spec = catalog.build(name, cfg, catalog.random_weights(cfg))
    kernel = spec.compile(runtime.open("sim", numerics="ieee", compile_budget=10**6, precision=precision))
    assert isinstance(kernel, SimKernel)
    rng = np.random.default_rng(len(name))
    with np.errstate(over="ignore"):
        inputs = [(rng.standard_normal(s.shape) * scale).astype(np.float16) for s in kernel.inputs]
    n_fast = assert_runners_match_run_step(kernel.plan, inputs)
    assert n_fast >= len(kernel.plan.steps) // 3  # the frequent ops do have runners
    np.testing.assert_equal(kernel.plan.run(list(inputs)), _plain_run(kernel.plan, inputs))


def test_a_failing_fast_runner_names_its_op() -> None:
    """A runtime input of another shape than declared: the runner's numpy error becomes EvalFailed."""
    from anekit import mil
    from anekit.mil import tensor

    b = mil.Builder()
    f = b.function()
    x = f.input("x", tensor("fp16", (2, 6)))
    f.output(f.op("reshape", x=x, shape=np.array([3, 4], np.int32)))
    kernel = runtime.open("sim", numerics="ieee", strict=False).compile(b.build())
    assert isinstance(kernel, SimKernel)
    assert kernel.plan.runners[0].__module__ == "anekit.runtime.sim.fast"
    with pytest.raises(EvalFailed, match=r"^\[reshape\] \(.*\) failed: ValueError"):
        kernel.plan.run([np.zeros((5, 5), np.float16)])


@pytest.mark.parametrize("precision", ["ane", "fp32"])
@pytest.mark.parametrize("special", [0.0, -0.0, np.inf, -np.inf, np.nan, None])
def test_a_signed_permutation_conv_is_the_products_bits(precision: str, special: float | None) -> None:
    """RoPE's pair swap as a gather: zeros of both signs come out +0 as from the matmul, and an x with inf
    or NaN (where 0 * inf is NaN in the product) takes the product itself."""
    from anekit import mil
    from anekit.kernels.blocks import pair_swap_matrix
    from anekit.mil import tensor

    channels, seq = 64, 64
    weight = pair_swap_matrix(channels).reshape(channels, channels, 1, 1).astype(np.float16)
    b = mil.Builder()
    f = b.function()
    x = f.input("x", tensor("fp16", (1, channels, 1, seq)))
    f.output(f.conv1x1(x, f.const(weight, name="swap")))
    kernel = runtime.open("sim", numerics="ieee", strict=False, precision=precision).compile(b.build())
    assert isinstance(kernel, SimKernel)
    assert any(r.__module__ == "anekit.runtime.sim.fast" for r in kernel.plan.runners)
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((1, channels, 1, seq)).astype(np.float16)
    xs[0, ::3, 0, ::5] = 0.0
    xs[0, 1::3, 0, ::7] = -0.0
    if special is not None:
        xs[0, 5, 0, 9] = special
    assert_runners_match_run_step(kernel.plan, [xs])
