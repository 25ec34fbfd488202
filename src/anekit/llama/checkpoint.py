"""BLZT training checkpoints (the ANE training reference's format): header, weights, Adam state.

All values are little-endian. The header is the reference's C struct ``CkptHdr`` written with
``fwrite(&h, sizeof(h), 1, f)``, so its layout is whatever the C compiler gives that struct: every
scalar aligned to its own size, the whole struct to its widest member::

    offset  size  field
    0       4     i32 magic            0x424C5A54 (the bytes "TZLB"; "BLZT" read as a big-endian int)
    4       4     i32 version          2
    8       4     i32 step             optimizer steps done; a resumed run continues here
    12      4     i32 total_steps
    16      4     i32 n_layers         \
    20      4     i32 vocab_size        |
    24      4     i32 dim               |  the model's shape (n_kv_heads is not stored: see below)
    28      4     i32 hidden_dim        |
    32      4     i32 n_heads           |
    36      4     i32 seq_len          /
    40      4     f32 lr               learning rate at save time
    44      4     f32 loss             last loss
    48      8     f64 cum_compile      cumulative milliseconds compiling kernels
    56      8     f64 cum_train        cumulative milliseconds in training steps
    64      8     f64 cum_wall         cumulative wall-clock milliseconds
    72      4     i32 cum_steps
    76      4     i32 cum_batches      accumulation batches (one kernel recompile each, in baked mode)
    80      4     i32 adam_t           Adam timestep, for the bias correction
    84      12    i32 pad[3]           written as zeros, ignored on read
    96            end of header: the struct is 96 bytes

The reference's documentation calls this a 128-byte header, but the struct it declares (ten ints, two
floats, three doubles, six ints) packs to 96 bytes, and the reference's own save / load move
``sizeof(CkptHdr)`` bytes. This module follows the struct: the doubles land at 48, already 8-byte
aligned, so the compiler inserts no padding and the header is 96 bytes (asserted at import).

Then float32 arrays, each in its llama2.c row-major layout (``anekit.llama.params``), in the order of
the reference's ``save_checkpoint``::

    for each layer:   wq wk wv wo w1 w2 w3 rms_att rms_ffn                 (the weights)
                      wq.m wq.v wk.m wk.v ... rms_att.m rms_att.v rms_ffn.m rms_ffn.v   (Adam moments)
    rms_final  rms_final.m  rms_final.v
    embed      embed.m      embed.v                                       (the tied classifier)
    [wcls      wcls.m       wcls.v]                                       (anekit extension, below)

Format facts and choices:

* ``n_kv_heads`` is not in the header: wk and wv are (kv_dim, dim). Without a config, a file is read
  as ``n_kv_heads == n_heads`` (the reference only trains multi-head attention); a grouped-query model
  loads when ``cfg`` gives its ``n_kv_heads``, and the file size is checked against it.
* The reference ties the classifier to the embedding. A model with its own classifier (llama2.c's
  unshared ``wcls``) gets ``wcls`` and its Adam moments appended after the embedding's: the file is
  then exactly ``3 * vocab_size * dim`` floats longer, which is how the reader tells. The reference's
  C loader stops before those bytes, so it reads such a file as a tied model.
* ``lr`` and ``loss`` are float32 in the file: they come back rounded to float32.
* Writes are atomic (``atomic_write``): a temporary file beside the target, fsync'd, then renamed over
  it, so a crash or kill during a save leaves the previous checkpoint intact.
* Reading for training (``load_checkpoint_file``) gives writable arrays in memory; ``open_checkpoint``
  maps the file read-only instead (sampling, inspecting), so a checkpoint larger than RAM reads too.

The run record (anekit extension). ``anekit train`` appends, after the body, everything a resumed run
needs besides the tensors — the full model config (``n_kv_heads`` included), the training config,
the loss history, data and tokenizer identities — so that a checkpoint and its run state are one
file, replaced by one rename::

    offset        size  field
    body_end      n     run record: UTF-8 JSON object, keys sorted, no spaces (``RUN_FORMAT``)
    size - 24     8     char[8] magic     "ANEKRUN\0"
    size - 16     4     u32 version       1
    size - 12     4     u32 crc32         of the n JSON bytes
    size - 8      8     u64 n             length of the JSON
                        end of file: size = checkpoint_size(cfg) + n + 24

A record whose ``format`` is ``RUN_FORMAT`` (the one ``anekit train`` writes) is checked on every load
against ``RUN_SCHEMA`` — every field, its type and its range, declared once as data in
``anekit.llama.run_record`` — so a damaged
record, even one with a valid CRC, is one FormatError naming the field path; the JSON is read with
``anekit.jsonio``'s size and depth limits.

A file without the footer's magic has no run record. The reference's C loader reads a fixed number of
floats after the header and never looks at the bytes after them, so it loads such a file unchanged.
Without a config and without a run record, ``n_kv_heads = n_heads`` (the reference's files); the size
alone cannot tell ``n_kv_heads`` apart from other shape changes (a smaller kv_dim can exactly offset a
larger hidden_dim), so it is never silently inferred here (``anekit inspect`` shows a guess, flagged).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO, Union

import numpy as np

from anekit.binfmt import Field, Record, writable_bytes
from anekit.errors import AnekitError, FormatError
from anekit.fileio import atomic_write
from anekit.jsonio import JsonError
from anekit.jsonio import loads as json_loads
from anekit.kernels.config import ModelConfig
from anekit.llama.params import LAYER_FIELDS, LayerParams, Params, layer_shapes, map_file
from anekit.llama.run_record import RUN_FORMAT, RUN_SCHEMA, check_run_record

__all__ = [
    "BLZT_LAYER_ORDER",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "VERSION",
    "RUN_FOOTER",
    "Checkpoint",
    "CheckpointMeta",
    "RUN_FORMAT",
    "RUN_SCHEMA",
    "atomic_write",
    "build_checkpoint",
    "check_run_record",
    "checkpoint_size",
    "load_checkpoint",
    "load_checkpoint_file",
    "open_checkpoint",
    "parse_checkpoint",
    "read_checkpoint",
    "read_run_record",
    "save_checkpoint",
]

FORMAT = "blzt"
MAGIC = 0x424C5A54
VERSION = 2
BLZT_LAYER_ORDER = ("wq", "wk", "wv", "wo", "w1", "w2", "w3", "rms_att", "rms_ffn")
assert sorted(BLZT_LAYER_ORDER) == sorted(LAYER_FIELDS)

PathOrBytes = Union[str, os.PathLike, bytes, bytearray, memoryview]


def _c_struct(name: str, members: tuple[tuple[str, str], ...]) -> Record:
    """A Record whose field offsets are where a C compiler puts the members: each scalar aligned to
    its own size (the natural alignment of int32 / float32 / float64 on every ABI anekit runs on)."""
    out, offset, widest = [], 0, 1
    for field_name, code in members:
        size = struct.calcsize("<" + code)
        offset += -offset % size
        out.append(Field(field_name, code, offset))
        offset += size
        widest = max(widest, size)
    offset += -offset % widest
    return Record(name, out, size=offset)


HEADER = _c_struct(
    "CkptHdr",
    (
        *((k, "i") for k in ("magic", "version", "step", "total_steps")),
        *((k, "i") for k in ("n_layers", "vocab_size", "dim", "hidden_dim", "n_heads", "seq_len")),
        ("lr", "f"),
        ("loss", "f"),
        ("cum_compile", "d"),
        ("cum_train", "d"),
        ("cum_wall", "d"),
        ("cum_steps", "i"),
        ("cum_batches", "i"),
        ("adam_t", "i"),
        ("pad0", "i"),
        ("pad1", "i"),
        ("pad2", "i"),
    ),
)
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 96 and HEADER.offset_of("cum_compile") == 48 and HEADER.offset_of("pad0") == 84

RUN_MAGIC = b"ANEKRUN\0"
RUN_VERSION = 1
RUN_FOOTER = Record(
    "RunFooter",
    (Field("magic", "8s", 0), Field("version", "I", 8), Field("crc32", "I", 12), Field("size", "Q", 16)),
    size=24,
)
assert len(RUN_MAGIC) == 8

_FLOAT_FIELDS = frozenset(f.name for f in HEADER.fields if f.code in ("f", "d"))
_F32_FIELDS = frozenset(f.name for f in HEADER.fields if f.code == "f")
SHAPE_FIELDS = ("n_layers", "vocab_size", "dim", "hidden_dim", "n_heads", "seq_len")
_INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class CheckpointMeta:
    """The training state a BLZT header carries besides the model's shape."""

    step: int = 0  # optimizer steps done: a resumed run starts at this step
    total_steps: int = 0
    lr: float = 0.0  # stored as float32
    loss: float = 0.0  # last loss, stored as float32
    cum_compile: float = 0.0  # cumulative ms compiling kernels, across restarts
    cum_train: float = 0.0  # cumulative ms in training steps
    cum_wall: float = 0.0  # cumulative wall-clock ms
    cum_steps: int = 0
    cum_batches: int = 0  # accumulation batches done (baked mode recompiles once per batch)
    adam_t: int = 0  # Adam timestep for bias correction (0: no update yet)


_META_FIELDS = tuple(f.name for f in fields(CheckpointMeta))


# --------------------------------------------------------------------------------------------------------
# the body layout, declared once: parse, build and size all walk this list
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tensor:
    """One float32 array of the body: which container it belongs to, where in it, and its shape."""

    label: str  # e.g. "layers.3.wq.m"
    slot: int  # 0 params, 1 adam_m, 2 adam_v
    key: str  # field of LayerParams, or "rms_final" / "embed" / "wcls"
    layer: int | None
    shape: tuple[int, ...]

    @property
    def count(self) -> int:
        return int(np.prod(self.shape))


_SLOT_SUFFIX = ("", ".m", ".v")


def _body(cfg: ModelConfig, untied: bool) -> list[_Tensor]:
    shapes = layer_shapes(cfg)
    out: list[_Tensor] = []
    for i in range(cfg.n_layers):
        out += [_Tensor(f"layers.{i}.{k}", 0, k, i, shapes[k]) for k in BLZT_LAYER_ORDER]
        for k in BLZT_LAYER_ORDER:
            out += [_Tensor(f"layers.{i}.{k}{_SLOT_SUFFIX[s]}", s, k, i, shapes[k]) for s in (1, 2)]
    head = [("rms_final", (cfg.dim,)), ("embed", (cfg.vocab_size, cfg.dim))]
    if untied:
        head.append(("wcls", (cfg.vocab_size, cfg.dim)))
    for key, shape in head:
        out += [_Tensor(f"{key}{_SLOT_SUFFIX[s]}", s, key, None, shape) for s in (0, 1, 2)]
    return out


def checkpoint_size(cfg: ModelConfig, untied: bool = False) -> int:
    """Bytes of a BLZT file for this model (header included), by arithmetic: the same sum as walking
    ``_body``, without one entry per layer, so a hostile header's n_layers costs nothing to size."""
    per_layer = sum(int(np.prod(shape)) for shape in layer_shapes(cfg).values())
    head = cfg.dim + cfg.vocab_size * cfg.dim * (2 if untied else 1)  # rms_final, embed [, wcls]
    return HEADER_SIZE + 4 * 3 * (cfg.n_layers * per_layer + head)  # weights, adam m, adam v


def _get(p: Params, t: _Tensor) -> np.ndarray | None:
    return getattr(p if t.layer is None else p.layers[t.layer], t.key)


# --------------------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------------------


def _check_int32(field: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or not _INT32[0] <= int(value) <= _INT32[1]:
        raise FormatError(
            FORMAT, field, "must be an int32", offset=HEADER.offset_of(field), expected="int32", actual=value
        )
    return int(value)


def _header_bytes(cfg: ModelConfig, meta: CheckpointMeta) -> bytes:
    values: dict[str, Any] = {"magic": MAGIC, "version": VERSION}
    for key in SHAPE_FIELDS:
        values[key] = _check_int32(key, getattr(cfg, key))
    for key in _META_FIELDS:
        value = getattr(meta, key)
        if key not in _FLOAT_FIELDS:
            values[key] = _check_int32(key, value)
        elif not isinstance(value, (int, float, np.integer, np.floating)):
            raise FormatError(
                FORMAT, key, "must be a number", offset=HEADER.offset_of(key), expected="float", actual=value
            )
        elif key in _F32_FIELDS and np.isfinite(value) and abs(value) > float(np.finfo(np.float32).max):
            raise FormatError(
                FORMAT,
                key,
                "does not fit a float32",
                offset=HEADER.offset_of(key),
                expected="|x| <= 3.4e38",
                actual=float(value),
            )
        else:
            values[key] = float(value)
    return HEADER.build(**values)


def _checked(params: Params, adam_m: Params, adam_v: Params) -> list[tuple[_Tensor, np.ndarray]]:
    """Every tensor to write, in file order, after checking the three containers against the layout."""
    cfg = params.cfg
    untied = params.wcls is not None
    beyond = [what for what in cfg.llama2c_problems() if not what.startswith(("rope_theta", "RMSNorm"))]
    if beyond:  # BLZT holds llama2.c's tensors; the run record keeps rope_theta and the epsilon
        raise AnekitError(f"[{FORMAT}] a BLZT checkpoint cannot hold {cfg.name}: it has {'; '.join(beyond)}")
    for name, c in (("adam_m", adam_m), ("adam_v", adam_v)):
        if len(c.layers) != cfg.n_layers:
            raise AnekitError(f"[{FORMAT}] {name} has {len(c.layers)} layers, the model {cfg.n_layers}")
        if (c.wcls is not None) != untied:
            raise AnekitError(
                f"[{FORMAT}] {name} {'has' if c.wcls is not None else 'lacks'} a wcls moment but the "
                f"model's classifier is {'untied' if untied else 'tied'}"
            )
    if len(params.layers) != cfg.n_layers:
        raise AnekitError(f"[{FORMAT}] params has {len(params.layers)} layers, cfg.n_layers {cfg.n_layers}")
    out = []
    containers = (params, adam_m, adam_v)
    for t in _body(cfg, untied):
        a = np.asarray(_get(containers[t.slot], t))
        if a.shape != t.shape:
            raise AnekitError(f"[{FORMAT}] {t.label}: shape {a.shape}, the model needs {t.shape}")
        out.append((t, a))
    return out


def _write(f: BinaryIO, header: bytes, tensors: list[tuple[_Tensor, np.ndarray]]) -> None:
    f.write(header)
    for _, a in tensors:
        _write_array(f, a)


# A tensor of at least this many bytes whose bits are all zero (a fresh run's Adam moments: two thirds of
# its step-0 checkpoint) is skipped with a seek instead of written: the file gets a hole there, which reads
# back as zeros (or zeros are written by a file system without holes). Bits, not values: -0.0 is written.
HOLE_MIN_BYTES = 1 << 16


def _write_array(f: BinaryIO, a: np.ndarray) -> None:
    a = np.ascontiguousarray(a, dtype="<f4")
    if a.nbytes >= HOLE_MIN_BYTES and not a.view(np.uint32).any():
        f.seek(a.nbytes, os.SEEK_CUR)
        return
    f.write(memoryview(a).cast("B"))


def _run_bytes(run: dict[str, Any] | None) -> bytes:
    """The run record and its footer (empty without a record)."""
    if run is None:
        return b""
    if not isinstance(run, dict):
        raise AnekitError(f"[{FORMAT}] the run record must be a dict, got {type(run).__name__}")
    try:
        text = json.dumps(run, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise AnekitError(f"[{FORMAT}] the run record is not plain finite JSON: {e}") from e
    raw = text.encode("utf-8")
    footer = RUN_FOOTER.build(magic=RUN_MAGIC, version=RUN_VERSION, crc32=zlib.crc32(raw), size=len(raw))
    return raw + footer


def save_checkpoint(
    path: str | os.PathLike,
    params: Params,
    adam_m: Params,
    adam_v: Params,
    meta: CheckpointMeta,
    run: dict[str, Any] | None = None,
) -> None:
    """Write a BLZT checkpoint atomically, with ``run`` as its run record when given: the tensors
    and the run state land in one rename, so no reader ever sees one without the other.
    ``params.cfg`` gives the header's shape fields; ``adam_m`` / ``adam_v`` have the shapes of
    ``params`` (``params.zeros_like()`` makes them)."""
    header = _header_bytes(params.cfg, meta)
    tensors = _checked(params, adam_m, adam_v)
    trailer = _run_bytes(run)
    try:
        with atomic_write(path) as f:
            _write(f, header, tensors)
            if trailer:
                f.write(trailer)
            f.truncate(f.tell())  # the size, should the last tensor have been a hole
    except OSError as e:
        from anekit.outputs import reason

        raise AnekitError(f"[{FORMAT}] cannot write checkpoint {path}: {reason(e)}") from e


def build_checkpoint(
    params: Params,
    adam_m: Params,
    adam_v: Params,
    meta: CheckpointMeta,
    run: dict[str, Any] | None = None,
) -> bytes:
    """The bytes ``save_checkpoint`` writes."""
    tensors = _checked(params, adam_m, adam_v)
    parts = [_header_bytes(params.cfg, meta)]
    parts += [np.ascontiguousarray(a, dtype="<f4").tobytes() for _, a in tensors]
    parts.append(_run_bytes(run))
    return b"".join(parts)


# --------------------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------------------


def _read_all(source: PathOrBytes, cfg: ModelConfig | None) -> tuple[np.ndarray, str]:
    """The file's bytes as a writable uint8 array (so loaded tensors can be trained in place).

    A file is first mapped and decoded (views only, nothing read but the header and the run record), so
    a header that disagrees with the file's size, or a file far larger than its header says, is refused
    before its bytes are copied into memory."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return np.frombuffer(source, np.uint8).copy(), "checkpoint"
    name = Path(source).stem
    try:
        os.stat(source)
    except OSError as e:
        raise AnekitError(f"[{FORMAT}] cannot read checkpoint {source}: {e.strerror}") from e
    mapped = map_file(source, f"[{FORMAT}] checkpoint")
    _decode(mapped, cfg, name)  # the structure checked against the size before any copy
    try:
        return np.array(mapped), name
    except MemoryError as e:
        raise AnekitError(
            f"[{FORMAT}] checkpoint {source} ({mapped.size} bytes) does not fit in memory"
        ) from e


def _config_from_header(h: dict[str, Any], cfg: ModelConfig | None, name: str) -> ModelConfig:
    for key in SHAPE_FIELDS:
        if h[key] <= 0:
            raise FormatError(
                FORMAT, key, "must be positive", offset=HEADER.offset_of(key), expected="> 0", actual=h[key]
            )
    if cfg is not None:
        for key in SHAPE_FIELDS:
            if h[key] != getattr(cfg, key):
                raise FormatError(
                    FORMAT,
                    key,
                    f"the file's model does not match the config '{cfg.name}'",
                    offset=HEADER.offset_of(key),
                    expected=getattr(cfg, key),
                    actual=h[key],
                )
        return cfg
    if h["dim"] % h["n_heads"]:
        raise FormatError(
            FORMAT,
            "n_heads",
            f"does not divide dim {h['dim']}",
            offset=HEADER.offset_of("n_heads"),
            expected=f"a divisor of {h['dim']}",
            actual=h["n_heads"],
        )
    shape = {k: h[k] for k in SHAPE_FIELDS}
    return ModelConfig(n_kv_heads=h["n_heads"], name=name, **shape)


def _size_error(cfg: ModelConfig, size: int, given_cfg: bool) -> FormatError:
    tied, untied = checkpoint_size(cfg), checkpoint_size(cfg, untied=True)
    hint = ""
    if not given_cfg:  # does another n_kv_heads explain the size? (the header does not store it)
        for kv in range(1, cfg.n_heads):
            if cfg.n_heads % kv == 0 and size in (
                checkpoint_size(cfg.with_(n_kv_heads=kv)),
                checkpoint_size(cfg.with_(n_kv_heads=kv), untied=True),
            ):
                hint = f"; it fits n_kv_heads = {kv}: pass a cfg with n_kv_heads={kv}"
    truncated = f"truncated at byte {size}, expected {tied}: " if size < tied else ""
    return FormatError(
        FORMAT,
        "file size",
        f"{truncated}the header's shape fields (n_kv_heads = {cfg.n_kv_heads}) need {tied} bytes, or "
        f"{untied} with an untied classifier{hint}",
        offset=size if size < tied else None,
        expected=tied,
        actual=size,
    )


@dataclass(frozen=True)
class Checkpoint:
    """A decoded BLZT file: the tensors, the header's training fields and the run record, if any."""

    params: Params
    adam_m: Params
    adam_v: Params
    meta: CheckpointMeta
    run: dict[str, Any] | None  # anekit's run record (None: a plain BLZT file)
    kv_source: str  # where n_kv_heads came from: "config", "run record" or "header" (= n_heads)


def _split_run(buf: np.ndarray) -> tuple[int, dict[str, Any] | None]:
    """(where the body ends, the run record) of a whole file; (size, None) when it has no record."""
    size = int(buf.size)
    if size < HEADER_SIZE + RUN_FOOTER.size:
        return size, None
    at = size - RUN_FOOTER.size
    foot = RUN_FOOTER.parse(buf[at:].tobytes())
    if foot["magic"] != RUN_MAGIC:
        return size, None
    if foot["version"] != RUN_VERSION:
        raise FormatError(
            FORMAT,
            "run record version",
            "unsupported run record version",
            offset=at + RUN_FOOTER.offset_of("version"),
            expected=RUN_VERSION,
            actual=foot["version"],
        )
    n = foot["size"]
    if n > at - HEADER_SIZE:
        raise FormatError(
            FORMAT,
            "run record size",
            "larger than the file before the footer",
            offset=at + RUN_FOOTER.offset_of("size"),
            expected=f"<= {at - HEADER_SIZE}",
            actual=n,
        )
    raw = buf[at - n : at].tobytes()
    if zlib.crc32(raw) != foot["crc32"]:
        raise FormatError(
            FORMAT,
            "run record crc32",
            "the run record is damaged",
            offset=at + RUN_FOOTER.offset_of("crc32"),
            expected=hex(foot["crc32"]),
            actual=hex(zlib.crc32(raw)),
        )
    try:
        run = json_loads(raw, f"[{FORMAT}] run record")
    except JsonError as e:
        raise FormatError(
            FORMAT, "run record", str(e).removeprefix(f"[{FORMAT}] run record: "), offset=at - n
        ) from e
    if not isinstance(run, dict):
        raise FormatError(FORMAT, "run record", "not a JSON object", offset=at - n, actual=type(run).__name__)
    if run.get("format") == RUN_FORMAT:  # anekit train's own record: every field checked (RUN_SCHEMA)
        check_run_record(run)
    return at - n, run


def _config_from_run(run: dict[str, Any], h: dict[str, Any], name: str, offset: int) -> ModelConfig | None:
    """The model config a run record holds, checked against the header's shape fields."""
    spec = run.get("config")
    if not isinstance(spec, dict):
        return None
    known = {f.name for f in fields(ModelConfig)}
    try:
        cfg = ModelConfig(
            **{k: v for k, v in spec.items() if k in known and k != "name"}, name=spec.get("name", name)
        )
    except (TypeError, AnekitError) as e:
        raise FormatError(FORMAT, "run record config", f"not a model config: {e}", offset=offset) from e
    for key in SHAPE_FIELDS:
        if getattr(cfg, key) != h[key]:
            raise FormatError(
                FORMAT,
                f"run record config.{key}",
                "disagrees with the header",
                offset=offset,
                expected=h[key],
                actual=getattr(cfg, key),
            )
    return cfg


def _fits(cfg: ModelConfig, size: int) -> bool | None:
    """True (untied) or False (tied) when the body size fits ``cfg``, None when it does not."""
    if size == checkpoint_size(cfg):
        return False
    if size == checkpoint_size(cfg, untied=True):
        return True
    return None


def read_checkpoint(
    data: bytes | bytearray | memoryview | np.ndarray,
    cfg: ModelConfig | None = None,
    *,
    name: str = "checkpoint",
) -> Checkpoint:
    """Decode a BLZT checkpoint from memory, run record included.

    The model config is ``cfg`` when given (the header must agree with it), else the run record's,
    else the header's shape with ``n_kv_heads = n_heads``. The returned arrays are
    views of one float32 buffer (a writable copy when ``data`` is read-only).
    """
    return _decode(writable_bytes(data), cfg, name)


def open_checkpoint(path: str | os.PathLike, cfg: ModelConfig | None = None) -> Checkpoint:
    """A BLZT checkpoint whose arrays are read-only views of a map of the file (``read_checkpoint``'s
    config rules): nothing is read until used, so sampling or inspecting a checkpoint larger than RAM
    works. Training, which updates the arrays, reads with ``load_checkpoint_file``."""
    return _decode(map_file(path, f"[{FORMAT}] checkpoint"), cfg, Path(path).stem)


def _decode(buf: np.ndarray, cfg: ModelConfig | None, name: str) -> Checkpoint:
    """The checkpoint whose file bytes are ``buf`` (uint8): its arrays are views of ``buf``."""
    if buf.size < HEADER_SIZE:
        raise FormatError(
            FORMAT, "header", "file too short for the header", offset=0, expected=HEADER_SIZE, actual=buf.size
        )
    h = HEADER.parse(buf[:HEADER_SIZE].tobytes())
    if h["magic"] != MAGIC:
        hint = (
            " (this looks like a llama2.c model file: see anekit.llama.llama2c)"
            if h["magic"] == 0x616B3432
            else ""
        )
        raise FormatError(
            FORMAT,
            "magic",
            f"not a BLZT checkpoint{hint}",
            offset=0,
            expected=hex(MAGIC),
            actual=hex(h["magic"]),
        )
    if h["version"] != VERSION:
        raise FormatError(
            FORMAT,
            "version",
            "unsupported BLZT version: anekit reads the reference's version 2 (forks' later versions "
            "reuse the header's padding for other fields)",
            offset=HEADER.offset_of("version"),
            expected=VERSION,
            actual=h["version"],
        )
    size, run = _split_run(buf)
    kv_source = "config"
    if cfg is None and run is not None:
        cfg = _config_from_run(run, h, name, size)
        kv_source = "run record"
    model = _config_from_header(h, cfg, name)
    untied = _fits(model, size)
    if untied is None:
        raise _size_error(model, size, cfg is not None)
    if cfg is None and kv_source == "config":
        kv_source = "header"

    floats = buf[HEADER_SIZE:size].view("<f4")
    found: dict[tuple[int, str, int | None], np.ndarray] = {}
    pos = 0
    for t in _body(model, untied):
        found[t.slot, t.key, t.layer] = floats[pos : pos + t.count].reshape(t.shape)
        pos += t.count

    def container(slot: int) -> Params:
        layers = [LayerParams(**{k: found[slot, k, i] for k in LAYER_FIELDS}) for i in range(model.n_layers)]
        wcls = found[slot, "wcls", None] if untied else None
        return Params(model, found[slot, "embed", None], layers, found[slot, "rms_final", None], wcls)

    meta = CheckpointMeta(**{k: h[k] for k in _META_FIELDS})
    return Checkpoint(container(0), container(1), container(2), meta, run, kv_source)


def parse_checkpoint(
    data: bytes | bytearray | memoryview | np.ndarray,
    cfg: ModelConfig | None = None,
    *,
    name: str = "checkpoint",
) -> tuple[Params, Params, Params, CheckpointMeta]:
    """Decode a BLZT checkpoint from memory: ``(params, adam_m, adam_v, meta)`` (``read_checkpoint``
    without the run record)."""
    ck = read_checkpoint(data, cfg, name=name)
    return ck.params, ck.adam_m, ck.adam_v, ck.meta


def load_checkpoint(
    path: PathOrBytes, cfg: ModelConfig | None = None
) -> tuple[Params, Params, Params, CheckpointMeta]:
    """Read a BLZT checkpoint (a path, or its bytes): ``(params, adam_m, adam_v, meta)``.

    Without ``cfg`` the model config comes from the header with ``n_kv_heads = n_heads`` and the file's
    name; with ``cfg`` the header must agree with it (FormatError naming the field otherwise).
    """
    buf, name = _read_all(path, cfg)
    return parse_checkpoint(buf, cfg, name=name)


def read_run_record(path: PathOrBytes) -> dict[str, Any] | None:
    """Only the run record of a BLZT file (None when it has none); the body is neither read nor decoded."""
    if isinstance(path, (bytes, bytearray, memoryview)):
        return _split_run(np.frombuffer(path, np.uint8))[1]
    return _split_run(map_file(path, f"[{FORMAT}] checkpoint"))[1]


def load_checkpoint_file(path: PathOrBytes, cfg: ModelConfig | None = None) -> Checkpoint:
    """Read a BLZT checkpoint (a path, or its bytes) with its run record (``read_checkpoint``)."""
    buf, name = _read_all(path, cfg)
    return read_checkpoint(buf, cfg, name=name)
