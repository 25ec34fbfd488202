"""The simulator's fast step execution (no rounding of moved values, fp16 rounding in place) against the
plain one: every op's reference, then its output's store, one op at a time — bit for bit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import attention_bwd, catalog, dynamic, forward, preset
from anekit.runtime.sim import Plan, SimKernel

pytestmark = pytest.mark.usefixtures("fp16_path")  # every test with and without the jit


def initial_env(plan: Plan, inputs: list[np.ndarray]) -> list[Any]:
    """The plan's slots before its first step: the constants, and the inputs through their stores."""
    env: list[Any] = [None] * plan.n_slots
    for slot, value in plan.constants.items():
        env[slot] = value
    for slot, store, value in zip(plan.input_slots, plan.input_stores, inputs):
        env[slot] = store(value)
    return env


def plain_run(plan: Plan, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The plan's meaning stated plainly: reference, then ``store`` of every output, for every step."""
    env = initial_env(plan, inputs)
    with np.errstate(all="ignore"):
        for step in plan.steps:
            values = {
                key: tuple(env[s] for s in slot) if isinstance(slot, tuple) else env[slot]
                for key, slot in step.args
            }
            outs = step.opdef.run(values, step.out_types)
            for slot, store, value in zip(step.out_slots, step.stores, outs):
                env[slot] = store(value)
    return [np.array(env[s], copy=True) for s in plan.output_slots]


def _specs() -> list[Any]:
    cfg = preset("default")
    w = catalog.random_weights(cfg)
    return [
        forward.sdpa_fwd(cfg, w),
        forward.ffn_fwd(cfg, w),
        attention_bwd.sdpa_bwd2(cfg),
        dynamic.sdpa_fwd_dynamic(cfg),
        dynamic.ffn_bwd_w13t_dynamic(cfg),
    ]


@pytest.mark.parametrize("scale", [1.0, 3e4, 1e-6])
@pytest.mark.parametrize("index", range(5))
def test_fast_steps_equal_plain_steps(index: int, scale: float) -> None:
    """Large scales overflow to inf and NaN (the exact fallback), tiny ones reach the subnormal halves."""
    spec = _specs()[index]
    kernel = spec.compile(runtime.open("sim", numerics="ieee", compile_budget=10**6))
    assert isinstance(kernel, SimKernel)
    plan = kernel.plan
    assert any(step.moves_only for step in plan.steps) or index == 2
    rng = np.random.default_rng(index)
    with np.errstate(over="ignore"):
        inputs = [
            (rng.standard_normal(s.shape) * scale).astype(np.float32).astype(np.float16)
            for s in kernel.inputs
        ]
    want = plain_run(plan, [x.copy() for x in inputs])
    got = plan.run([x.copy() for x in inputs])
    for g, w in zip(got, want):
        g = np.asarray(g, np.float32)
        nan = np.isnan(w)
        np.testing.assert_array_equal(np.isnan(g), nan)  # NaN payloads may differ: a NaN only stays a NaN
        np.testing.assert_array_equal(g[~nan].view(np.uint32), w[~nan].view(np.uint32))
