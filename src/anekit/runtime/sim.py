"""The simulator backend: runs any verified MIL program with ANE numerics, on any machine.

Compiling builds an execution plan once: the program is verified, BLOBFILE consts are read through
the blob reader and checked against their declared type, every op whose inputs are all constant
(``const``, ``constexpr_*`` and anything computed only from them) is folded, and the remaining ops
become a list of steps over numbered value slots. Each step is bound to a runner: for the frequent ops
one made by ``runtime.sim_fast`` (the reference's own numpy calls, its constant parameters read once),
else ``run_step``; a value-moving step read only by a reshape runs together with it. Running fills the
input slots from the input surfaces and runs the steps, letting go of each value after its last reader.
Either way every stored value is the one ``run_step`` stores, bit for bit and in the same memory layout
(tests/test_sim_fast_runners.py).

Numerics (DESIGN.md "Numerics"), precision ``"ane"`` (the default): every value is stored in its
declared dtype — fp16 values are rounded to nearest even after every op and overflow to inf, bf16
likewise — while ops compute on float32 operands, so matmul / conv / reductions accumulate in fp32.
On top of that the chip's numeric profile applies (``numerics="engine"``, the default; the profile of
``chip``, "any" the conservative union): ``runtime.engine_numerics`` wraps each step's runner with what
the engine does differently (the MAC port's 2^15 ceiling, NaN coercion and indeterminate forms to +0,
subnormal flushes, the width-offset slice gain, tie rounding, activation tables), and its sanitizer counts
where that departs from the ideal machine. ``numerics="ieee"`` is the ideal machine alone.
Precision ``"fp32"`` keeps every float value in float32 (no fp16 rounding between ops): the exact
reference path for comparisons with float32 tools. Op meaning comes from the op registry's numpy
references; nothing here redefines an op.

Strictness: by default compiling refuses, with ``CompilationFailed`` naming the rule, a program that
breaks an ``error`` rule of the rule book (``anekit.rules``) for the target ``chip`` ("any": every
chip) — what the engine would refuse or compute wrongly — so a program that passes here has a fair
chance on a Mac. ``strict=False`` (or ``ANEKIT_STRICT=0`` in the environment) runs anything, for
exploring ops and shapes the engine may not take.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anekit import jit
from anekit.engine.evidence import check_route
from anekit.engine.numerics import check_chip as numeric_chip
from anekit.engine.numerics import profile
from anekit.errors import AnekitError, BlobFormatError, CompilationFailed, EvalFailed, OptionError
from anekit.fp16 import _round_fp16_fast, bf16_bits_to_f32, encode_fp16_values, round_to_bf16, round_to_fp16
from anekit.mil import types as T
from anekit.mil.ir import Function, Op, Program, Var
from anekit.mil.registry import OpDef, RefArgs, get_op, op_arguments
from anekit.mil.values import BlobRef, Literal
from anekit.rules import check_chip
from anekit.rules.checks import enforce
from anekit.runtime.base import Backend, Kernel, Surface, WeightSource, strict_default
from anekit.runtime.engine_numerics import SLICE_OPS, EngineNumerics
from anekit.runtime.heap import keep_freed_memory
from anekit.runtime.mac_model import MAC_OPS
from anekit.runtime.sanitizer import Sanitizer
from anekit.runtime.sim_fast import Binding, Finish, Runner, fast_runner, fused_reshape

PRECISIONS = ("ane", "fp32")
NUMERICS = ("engine", "ieee")
MODEL_PATH_PREFIX = "@model_path/"

Store = Callable[[Any], np.ndarray]


def _store_fn(dt: T.DType, precision: str) -> Store:
    """How a value of dtype ``dt`` is held between ops (the rounding of the simulated hardware)."""
    if dt.kind == "float":
        if precision == "fp32" or dt.name == "fp32":
            return lambda v: np.asarray(v, dtype=np.float32)
        # References compute on float32 operands; a float64 result (rare) is rounded to float32 first.
        if dt.name == "fp16":
            return _store_fp16
        if dt.name == "bf16":
            return lambda v: round_to_bf16(np.asarray(v, dtype=np.float32))
        return lambda v: np.asarray(v, dtype=np.float64)
    if dt.kind == "string":
        return lambda v: np.asarray(v, dtype=object)
    storage = dt.np
    return lambda v: np.asarray(v).astype(storage)


SMALL = 2048  # below this many elements numpy's own casts cost less than the fast path's fixed calls
# Memory layout of stored fp16 values, kept as it has always been because it decides how numpy's matmul
# accumulates (BLAS or its own loop): C-contiguous from this many elements on, the op result's own
# element order below it.
C_LAYOUT_FROM = 4096


def _store_fp16(v: Any) -> np.ndarray:
    """Round to fp16 values held in float32 (round to nearest even, overflow to inf)."""
    if isinstance(v, np.ndarray) and v.dtype == np.float16:  # already fp16 values: widening is exact
        return v.astype(np.float32) if v.size < C_LAYOUT_FROM else v.astype(np.float32, order="C")
    a = np.asarray(v, dtype=np.float32)
    out = np.empty(a.shape, np.float32) if a.size >= C_LAYOUT_FROM else np.empty_like(a)
    if jit.round_fp16_into(a, out):
        return out
    if a.size < SMALL:  # same values as round_to_fp16 (NaN stays NaN), less fixed cost
        return a.astype(np.float16).astype(np.float32)
    return round_to_fp16(a, out=out)


def _store_fp16_result(v: Any, inputs: tuple[Any, ...]) -> np.ndarray:
    """``_store_fp16`` of an op's result, rounding in place when the result is a fresh float32 array.

    In place only when nothing else can see the array: it owns its data and is none of the op's inputs
    (a reference may hand an input back). Same values and layout as ``_store_fp16``.
    """
    if type(v) is np.ndarray and v.dtype == np.float32 and _fresh(v, inputs):
        if jit.round_fp16_inplace(v):
            return v
        if v.size < SMALL:
            return _store_fp16(v)
        if _round_fp16_fast(v, v) is not None:
            return v
        return round_to_fp16(v, out=v)
    return _store_fp16(v)


def _fresh(v: np.ndarray, inputs: tuple[Any, ...]) -> bool:
    """True if ``v`` owns writeable data laid out as a store would lay it out, and is none of ``inputs``."""
    flags = v.flags
    if not (flags.owndata and flags.writeable and (v.size < C_LAYOUT_FROM or flags.c_contiguous)):
        return False
    return all(v is not x for x in inputs)


def _moved(v: np.ndarray) -> np.ndarray:
    """A moved value as the store would have laid it out (its values are already rounded)."""
    return np.ascontiguousarray(v) if v.size >= C_LAYOUT_FROM else v


# Ops whose outputs are input values moved around, never computed: with every float input already held in
# the output's dtype they need no rounding (it would give back the same bits).
VALUE_MOVING_OPS = frozenset(
    {
        "reshape", "transpose", "expand_dims", "squeeze", "flatten2d", "concat", "split", "stack",
        "slice_by_size", "slice_by_index", "tile", "reverse", "identity", "depth_to_space",
        "space_to_depth", "pixel_shuffle",
    }
)  # fmt: skip


def _moves_values_only(op: Op, out_types: tuple[T.Type, ...]) -> bool:
    """True if ``op`` only moves values and every float tensor in and out has one dtype."""
    if op.op_type not in VALUE_MOVING_OPS:
        return False
    dtypes = set()
    for arg in op.inputs.values():
        for item in arg if isinstance(arg, tuple) else (arg,):
            t = item.type
            if isinstance(t, (T.TensorType, T.TensorBufferType)) and t.dtype.kind == "float":
                dtypes.add(t.dtype.name)
    for t in out_types:
        if not isinstance(t, T.TensorType) or t.dtype.kind != "float":
            return False
        dtypes.add(t.dtype.name)
    return len(dtypes) == 1


def _store_for(t: T.Type, precision: str) -> Store:
    if isinstance(t, (T.TensorType, T.TensorBufferType)):
        return _store_fn(t.dtype, precision)
    return np.asarray


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


class _WeightFiles:
    """Opens each weight file a program refers to once, and reads consts out of it."""

    def __init__(self, weights: dict[str, WeightSource]) -> None:
        self.weights = weights
        self.open: dict[str, Any] = {}

    def source(self, path: str, const_name: str) -> Any:
        for key in (path, path.removeprefix(MODEL_PATH_PREFIX)):
            if key in self.weights:
                return self.weights[key]
        known = ", ".join(sorted(self.weights)) or "none"
        raise CompilationFailed(
            f"[compile] const '{const_name}' refers to weight file '{path}', which was not given "
            f"(weights given: {known})"
        )

    def read(self, lit: Literal, const_name: str) -> np.ndarray:
        ref = lit.value
        assert isinstance(ref, BlobRef) and isinstance(lit.type, T.TensorType)
        blob = self.open.get(ref.path)
        if blob is None:
            src = self.source(ref.path, const_name)
            if isinstance(src, (str, Path)) and not Path(src).is_file():
                raise CompilationFailed(
                    f"[compile] const '{const_name}': weight file '{ref.path}' -> {src} does not exist"
                )
            from anekit.blob import BlobFile

            try:
                blob = BlobFile(src)
            except (AnekitError, OSError) as e:
                msg = f"[compile] const '{const_name}': cannot open '{ref.path}': {e}"
                raise CompilationFailed(msg) from e
            self.open[ref.path] = blob
        shape = tuple(int(d) for d in lit.type.shape)
        try:
            data = blob.read(ref.offset, shape=shape, dtype=lit.type.dtype.name)
        except BlobFormatError as e:
            raise CompilationFailed(
                f"[compile] const '{const_name}' ({lit.type}) at offset {ref.offset} of '{ref.path}': {e}"
            ) from e
        if lit.type.dtype.name == "bf16":  # the blob holds bfloat16 bit patterns
            return bf16_bits_to_f32(data).reshape(shape)
        return data  # a read-only view into the file; the plan keeps only converted copies

    def close(self) -> None:
        for blob in self.open.values():
            blob.close()
        self.open.clear()


class Plan:
    """A compiled function: constant slots filled once, steps run in order over the slots."""

    def __init__(
        self,
        fn: Function,
        weights: dict[str, WeightSource],
        precision: str,
        numerics: EngineNumerics | None = None,
    ) -> None:
        self.precision = precision
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
        self.input_stores = [_store_for(v.type, precision) for v in fn.inputs]
        files = _WeightFiles(weights)
        try:
            with np.errstate(all="ignore"):
                for op in fn.ops:
                    self._add(op, files)
        finally:
            files.close()
        self.output_slots = [self.slot_of[v.name] for v in fn.outputs]
        self.n_slots = len(self.slot_of)
        # Slots a fused runner reads in place of the step it stands for (``_fuse_moves``), by step index.
        self.fused_reads: dict[int, tuple[int, ...]] = {}
        self.elided: set[int] = set()  # the slots of the steps fused away: never filled
        self._fuse_moves()
        self.dead_after = self._dead_after()
        if self.numerics is not None:
            self.numerics.mac_only_slots = self._mac_only_slots()
        self.constant_ids = frozenset(id(v) for v in self.constants.values())  # never handed out as is
        self._template: list[Any] | None = None  # the slots with the constants filled in, built on first run

    def _fuse_moves(self) -> None:
        """Give a value-moving step read only by a reshape, and that reshape, one runner
        (``sim_fast.fused_reshape``): the reshape's value is made in one copy, the other is never made."""
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
            p, c = _binding(producer, self.constants), _binding(consumer, self.constants)
            if p is None or c is None:
                continue
            shape = tuple(int(d) for d in out_type.shape)
            run = fused_reshape(
                producer.opdef,
                p,
                consumer.opdef,
                c,
                shape,
                _in_turn(producer, self.runners[pi], self.runners[ci]),
            )
            if run is not None and pi in self.slice_checks:
                run = _then_saturate(run, consumer.out_slots[0], self.slice_checks[pi])
            if run is not None:
                self.runners[pi], self.runners[ci] = _elided, run
                self.fused_reads[ci] = (p_in,)
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

    def _literal_value(self, lit: Literal, name: str, files: _WeightFiles) -> np.ndarray:
        raw = files.read(lit, name) if isinstance(lit.value, BlobRef) else lit.value
        value = _store_for(lit.type, self.precision)(raw)
        if isinstance(raw, np.ndarray) and np.may_share_memory(value, raw):
            value = value.copy()  # own the data: weight files are closed after compiling
        return value

    def _add(self, op: Op, files: _WeightFiles) -> None:
        if op.op_type == "const":
            (out,) = op.outputs
            value = self._literal_value(op.attributes["val"], out.name, files)
            if self.numerics is not None:
                value = self.numerics.coerce_input(value, out.name)
            self.constants[self._slot(out)] = value
            return
        args: list[tuple[str, Any]] = []
        all_const = True
        opdef = get_op(op.op_type)
        for key, arg in op_arguments(opdef, op).items():  # inputs, or the attributes of an iOS16 form
            items = arg if isinstance(arg, tuple) else (arg,)
            slots = []
            for item in items:
                if isinstance(item, Literal):
                    slot = len(self.slot_of)
                    self.slot_of[f"\0lit{slot}"] = slot
                    self.constants[slot] = self._literal_value(item, f"{op.name}.{key}", files)
                else:
                    slot = self.slot_of[item.name]
                slots.append(slot)
                all_const = all_const and slot in self.constants
            args.append((key, tuple(slots) if isinstance(arg, tuple) else slots[0]))
        out_types = tuple(v.type for v in op.outputs)
        stores = tuple(_store_for(t, self.precision) for t in out_types)
        step = Step(
            op,
            opdef,
            tuple(args),
            tuple(self._slot(v) for v in op.outputs),
            out_types,
            stores,
            moves_only=_moves_values_only(op, out_types),
            fp16_out=all(st is _store_fp16 for st in stores),
        )
        if all_const:  # fold: computed once here, exactly as a run would compute it
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

    def run(self, inputs: list[np.ndarray], stored: frozenset[int] = frozenset()) -> list[np.ndarray]:
        """Run the steps on ``inputs``; those at the indices in ``stored`` are already fp16 values held in
        C-contiguous float32 arrays the plan may keep, exactly what an fp16 input's store would make."""
        if self._template is None or len(self._template) != self.n_slots:
            self._template = [None] * self.n_slots
            for slot, value in self.constants.items():
                self._template[slot] = value
        env: list[Any] = self._template.copy()  # the constants in place, the rest filled below
        if self.numerics is not None:
            self.numerics.begin_run()
        for i, (slot, store, value) in enumerate(zip(self.input_slots, self.input_stores, inputs)):
            env[slot] = value if i in stored and store is _store_fp16 else store(value)
            if self.numerics is not None:
                env[slot] = self.numerics.coerce_input(env[slot], self.input_names[i], slot)
        runners, dead_after = self.runners, self.dead_after
        index = 0
        try:
            with np.errstate(all="ignore"):
                for index in range(len(runners)):
                    runners[index](env)
                    for slot in dead_after[index]:
                        env[slot] = None
        except AnekitError:
            raise
        except Exception as e:  # a pre-bound runner's failure, named as run_step names a reference's
            raise _failed(self.steps[index], e) from e
        finally:
            if self.numerics is not None:
                self.numerics.begin_run()  # let go of the run's operands
        return [env[s] for s in self.output_slots]


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
        raise _failed(step, e) from e
    if not isinstance(outs, tuple):
        outs = (outs,)
    if len(outs) != len(step.stores):
        raise EvalFailed(f"[{step.op.op_type}] ({step.op.where()}) returned {len(outs)} outputs")
    if step.moves_only and all(type(o) is np.ndarray and o.dtype == np.float32 for o in outs):
        return [_moved(o) for o in outs]
    if step.fp16_out:
        inputs = tuple(values.values())
        return [_store_fp16_result(o, inputs) for o in outs]
    return [store(o) for store, o in zip(step.stores, outs)]


def _values(step: Step, env: Any) -> dict[str, Any]:
    return {
        key: tuple(env[s] for s in slot) if isinstance(slot, tuple) else env[slot] for key, slot in step.args
    }


def _reference(step: Step) -> Callable[[dict[str, Any]], list[Any]]:
    """The op's reference on given input values (its outputs unstored), failures named after the step."""
    opdef = step.opdef

    def reference(values: dict[str, Any]) -> list[Any]:
        try:
            outs = opdef.reference(RefArgs(opdef, values, step.out_types))
        except AnekitError:
            raise
        except Exception as e:
            raise _failed(step, e) from e
        return list(outs) if isinstance(outs, tuple) else [outs]

    return reference


def engine_step(step: Step, env: Any, numerics: EngineNumerics) -> list[np.ndarray]:
    """``run_step`` under a chip's numeric profile (``runtime.engine_numerics``)."""
    op_type = step.op.op_type
    try:
        with np.errstate(all="ignore"):
            if numerics.needs_values(op_type):
                return numerics.evaluate(step, _values(step, env), _reference(step))
            values = _values(step, env) if op_type in SLICE_OPS else {}
            return [numerics.after(step, values, o) for o in run_step(step, env)]
    except AnekitError:
        raise
    except Exception as e:
        raise _failed(step, e) from e


def engine_runner(
    step: Step, runner: Runner, numerics: EngineNumerics, constants: dict[int, np.ndarray]
) -> Runner:
    """``runner`` under a chip's numeric profile (``EngineNumerics.bind``); ``runner`` itself when the
    profile changes nothing about the step. A MAC op gets, where it can, a fast runner whose store is
    the output port as well."""
    ported = engine_mac_step(step, constants, numerics) if step.op.op_type in MAC_OPS else None
    if ported is not None:
        runner, cell = ported
        return numerics.bind(step, runner, lambda env: _values(step, env), _reference(step), constants, cell)
    return numerics.bind(step, runner, lambda env: _values(step, env), _reference(step), constants)


def _failed(step: Step, e: Exception) -> EvalFailed:
    return EvalFailed(f"[{step.op.op_type}] ({step.op.where()}) failed: {type(e).__name__}: {e}")


def _finish(step: Step) -> Finish:
    """How ``run_step`` stores the one output of ``step``: (result, the op's input values) -> stored value."""
    (store,) = step.stores

    def moved_or(store: Callable[..., np.ndarray]) -> Finish:
        def finish(o: Any, inputs: tuple[Any, ...]) -> np.ndarray:
            if type(o) is np.ndarray and o.dtype == np.float32:
                return _moved(o)
            return store(o, inputs)

        return finish

    stored = _store_fp16_result if step.fp16_out else lambda o, inputs: store(o)
    return moved_or(stored) if step.moves_only else stored


def bind_step(step: Step, constants: dict[int, np.ndarray]) -> Runner:
    """What running ``step`` does, bound once: a ``sim_fast`` runner for the ops it knows, else ``run_step``.

    Either way the slots receive the values ``run_step`` stores (tests/test_sim_fast_runners.py)."""
    binding = _binding(step, constants)
    return (fast_runner(step.opdef, binding) if binding else None) or _plain(step)


def engine_mac_step(
    step: Step, constants: dict[int, np.ndarray], numerics: EngineNumerics
) -> tuple[Runner, list[Any]] | None:
    """A MAC op's ``sim_fast`` runner whose store also applies the output port (``_jit_loops.
    round_port_inplace``), and the cell in which each run leaves the port's counts (None after a run that
    took the plain way); None where there is no such runner or no compiled loop."""
    ceiling = numerics.port_ceiling(step)
    if ceiling is None or not step.fp16_out or not jit.available():
        return None
    binding = _binding(step, constants)
    if binding is None:
        return None
    plain = _finish(step)
    flush = numerics.flush
    cell: list[Any] = [None]
    loops = jit.loops()

    def finish(o: Any, inputs: tuple[Any, ...]) -> np.ndarray:
        if type(o) is np.ndarray and o.dtype == np.float32 and o.flags.c_contiguous and _fresh(o, inputs):
            cell[0] = loops.round_port_inplace(o.reshape(-1), np.float32(ceiling), flush)
            return o
        return plain(o, inputs)

    binding.finish = finish
    runner = fast_runner(step.opdef, binding)
    return None if runner is None else (runner, cell)


def engine_fast_step(step: Step, constants: dict[int, np.ndarray], numerics: EngineNumerics) -> Runner | None:
    """A ``sim_fast`` runner whose store also applies the profile's correction of a fresh fp16 result in
    the same pass (NaN -> +0; ties away from zero for a reduction on chips that round so), or None where
    the step has no fast runner or its store is not the fp16 one."""
    ties = numerics.fused_store(step.op.op_type)
    if ties is None or not step.fp16_out or step.moves_only:
        return None
    binding = _binding(step, constants)
    if binding is None:
        return None
    plain = _finish(step)
    op = step.op
    away = ties == "away"

    def finish(o: Any, inputs: tuple[Any, ...]) -> np.ndarray:
        if type(o) is np.ndarray and o.dtype == np.float32 and o.flags.c_contiguous and _fresh(o, inputs):
            found = numerics.round_store(op, o, away)
            if found is not None:
                return found
        return numerics.store_numpy(op, o, inputs, plain, away)

    binding.finish = finish
    return fast_runner(step.opdef, binding)


def _plain(step: Step) -> Runner:
    """``run_step`` as a runner."""
    out_slots = step.out_slots

    def plain(env: list[Any]) -> None:
        for slot, value in zip(out_slots, run_step(step, env)):
            env[slot] = value

    return plain


def _binding(step: Step, constants: dict[int, np.ndarray]) -> Binding | None:
    """What ``sim_fast`` needs to bind a step of one output (None for other steps)."""
    if len(step.out_slots) != 1 or step.opdef.forms:
        return None
    items = {k: v[0] if isinstance(v, tuple) else v for k, v in step.op.inputs.items() if v != ()}
    in_types = {k: v.type for k, v in items.items()}  # a tuple input: its first item's type
    contiguous_from = C_LAYOUT_FROM if step.moves_only else None
    return Binding(
        step.args, in_types, constants, step.out_slots[0], _finish(step), _plain(step), contiguous_from
    )


def _in_turn(producer: Step, run_producer: Runner, run_consumer: Runner) -> Runner:
    """Both steps' own runners, one after the other; a failure of the first named after its step."""

    def run(env: list[Any]) -> None:
        try:
            run_producer(env)
        except AnekitError:
            raise
        except Exception as e:
            raise _failed(producer, e) from e
        run_consumer(env)

    return run


def _then_saturate(run: Runner, slot: int, saturate: Callable[[Any], Any]) -> Runner:
    """A fused slice + reshape whose slice saturates (a width offset on a chip with the crop gain): the
    reshaped value holds the same elements, so the saturation is applied to it."""

    def fused(env: list[Any]) -> None:
        run(env)
        env[slot] = saturate(env[slot])

    return fused


def _elided(env: list[Any]) -> None:
    """The runner of a step whose only reader computes its output itself (``Plan._fuse_moves``)."""


class SimKernel(Kernel):
    """A kernel of the simulator: its plan runs on the host."""

    def __init__(self, backend: SimBackend, fn: Function, plan: Plan) -> None:
        self.precision = backend.precision
        super().__init__(backend, fn)
        self.plan = plan
        # Where each function input comes from: a state buffer (by name) or the next input surface.
        self._state_inputs = [v.name if isinstance(v.type, T.StateType) else None for v in fn.inputs]
        self._state_shapes = {name: buf.shape for name, buf in self.states.items()}
        # Only while __call__ runs (surface id -> float32 array): the fp16 values just written to an input
        # surface and those just stored in an output surface, so that neither is converted back from fp16
        # (it would give the same bits).
        self._in_call = False
        self._written: dict[int, np.ndarray] = {}
        # surface id -> (float32 values, True if the caller may have them without a copy)
        self._results: dict[int, tuple[np.ndarray, bool]] = {}

    def surface_dtype(self, dtype: T.DType) -> str:
        """In fp32 precision 16-bit float tensors travel in float32 surfaces (no rounding at the boundary)."""
        if self.precision == "fp32" and dtype.name in ("fp16", "bf16"):
            return "fp32"
        return dtype.name

    def __call__(self, **arrays: Any) -> dict[str, np.ndarray]:
        self._in_call = True
        try:
            return super().__call__(**arrays)
        finally:
            self._in_call = False
            self._written.clear()
            self._results.clear()

    def _write_input(self, surface: Surface, a: np.ndarray) -> None:
        """float32 into fp16: rounded once to fp16 values (the plan's input), which are encoded exactly."""
        if surface.dtype.name == "fp16" and a.dtype == np.float32:
            values: np.ndarray | None = np.empty(a.shape, np.float32)
            with surface.view() as buf:
                if jit.round_encode_into(a, values, buf.view(np.uint16)):  # one pass: the common case
                    self._written[surface.id] = values
                    return
            if not jit.round_fp16_into(a, values):
                with np.errstate(all="ignore"):  # None for NaN, inf and |x| >= 65520: numpy casts those
                    values = _round_fp16_fast(a, None)
            if values is not None:
                with surface.view() as buf:
                    if encode_fp16_values(values, buf.view(np.uint16)):
                        self._written[surface.id] = values
                        return
        super()._write_input(surface, a)

    def _read_output(self, surface: Surface) -> np.ndarray:
        """The float32 values just stored in an fp16 (encoded) or fp32 output surface, else the surface
        decoded."""
        values = self._results.pop(surface.id, None)
        if values is None:
            return super()._read_output(surface)
        value, owned = values
        return value if owned else value.copy()

    def _unshared(self, value: Any, ins: list[np.ndarray], handed: list[Any]) -> bool:
        """True if an output array made by this run is referenced by nothing else: it owns its data and
        is none of the plan's constants, none of this run's inputs (a state buffer is one) and no output
        handed out before. Such a value is given to the caller as it is; any other is copied."""
        return (
            type(value) is np.ndarray
            and value.flags.owndata
            and id(value) not in self.plan.constant_ids
            and not any(value is x for x in ins)
            and not any(value is x for x in handed)
        )

    def _run(self) -> None:
        ins: list[np.ndarray] = []
        stored: set[int] = set()
        surfaces = iter(self.inputs)
        for state in self._state_inputs:
            if state is not None:
                buf = self.states.get(state)
                want = self._state_shapes[state]
                if buf is None or buf.shape != want:
                    raise EvalFailed(
                        f"[{self.name}] state '{state}' must be an array of shape {list(want)} in "
                        f"kernel.states, got {None if buf is None else list(buf.shape)}"
                    )
                ins.append(buf)  # the buffer itself: state ops read and write it in place
                continue
            surface = next(surfaces)
            written = self._written.pop(surface.id, None)
            if written is not None:  # the values __call__ just wrote, already as fp16 values in float32
                stored.add(len(ins))
                ins.append(written)
                continue
            # The plan's input stores convert fp16 -> float32; a float32 surface is read in place: no step
            # writes into its inputs, and an output that is or views an input is copied before it is
            # handed out (``_unshared``, ``_read_output``).
            with surface.view() as buf:
                ins.append(buf)
        outs = self.plan.run(ins, frozenset(stored))
        self._results.clear()
        handed: list[Any] = []
        for surface, value in zip(self.outputs, outs):
            with surface.view() as buf:
                try:
                    v = np.asarray(value).reshape(buf.shape)
                except ValueError as e:
                    raise EvalFailed(f"[{self.name}] output '{surface.name}': {e}") from e
                if (
                    buf.dtype == np.float16
                    and v.dtype == np.float32
                    and encode_fp16_values(v, buf.view(np.uint16))
                ):
                    if self._in_call:  # __call__ reads it next: hand it the float32 values
                        self._results[surface.id] = (v, self._unshared(value, ins, handed))
                        handed.append(value)
                else:
                    with np.errstate(over="ignore"):  # values past the fp16 range become inf
                        buf[...] = v
                    if self._in_call and buf.dtype == np.float32 and v.dtype == np.float32:
                        self._results[surface.id] = (v, self._unshared(value, ins, handed))  # the same values
                        handed.append(value)


class SimBackend(Backend):
    """Runs programs in the numerical simulator (``precision``: "ane" or "fp32").

    ``numerics`` "engine" (the default) computes with the numeric profile of ``chip``
    (``anekit.engine.numerics``: "any" is the conservative union of every chip); "ieee" is the ideal
    machine (fp16 storage, fp32 accumulation, exact functions). ``sanitize`` keeps a ``Sanitizer``
    (``self.sanitizer``, shared by every kernel this backend compiles) counting, per op, where the
    profile departs from the ideal machine. ``precision="fp32"`` has no profile: it is the float32
    comparison path.

    ``strict`` (default: on, unless ``ANEKIT_STRICT=0``) refuses programs that break an error rule of
    the rule book for ``chip`` and ``route`` ("direct": kernels for the in-memory framework; "e5rt": a
    program for the Espresso / e5rt runtime; "coreml": the program of a CoreML package, whose buffers
    CoreML allocates). ``route=None`` (the default) takes each program's own: a program that carries a
    ``route`` attribute (the one ``anekit.coreml.load_mlpackage`` returns says "coreml") is judged for
    it, any other for "direct".
    """

    name = "sim"

    def __init__(
        self,
        compile_budget: int = 100,
        precision: str = "ane",
        strict: bool | None = None,
        chip: str = "any",
        route: str | None = None,
        numerics: str = "engine",
        sanitize: bool = False,
    ) -> None:
        if precision not in PRECISIONS:
            raise OptionError(f"[sim] precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        if numerics not in NUMERICS:
            raise OptionError(f"[sim] numerics must be one of {', '.join(NUMERICS)}, not {numerics!r}")
        if sanitize and (numerics != "engine" or precision != "ane"):
            raise OptionError(
                "[sim] sanitize compares a chip's numerics with the ideal machine: it needs numerics "
                f"'engine' and precision 'ane' (got numerics {numerics!r}, precision {precision!r})"
            )
        super().__init__(compile_budget)
        self.precision = precision
        self.strict = strict_default() if strict is None else bool(strict)
        self.chip = check_chip(numeric_chip(chip))
        # whose rules strictness applies (direct, e5rt, coreml); None: the program's own
        self.route = None if route is None else check_route(route, "sim")
        self.numerics = numerics
        self.profile = profile(self.chip) if numerics == "engine" else None
        self.sanitizer = Sanitizer() if sanitize else None
        keep_freed_memory()  # plans allocate all their values anew on each run (runtime.heap)

    def _engine(self) -> EngineNumerics | None:
        if self.profile is None or self.precision != "ane":
            return None
        return EngineNumerics(self.profile, self.sanitizer)

    def _compile(self, prog: Program, fn: Function, weights: dict[str, WeightSource]) -> Kernel:
        if self.strict:
            route = self.route or check_route(getattr(prog, "route", "direct"), "sim")  # a package's: coreml
            enforce(prog, fn, self.chip, weights, "strict simulator", route)
        try:
            plan = Plan(fn, weights, self.precision, self._engine())
        except EvalFailed as e:
            raise CompilationFailed(f"[compile] folding constants failed: {e}") from e
        return SimKernel(self, fn, plan)
