"""Exported packages run in the simulator as the sampler's decoder: states held across calls.

One package (``prefill`` / ``decode``) or a chain of shards (``shards.json``) becomes an object with
``forward(tokens, pos) -> logits``, what ``anekit.llama.sample.Sampler`` drives. Each stage compiles
both functions once; its decode kernel shares the prefill kernel's state buffers
(``decode.states = prefill.states``), so the KV cache written by prefill is what decode reads, and it
stays in the kernels between calls, never passed in or out (law 8).

Strictness: the strict simulator applies the rule book for the CoreML route (``route="coreml"``): the
rules about the direct path's IOSurfaces, descriptor and dialect do not hold for a package, whose
buffers CoreML allocates (a decode step's ``[1, C, 1, 1]`` I/O would break them by construction).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anekit.coreml.export import FUNCTIONS
from anekit.coreml.shards import CALLER, SHARDS_FILE, read_manifest
from anekit.errors import AnekitError
from anekit.mil import types as T
from anekit.mil.ir import Program
from anekit.rules.checks import check_function, errors
from anekit.runtime.base import Kernel
from anekit.runtime.sim import SimBackend


@dataclass(frozen=True)
class PackageShape:
    """What the sampler needs to know of an exported model: its vocabulary and context."""

    vocab_size: int
    seq_len: int


@dataclass
class _StageKernels:
    name: str
    prefill: Kernel
    decode: Kernel
    sources: dict[str, str]  # input name -> "caller" or "<stage>:<output>"


def package_findings(program: Program, chip: str = "any") -> list[Any]:
    """The error findings of every function of an exported program, for the CoreML route."""
    found = []
    for fn in program.functions.values():
        found += errors(check_function(program, fn, chip, route="coreml"))
    return found


def compile_stage(
    name: str, program: Program, weights: Mapping[str, Any], backend: SimBackend, sources: dict[str, str]
) -> _StageKernels:
    missing = [f for f in FUNCTIONS if f not in program.functions]
    if missing:
        raise AnekitError(
            f"[sample] {name} has no function {missing[0]!r} (it has: {', '.join(program.functions)})"
        )
    prefill = backend.compile(program, dict(weights), function="prefill").load()
    decode = backend.compile(program, dict(weights), function="decode").load()
    decode.states = prefill.states  # one KV cache, written by prefill, read and updated by decode
    return _StageKernels(name, prefill, decode, sources)


class PackageDecoder:
    """The sampler's decoder over exported stages (one package, or shards in order)."""

    def __init__(self, stages: Sequence[_StageKernels]) -> None:
        if not stages:
            raise AnekitError("[sample] an export with no packages")
        self.stages = list(stages)
        first = self.stages[0].prefill
        last = self.stages[-1].decode
        tokens = first.inputs[first.input_names.index("tokens")] if "tokens" in first.input_names else None
        if tokens is None or "logits" not in last.output_names:
            raise AnekitError("[sample] the first package must take 'tokens' and the last return 'logits'")
        vocab = last.outputs[last.output_names.index("logits")].shape[1]
        self.cfg = PackageShape(vocab_size=int(vocab), seq_len=int(tokens.shape[2]))

    @staticmethod
    def from_programs(
        programs: Sequence[tuple[str, Program, Mapping[str, Any]]],
        precision: str = "ane",
        strict: bool = True,
    ) -> PackageDecoder:
        """Stages from (name, program, weights) in chain order; each stage's x is the previous y."""
        backend = SimBackend(compile_budget=10**6, precision=precision, strict=strict, route="coreml")
        stages = []
        previous = None
        for name, program, weights in programs:
            sources = {
                v.name: (f"{previous}:y" if v.name == "x" else CALLER)
                for fn in program.functions.values()
                for v in fn.inputs
                if not isinstance(v.type, T.StateType)
            }
            stages.append(compile_stage(name, program, weights, backend, sources))
            previous = name
        return PackageDecoder(stages)

    @staticmethod
    def open(path: str | Path, precision: str = "ane", strict: bool = True) -> PackageDecoder:
        """An ``.mlpackage`` from ``anekit export``, or a sharded export (its directory or shards.json)."""
        path = Path(path)
        manifest_path = path / SHARDS_FILE if path.is_dir() and (path / SHARDS_FILE).is_file() else path
        if manifest_path.name == SHARDS_FILE:
            manifest = read_manifest(manifest_path)
            programs = []
            for shard in manifest["shards"]:
                pkg = _load(manifest_path.parent / shard["package"])
                programs.append((shard["package"], pkg.program, pkg.weights))
            return PackageDecoder.from_programs(programs, precision, strict)
        pkg = _load(path)
        return PackageDecoder.from_programs([(path.name, pkg.program, pkg.weights)], precision, strict)

    def reset(self) -> None:
        """Zero every KV cache (a new sequence)."""
        for stage in self.stages:
            for buf in stage.prefill.states.values():
                buf[...] = 0

    def _chain(self, mode: str, caller: dict[str, np.ndarray]) -> np.ndarray:
        outputs: dict[str, np.ndarray] = {}
        for stage in self.stages:
            kernel = stage.prefill if mode == "prefill" else stage.decode
            args = {}
            for name in kernel.input_names:
                source = stage.sources.get(name, CALLER)
                args[name] = caller[name] if source == CALLER else outputs[source]
            for out_name, value in kernel(**args).items():
                outputs[f"{stage.name}:{out_name}"] = value
        return outputs[f"{self.stages[-1].name}:logits"]

    def forward(self, tokens: Sequence[int] | np.ndarray, pos: int) -> np.ndarray:
        """Logits (vocab,) after running tokens at positions pos, pos+1, ...: a prompt at position 0 goes
        through ``prefill`` (padded to seq_len), later tokens one at a time through ``decode``."""
        ids = [int(t) for t in np.asarray(tokens).ravel()]
        s = self.cfg.seq_len
        if not ids or pos < 0 or pos + len(ids) > s:
            raise AnekitError(f"[sample] cannot run {len(ids)} token(s) at position {pos} (context {s})")
        one = (1, 1, 1, 1)
        if pos == 0:
            padded = np.zeros((1, 1, s, 1), np.int32)  # (1, 1, S, 1)
            padded[0, 0, : len(ids), 0] = ids
            last = np.full(one, len(ids) - 1, np.int32)
            return self._chain("prefill", {"tokens": padded, "last": last}).reshape(-1)  # (vocab,)
        logits = None
        for i, tok in enumerate(ids):
            caller = {"token": np.full(one, tok, np.int32), "pos": np.full(one, pos + i, np.int32)}
            logits = self._chain("decode", caller).reshape(-1)  # (vocab,)
        assert logits is not None
        return logits


def _load(path: Path) -> Any:
    try:
        from anekit.coreml import load_mlpackage
    except ImportError as e:
        raise AnekitError(f"[sample] reading .mlpackage files is not available here ({e})") from e
    return load_mlpackage(path)
