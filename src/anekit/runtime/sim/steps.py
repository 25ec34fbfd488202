"""One op of a simulator plan: its ``Step`` record, ``run_step`` (the op's reference, then the store) and the
runner a step is bound to (a ``fast`` runner where there is one, else ``run_step``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from anekit.errors import AnekitError, EvalFailed
from anekit.mil import types as T
from anekit.mil.ir import Op
from anekit.mil.registry import OpDef, RefArgs
from anekit.runtime.sim.fast import Binding, Finish, Runner, fast_runner
from anekit.runtime.sim.store import C_LAYOUT_FROM, Store, moved, store_fp16_result


@dataclass(frozen=True)
class Step:
    """One op of the plan: where its inputs are, which slots its outputs go to, how they are stored."""

    op: Op
    opdef: OpDef
    args: tuple[tuple[str, Any], ...]  # (input name, slot int | tuple of slots)
    out_slots: tuple[int, ...]
    out_types: tuple[T.Type, ...]
    stores: tuple[Store, ...]
    # True when the outputs are input values moved around (VALUE_MOVING_OPS): stored as they come.
    moves_only: bool = False
    # True when every output is fp16 in "ane" precision: rounded in place where the result is fresh.
    fp16_out: bool = False


def run_step(step: Step, env: Any) -> list[np.ndarray]:
    """Run one op's reference on its input slots and store each output in its declared dtype.

    Outputs that only move input values (``Step.moves_only``) are already in their dtype and are kept as
    they come; fresh fp16 results are rounded in place. Either way the stored values are those of
    ``store(output)``.
    """
    values = {
        key: tuple(env[s] for s in slot) if isinstance(slot, tuple) else env[slot] for key, slot in step.args
    }
    opdef = step.opdef
    try:
        outs = opdef.reference(RefArgs(opdef, values, step.out_types))
    except AnekitError:
        raise
    except Exception as e:  # the one boundary where a reference's failure becomes an anekit error
        raise failed(step, e) from e
    if not isinstance(outs, tuple):
        outs = (outs,)
    if len(outs) != len(step.stores):
        raise EvalFailed(f"[{step.op.op_type}] ({step.op.where()}) returned {len(outs)} outputs")
    if step.moves_only and all(type(o) is np.ndarray and o.dtype == np.float32 for o in outs):
        return [moved(o) for o in outs]
    if step.fp16_out:
        inputs = tuple(values.values())
        return [store_fp16_result(o, inputs) for o in outs]
    return [store(o) for store, o in zip(step.stores, outs)]


def values_of(step: Step, env: Any) -> dict[str, Any]:
    return {
        key: tuple(env[s] for s in slot) if isinstance(slot, tuple) else env[slot] for key, slot in step.args
    }


def reference_of(step: Step) -> Callable[[dict[str, Any]], list[Any]]:
    """The op's reference on given input values (its outputs unstored), failures named after the step."""
    opdef = step.opdef

    def reference(values: dict[str, Any]) -> list[Any]:
        try:
            outs = opdef.reference(RefArgs(opdef, values, step.out_types))
        except AnekitError:
            raise
        except Exception as e:
            raise failed(step, e) from e
        return list(outs) if isinstance(outs, tuple) else [outs]

    return reference


def failed(step: Step, e: Exception) -> EvalFailed:
    return EvalFailed(f"[{step.op.op_type}] ({step.op.where()}) failed: {type(e).__name__}: {e}")


def finish_of(step: Step) -> Finish:
    """How ``run_step`` stores the one output of ``step``: (result, the op's input values) -> stored value."""
    (store,) = step.stores

    def moved_or(store: Callable[..., np.ndarray]) -> Finish:
        def finish(o: Any, inputs: tuple[Any, ...]) -> np.ndarray:
            if type(o) is np.ndarray and o.dtype == np.float32:
                return moved(o)
            return store(o, inputs)

        return finish

    stored = store_fp16_result if step.fp16_out else lambda o, inputs: store(o)
    return moved_or(stored) if step.moves_only else stored


def bind_step(step: Step, constants: dict[int, np.ndarray]) -> Runner:
    """What running ``step`` does, bound once: a ``fast`` runner for the ops it knows, else ``run_step``.

    Either way the slots receive the values ``run_step`` stores (tests/test_sim_fast_runners.py)."""
    binding = binding_of(step, constants)
    return (fast_runner(step.opdef, binding) if binding else None) or plain_runner(step)


def plain_runner(step: Step) -> Runner:
    """``run_step`` as a runner."""
    out_slots = step.out_slots

    def plain(env: list[Any]) -> None:
        for slot, value in zip(out_slots, run_step(step, env)):
            env[slot] = value

    return plain


def binding_of(step: Step, constants: dict[int, np.ndarray]) -> Binding | None:
    """What ``fast`` needs to bind a step of one output (None for other steps)."""
    if len(step.out_slots) != 1 or step.opdef.forms:
        return None
    items = {k: v[0] if isinstance(v, tuple) else v for k, v in step.op.inputs.items() if v != ()}
    in_types = {k: v.type for k, v in items.items()}  # a tuple input: its first item's type
    contiguous_from = C_LAYOUT_FROM if step.moves_only else None
    return Binding(
        step.args,
        in_types,
        constants,
        step.out_slots[0],
        finish_of(step),
        plain_runner(step),
        contiguous_from,
        rounds=step.fp16_out and not step.moves_only,
    )


def in_turn(producer: Step, run_producer: Runner, run_consumer: Runner) -> Runner:
    """Both steps' own runners, one after the other; a failure of the first named after its step."""

    def run(env: list[Any]) -> None:
        try:
            run_producer(env)
        except AnekitError:
            raise
        except Exception as e:
            raise failed(producer, e) from e
        run_consumer(env)

    return run


def then_saturate(run: Runner, slot: int, saturate: Callable[[Any], Any]) -> Runner:
    """A fused slice + reshape whose slice saturates (a width offset on a chip with the crop gain): the
    reshaped value holds the same elements, so the saturation is applied to it."""

    def fused(env: list[Any]) -> None:
        run(env)
        env[slot] = saturate(env[slot])

    return fused


def elided(env: list[Any]) -> None:
    """The runner of a step whose only reader computes its output itself (``Plan._fuse_moves``)."""
