"""Kept steps: the values a plan moves out of columns of an input that did not change since it made them.

A dynamic kernel's "x" input carries its weights in the columns after its activations. A generation
kernel's host writes those weight columns once and only the activation columns before each run
(``anekit.generate.layers.Compiled``), but the plan slices every weight segment out of "x" and reshapes
or transposes it into a product's operand on every run: a copy of every weight per token, more time than
the products of a decode step that reads one column. A step whose value only moves elements of a block of
constant columns of an input (``slice_by_size`` with constant begin and size, then ``reshape``,
``transpose``, ``squeeze`` or ``expand_dims``) is *kept*: the run that makes it keeps its outputs, made
read-only, with the version of its input's source (``ColumnLog``); a later run whose source says that no
element of those columns changed since (``ColumnLog.changed_since``) hands the same
arrays to the steps that read them instead of making them again. They are the values the steps would
make: the same elements of the same input values, moved the same way.

Only a run given the sources of its inputs (``Plan.run``'s ``sources``, from ``SimKernel._run``: a mirror's
or a held surface's ``ColumnLog``, each handed with the values it keeps) keeps or reuses; a run on other
arrays (the narrowing probe's random inputs) neither reads nor replaces what is kept. A plan whose
numerics count hazards keeps nothing: a sanitizer counts each run's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from anekit.runtime.sim.steps import Step

ROOTS = frozenset({"slice_by_size"})
MOVES = frozenset({"reshape", "transpose", "squeeze", "expand_dims"})


class Source(Protocol):
    """What a run knows of an input array between runs (``ColumnLog``: a mirror's, a held surface's)."""

    @property
    def version(self) -> int: ...

    def changed_since(self, version: int, first: int, stop: int) -> bool: ...


class ColumnLog:
    """The version at which each column of an array (read as rows of columns) last changed: a ``Source``."""

    def __init__(self, columns: int) -> None:
        self.version = 0  # how many changes there were
        self._last = np.zeros(max(columns, 1), np.int64)  # per column: the version that last changed it

    def changed(self, first: int, stop: int) -> None:
        """Elements in columns [first, stop) changed."""
        self.version += 1
        self._last[max(first, 0) : stop] = self.version

    def changed_since(self, version: int, first: int, stop: int) -> bool:
        """Whether a change after ``version`` touched columns [first, stop)."""
        if version == self.version:
            return False
        part = self._last[max(first, 0) : stop]
        return bool(part.size) and int(part.max()) > version


class Holder(Protocol):
    """Where a kept array's scans are held (``runtime.sim.numerics.EngineNumerics``)."""

    def hold(self, v: np.ndarray) -> None: ...

    def release(self, v: np.ndarray) -> None: ...


def _root_region(
    step: Step, inputs: dict[int, int], constants: dict[int, Any]
) -> tuple[int, int, int] | None:
    """(input index, first column, stop) of a slice of a block of constant columns of an input."""
    args = dict(step.args)
    x, begin, size = args.get("x"), args.get("begin"), args.get("size")
    if not isinstance(x, int) or x not in inputs or begin not in constants or size not in constants:
        return None
    shape = getattr(step.op.inputs.get("x"), "type", None)
    width = getattr(shape, "shape", (None,))[-1] if shape is not None else None
    if not isinstance(width, int):
        return None
    b = np.asarray(constants[begin]).reshape(-1)
    s = np.asarray(constants[size]).reshape(-1)
    if not b.size or b.size != s.size:
        return None
    first = int(b[-1])
    stop = width if int(s[-1]) < 0 else first + int(s[-1])
    return (inputs[x], first, stop) if 0 <= first < stop <= width else None


class KeptSteps:
    """The kept steps of one plan (module docstring) and the values kept of each."""

    def __init__(
        self,
        steps: Sequence[Step],
        input_slots: Sequence[int],
        constants: dict[int, Any],
        elided: set[int],
        holder: Holder | None,
    ) -> None:
        self.holder = holder
        inputs = {slot: i for i, slot in enumerate(input_slots)}
        region_of: dict[int, tuple[int, int, int]] = {}  # slot -> where its elements come from
        self.regions: dict[int, tuple[int, int, int]] = {}  # step index -> (input, first column, stop)
        for index, step in enumerate(steps):
            op_type = step.op.op_type
            if op_type in ROOTS:
                region = _root_region(step, inputs, constants)
            elif op_type in MOVES:
                moving = [s for _, s in step.args if isinstance(s, int) and s not in constants]
                region = region_of.get(moving[0]) if len(moving) == 1 else None
            else:
                region = None
            if region is None:
                continue
            for slot in step.out_slots:
                region_of[slot] = region
            if not any(s in elided for s in step.out_slots):  # a step fused away makes nothing
                self.regions[index] = region
        # step index -> (the source, its version, the outputs kept)
        self._kept: dict[int, tuple[Source, int, tuple[Any, ...]]] = {}
        # step index -> (the source, its version) when the step last ran
        self._seen: dict[int, tuple[Source, int]] = {}

    def __bool__(self) -> bool:
        return bool(self.regions)

    def reuse(self, index: int, out_slots: Sequence[int], env: list[Any], sources: dict[int, Source]) -> bool:
        """Put the outputs kept of step ``index`` into ``env`` if they still hold (module docstring)."""
        kept = self._kept.get(index)
        if kept is None:
            return False
        source, version, outs = kept
        k, first, stop = self.regions[index]
        if sources.get(k) is not source or source.changed_since(version, first, stop):
            return False
        for slot, value in zip(out_slots, outs):
            env[slot] = value
        return True

    def keep(self, index: int, out_slots: Sequence[int], env: list[Any], sources: dict[int, Source]) -> None:
        """Keep step ``index``'s fresh outputs (read-only from now on) once its columns have stayed as they
        were from one run to the next: the weight columns, written once, are kept from the second run on;
        the activation columns, written before every run, and a training step's weights, rewritten between
        its runs, never are (keeping them would cost a copy's worth of memory and gain nothing)."""
        k, first, stop = self.regions[index]
        source = sources.get(k)
        if source is None:
            return
        seen = self._seen.get(index)
        self._seen[index] = (source, source.version)
        if seen is None or seen[0] is not source or source.changed_since(seen[1], first, stop):
            self._drop(index)
            return
        outs = tuple(env[s] for s in out_slots)
        for v in outs:
            if isinstance(v, np.ndarray):
                v.flags.writeable = False  # handed out again: no step may write into it
        self._drop(index)
        if self.holder is not None:
            for v in outs:
                if isinstance(v, np.ndarray) and v.flags.owndata:
                    self.holder.hold(v)
        self._kept[index] = (source, source.version, outs)

    def _drop(self, index: int) -> None:
        old = self._kept.pop(index, None)
        if old is not None and self.holder is not None:
            for v in old[2]:
                if isinstance(v, np.ndarray):
                    self.holder.release(v)
