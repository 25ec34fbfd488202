"""A compiled function of the simulator: the program's ops as steps over numbered value slots.

Compiling reads the BLOBFILE consts (``runtime.sim.weights``), folds every op whose inputs are all
constant, binds each remaining step to its runner (``runtime.sim.steps``; under a chip's profile,
``runtime.sim.engine_steps``), gives a value-moving step read only by a reshape one runner with it, and
works out when each value can be let go. Running fills the input slots and runs the steps in order. A
narrow decode-shaped program's convs, matmuls, softmax and reductions are bound to the ops of
``runtime.sim.ordered.ORDERED_OPS`` (each output summed in order), the convs' constant weights stored in
the layout their loop reads. A plan may take the constants of another (``constants_of``: a narrowed copy's
plan those of the full one), each only where its source is the same (``literal_key``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, cast

import numpy as np

from anekit.errors import AnekitError
from anekit.mil import types as T
from anekit.mil.ir import Function, Op, Var
from anekit.mil.registry import get_op, op_arguments
from anekit.mil.values import BlobRef, Literal
from anekit.runtime.base import WeightSource
from anekit.runtime.sim.columns import input_widths
from anekit.runtime.sim.engine_steps import engine_fast_step, engine_runner, engine_step
from anekit.runtime.sim.fast import Runner, fused_reshape
from anekit.runtime.sim.kept import KeptSteps, Source
from anekit.runtime.sim.mac import MAC_OPS
from anekit.runtime.sim.numerics import SLICE_OPS, EngineNumerics
from anekit.runtime.sim.ordered import ORDERED_CONV, ORDERED_OPS, ordered_program, transposed_layout
from anekit.runtime.sim.steps import (
    Step,
    bind_step,
    binding_of,
    elided,
    failed,
    in_turn,
    run_step,
    then_saturate,
)
from anekit.runtime.sim.store import moves_values_only, store_for, store_fp16
from anekit.runtime.sim.weights import WeightFiles


def literal_key(lit: Literal) -> Hashable:
    """A key equal for two literals that hold the same value: a weight file's path, offset and type, or the
    type and bytes of an inline value (the weight files' bytes are the caller's: ``SimKernel.causal``
    checks that a copy's files of one path hold the same bytes)."""
    if isinstance(lit.value, BlobRef):
        return ("blob", lit.value.path, lit.value.offset, str(lit.type))
    value = lit.value
    if isinstance(value, np.ndarray):
        return ("inline", str(lit.type), str(value.dtype), value.shape, value.tobytes())
    return ("inline", str(lit.type), repr(value))


class Plan:
    """A compiled function: constant slots filled once, steps run in order over the slots."""

    def __init__(
        self,
        fn: Function,
        weights: dict[str, WeightSource],
        precision: str,
        numerics: EngineNumerics | None = None,
        constants_of: Plan | None = None,
        ordered: bool | None = None,
    ) -> None:
        self.precision = precision
        # Whether its convs sum every output in order (``runtime.sim.ordered``): None, when ``fn`` is a narrow
        # column-separable program; a narrowed copy of a program takes the full plan's choice.
        self.ordered = ordered_program(fn) if ordered is None else ordered
        # What each constant slot holds, as a key equal for equal values: its literal's source (a weight
        # file's path and offset, or the inline value), or for a folded value the op and its operands' keys.
        self.signatures: dict[int, Hashable] = {}
        # Constants by the name of the value they hold, with their keys, taken as they are from
        # ``constants_of`` (a plan of the same program, or of a narrowed copy of it: ``runtime.sim.columns``)
        # instead of being read and folded again, where this program's constant of that name has the same
        # key (a copy's own constants, of another shape, are read and folded here).
        self._shared: dict[str, tuple[np.ndarray, Hashable]] = {}
        if constants_of is not None:
            self._shared = {
                name: (constants_of.constants[slot], constants_of.signatures.get(slot))
                for name, slot in constants_of.slot_of.items()
                if slot in constants_of.constants and not name.startswith("\0lit")
            }
        # The chip's numeric profile (None: the ideal machine); only fp16 "ane" precision has one.
        self.numerics = numerics if precision == "ane" else None
        self.engine_steps: set[int] = set()  # the steps whose runners the profile wraps (never fused)
        # Width-offset slices on a chip with the crop gain: step index -> the saturation of its values.
        self.slice_checks: dict[int, Callable[[Any], Any]] = {}
        self.slot_of: dict[str, int] = {}
        self.constants: dict[int, np.ndarray] = {}
        self.steps: list[Step] = []
        self.runners: list[Runner] = []  # one per step: what running it does (``bind_step``)
        self.input_slots = [self._slot(v) for v in fn.inputs]
        self.input_names = [v.name for v in fn.inputs]
        self.input_widths = input_widths(fn)  # each input's last axis (a copy's inputs: ``columns.fit``)
        self.input_stores = [store_for(v.type, precision) for v in fn.inputs]
        files = WeightFiles(weights)
        try:
            with np.errstate(all="ignore"):
                for op in fn.ops:
                    self._add(op, files)
        finally:
            files.close()
        self._shared = {}  # only while building
        self.output_slots = [self.slot_of[v.name] for v in fn.outputs]
        self.n_slots = len(self.slot_of)
        # Slots a fused runner reads in place of the step it stands for (``_fuse_moves``), by step index.
        self.fused_reads: dict[int, tuple[int, ...]] = {}
        self.elided: set[int] = set()  # the slots of the steps fused away: never filled
        self._fuse_moves()
        self.dead_after = self._dead_after()
        # The steps that move elements of constant columns of an input, kept between runs (``kept``):
        # none under a sanitizer, which counts each run's hazards.
        counting = self.numerics is not None and self.numerics.sanitizer is not None
        self.kept = (
            None
            if counting
            else KeptSteps(self.steps, self.input_slots, self.constants, self.elided, self.numerics)
        )
        if self.numerics is not None:
            self.numerics.mac_only_slots = self._mac_only_slots()
        self.constant_ids = frozenset(id(v) for v in self.constants.values())  # never handed out as is
        self._template: list[Any] | None = None  # the slots with the constants filled in, built on first run

    def _fuse_moves(self) -> None:
        """Give a value-moving step read only by a reshape, and that reshape, one runner
        (``fast.fused_reshape``): the reshape's value is made in one copy, the other is never made."""
        readers: dict[int, int] = {}
        made_by: dict[int, int] = {}
        for index, step in enumerate(self.steps):
            for _, slot in step.args:
                for s in slot if isinstance(slot, tuple) else (slot,):
                    readers[s] = readers.get(s, 0) + 1
            for s in step.out_slots:
                made_by[s] = index
        outputs = set(self.output_slots)
        for ci, consumer in enumerate(self.steps):
            x = dict(consumer.args).get("x")
            out_type = consumer.out_types[0]
            if consumer.op.op_type != "reshape" or not isinstance(x, int) or x not in made_by:
                continue
            if readers.get(x) != 1 or x in outputs or not isinstance(out_type, T.TensorType):
                continue
            pi = made_by[x]
            if pi in self.engine_steps or ci in self.engine_steps:
                continue  # the profile corrects this step's own output
            producer = self.steps[pi]
            p_in = dict(producer.args).get("x")
            if p_in in self.elided or pi in self.fused_reads or not out_type.is_static:
                continue
            p, c = binding_of(producer, self.constants), binding_of(consumer, self.constants)
            if p is None or c is None:
                continue
            shape = tuple(int(d) for d in out_type.shape)
            run = fused_reshape(
                producer.opdef,
                p,
                consumer.opdef,
                c,
                shape,
                in_turn(producer, self.runners[pi], self.runners[ci]),
            )
            if run is not None and pi in self.slice_checks:
                run = then_saturate(run, consumer.out_slots[0], self.slice_checks[pi])
            if run is not None:
                self.runners[pi], self.runners[ci] = elided, run
                self.fused_reads[ci] = (cast(int, p_in),)  # a fused view reads one slot
                self.elided.add(x)

    def _mac_only_slots(self) -> frozenset[int]:
        """Slots made by a step of this plan whose every reader is a MAC op (matmul, linear, conv, ...) and
        that are no output: the engine numerics may flush their subnormals in place."""
        readers: dict[int, set[str]] = {}
        for index, step in enumerate(self.steps):
            for _, slot in step.args:
                for s in slot if isinstance(slot, tuple) else (slot,):
                    readers.setdefault(s, set()).add(step.op.op_type)
            for s in self.fused_reads.get(index, ()):
                readers.setdefault(s, set()).add("fused")
        # Whether a value is an array of its own (no view of another, in no other slot) is checked when it
        # runs (EngineNumerics: owndata and its reference count).
        made = {s for step in self.steps for s in step.out_slots} - self.elided
        keep = set(self.output_slots) | set(self.constants) | set(self.input_slots)
        return frozenset(s for s in made - keep if readers.get(s) and readers[s] <= MAC_OPS)

    def _dead_after(self) -> list[tuple[int, ...]]:
        """Per step, the slots no later step reads (nor the outputs, nor the constants): a run lets go of
        them right after the step, so the next values are allocated in memory that is still in cache."""
        last_use: dict[int, int] = {}
        for index, step in enumerate(self.steps):
            for _, slot in step.args:
                for s in slot if isinstance(slot, tuple) else (slot,):
                    last_use[s] = index
            for s in self.fused_reads.get(index, ()):
                last_use[s] = index
            for s in step.out_slots:
                last_use.setdefault(s, index)  # an output nobody reads: let go at once
        keep = set(self.output_slots) | set(self.constants)
        dead: list[list[int]] = [[] for _ in self.steps]
        for s, index in last_use.items():
            if s not in keep:
                dead[index].append(s)
        return [tuple(d) for d in dead]

    def _slot(self, v: Var) -> int:
        slot = len(self.slot_of)
        self.slot_of[v.name] = slot
        return slot

    def _literal_value(self, lit: Literal, name: str, files: WeightFiles) -> np.ndarray:
        raw = files.read(lit, name) if isinstance(lit.value, BlobRef) else lit.value
        value = store_for(lit.type, self.precision)(raw)
        if isinstance(raw, np.ndarray) and np.may_share_memory(value, raw):
            value = value.copy()  # own the data: weight files are closed after compiling
        return value

    def _add(self, op: Op, files: WeightFiles) -> None:
        if op.op_type == "const":
            (out,) = op.outputs
            key = literal_key(op.attributes["val"])
            shared = self._shared.get(out.name)
            slot = self._slot(out)
            self.signatures[slot] = key
            if shared is not None and shared[1] == key:
                self.constants[slot] = shared[0]
                return
            value = self._literal_value(op.attributes["val"], out.name, files)
            if self.numerics is not None:
                value = self.numerics.coerce_input(value, out.name)
            self.constants[slot] = value
            return
        args: list[tuple[str, Any]] = []
        all_const = True
        opdef = get_op(op.op_type)
        if self.ordered:
            opdef = ORDERED_OPS.get(op.op_type, opdef)
        for key, arg in op_arguments(opdef, op).items():  # inputs, or the attributes of an iOS16 form
            items = arg if isinstance(arg, tuple) else (arg,)
            slots = []
            for item in items:
                if isinstance(item, Literal):
                    slot = len(self.slot_of)
                    self.slot_of[f"\0lit{slot}"] = slot
                    self.constants[slot] = self._literal_value(item, f"{op.name}.{key}", files)
                    self.signatures[slot] = literal_key(item)
                else:
                    slot = self.slot_of[item.name]
                slots.append(slot)
                all_const = all_const and slot in self.constants
            args.append((key, tuple(slots) if isinstance(arg, tuple) else slots[0]))
        if opdef is ORDERED_CONV:
            weight = dict(args).get("weight")
            if isinstance(weight, int) and weight in self.constants:  # stored as the ordered loop reads it
                self.constants[weight] = transposed_layout(self.constants[weight])
        out_types = tuple(v.type for v in op.outputs)
        stores = tuple(store_for(t, self.precision) for t in out_types)
        step = Step(
            op,
            opdef,
            tuple(args),
            tuple(self._slot(v) for v in op.outputs),
            out_types,
            stores,
            moves_only=moves_values_only(op, out_types),
            fp16_out=all(st is store_fp16 for st in stores),
        )
        if all_const:
            sig = self.signatures.get
            operands = tuple((k, tuple(map(sig, v)) if isinstance(v, tuple) else sig(v)) for k, v in args)
            for i, slot in enumerate(step.out_slots):
                self.signatures[slot] = (op.op_type, type(opdef).__name__, operands, i)
        if all_const and all(
            v.name in self._shared and self._shared[v.name][1] == self.signatures[slot]
            for slot, v in zip(step.out_slots, op.outputs)
        ):  # folded in ``constants_of``, from the same constants
            for slot, v in zip(step.out_slots, op.outputs):
                self.constants[slot] = self._shared[v.name][0]
        elif all_const:  # fold: computed once here, exactly as a run would compute it
            numerics = self.numerics
            outs = (
                run_step(step, self.constants)
                if numerics is None
                else engine_step(step, self.constants, numerics)
            )
            for slot, value in zip(step.out_slots, outs):
                self.constants[slot] = value
        else:
            self.steps.append(step)
            runner = bind_step(step, self.constants)
            fused = (
                engine_fast_step(step, self.constants, self.numerics) if self.numerics is not None else None
            )
            if fused is not None:  # the profile's correction made in the store itself: nothing to wrap
                runner = fused
            elif self.numerics is not None:
                wrapped = engine_runner(step, runner, self.numerics, self.constants)
                if wrapped is not runner:
                    index = len(self.steps) - 1
                    if op.op_type in SLICE_OPS and self.numerics.width_offset(step, self.constants):
                        # a constant width-offset slice: fusable, its saturation applied to the fused value
                        self.slice_checks[index] = self.numerics.slice_saturation(step)
                    else:
                        self.engine_steps.add(index)
                    runner = wrapped
            self.runners.append(runner)

    def run(
        self,
        inputs: list[np.ndarray],
        stored: frozenset[int] = frozenset(),
        peaks: dict[int, float] | None = None,
        sources: dict[int, Source] | None = None,
    ) -> list[np.ndarray]:
        """Run the steps on ``inputs``; those at the indices in ``stored`` are already fp16 values held in
        C-contiguous float32 arrays the plan may keep, exactly what an fp16 input's store would make.
        ``peaks``: for some of those, their largest |value|, read where they were made, and no NaN among
        them (the engine's input coercion then changes nothing and need not scan them). ``sources``: for
        some of those, the mirror that keeps the array between runs and knows which of its columns changed
        (``runtime.sim.kept``: the steps that only move elements of unchanged columns are not run again)."""
        if self._template is None or len(self._template) != self.n_slots:
            self._template = [None] * self.n_slots
            for slot, value in self.constants.items():
                self._template[slot] = value
        env: list[Any] = self._template.copy()  # the constants in place, the rest filled below
        if self.numerics is not None:
            self.numerics.begin_run()
        for i, (slot, store, value) in enumerate(zip(self.input_slots, self.input_stores, inputs)):
            known = i in stored and store is store_fp16
            env[slot] = value if known else store(value)
            if self.numerics is not None:
                if known and peaks is not None and i in peaks:
                    self.numerics.known_input(slot, peaks[i])
                else:
                    env[slot] = self.numerics.coerce_input(env[slot], self.input_names[i], slot)
        runners, dead_after = self.runners, self.dead_after
        kept = self.kept if sources and self.kept else None
        index = 0
        try:
            with np.errstate(all="ignore"):
                if kept is None:
                    for index in range(len(runners)):
                        runners[index](env)
                        for slot in dead_after[index]:
                            env[slot] = None
                else:
                    assert sources is not None
                    regions, steps = kept.regions, self.steps
                    for index in range(len(runners)):
                        if index not in regions:
                            runners[index](env)
                        elif not kept.reuse(index, steps[index].out_slots, env, sources):
                            runners[index](env)
                            kept.keep(index, steps[index].out_slots, env, sources)
                        for slot in dead_after[index]:
                            env[slot] = None
        except AnekitError:
            raise
        except Exception as e:  # a pre-bound runner's failure, named as run_step names a reference's
            raise failed(self.steps[index], e) from e
        finally:
            if self.numerics is not None:
                self.numerics.begin_run()  # let go of the run's operands
        return [env[s] for s in self.output_slots]
