"""Recognise an artifact by its content and describe it through the decoder of its kind (``anekit inspect``).

Kinds are tried in a fixed order (``KINDS``: bundles, .hwx, MILBlob, BLZT, llama2.c model and tokenizer,
sentencepiece, E5, task descriptors, MIL text, property lists); the first whose content test accepts the
file wins, and the tests check that no two kinds accept the same file. The
decoders of compiled artifacts (``anekit.inspect.hwx``, ``.td``, ``.e5``) are imported only when their
turn comes and expose ``detect(data) -> bool`` and ``summarize(data) -> dict``; the other kinds are
described here through anekit's own readers (MILBlob, MIL text, llama2.c files, BLZT checkpoints,
sentencepiece models, CoreML bundles). Every summary is a JSON-able dict whose first keys are ``file``
and ``kind``; ``diff`` compares two summaries of one kind field by field.
"""

from __future__ import annotations

import importlib
import json
import plistlib
import stat
import struct
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from anekit import blob, jsonio
from anekit.errors import AnekitError, FormatError
from anekit.inputs import check_input, shown, stat_input

__all__ = [
    "KINDS",
    "Kind",
    "Source",
    "diff",
    "identify",
    "inspect_path",
    "render",
    "render_diff",
]

FMT = "inspect"
WHOLE_FILE_LIMIT = 16 << 20  # files up to this size are read whole for detection
HEAD_BYTES = 1 << 20  # what detection reads of a larger file
BYTE_DIFF_LIMIT = 256 << 20  # --diff compares raw bytes of files up to this size
CRC_FILE_LIMIT = 2 << 30  # a llama2.c model up to this size gets a CRC-32 per tensor (read, not mapped)
LIST_LIMIT = 24  # list items the text rendering shows (--json shows everything)


# --------------------------------------------------------------------------------------------------------
# sources and kinds
# --------------------------------------------------------------------------------------------------------


@dataclass
class Source:
    """A file (or bundle directory) being identified: its path, size and first bytes."""

    path: Path
    is_dir: bool
    size: int
    head: bytes  # the whole file when size <= WHOLE_FILE_LIMIT, else its first HEAD_BYTES
    _data: bytes | None = field(default=None, repr=False)

    @classmethod
    def open(cls, path: Path) -> Source:
        # stat first, never open: a FIFO would block the open, a device would never end.
        st = stat_input(path, f"[{FMT}] cannot read")
        if st is None:
            raise AnekitError(f"[{FMT}] cannot read {shown(path)}: No such file or directory")
        if stat.S_ISDIR(st.st_mode):
            return cls(path, True, 0, b"")
        check_input(path, f"[{FMT}] cannot read", expected="a file or bundle anekit describes")
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                f.seek(0)
                head = f.read(size if size <= WHOLE_FILE_LIMIT else HEAD_BYTES)
        except OSError as e:
            raise AnekitError(f"[{FMT}] cannot read {path}: {e.strerror or e}") from e
        src = cls(path, False, size, head)
        if src.complete:
            src._data = head
        return src

    @property
    def complete(self) -> bool:
        """Whether ``head`` holds the whole file."""
        return self.is_dir or len(self.head) == self.size

    def data(self) -> bytes:
        """The whole file (read once)."""
        if self._data is None:
            try:
                self._data = self.path.read_bytes()
            except OSError as e:
                raise AnekitError(f"[{FMT}] cannot read {self.path}: {e.strerror or e}") from e
        return self._data


@dataclass(frozen=True)
class Kind:
    """A kind ``inspect`` knows: how it is recognised, how it is summarised, and how it is printed.

    A kind with a ``module`` is recognised and summarised by that decoder module (imported lazily):
    its ``detect`` and ``summarize``. ``hint`` is a cheap signature that names the kind when the module
    is missing; ``why_not`` says why a file is not of this kind, for the "unknown kind" message.
    """

    name: str
    title: str
    signature: str
    sniff: Callable[[Source], bool] | None = None
    summarize: Callable[[Source], dict[str, Any]] | None = None
    render: Callable[[dict[str, Any]], list[str]] | None = None
    module: str = ""
    whole_file: bool = False  # the module's detect needs the whole file, not only its head
    directory: bool = False
    hint: Callable[[bytes], bool] | None = None
    why_not: Callable[[Source], str | None] | None = None
    # Tried only when no kind accepts the file: a file with this kind's header that fails its full test
    # (a truncated model); the summary then raises the reader's own error ("truncated at byte N, ...").
    near: Callable[[Source], bool] | None = None


def _load(module: str) -> ModuleType | None:
    """The decoder module, or None when it is not installed (any other import failure propagates)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            return None
        raise


def _module_sniff(kind: Kind, mod: ModuleType, src: Source) -> bool:
    if kind.whole_file and not src.complete:
        return False
    try:
        return bool(mod.detect(src.head))
    except FormatError:  # a detect that decodes to decide: "not this kind"
        return False


def _near_module(module: str, head: bytes) -> bool:
    mod = _load(module)
    return mod is not None and bool(mod.near(head))


def _module_summary(kind: Kind, src: Source) -> dict[str, Any]:
    mod = _load(kind.module)
    if mod is None:
        raise AnekitError(f"[{FMT}] {src.path}: the {kind.title} decoder {kind.module} is not available")
    return dict(mod.summarize(src.data()))


def _crc(data: Any) -> str:
    """CRC-32 as 8 hex digits (what --diff compares to find an edited tensor or file)."""
    return f"{zlib.crc32(data):08x}"


def _u32(b: bytes, at: int) -> int | None:
    return struct.unpack_from("<I", b, at)[0] if len(b) >= at + 4 else None


# --------------------------------------------------------------------------------------------------------
# MILBlob v2
# --------------------------------------------------------------------------------------------------------


def _sniff_milblob(src: Source) -> bool:
    """Version 2 in the header with a blob count the file can hold (64 bytes of metadata each), or a
    metadata sentinel right after the header (then the reader names whatever else is wrong)."""
    head = src.head
    if len(head) < blob.HEADER_SIZE:
        return False
    count, version = _u32(head, 0), _u32(head, 4)
    plausible = count is not None and count * blob.METADATA_SIZE <= src.size - blob.HEADER_SIZE
    return (version == blob.VERSION and plausible) or _u32(head, 64) == blob.SENTINEL


def _why_not_milblob(src: Source) -> str:
    head = src.head
    if len(head) < blob.HEADER_SIZE:
        return f"not MILBlob v2 weights ({src.size} bytes, shorter than the {blob.HEADER_SIZE}-byte header)"
    sentinel = _u32(head, 64)
    s = "the file ends before byte 68" if sentinel is None else f"{sentinel:#x} at byte 64"
    return (
        f"not MILBlob v2 weights (version {_u32(head, 4):#x} at byte 4, not {blob.VERSION}; {s}, "
        f"not the metadata sentinel {blob.SENTINEL:#x})"
    )


def _summarize_milblob(src: Source) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", blob.BlobWarning)
        with blob.BlobFile(src.path) as f:
            header_count, size = f.header_count, f.size
            entries = blob.describe(f)
    return {
        "file": str(src.path),
        "format": "milblob",
        "version": blob.VERSION,
        "file_size": size,
        "header_count": header_count,
        "entries": entries,
        "data_bytes": sum(e["size_in_bytes"] for e in entries),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, blob.BlobWarning)],
    }


def _render_milblob(info: dict[str, Any]) -> list[str]:
    lines = [f"{'metadata':>10}  {'data':>10}  {'dtype':<8}  {'bytes':>12}  {'pad':>3}  crc32"]
    for e in info["entries"]:
        lines.append(
            f"{e['metadata_offset']:>#10x}  {e['data_offset']:>#10x}  {e['dtype']:<8}  "
            f"{e['size_in_bytes']:>12}  {e['padding_bits']:>3}  {e['crc32']:08x}"
        )
    n = len(info["entries"])
    lines.append(
        f"{info['file']}: MILBlob v{info['version']}, {n} blob{'s' * (n != 1)}, {info['data_bytes']} "
        f"data bytes, file {info['file_size']} bytes, header count {info['header_count']}"
    )
    lines.extend(f"warning: {w}" for w in info["warnings"])
    return lines


# --------------------------------------------------------------------------------------------------------
# llama2.c model, tokenizer.bin, BLZT checkpoint, sentencepiece model
# --------------------------------------------------------------------------------------------------------

_AK42_MAGIC = 0x616B3432
_BLZT_MAGIC = 0x424C5A54
_MAX_DIM = 1 << 24
_LLAMA2C_DIMS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")


def _llama2c_legacy_size(d: dict[str, int]) -> int | None:
    """Bytes of a legacy llama2.c model file with these header ints, or None if they are not a model."""
    dim, hidden, layers, heads, kv_heads, vocab, seq = (d[k] for k in _LLAMA2C_DIMS)
    if (
        min(dim, hidden, layers, heads, kv_heads, seq, abs(vocab)) <= 0
        or max(dim, hidden, abs(vocab)) > _MAX_DIM
    ):
        return None
    if layers > 4096 or seq > _MAX_DIM or dim % heads or heads % kv_heads or (dim // heads) % 2:
        return None
    kv_dim = kv_heads * (dim // heads)
    per_layer = 2 * dim + 2 * dim * dim + 2 * kv_dim * dim + 3 * hidden * dim
    floats = layers * per_layer + abs(vocab) * dim + dim + seq * (dim // heads)  # + the two RoPE tables
    floats += abs(vocab) * dim if vocab < 0 else 0  # an unshared classifier
    return 28 + 4 * floats


def _sniff_llama2c(src: Source) -> bool:
    head = src.head
    if len(head) < 28:
        return False
    if _u32(head, 0) == _AK42_MAGIC:
        return _u32(head, 4) in (1, 2)  # version 2 is refused by the reader with its own message
    d = dict(zip(_LLAMA2C_DIMS, struct.unpack_from("<7i", head, 0)))
    return _llama2c_legacy_size(d) == src.size


def _llama2c_header(head: bytes) -> dict[str, int] | None:
    """The 7 ints of a legacy header when they read as a model's shape (positive, dividing as a model's
    must, widths within _MAX_DIM), whatever n_layers says; None otherwise."""
    if len(head) < 28:
        return None
    d = dict(zip(_LLAMA2C_DIMS, struct.unpack_from("<7i", head, 0)))
    dim, hidden, layers, heads, kv_heads, vocab, seq = (d[k] for k in _LLAMA2C_DIMS)
    if min(dim, hidden, layers, heads, kv_heads, seq, abs(vocab)) <= 0:
        return None
    if max(dim, hidden, abs(vocab), seq) > _MAX_DIM or dim % heads or heads % kv_heads or (dim // heads) % 2:
        return None
    return d


def _near_llama2c(src: Source) -> bool:
    """A legacy header that reads as a model's shape but promises more bytes than the file holds."""
    d = _llama2c_header(src.head)
    return d is not None and _llama2c_size_any_layers(d) > src.size


def _llama2c_size_any_layers(d: dict[str, int]) -> int:
    kv_dim = d["n_kv_heads"] * (d["dim"] // d["n_heads"])
    per_layer = 2 * d["dim"] + 2 * d["dim"] ** 2 + 2 * kv_dim * d["dim"] + 3 * d["hidden_dim"] * d["dim"]
    vocab, dim = abs(d["vocab_size"]), d["dim"]
    floats = d["n_layers"] * per_layer + vocab * dim * (1 + (d["vocab_size"] < 0)) + dim
    return 28 + 4 * (floats + d["seq_len"] * (dim // d["n_heads"]))


def _tensor_list(params: Any) -> list[dict[str, Any]]:
    """Name, shape and CRC-32 of every parameter array (what --diff compares to find an edited weight)."""
    return [
        {"name": name, "shape": list(a.shape), "crc32": _crc(np.ascontiguousarray(a).view(np.uint8))}
        for name, a in params.tensors()
    ]


def _config_dict(cfg: Any) -> dict[str, int]:
    return {k: getattr(cfg, k) for k in _LLAMA2C_DIMS}


def _summarize_llama2c(src: Source) -> dict[str, Any]:
    """The header's description of a llama2.c model: its config, parameter count and every tensor's
    place; each tensor's CRC-32 too (what --diff compares) when the file is at most CRC_FILE_LIMIT bytes,
    read in pieces, never mapped (a 26 GB model is described from its header alone)."""
    from anekit.llama.llama2c import read_llama2c_header
    from anekit.llama.params import LAYER_FIELDS

    header = read_llama2c_header(src.path)
    runs = header.runs()
    places = [("embed", *runs["embed"][::2])]
    for key in LAYER_FIELDS:
        first, stride, shape = runs[key]
        places += [(f"layers.{i}.{key}", first + i * stride, shape) for i in range(header.cfg.n_layers)]
    places += [(k, *runs[k][::2]) for k in ("rms_final", "wcls") if k in runs]
    checksums = src.size <= CRC_FILE_LIMIT
    tensors = [
        {"name": name, "shape": list(shape), "offset": offset}
        | ({"crc32": _crc_range(src.path, offset, 4 * int(np.prod(shape)))} if checksums else {})
        for name, offset, shape in places
    ]
    summary = {
        "format": "llama2.c model" + (" (ak42 version 1)" if header.version == 1 else " (legacy)"),
        "file_size": src.size,
        "config": _config_dict(header.cfg),
        "shared_classifier": header.shared,
        "rope_tables_stored": "freq_cis_real" in runs,
        "parameters": header.parameters(),
        "tensors": tensors,
    }
    if not checksums:
        summary["tensor_crc32"] = (
            f"not computed: the file is over {CRC_FILE_LIMIT >> 30} GiB (described from its header alone)"
        )
    return summary


def _crc_range(path: Path, offset: int, length: int) -> str:
    """CRC-32 of ``length`` bytes of a file from ``offset``, read a piece at a time."""
    crc = 0
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while length > 0:
                chunk = f.read(min(length, 1 << 24))
                if not chunk:
                    break
                crc = zlib.crc32(chunk, crc)
                length -= len(chunk)
    except OSError as e:
        raise AnekitError(f"[{FMT}] cannot read {path}: {e.strerror or e}") from e
    return f"{crc:08x}"


def _plausible_score(score: float) -> bool:
    from anekit.llama.llama2c import _plausible_score as plausible

    return plausible(score)


def _sniff_tokenizer_bin(src: Source) -> bool:
    """u32 max_token_length, then records (f32 score, i32 length <= max, bytes) that tile the whole file
    (or, for a file too large to read here, the first 64 records)."""
    head = src.head
    max_len = _u32(head, 0)
    if max_len is None or not 1 <= max_len <= 4096:
        return False
    off, records = 4, 0
    while off + 8 <= len(head) and (src.complete or records < 64):
        score, n = struct.unpack_from("<fi", head, off)
        if not _plausible_score(score) or not 0 <= n <= max_len:
            return False
        off += 8 + n
        records += 1
    return off == len(head) if src.complete else records == 64


def _summarize_tokenizer_bin(src: Source) -> dict[str, Any]:
    from anekit.llama.llama2c import parse_tokenizer_bin

    tok = parse_tokenizer_bin(src.data())
    byte_pieces = sum(bool(len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">")) for p in tok.vocab)
    return {
        "format": "llama2.c tokenizer.bin",
        "file_size": src.size,
        "vocab_size": tok.vocab_size,
        "max_token_length": tok.max_token_length,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "byte_fallback_pieces": byte_pieces,
        "score_range": [float(tok.scores.min()), float(tok.scores.max())],
        "first_pieces": [p.decode("utf-8", "backslashreplace") for p in tok.vocab[:12]],
        "crc32": _crc(src.data()),
    }


def _sniff_blzt(src: Source) -> bool:
    return _u32(src.head, 0) == _BLZT_MAGIC


def _summarize_blzt(src: Source) -> dict[str, Any]:
    from anekit.kernels.config import ModelConfig
    from anekit.llama.checkpoint import HEADER, SHAPE_FIELDS, checkpoint_size, open_checkpoint

    kv_inferred = False
    try:
        ck = open_checkpoint(src.path)  # a map: a checkpoint larger than RAM is read a page at a time
    except FormatError as e:
        # The header does not store n_kv_heads: a grouped-query model is found by the size it gives.
        if e.field != "file size":
            raise
        h = HEADER.parse(src.head[: HEADER.size])
        for kv in (k for k in range(1, h["n_heads"]) if h["n_heads"] % k == 0):
            try:
                cfg = ModelConfig(**{f: h[f] for f in SHAPE_FIELDS}, n_kv_heads=kv, name=src.path.stem)
            except AnekitError:
                continue
            if src.size in (checkpoint_size(cfg), checkpoint_size(cfg, untied=True)):
                ck = open_checkpoint(src.path, cfg)
                kv_inferred = True
                break
        else:
            raise
    params = ck.params
    return {
        "format": "BLZT training checkpoint (version 2)",
        "file_size": src.size,
        "config": _config_dict(params.cfg),
        "n_kv_heads_from_file_size": kv_inferred,
        "untied_classifier": params.wcls is not None,
        "meta": asdict(ck.meta),
        "run_record": _run_record(ck.run),
        "parameters": params.count(),
        "tensors": _tensor_list(params),
    }


def _run_record(run: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run record ``anekit train`` stores after the tensors, as stored (None: a plain BLZT file), with
    the loss history's length, first, last and lowest value beside the full list."""
    if run is None:
        return None
    state = run.get("state")
    losses = state.get("losses") if isinstance(state, dict) else None
    if not isinstance(losses, list) or not losses or not all(isinstance(x, (int, float)) for x in losses):
        return run
    summary = {"steps": len(losses), "first": losses[0], "last": losses[-1], "lowest": min(losses)}
    return {**run, "loss_summary": summary}


def _varint(b: bytes, at: int) -> tuple[int, int] | None:
    from anekit.inspect.coreml import read_varint

    try:
        return read_varint(b, at, "sniff")
    except FormatError:
        return None


def _sniff_sentencepiece(src: Source) -> bool:
    """A ModelProto starts with ``pieces`` (field 1): each {1: piece string, 2: f32 score, 3: type}."""
    head, at = src.head, 0
    for _ in range(2):
        if at >= len(head) or head[at] != 0x0A:
            return False
        outer = _varint(head, at + 1)
        if outer is None or head[outer[1] : outer[1] + 1] != b"\x0a":
            return False
        inner = _varint(head, outer[1] + 1)
        if inner is None or inner[0] >= outer[0]:
            return False
        score_at = inner[1] + inner[0]
        if head[score_at : score_at + 1] != b"\x15":
            return False
        at = outer[1] + outer[0]
    return True


def _summarize_sentencepiece(src: Source) -> dict[str, Any]:
    from anekit.llama.tokenizer import SentencePieceTokenizer

    tok = SentencePieceTokenizer.from_bytes(src.data(), str(src.path))
    return {
        "format": "sentencepiece model (protobuf)",
        "file_size": src.size,
        "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "unk_id": int(tok.sp.unk_id()),
        "first_pieces": [tok.piece(i) for i in range(min(12, tok.vocab_size))],
        "crc32": _crc(src.data()),
    }


# --------------------------------------------------------------------------------------------------------
# MIL text, property lists, CoreML bundles
# --------------------------------------------------------------------------------------------------------


def _text_head(src: Source) -> str | None:
    try:
        return src.head[:4096].decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= len(src.head[:4096]) - 3:  # a character cut by the 4096-byte window
            return src.head[: e.start].decode("utf-8")
        return None


def _sniff_mil(src: Source) -> bool:
    text = _text_head(src)
    if text is None:
        return False
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("//"):
            return line.startswith("program(")
    return False


def _literal_text(lit: Any) -> Any:
    from anekit.mil import format_literal

    value = getattr(lit, "value", None)
    if isinstance(value, tuple) and all(isinstance(kv, tuple) and len(kv) == 2 for kv in value):
        try:
            return {str(k.scalar()): str(v.scalar()) for k, v in value}
        except (ValueError, AttributeError):
            pass
    return format_literal(lit)


def mil_summary(text: str, source: str) -> dict[str, Any]:
    """Functions, signatures, op histogram, BLOBFILE references and verifier findings of MIL text."""
    from anekit import mil

    prog = mil.parse(text, source)
    problems = [str(p) for p in mil.check(prog)]
    histogram: Counter[str] = Counter()
    blobs = []
    functions = []
    for fn in prog.functions.values():
        histogram.update(op.op_type for op in fn.ops)
        for op in fn.ops:
            for name, arg in [*op.attributes.items(), *op.inputs.items()]:
                if isinstance(arg, mil.Literal) and isinstance(ref := arg.value, mil.BlobRef):
                    blobs.append({"op": op.name, "arg": name, "path": ref.path, "offset": ref.offset})
        functions.append(
            {
                "name": fn.name,
                "opset": fn.opset,
                "signature": fn.signature(),
                "inputs": [f"{v.name}: {v.type}" for v in fn.inputs],
                "outputs": [f"{v.name}: {v.type}" for v in fn.outputs],
                "ops": len(fn.ops),
            }
        )
    return {
        "program_version": prog.version,
        "attributes": {k: _literal_text(v) for k, v in prog.attributes.items()},
        "functions": functions,
        "op_histogram": dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0]))),
        "blob_refs": blobs,
        "verifies": not problems,
        "problems": problems,
    }


def _summarize_mil(src: Source) -> dict[str, Any]:
    try:
        text = src.data().decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError("mil", str(src.path), f"not UTF-8 text ({e.reason})", offset=e.start) from None
    return {"format": "MIL text", "file_size": src.size, **mil_summary(text, str(src.path))}


def _sniff_plist(src: Source) -> bool:
    head = src.head[:1024].lstrip()
    return head.startswith(b"bplist00") or (head.startswith(b"<?xml") and b"<!DOCTYPE plist" in head)


def _shape_of(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _shape_of(v) for k, v in value.items()}
    if isinstance(value, list):
        return f"array of {len(value)}"
    if isinstance(value, (bytes, bytearray)):
        return f"data of {len(value)} bytes"
    return value if isinstance(value, (str, int, float, bool)) else str(value)


def _summarize_plist(src: Source) -> dict[str, Any]:
    try:
        value = plistlib.loads(src.data())
    except Exception as e:  # plistlib raises several unrelated types for malformed input
        raise FormatError("plist", str(src.path), f"not a readable property list ({e})") from None
    return {"format": "property list", "file_size": src.size, "contents": _shape_of(value)}


_BUNDLE_WEIGHTS = ("weights", "Data/com.apple.CoreML/weights")


def _crc_file(path: Path) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _bundle_parts(root: Path) -> list[dict[str, Any]]:
    return [
        {"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "crc32": _crc_file(p)}
        for p in sorted(root.rglob("*"))
        if p.is_file()
    ]


def _weights_summary(path: Path) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", blob.BlobWarning)
            entries = blob.describe(path)
    except FormatError as e:
        return {"error": str(e)}
    return {
        "blobs": len(entries),
        "data_bytes": sum(e["size_in_bytes"] for e in entries),
        "entries": [
            {
                "offset": e["metadata_offset"],
                "dtype": e["dtype"],
                "bytes": e["size_in_bytes"],
                "crc32": f"{e['crc32']:08x}",
            }
            for e in entries
        ],
    }


def _check_blob_refs(root: Path, refs: list[dict[str, Any]]) -> list[str]:
    """BLOBFILE references of model.mil that name no blob of the bundle's weight files."""
    missing = []
    offsets: dict[str, set[int] | None] = {}
    for ref in refs:
        rel = ref["path"].removeprefix("@model_path/")
        if rel not in offsets:
            try:
                offsets[rel] = {e["metadata_offset"] for e in blob.describe(root / rel)}
            except (OSError, FormatError):
                offsets[rel] = None
        found = offsets[rel]
        if found is None or ref["offset"] not in found:
            missing.append(f"{ref['op']}: {ref['path']} offset {ref['offset']}")
    return missing


def _summarize_bundle(src: Source, fmt: str, mil_path: Path | None) -> dict[str, Any]:
    root = src.path
    info: dict[str, Any] = {"format": fmt, "parts": _bundle_parts(root)}
    if mil_path is not None and mil_path.is_file():
        try:  # a bad model.mil is reported inside the bundle's summary, beside its other parts
            mil_info = mil_summary(mil_path.read_bytes().decode("utf-8"), str(mil_path))
            mil_info["unresolved_blob_refs"] = _check_blob_refs(root, mil_info["blob_refs"])
        except UnicodeDecodeError as e:
            mil_info = {"error": f"[mil] {mil_path}: not UTF-8 text ({e.reason} at byte {e.start})"}
        except AnekitError as e:
            mil_info = {"error": str(e)}
        info["model_mil"] = mil_info
    weights = {
        p.relative_to(root).as_posix(): _weights_summary(p)
        for sub in _BUNDLE_WEIGHTS
        if (root / sub).is_dir()
        for p in sorted((root / sub).glob("*.bin"))
    }
    if weights:
        info["weights"] = weights
    for name in ("metadata.json", "Manifest.json"):
        if (root / name).is_file():
            try:
                meta = jsonio.loads((root / name).read_bytes(), f"{name}")
            except (OSError, AnekitError) as e:
                meta = {"error": str(e)}
            info[name] = _json_digest(meta) if "error" not in meta else meta
    if mil_path is None:  # an .mlpackage: read as the simulator and lint read it, and say what is wrong
        info["problems"] = _package_problems(root)
    else:
        info["problems"] = _compiled_problems(root, info)
    return info


def _compiled_problems(root: Path, info: dict[str, Any]) -> list[str]:
    """What keeps a compiled bundle from running as ``anekit run`` reads it, causes first: a model.mil that
    does not parse, an unreadable weight file or metadata.json, a BLOBFILE reference no weight file holds, a
    model.mil that does not verify."""
    where = f"[{FMT}] {root}"
    found = []
    mil_info = info.get("model_mil", {})
    if "error" in mil_info:  # the parser's own line names the file, line and column
        found.append(str(mil_info["error"]).splitlines()[0])
    found += [f"{where}: {name}: {w['error']}" for name, w in info.get("weights", {}).items() if "error" in w]
    found += [
        f"{where}: {meta['error']}"  # the JSON reader's message names the file
        for name in ("metadata.json", "Manifest.json")
        if isinstance(meta := info.get(name), dict) and "error" in meta
    ]
    found += [
        f"{where}: model.mil: {ref} names no blob of the bundle's weight files"
        for ref in mil_info.get("unresolved_blob_refs", [])
    ]
    found += [f"{where}: model.mil: {p} (it does not verify)" for p in mil_info.get("problems", [])]
    return found


def _package_problems(root: Path) -> list[str]:
    """What keeps the package from loading (a corrupt Manifest.json, a missing model or weight.bin), as
    the package reader says it; [] when it loads."""
    from anekit.coreml import load_mlpackage

    try:
        load_mlpackage(root)
    except AnekitError as e:
        return [str(e).splitlines()[0]]
    except Exception as e:  # a reader bug must not hide the rest of the summary
        return [f"{type(e).__name__}: {e}"]
    return []


def _json_digest(meta: Any) -> Any:
    """metadata.json / Manifest.json reduced to what identifies the model."""
    if isinstance(meta, list) and len(meta) == 1:
        meta = meta[0]
    if not isinstance(meta, dict):
        return _shape_of(meta)
    keep = (
        "specificationVersion",
        "computePrecision",
        "modelType",
        "mlProgramOperationTypeHistogram",
        "storagePrecision",
        "generatedClassName",
        "fileFormatVersion",
        "rootModelIdentifier",
    )
    out = {k: meta[k] for k in keep if k in meta}
    for schema in ("inputSchema", "outputSchema"):
        if isinstance(meta.get(schema), list):
            out[schema] = [
                f"{s.get('name')}: {s.get('formattedType', s.get('type'))}"
                for s in meta[schema]
                if isinstance(s, dict)
            ]
    if isinstance(meta.get("itemInfoEntries"), dict):
        out["items"] = sorted(
            str(v.get("path")) for v in meta["itemInfoEntries"].values() if isinstance(v, dict)
        )
    for k in ("userDefinedMetadata", "availability"):
        if k in meta:
            out[k] = meta[k]
    return out


def _sniff_mlpackage(src: Source) -> bool:
    return (src.path / "Manifest.json").is_file() and (src.path / "Data").is_dir()


def _summarize_mlpackage(src: Source) -> dict[str, Any]:
    return _summarize_bundle(src, "CoreML model package (.mlpackage)", None)


def _sniff_mlmodelc(src: Source) -> bool:
    return any((src.path / name).is_file() for name in ("model.mil", "coremldata.bin", "model.espresso.net"))


def _summarize_mlmodelc(src: Source) -> dict[str, Any]:
    return _summarize_bundle(src, "compiled CoreML model (.mlmodelc)", src.path / "model.mil")


# --------------------------------------------------------------------------------------------------------
# JSON documents, kernel dumps, and the files of Apple's toolchains that carry no signature
# --------------------------------------------------------------------------------------------------------


def _json_value(src: Source) -> Any:
    if not src.complete or src.head.lstrip()[:1] not in (b"{", b"["):
        return None
    try:
        return jsonio.loads(src.head, "JSON")
    except AnekitError:
        return None


def _json_role(value: Any) -> str:
    """What a JSON document is, from its keys."""
    item = value[0] if isinstance(value, list) and len(value) == 1 else value
    if isinstance(item, dict):
        if "metadataOutputVersion" in item or "mlProgramOperationTypeHistogram" in item:
            return "CoreML compiled-model metadata (metadata.json of an .mlmodelc)"
        if "fileFormatVersion" in item and "itemInfoEntries" in item:
            return "CoreML package manifest (Manifest.json of an .mlpackage)"
        if isinstance(item.get("kernels"), dict) and "config" in item:
            return "anekit kernel dump index (kernels.json of `anekit kernels dump`)"
    return "JSON document"


def _sniff_json(src: Source) -> bool:
    return _json_value(src) is not None


def _summarize_json(src: Source) -> dict[str, Any]:
    value = _json_value(src)
    role = _json_role(value)
    body = _json_digest(value) if role.startswith("CoreML") else _shape_of(value)
    if role.startswith("anekit kernel dump"):
        body = {"config": value["config"], "kernels": sorted(value["kernels"])}
    return {"format": role, "file_size": src.size, "contents": body, "crc32": _crc(src.data())}


def _sniff_kernel_dump(src: Source) -> bool:
    index = src.path / "kernels.json"
    if not index.is_file():
        return False
    try:
        value = jsonio.loads(index.read_bytes(), "kernels.json")
    except (OSError, AnekitError):
        return False
    return isinstance(value, dict) and isinstance(value.get("kernels"), dict)


def _summarize_kernel_dump(src: Source) -> dict[str, Any]:
    """kernels.json, and for each kernel folder its model.mil's summary and weight files."""
    root = src.path
    index = jsonio.loads((root / "kernels.json").read_bytes(), "kernels.json")
    kernels = []
    for name, entry in index["kernels"].items():
        folder = root / str(name)
        item: dict[str, Any] = {"name": name}
        if isinstance(entry, dict):
            item.update({k: entry[k] for k in ("ops", "input", "output") if k in entry})
        mil_path = folder / "model.mil"
        if not mil_path.is_file():
            item["error"] = f"{mil_path.relative_to(root).as_posix()} is missing"
        else:
            try:
                mil_info = mil_summary(mil_path.read_bytes().decode("utf-8"), str(mil_path))
                item["mil_ops"] = sum(f["ops"] for f in mil_info["functions"])
                item["verifies"] = mil_info["verifies"]
                item["unresolved_blob_refs"] = _check_blob_refs(folder, mil_info["blob_refs"])
            except UnicodeDecodeError as e:
                item["error"] = f"model.mil is not UTF-8 text ({e.reason} at byte {e.start})"
            except AnekitError as e:
                item["error"] = str(e)
        weights = sorted((folder / "weights").glob("*.bin")) if (folder / "weights").is_dir() else []
        item["weight_files"] = len(weights)
        item["weight_bytes"] = sum(p.stat().st_size for p in weights)
        kernels.append(item)
    where = f"[{FMT}] {root}"
    found = [f"{where}: {k['name']}: {k['error']}" for k in kernels if "error" in k]
    found += [
        f"{where}: {k['name']}/model.mil: {ref} names no blob of the kernel's weight files"
        for k in kernels
        for ref in k.get("unresolved_blob_refs", [])
    ]
    return {
        "format": "anekit kernel dump (`anekit kernels dump`)",
        "config": index.get("config"),
        "kernels": kernels,
        "all_verify": all(k.get("verifies") is True for k in kernels),
        "problems": found,
    }


def _printable_strings(data: bytes, least: int = 4) -> list[str]:
    out, run = [], bytearray()
    for b in data + b"\0":
        if 0x20 <= b < 0x7F:
            run.append(b)
            continue
        if len(run) >= least:
            out.append(run.decode("ascii"))
        run.clear()
    return out


def _by_name(name: str) -> Callable[[Source], bool]:
    """A kind with no signature of its own, recognised by its file name only when no content test claims
    the file (the kinds before it in ``KINDS`` are all tried first)."""

    def sniff(src: Source) -> bool:
        return src.path.name == name or (name.startswith(".") and src.path.name.endswith(name))

    return sniff


def _summarize_coremldata(src: Source) -> dict[str, Any]:
    """What can be said of coremlc's coremldata.bin without its (unpublished) layout: size, checksum, the
    leading u32 and the text it carries (model kind, feature names, coremltools metadata)."""
    data = src.data()
    return {
        "format": "compiled CoreML model data (coremldata.bin; layout undocumented, recognised by name)",
        "file_size": src.size,
        "first_u32": _u32(data, 0),
        "strings": _printable_strings(data)[:64],
        "crc32": _crc(data),
    }


def _plists_naming(src: Source) -> list[str]:
    """Property lists beside the file that name it (ANECompiler's net.plist lists its weight files)."""
    names = {src.path.name}
    found = []
    for plist in sorted(src.path.parent.glob("*.plist")):
        try:
            value = plistlib.loads(plist.read_bytes())
        except Exception:
            continue
        if names & set(_strings_in(value)):
            found.append(plist.name)
    return found


def _strings_in(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings_in(v)


def _summarize_ane_weights(src: Source) -> dict[str, Any]:
    """Raw weight bytes an ANECompiler plist names: no header, so only their size and two readings."""
    data = src.data()
    info: dict[str, Any] = {
        "format": "raw ANECompiler weights (named by a network plist; no header, recognised by name)",
        "file_size": src.size,
        "referenced_by": _plists_naming(src),
        "crc32": _crc(data),
    }
    if src.size % 2 == 0 and src.size:
        halves = np.frombuffer(data, "<f2").astype(np.float64)
        finite = halves[np.isfinite(halves)]
        info["as_fp16"] = {
            "count": int(halves.size),
            "finite": int(finite.size),
            "range": [float(finite.min()), float(finite.max())] if finite.size else None,
        }
        words = np.frombuffer(data, "<u2")
        info["as_uint16"] = {"range": [int(words.min()), int(words.max())]}
    return info


# --------------------------------------------------------------------------------------------------------
# the kinds, in detection order
# --------------------------------------------------------------------------------------------------------

_HWX_MAGIC_BYTES = bytes.fromhex("cefaefbe")


def _why_not_e5(src: Source) -> str | None:
    """The decoder's own error when the file starts like a FlatBuffer (an aligned root offset inside it)."""
    root = _u32(src.head, 0)
    if not src.complete or root is None or root % 4 or not 4 <= root < src.size:
        return None
    from anekit.inspect import e5

    try:
        e5.decode_e5(src.head)
    except FormatError as e:
        return f"not an E5 dispatch descriptor ({e})"
    return None


def _why_not_llama2c(src: Source) -> str | None:
    """The llama2.c reader's own error, when the first 28 bytes read as 7 positive ints."""
    if len(src.head) < 28 or min(struct.unpack_from("<7i", src.head, 0)[:5]) <= 0:
        return None
    from anekit.llama.llama2c import _checked_header

    try:
        _checked_header(np.frombuffer(src.head[:256], np.uint8), src.size, src.path.stem)
    except AnekitError as e:
        return f"not a llama2.c model ({e})"
    return None


def _why_not_tokenizer(src: Source) -> str | None:
    """The tokenizer.bin reader's own error, when the file starts like one (a max_token_length 1..4096 and
    a plausible first record)."""
    max_len = _u32(src.head, 0)
    if not src.complete or max_len is None or not 1 <= max_len <= 4096 or len(src.head) < 12:
        return None
    score, n = struct.unpack_from("<fi", src.head, 4)
    if not _plausible_score(score) or not 0 <= n <= max_len:  # not even its first record: not close
        return None
    from anekit.llama.llama2c import parse_tokenizer_bin

    try:
        parse_tokenizer_bin(src.head)
    except FormatError as e:
        return f"not a llama2.c tokenizer.bin ({e})"
    return None


def _why_not_hwx(src: Source) -> str:
    return (
        f"not an ANE hardware container (bytes 0-3 are {src.head[:4].hex(' ') or 'missing'}, not ce fa ef be)"
    )


KINDS: tuple[Kind, ...] = (
    Kind(
        "kernel_dump",
        "anekit kernel dump",
        "a directory holding kernels.json and one folder per kernel (model.mil, weights/)",
        _sniff_kernel_dump,
        _summarize_kernel_dump,
        directory=True,
    ),
    Kind(
        "mlpackage",
        "CoreML model package",
        "a directory holding Manifest.json and Data/",
        _sniff_mlpackage,
        _summarize_mlpackage,
        directory=True,
    ),
    Kind(
        "mlmodelc",
        "compiled CoreML model",
        "a directory holding model.mil or coremldata.bin",
        _sniff_mlmodelc,
        _summarize_mlmodelc,
        directory=True,
    ),
    Kind(
        "hwx",
        "ANE hardware container (.hwx)",
        "Mach-O-shaped, magic bytes CE FA EF BE",
        module="anekit.inspect.hwx",
        hint=lambda head: head[:4] == _HWX_MAGIC_BYTES,
        why_not=_why_not_hwx,
    ),
    Kind(
        "milblob",
        "MILBlob v2 weights",
        "MILBlob v2 weights (u32 version 2 at byte 4, metadata sentinel 0xDEADBEEF at byte 64)",
        _sniff_milblob,
        _summarize_milblob,
        _render_milblob,
        why_not=_why_not_milblob,
    ),
    Kind(
        "blzt",
        "BLZT training checkpoint",
        'BLZT checkpoint (u32 0x424C5A54, bytes "TZLB", at byte 0)',
        _sniff_blzt,
        _summarize_blzt,
    ),
    Kind(
        "llama2c",
        "llama2.c model",
        "llama2.c model (ak42 magic, or 7 header ints whose shapes give the file size)",
        _sniff_llama2c,
        _summarize_llama2c,
        why_not=_why_not_llama2c,
        near=_near_llama2c,
    ),
    Kind(
        "llama2c.tokenizer",
        "llama2.c tokenizer.bin",
        "llama2.c tokenizer.bin (u32 max_token_length, then score / length / bytes records)",
        _sniff_tokenizer_bin,
        _summarize_tokenizer_bin,
        why_not=_why_not_tokenizer,
    ),
    Kind(
        "sentencepiece",
        "sentencepiece model",
        "sentencepiece .model (protobuf pieces: piece string, f32 score)",
        _sniff_sentencepiece,
        _summarize_sentencepiece,
    ),
    Kind(
        "e5",
        "E5 dispatch descriptor",
        "E5 dispatch descriptor (a FlatBuffer whose root table decodes with a format version)",
        module="anekit.inspect.e5",
        whole_file=True,
        why_not=_why_not_e5,
    ),
    Kind(
        "ane_td",
        "ANE task-descriptor payload",
        "ANE task-descriptor payload (td_size 0x274 descriptors, then kernel bytes)",
        module="anekit.inspect.td",
    ),
    Kind("mil", "MIL text", 'MIL text (starts with "program(")', _sniff_mil, _summarize_mil),
    Kind(
        "mlmodel",
        "CoreML model spec",
        "CoreML model spec (a Model protobuf: specificationVersion, then a description)",
        module="anekit.inspect.coreml",
        whole_file=True,
        near=lambda src: src.complete and _near_module("anekit.inspect.coreml", src.head),
    ),
    Kind(
        "plist",
        "property list",
        "property list (XML with a plist DOCTYPE, or bplist00)",
        _sniff_plist,
        _summarize_plist,
    ),
    Kind(
        "json",
        "JSON document",
        "JSON (CoreML metadata.json / Manifest.json, anekit kernels.json, or any other)",
        _sniff_json,
        _summarize_json,
    ),
    # Last: no signature, recognised by name once every content test has said no.
    Kind(
        "coremldata",
        "compiled CoreML model data",
        "coremldata.bin (by name: its layout is not published)",
        _by_name("coremldata.bin"),
        _summarize_coremldata,
    ),
    Kind(
        "ane_weights",
        "raw ANECompiler weights",
        "*.weights named by an ANECompiler network plist (by name: raw bytes, no header)",
        _by_name(".weights"),
        _summarize_ane_weights,
    ),
)
"""Known kinds, tried in this order; add a row to teach ``inspect`` a new format."""


def identify(path: Path | str) -> tuple[Kind, Source]:
    """The kind of the file or bundle at ``path``, judged by its content (not its name)."""
    src = Source.open(Path(path))
    missing: list[Kind] = []
    for kind in KINDS:
        if kind.directory != src.is_dir:
            continue
        if kind.module:
            mod = _load(kind.module)
            if mod is None:
                if kind.hint is not None and kind.hint(src.head):
                    raise AnekitError(
                        f"[{FMT}] {src.path}: has the signature of the {kind.title} ({kind.signature}), but "
                        f"its decoder {kind.module} is not available in this installation"
                    )
                missing.append(kind)
                continue
            if _module_sniff(kind, mod, src):
                return kind, src
        elif kind.sniff is not None and kind.sniff(src):
            return kind, src
    for kind in KINDS:
        if kind.near is not None and kind.directory == src.is_dir and kind.near(src):
            return kind, src
    raise _unknown(src, missing)


_GENERIC_WHY_NOT = ("hwx", "milblob")  # reasons any file gets (a magic it lacks): named only when no other


def _unknown(src: Source, missing: list[Kind]) -> FormatError:
    """One short line: what the file is not, naming the closest kind anekit knows and why it is not that."""
    candidates = [k for k in KINDS if k.directory == src.is_dir]
    note = ""
    if missing:
        note = "; decoders not available here: " + ", ".join(f"{k.module} ({k.title})" for k in missing)
    if src.is_dir:
        what = (
            "a directory that is neither a .mlpackage nor a .mlmodelc bundle nor a kernel dump "
            "(no Manifest.json + Data/, no model.mil or coremldata.bin, no kernels.json)"
        )
        return FormatError(FMT, str(src.path), f"not a file kind anekit can inspect: {what}{note}")
    reasons = [(k.name, r) for k in candidates if k.why_not is not None and (r := k.why_not(src))]
    specific = [r for name, r in reasons if name not in _GENERIC_WHY_NOT]
    closest = specific[0] if specific else "; ".join(r for _, r in reasons)
    start = src.head[:8].hex(" ") or "nothing"
    return FormatError(
        FMT,
        str(src.path),
        f"not a file kind anekit can inspect ({src.size} bytes starting {start}); closest: {closest}{note}",
    )


def inspect_path(path: Path | str) -> tuple[Kind, dict[str, Any]]:
    """Identify and summarise one file or bundle: ``(kind, summary)``; the summary starts with file, kind."""
    kind, src = identify(path)
    try:
        summary = kind.summarize(src) if kind.summarize is not None else _module_summary(kind, src)
    except OSError as e:
        raise AnekitError(f"[{FMT}] cannot read {src.path}: {e.strerror or e}") from e
    summary.pop("file", None)
    summary.pop("kind", None)
    return kind, {"file": str(src.path), "kind": kind.name, **summary}


# --------------------------------------------------------------------------------------------------------
# text rendering
# --------------------------------------------------------------------------------------------------------


def _scalar(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, str):
        return value if value and value.strip() == value and "\n" not in value else json.dumps(value)
    if value is None:
        return "-"
    return json.dumps(value) if isinstance(value, (bool, float)) else str(value)


def _is_flat(value: Any) -> bool:
    """A scalar, or a short list of scalars: printed inline."""
    if isinstance(value, list):
        return len(value) <= 8 and not any(isinstance(v, (dict, list)) for v in value)
    return not isinstance(value, dict)


def _render(key: str, value: Any, indent: int) -> Iterator[str]:
    pad = "  " * indent
    label = f"{key}: " if key else ""
    if isinstance(value, dict):
        if all(_is_flat(v) for v in value.values()) and len(value) <= 8:
            body = ", ".join(f"{k}={_scalar(v)}" for k, v in value.items())
            if len(pad + label + body) <= 110:
                yield pad + label + (body or "{}")
                return
        if key:
            yield f"{pad}{key}:"
        for k, v in value.items():
            yield from _render(str(k), v, indent + 1 if key else indent)
        return
    if isinstance(value, list):
        if not any(isinstance(v, (dict, list)) for v in value):
            body = ", ".join(_scalar(v) for v in value[:LIST_LIMIT])
            more = f", ... ({len(value)} in all)" if len(value) > LIST_LIMIT else ""
            yield f"{pad}{label}[{body}{more}]"
            return
        yield f"{pad}{key}: {len(value)} item{'s' * (len(value) != 1)}"
        for i, v in enumerate(value[:LIST_LIMIT]):
            yield from _render(f"[{i}]", v, indent + 1)
        if len(value) > LIST_LIMIT:
            yield f"{pad}  ... {len(value) - LIST_LIMIT} more (--json shows all)"
        return
    yield pad + label + _scalar(value)


def problems(kind: Kind, info: dict[str, Any]) -> list[str]:
    """What ``inspect`` found wrong with a bundle (a package, a compiled model, a kernel dump), each one
    line: the command describes it, then fails. A lone MIL file's verifier findings are its description
    (``verifies`` false), not a failure to read it."""
    found = info.get("problems") if kind.directory else None
    return [str(p) for p in found] if isinstance(found, list) else []


def render(kind: Kind, info: dict[str, Any]) -> list[str]:
    """The readable text of a summary."""
    if kind.render is not None:
        return kind.render(info)
    rest = {k: v for k, v in info.items() if k not in ("file", "kind")}
    return [f"{info['file']}: {kind.title} [{kind.name}]", *_render("", rest, 1)]


# --------------------------------------------------------------------------------------------------------
# --diff
# --------------------------------------------------------------------------------------------------------

_ABSENT = "<absent>"


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}[{i}]", out)
        if not value:
            out[prefix] = []
    else:
        out[prefix] = value
    return out


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            return None
    return None


def _region_pairs(d: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(offset key, size key, label) of the regions a dict names: ``offset`` / ``size``, ``fileoff`` /
    ``filesize``, ``krn_offset`` / ``krn_size``, ``data_offset`` / ``size_in_bytes``, ..."""
    for k in d:
        for suffix in ("offset", "off"):
            if k.endswith(suffix):
                prefix = k[: -len(suffix)]
                for size_key in (prefix + "size", "size_in_bytes" if prefix == "data_" else ""):
                    if size_key in d:
                        yield k, size_key, prefix.rstrip("_")
                        break
                break


def _regions(value: Any, path: str, out: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """File regions a summary names (sections, blobs, descriptors, kernel bytes) as (start, end, label).
    Whatever sits under a segment with no file bytes (``filesize`` 0) is not a file region."""
    if isinstance(value, dict):
        if _as_int(value.get("filesize", 1)) == 0:
            return out
        name = value.get("name")
        for off_key, size_key, what in _region_pairs(value):
            start, size = _as_int(value[off_key]), _as_int(value[size_key])
            if start is not None and size:
                label = " ".join(x for x in (path, name if isinstance(name, str) else "", what) if x)
                out.append((start, start + size, label))
        for k, v in value.items():
            _regions(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _regions(v, f"{path}[{i}]", out)
    return out


def _where(offset: int, regions: list[tuple[int, int, str]]) -> str:
    inside = [r for r in regions if r[0] <= offset < r[1]]
    return f" ({min(inside, key=lambda r: r[1] - r[0])[2]})" if inside else ""


def _byte_ranges(a: bytes, b: bytes, regions: list[tuple[int, int, str]], limit: int = 16) -> dict[str, Any]:
    """How many bytes differ between two equal-length files and where: the first ``limit`` runs, each with
    the smallest region of the summary that holds it."""
    diff_at = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))
    if not diff_at.size:
        return {"identical": True}
    breaks = np.flatnonzero(np.diff(diff_at) > 1)
    starts = np.concatenate([diff_at[:1], diff_at[breaks + 1]])
    ends = np.concatenate([diff_at[breaks], diff_at[-1:]])
    runs = [
        (f"{s:#x}..{e:#x}" if e > s else f"{s:#x}") + _where(int(s), regions)
        for s, e in zip(starts[:limit], ends[:limit])
    ]
    return {
        "identical": False,
        "differing_bytes": int(diff_at.size),
        "runs": int(starts.size),
        "first_runs": runs,
    }


def diff(path_a: Path | str, path_b: Path | str) -> dict[str, Any]:
    """Field-by-field differences of two files of one kind, and (for files) of their raw bytes."""
    kind_a, a = inspect_path(path_a)
    kind_b, b = inspect_path(path_b)
    if kind_a.name != kind_b.name:
        raise AnekitError(
            f"[{FMT}] --diff needs two files of one kind: {path_a} is {kind_a.name}, "
            f"{path_b} is {kind_b.name}"
        )
    fa = _flatten({k: v for k, v in a.items() if k not in ("file", "kind")}, "", {})
    fb = _flatten({k: v for k, v in b.items() if k not in ("file", "kind")}, "", {})
    keys = list(fa) + [k for k in fb if k not in fa]
    changes = [
        {"field": k, "a": fa.get(k, _ABSENT), "b": fb.get(k, _ABSENT)}
        for k in keys
        if fa.get(k, _ABSENT) != fb.get(k, _ABSENT)
    ]
    out: dict[str, Any] = {"kind": kind_a.name, "a": a["file"], "b": b["file"], "differences": changes}
    pa, pb = Path(path_a), Path(path_b)
    if pa.is_file() and pb.is_file():
        sa, sb = pa.stat().st_size, pb.stat().st_size
        if sa != sb:
            out["bytes"] = {"identical": False, "sizes": [sa, sb]}
        elif sa <= BYTE_DIFF_LIMIT:
            out["bytes"] = _byte_ranges(pa.read_bytes(), pb.read_bytes(), _regions(a, "", []))
    return out


def _diff_value(value: Any) -> str:
    """A value in a diff line: strings with spaces quoted, so ``a -> b`` stays unambiguous."""
    return json.dumps(value) if isinstance(value, str) and (" " in value or not value) else _scalar(value)


def render_diff(result: dict[str, Any]) -> list[str]:
    """The readable text of a ``diff`` result."""
    lines = [f"--- {result['a']}", f"+++ {result['b']}", f"kind: {result['kind']}"]
    changes = result["differences"]
    for c in changes[: LIST_LIMIT * 4]:
        a, b = c["a"], c["b"]
        if c["field"].endswith("crc32") and isinstance(a, int) and isinstance(b, int):
            a, b = f"{a:08x}", f"{b:08x}"
        lines.append(f"{c['field']}: {_diff_value(a)} -> {_diff_value(b)}")
    if len(changes) > LIST_LIMIT * 4:
        lines.append(f"... {len(changes) - LIST_LIMIT * 4} more differences (--json shows all)")
    if not changes:
        lines.append("no differences in the decoded fields")
    raw = result.get("bytes")
    if raw is not None:
        if raw.get("identical"):
            lines.append("bytes: identical")
        elif "sizes" in raw:
            lines.append(f"bytes: sizes differ ({raw['sizes'][0]} vs {raw['sizes'][1]})")
        else:
            lines.append(
                f"bytes: {raw['differing_bytes']} differ in {raw['runs']} run{'s' * (raw['runs'] != 1)}: "
                + ", ".join(raw["first_runs"])
                + (", ..." if raw["runs"] > len(raw["first_runs"]) else "")
            )
    return lines
