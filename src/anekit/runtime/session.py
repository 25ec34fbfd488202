"""A stateful runner: the functions of one program compiled once each, their states shared and kept.

A program's functions that declare states of one name share them: an exported model's ``prefill`` and
``decode`` (``anekit.coreml.export``) read and write the same KV-cache states, as CoreML's one ``MLState``
passed to each function's prediction. A ``Session`` holds those states, one buffer per name, zero at the
start, and gives them to every function that declares a state of that name; each call reads and updates
them in place. Every MIL program with states runs through here, on any backend::

    with Session(program, weights) as s:        # a package: anekit.coreml.open_session("model.mlpackage")
        logits = s.run("prefill", tokens=tokens, last=last)["logits"]   # writes the caches
        s.save_states("state.npz")                                  # the caches, one array per name
        logits = s.run("decode", token=token, pos=pos)["logits"]      # reads and updates them

    with Session(program, weights, states="state.npz") as s:    # carry on where it stopped
        ...

The states file is a numpy ``.npz`` holding one array per state, in its declared dtype (fp16 as
float16); ``anekit run --state-in / --state-out`` reads and writes the same file. Loading checks every
name and shape against the program's state inputs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from anekit import runtime
from anekit.errors import AnekitError
from anekit.fileio import atomic_write
from anekit.mil import types as T
from anekit.mil.ir import Program
from anekit.runtime.base import Backend, Kernel, WeightSource

StatesSource = str | os.PathLike[str] | Mapping[str, Any]


def state_types(program: Program) -> dict[str, T.TensorType]:
    """``{name: wrapped tensor type}`` of every state input of every function; one name, one type."""
    found: dict[str, T.TensorType] = {}
    for fn in program.functions.values():
        for v in fn.inputs:
            if not isinstance(v.type, T.StateType):
                continue
            wrapped = v.type.wrapped
            if not isinstance(wrapped, T.TensorType) or not wrapped.is_static:
                raise AnekitError(
                    f"[session] state '{v.name}' of '{fn.name}' has type {v.type}: not a static tensor"
                )
            if found.setdefault(v.name, wrapped) != wrapped:
                raise AnekitError(
                    f"[session] state '{v.name}' is {found[v.name]} in one function and {wrapped} in "
                    f"'{fn.name}': functions that share a state must agree on its type"
                )
    return found


def _buffer_dtype(t: T.TensorType) -> Any:
    """How a kernel holds a state: float states as float32 (their values rounded by the ops), others as is."""
    return np.float32 if t.dtype.is_float else t.dtype.np


def _file_dtype(t: T.TensorType) -> Any:
    """How a states file stores a state: its declared dtype where numpy has it (fp16 as float16)."""
    return np.float16 if t.dtype.name == "fp16" else _buffer_dtype(t)


class Session:
    """Runs the functions of ``program`` on ``backend`` (default: ``runtime.open()``), states shared."""

    def __init__(
        self,
        program: Program,
        weights: Mapping[str, WeightSource] | None = None,
        backend: Backend | None = None,
        states: StatesSource | None = None,
    ) -> None:
        self.program = program
        self.weights = dict(weights or {})
        self.backend = backend if backend is not None else runtime.open()
        self.types = state_types(program)
        self.states: dict[str, np.ndarray] = {
            name: np.zeros(t.shape, _buffer_dtype(t))  # type: ignore[arg-type]  # static: ints
            for name, t in self.types.items()
        }
        self.kernels: dict[str, Kernel] = {}
        if states is not None:
            self.load_states(states)

    def kernel(self, function: str) -> Kernel:
        """The loaded kernel of ``function`` (compiled on first use), using the shared states."""
        kernel = self.kernels.get(function)
        if kernel is None:
            kernel = self.backend.compile(self.program, self.weights, function=function).load()
            kernel.states = self.states
            self.kernels[function] = kernel
        return kernel

    def run(self, function: str, **inputs: Any) -> dict[str, np.ndarray]:
        """Outputs of one call of ``function``; its states are read and left updated for the next call."""
        return self.kernel(function)(**inputs)

    def reset(self) -> None:
        """Every state back to zero (a new sequence)."""
        for buf in self.states.values():
            buf[...] = 0

    def load_states(self, source: StatesSource) -> None:
        """Set every state from a states file (``.npz``) or a mapping: the same names and shapes as the
        program's states, no more, no fewer."""
        if isinstance(source, Mapping):
            self._set(dict(source), "the states given")
            return
        path = Path(source)
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
        except (OSError, ValueError, EOFError) as e:  # missing, unreadable, not an .npz (or a pickle)
            raise AnekitError(f"[session] cannot read states from {path}: {e}") from e
        self._set(arrays, str(path))

    def _set(self, arrays: dict[str, Any], where: str) -> None:
        missing = [name for name in self.types if name not in arrays]
        unknown = [name for name in arrays if name not in self.types]
        if missing or unknown:
            problem = f"no value for state '{missing[0]}'" if missing else f"no state is named '{unknown[0]}'"
            raise AnekitError(
                f"[session] {where}: {problem} (the program's states: {', '.join(self.types) or 'none'})"
            )
        values = {}
        for name, t in self.types.items():
            a = np.asarray(arrays[name])
            if a.shape != t.shape or a.dtype.kind not in "fiub":
                raise AnekitError(
                    f"[session] {where}: state '{name}' is a {list(a.shape)} {a.dtype} array, "
                    f"expected {t} ({list(t.shape)} numbers)"
                )
            with np.errstate(over="ignore"):  # past the fp16 range is inf, as an op would store it
                values[name] = a.astype(_file_dtype(t)).astype(_buffer_dtype(t))  # in the state's dtype
        for name, v in values.items():  # all checked first: a bad file changes nothing
            self.states[name][...] = v

    def save_states(self, path: str | os.PathLike[str]) -> Path:
        """Write every state to ``path`` (``.npz``, atomically), each in its declared dtype."""
        path = Path(path)
        arrays = {name: self.states[name].astype(_file_dtype(t)) for name, t in self.types.items()}
        with atomic_write(path) as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        return path

    def close(self) -> None:
        for kernel in self.kernels.values():
            kernel.close()
        self.kernels.clear()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
