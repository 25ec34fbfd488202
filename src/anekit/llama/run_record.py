"""The run records anekit train writes, declared once as data: every field, its type and its range.

Two kinds of run share one vocabulary of field types (``Int``, ``Num``, ``Str``, ``Obj``...):

* ``RUN_SCHEMA`` (format ``RUN_FORMAT``): the record a BLZT checkpoint carries after its body
  (``anekit.llama.checkpoint``, which checks it on every load) for a run of a preset or a llama2.c model;
* ``HF_RUN_SCHEMA`` (format ``HF_RUN_FORMAT``): the record a Hugging Face fine-tuning run keeps in its
  state file's metadata (``anekit.hf.training``), checked before a resume reads it.

A record that breaks its schema, even one with a valid CRC, is one FormatError naming the field path and
what was expected (``[blzt] run record state.loss_scale: must be a finite number in (0, inf]``); a reader
never meets a missing key, a wrong type or a zero divisor. Fields not in a schema are kept unchecked (a
newer writer's additions).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from anekit.errors import FormatError
from anekit.kernels.route import ROUTES

FORMAT = "blzt"  # the format the errors name (the BLZT checkpoint's run record came first)
_INT32 = (-(2**31), 2**31 - 1)
INT32_MAX = _INT32[1]


RUN_FORMAT = "anekit train run"  # the "format" of the records ``anekit train`` writes (RUN_SCHEMA)
RUN_RECORD_VERSION = 1
_MAX_LIST = 1 << 31  # a list longer than any run (steps are int32)


@dataclass(frozen=True)
class Int:
    """An integer (not a bool) in lo .. hi."""

    lo: int = _INT32[0]
    hi: int = _INT32[1]

    def check(self, v: Any, path: str) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not self.lo <= v <= self.hi:
            _schema_error(path, f"an integer in {self.lo} .. {self.hi}", v)


@dataclass(frozen=True)
class Num:
    """A finite number in [lo, hi] (lo excluded when ``open_lo``, hi when ``open_hi``)."""

    lo: float = -math.inf
    hi: float = math.inf
    open_lo: bool = False
    open_hi: bool = False

    def check(self, v: Any, path: str) -> None:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ok = (
            ok
            and (self.lo < v if self.open_lo else self.lo <= v)
            and (v < self.hi if self.open_hi else v <= self.hi)
        )
        if not ok:
            left, right = "(["[not self.open_lo], ")]"[not self.open_hi]
            _schema_error(path, f"a finite number in {left}{self.lo:g}, {self.hi:g}{right}", v)


@dataclass(frozen=True)
class Str:
    """A string, one of ``choices`` when given, of ``length`` lowercase hex digits when given."""

    choices: tuple[str, ...] = ()
    hex_length: int = 0

    def check(self, v: Any, path: str) -> None:
        if not isinstance(v, str):
            _schema_error(path, "a string", v)
        if self.choices and v not in self.choices:
            _schema_error(path, f"one of {', '.join(map(repr, self.choices))}", v)
        if self.hex_length and (len(v) != self.hex_length or v.strip("0123456789abcdef")):
            _schema_error(path, f"{self.hex_length} lowercase hex digits", v)


@dataclass(frozen=True)
class Bool:
    """true or false."""

    def check(self, v: Any, path: str) -> None:
        if not isinstance(v, bool):
            _schema_error(path, "true or false", v)


@dataclass(frozen=True)
class Null:
    """``inner`` or null."""

    inner: Any

    def check(self, v: Any, path: str) -> None:
        if v is not None:
            self.inner.check(v, path)


@dataclass(frozen=True)
class Nothing:
    """Only null: a field the record's kind never sets (``Null(Nothing())`` is null and nothing else)."""

    def check(self, v: Any, path: str) -> None:
        _schema_error(path, "null", v)


@dataclass(frozen=True)
class ListOf:
    """A list whose every item is ``item``."""

    item: Any

    def check(self, v: Any, path: str) -> None:
        if not isinstance(v, list) or len(v) > _MAX_LIST:
            _schema_error(path, "a list", v)
        for i, x in enumerate(v):
            self.item.check(x, f"{path}[{i}]")


@dataclass(frozen=True)
class Pair:
    """A two-item list: ``first``, ``second``."""

    first: Any
    second: Any

    def check(self, v: Any, path: str) -> None:
        if not isinstance(v, list) or len(v) != 2:
            _schema_error(path, "a list of two items", v)
        self.first.check(v[0], f"{path}[0]")
        self.second.check(v[1], f"{path}[1]")


@dataclass(frozen=True)
class MapOf:
    """An object of string keys whose every value is ``value``."""

    value: Any

    def check(self, v: Any, path: str) -> None:
        if not isinstance(v, dict):
            _schema_error(path, "an object", v)
        for k, x in v.items():
            self.value.check(x, f"{path}.{k}")


@dataclass(frozen=True)
class Obj:
    """An object with these fields: ``required`` must be present, ``optional`` may be (a reader takes its
    default); other keys are kept unchecked (a newer writer's additions)."""

    required: dict[str, Any]
    optional: dict[str, Any]

    def check(self, v: Any, path: str) -> None:
        if not isinstance(v, dict):
            _schema_error(path, "an object", v)
        for key in self.required:
            if key not in v:
                where = f"{path}.{key}" if path else key
                raise FormatError(FORMAT, f"run record {where}", "must be present, but is missing")
        for key, spec in (*self.required.items(), *self.optional.items()):
            if key in v:
                spec.check(v[key], f"{path}.{key}" if path else key)


def _schema_error(path: str, expected: str, actual: Any) -> None:
    shown = actual if not isinstance(actual, (list, dict, str)) else json.dumps(actual)[:40]
    raise FormatError(FORMAT, f"run record {path}", f"must be {expected}, got {shown}")


# How a run spread its batches over processes: the world size of the last start, the order micro-batches
# are given to ranks in (rank r of N runs the global indices [r*k, (r+1)*k), k = accum / N: the global batch
# never depends on N), and (step, world size) of every start. Absent in older records (one process).
MICRO_ORDERS = ("global index blocks",)
WORLD_MAX = 65536
_WORLD = {
    "world": Int(1, WORLD_MAX),
    "micro_order": Str(MICRO_ORDERS),
    "worlds": ListOf(Pair(Int(0, _INT32[1]), Int(1, WORLD_MAX))),
    # the BLAS threads one sequence's products run on, fixed when the run starts: a float32 product's bits
    # depend on them, so every rank and every resume uses the same count whatever its cores
    "blas_threads": Int(1, 1024),
}


def world_fields(worlds: list[tuple[int, int]], blas_threads: int | None) -> dict[str, Any]:
    """The record's world fields for a run whose starts had ``worlds`` ((step, world size), in order) and
    whose sequences run on ``blas_threads`` BLAS threads (None: not fixed, an older run's)."""
    fields: dict[str, Any] = {
        "world": worlds[-1][1] if worlds else 1,
        "micro_order": MICRO_ORDERS[0],
        "worlds": [[step, size] for step, size in worlds],
    }
    if blas_threads is not None:
        fields["blas_threads"] = blas_threads
    return fields


_SHA256 = Str(hex_length=64)
_SOURCE = Obj({"path": Null(Str()), "sha256": _SHA256}, {})
_POSITIVE = Int(1, _INT32[1])
_RATE = Num(0.0, 1.0, open_lo=True)

# Every field of the record ``anekit train`` writes, with its type and range; ``check_run_record`` checks a
# record against it on every load, so a reader never meets a missing key, a wrong type or a zero divisor.
# The ``train`` fields are optional: a missing one takes TrainConfig's default (older records).
RUN_SCHEMA = Obj(
    required={
        "format": Str((RUN_FORMAT,)),
        "version": Int(RUN_RECORD_VERSION, RUN_RECORD_VERSION),
        "config": Obj(
            {
                k: _POSITIVE
                for k in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
            },
            {
                "rope": Bool(),
                "norm_eps": Num(0.0, 1.0, open_lo=True),
                "rope_theta": Num(0.0, open_lo=True),
                "name": Str(),
                # a BLZT checkpoint holds llama2.c's tensors only (``_checked``): these stay at their defaults
                "attn_head_dim": Int(0, 0),
                "qkv_bias": Bool(),
                "qk_norm": Bool(),
                "rope_scaling": Null(Nothing()),
            },
        ),
        "train": Obj(
            {},
            {
                "steps": _POSITIVE,
                "accum": Int(1, 65536),
                "lr": _RATE,
                "min_lr": Num(0.0, 1.0),
                "warmup": Int(0, _INT32[1]),
                "weight_decay": Num(0.0, 1.0),
                "beta1": Num(0.0, 1.0, open_hi=True),  # 1 would divide by zero in Adam's bias correction
                "beta2": Num(0.0, 1.0, open_hi=True),
                "grad_clip": Num(0.0, open_lo=True),
                "loss_scale": Num(0.0, open_lo=True),
                "seed": Int(0, 2**32 - 1),
                "weights": Str(("baked", "dynamic")),
                "route": Str(("", *ROUTES)),  # the training route's id; "" (and absent): the legacy kernels
            },
        ),
        "data": _SOURCE,
        "tokenizer": Obj(
            {"path": Null(Str()), "sha256": _SHA256, "file": Str(("tokenizer.model", "tokenizer.bin"))}, {}
        ),
        "state": Obj(
            {
                "step": Int(0, _INT32[1]),
                "adam_t": Int(0, _INT32[1]),
                "loss_scale": Num(0.0, open_lo=True),
                "losses": ListOf(Num()),
            },
            {"seconds": MapOf(Num(0.0))},
        ),
    },
    optional={
        "init": Null(_SOURCE),
        "marks": ListOf(Pair(Int(0, _INT32[1]), Str(("budget", "resume")))),
        **_WORLD,
    },
)


def check_run_record(rec: Any) -> dict[str, Any]:
    """``rec`` when it follows ``RUN_SCHEMA``; else FormatError naming the first wrong field's path and what
    was expected (e.g. ``[blzt] run record state.loss_scale: must be a finite number in (0, inf]``)."""
    RUN_SCHEMA.check(rec, "")
    return rec


# The record of a Hugging Face fine-tuning run (``anekit.hf.training``): its base model, tokenizer and data
# identities, the training config (the same fields as ``RUN_SCHEMA``'s), LoRA's spec or null (full
# fine-tuning), the window length, the validation settings and the state.
HF_RUN_FORMAT = "anekit.hf-run"
HF_RUN_VERSION = 1
_I32 = Int(0, INT32_MAX)
_LORA = Obj({"rank": Int(1, 4096), "alpha": Num(0.0, open_lo=True), "targets": ListOf(Str())}, {})
HF_RUN_SCHEMA = Obj(
    {
        "base": Obj({"path": Str(), "sha256": _SHA256}, {}),
        "tokenizer": _SOURCE,
        "data": _SOURCE,
        "train": RUN_SCHEMA.required["train"],
        "lora": Null(_LORA),
        "seq": Int(1, 32767),
        "val_every": _I32,
        "val_batches": Int(-1, INT32_MAX),
        "state": Obj(
            {
                "step": _I32,
                "adam_t": _I32,
                "loss_scale": Num(0.0, open_lo=True),
                "losses": ListOf(Num()),
                "val_losses": MapOf(Num()),
                "seconds": MapOf(Num(0.0)),
            },
            {"wall": Num(0.0)},
        ),
    },
    {"marks": ListOf(Pair(_I32, Str(("budget", "resume")))), **_WORLD},
)


def check_hf_run_record(rec: Any) -> dict[str, Any]:
    """``rec`` when it follows ``HF_RUN_SCHEMA``; else FormatError naming the first wrong field's path."""
    HF_RUN_SCHEMA.check(rec, "")
    return rec
