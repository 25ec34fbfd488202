"""A plan's steps under a chip's numeric profile (``runtime.sim.numerics``): folded steps run with the
profile, runners wrapped by it, and the fast runners whose store applies the profile's correction itself."""

from __future__ import annotations

from typing import Any

import numpy as np

from anekit import jit
from anekit.errors import AnekitError
from anekit.runtime.sim.fast import Runner, fast_runner
from anekit.runtime.sim.mac import MAC_OPS
from anekit.runtime.sim.numerics import SLICE_OPS, EngineNumerics
from anekit.runtime.sim.steps import (
    Step,
    bind_step,
    binding_of,
    failed,
    finish_of,
    reference_of,
    run_step,
    values_of,
)
from anekit.runtime.sim.store import fresh


def engine_step(step: Step, env: Any, numerics: EngineNumerics) -> list[np.ndarray]:
    """``run_step`` under a chip's numeric profile (``runtime.sim.numerics``)."""
    op_type = step.op.op_type
    try:
        with np.errstate(all="ignore"):
            if numerics.needs_values(op_type):
                return numerics.evaluate(step, values_of(step, env), reference_of(step))
            values = values_of(step, env) if op_type in SLICE_OPS else {}
            return [numerics.after(step, values, o) for o in run_step(step, env)]
    except AnekitError:
        raise
    except Exception as e:
        raise failed(step, e) from e


def engine_runner(
    step: Step, runner: Runner, numerics: EngineNumerics, constants: dict[int, np.ndarray]
) -> Runner:
    """``runner`` under a chip's numeric profile (``EngineNumerics.bind``); ``runner`` itself when the
    profile changes nothing about the step. A MAC op gets, where it can, a fast runner whose store is
    the output port as well; one whose constant operands hold subnormals on a chip that flushes them is
    bound to those operands flushed once, here (``EngineNumerics.flushed_constants``)."""
    if step.op.op_type not in MAC_OPS:
        return numerics.bind(step, runner, lambda env: values_of(step, env), reference_of(step), constants)
    flushed = numerics.flushed_constants(step, constants)
    bound = constants
    if flushed:
        bound = {**constants, **{slot: value for slot, (value, _) in flushed.items()}}
        runner = bind_step(step, bound)
    cell = None
    ported = engine_mac_step(step, bound, numerics)
    if ported is not None:
        runner, cell = ported
    return numerics.bind(
        step, runner, lambda env: values_of(step, env), reference_of(step), constants, cell, flushed
    )


def engine_mac_step(
    step: Step, constants: dict[int, np.ndarray], numerics: EngineNumerics
) -> tuple[Runner, list[Any]] | None:
    """A MAC op's ``fast`` runner whose store also applies the output port (``_jit_loops.
    round_port_inplace``; on a chip whose MAC ties round away from zero, the unrounded float32 product
    rounded as that chip rounds it, as ``EngineNumerics._mac`` does), and the cell in which each run leaves
    the port's counts (None after a run that took the plain way, which a ties-away chip never takes); None
    where there is no such runner or no compiled loop."""
    ceiling = numerics.port_ceiling(step)
    if ceiling is None or not step.fp16_out or not jit.available():
        return None
    binding = binding_of(step, constants)
    if binding is None:
        return None
    plain = finish_of(step)
    flush = numerics.chip.flush
    away = numerics.chip.mac_ties == "away"
    cell: list[Any] = [None]
    loops = jit.loops()
    if loops is None:  # jit.available() said there are: never taken
        return None

    def finish(o: Any, inputs: tuple[Any, ...]) -> np.ndarray:
        fresh_f32 = type(o) is np.ndarray and o.dtype == np.float32 and o.flags.c_contiguous
        if not (fresh_f32 and fresh(o, inputs)):
            if not away:
                return plain(o, inputs)
            # ties away need the unrounded product, which the plain store would round to even: a copy
            o = np.array(o, dtype=np.float32, order="C")
        cell[0] = loops.round_port_inplace(o.reshape(-1), np.float32(ceiling), flush, away)
        return o

    binding.finish = finish
    runner = fast_runner(step.opdef, binding)
    return None if runner is None else (runner, cell)


def engine_fast_step(step: Step, constants: dict[int, np.ndarray], numerics: EngineNumerics) -> Runner | None:
    """A ``fast`` runner whose store also applies the profile's correction of a fresh fp16 result in
    the same pass (NaN -> +0; ties away from zero for a reduction on chips that round so), or None where
    the step has no fast runner or its store is not the fp16 one."""
    ties = numerics.fused_store(step.op.op_type)
    if ties is None or not step.fp16_out or step.moves_only:
        return None
    binding = binding_of(step, constants)
    if binding is None:
        return None
    plain = finish_of(step)
    op = step.op
    away = ties == "away"

    def finish(o: Any, inputs: tuple[Any, ...]) -> np.ndarray:
        if type(o) is np.ndarray and o.dtype == np.float32 and o.flags.c_contiguous and fresh(o, inputs):
            found = numerics.round_store(op, o, away)
            if found is not None:
                return found
        return numerics.store_numpy(op, o, inputs, plain, away)

    binding.finish = finish
    return fast_runner(step.opdef, binding)
