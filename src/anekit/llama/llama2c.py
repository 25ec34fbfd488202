"""llama2.c's files: the model .bin (legacy and "ak42" version 1) and tokenizer.bin.

All values are little-endian float32 / int32. The legacy model file (what llama2.c's ``run.c`` reads)::

    offset  size                       contents
    0       28                         i32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
                                       (vocab_size < 0: the classifier is not tied to the embedding)
    28      4 * vocab * dim            embed (token embedding table)
            4 * n_layers * dim         rms_att      for every layer, layer 0 first
            4 * n_layers * dim * dim   wq           for every layer
            4 * n_layers * kv * dim    wk, then wv  (kv = n_kv_heads * head_dim)
            4 * n_layers * dim * dim   wo
            4 * n_layers * dim         rms_ffn
            4 * n_layers * hid * dim   w1, then w2 (dim, hid), then w3
            4 * dim                    rms_final
            4 * seq_len * head_dim/2   freq_cis_real: cos(pos * theta^(-2i / head_dim)), (seq_len, head_dim/2)
            4 * seq_len * head_dim/2   freq_cis_imag: the matching sin
            [4 * vocab * dim]          wcls, only when vocab_size < 0
                                       the file ends here

The versioned format (llama2.c ``export.py``) starts with a 256-byte header: u32 magic 0x616B3432
("ak42"), i32 version, the same 7 ints (vocab_size positive), u8 shared_classifier, zero padding. Version
1 is float32 with the order rms_att, rms_ffn (each for all layers), rms_final, embed, wq, wk, wv, wo, w1,
w2, w3 (all layers), then wcls if not shared, and no RoPE tables; it is read and written here. Version 2
is int8 Q8_0 (a group size follows the flag) and is refused with a message.

``open_llama2c`` maps a model file read-only, its arrays views of the map (inspecting, sampling and
exporting a model larger than RAM); ``read_llama2c`` reads it into writable memory (what training updates).

Format facts this module relies on:

* The RoPE tables are derived data: ``run.c`` computes the rotation itself and skips them (older run.c
  versions read them). Parsing keeps the stored tables so ``build(parse(b)) == b``; writing a model
  without tables computes them as llama2.c ``model.py`` does (float32 angles; cos / sin rounded to
  float32), within one float32 ulp of what PyTorch writes.
* tokenizer.bin: u32 max_token_length, then per token f32 score, i32 length, the token's bytes; the
  file does not store the vocabulary size (run.c reads as many tokens as the model's vocab_size; here
  every record up to the end of the file). Sentencepiece's "▁" is already a space in the pieces, BOS /
  EOS are "\\n<s>\\n" / "\\n</s>\\n", raw bytes are "<0xXX>" pieces (ids 3..258 in llama's vocabulary).
"""

from __future__ import annotations

import functools
import heapq
import os
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np

from anekit import addrspace
from anekit.binfmt import Field, Record, writable_bytes
from anekit.errors import AnekitError, FormatError
from anekit.fileio import atomic_write
from anekit.kernels.config import ModelConfig
from anekit.llama.params import LAYER_FIELDS, LayerParams, Params, layer_shapes, map_file

__all__ = [
    "AK42_HEADER",
    "AK42_MAGIC",
    "LEGACY_HEADER",
    "Llama2cHeader",
    "Llama2cModel",
    "Tokenizer",
    "TokenizerError",
    "build_llama2c",
    "build_tokenizer_bin",
    "open_llama2c",
    "parse_llama2c",
    "parse_tokenizer_bin",
    "read_llama2c",
    "read_llama2c_header",
    "read_tokenizer_bin",
    "rope_tables",
    "write_llama2c",
    "write_tokenizer_bin",
]

FORMAT = "llama2c"
TOKENIZER_FORMAT = "llama2c.tokenizer"
AK42_MAGIC = 0x616B3432
AK42_HEADER_SIZE = 256

PathOrBytes = Union[str, os.PathLike, bytes, bytearray, memoryview]

_DIMS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
LEGACY_HEADER = Record("Config", [Field(k, "i", 4 * i) for i, k in enumerate(_DIMS)], size=28)
AK42_HEADER = Record(
    "ak42 header",
    [
        Field("magic", "I", 0),
        Field("version", "i", 4),
        *(Field(k, "i", 8 + 4 * i) for i, k in enumerate(_DIMS)),
        Field("shared_classifier", "B", 36),
        Field("reserved", "219s", 37),  # zeros; version 2 keeps an i32 group_size at 37
    ],
    size=AK42_HEADER_SIZE,
)

# The tensor order of each version, declared once: parse, build and size walk these. "layers": one
# array per layer, layer 0 first; "rope": a (seq_len, head_dim / 2) table; "head": wcls, when untied.
LEGACY_ORDER = (
    ("embed", "model"),
    *((k, "layers") for k in ("rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3")),
    ("rms_final", "model"),
    ("freq_cis_real", "rope"),
    ("freq_cis_imag", "rope"),
    ("wcls", "head"),
)
V1_ORDER = (
    ("rms_att", "layers"),
    ("rms_ffn", "layers"),
    ("rms_final", "model"),
    ("embed", "model"),
    *((k, "layers") for k in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")),
    ("wcls", "head"),
)
_ORDERS = {0: LEGACY_ORDER, 1: V1_ORDER}


# --------------------------------------------------------------------------------------------------------
# model files
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Llama2cModel:
    """A parsed model file: the parameters, the RoPE tables as stored (legacy files), and the version."""

    params: Params
    freq_cis_real: np.ndarray | None = None  # (seq_len, head_dim // 2); None: computed when written
    freq_cis_imag: np.ndarray | None = None  # (seq_len, head_dim // 2)
    version: int = 0  # 0 legacy, 1 "ak42" float32

    @property
    def cfg(self) -> ModelConfig:
        return self.params.cfg


@dataclass(frozen=True)
class Llama2cHeader:
    """What a model file's header says, checked against the file's size: the config, the version (0
    legacy, 1 ak42), the byte where the arrays start, whether the classifier is the embedding, the size."""

    cfg: ModelConfig
    version: int
    start: int
    shared: bool
    size: int

    def runs(self) -> dict[str, tuple[int, int, tuple[int, ...]]]:
        """Every key's (byte offset of its first array, bytes between layers, shape), in file order."""
        out: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        at, cfg = self.start, self.cfg
        shapes = layer_shapes(cfg)
        for key, scope, n, k in _extents(_ORDERS[self.version], cfg, self.shared):
            if scope == "layers":
                shape = shapes[key]
            elif scope == "rope":
                shape = (cfg.seq_len, cfg.head_dim // 2)
            else:
                shape = (cfg.dim,) if key == "rms_final" else (cfg.vocab_size, cfg.dim)
            out[key] = (at, 4 * n, shape)
            at += 4 * n * k
        return out

    def parameters(self) -> int:
        """The number of weights (the RoPE tables are derived data, not counted)."""
        return sum(
            n * k
            for key, _, n, k in _extents(_ORDERS[self.version], self.cfg, self.shared)
            if not key.startswith("freq_cis")
        )


def rope_tables(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """llama2.c's freq_cis_real / freq_cis_imag: cos and sin of pos * theta^(-2i / head_dim), each
    (seq_len, head_dim // 2) float32; the angles are float32 as model.py computes them."""
    hd = cfg.head_dim
    exponents = np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)  # (hd/2,)
    freqs = np.float32(1.0) / np.float32(cfg.rope_theta) ** exponents  # (hd/2,) float32
    angles = np.outer(np.arange(cfg.seq_len, dtype=np.float32), freqs)  # (seq, hd/2) float32 products
    angles = angles.astype(np.float64)  # cos / sin evaluated exactly, then rounded once to float32
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _layout(
    order: tuple, cfg: ModelConfig, shared: bool
) -> list[tuple[str, str, int | None, tuple[int, ...]]]:
    """(label, key, layer, shape) of every array of a file, in file order."""
    shapes = layer_shapes(cfg)
    out: list[tuple[str, str, int | None, tuple[int, ...]]] = []
    for key, scope in order:
        if scope == "layers":
            out += [(f"layers.{i}.{key}", key, i, shapes[key]) for i in range(cfg.n_layers)]
        elif scope == "rope":
            out.append((key, key, None, (cfg.seq_len, cfg.head_dim // 2)))
        elif scope == "model":
            out.append((key, key, None, (cfg.vocab_size, cfg.dim) if key == "embed" else (cfg.dim,)))
        elif not shared:  # "head"
            out.append((key, key, None, (cfg.vocab_size, cfg.dim)))
    return out


def _positive_dims(h: dict[str, int], base: int) -> None:
    for key in _DIMS:
        value = h[key] if key != "vocab_size" else abs(h[key])
        if value <= 0:
            raise FormatError(
                FORMAT,
                key,
                "must be positive" if key != "vocab_size" else "must not be zero",
                offset=base + 4 * _DIMS.index(key),
                expected="> 0" if key != "vocab_size" else "!= 0",
                actual=h[key],
            )
    for key, of in (("n_heads", "dim"), ("n_kv_heads", "n_heads")):
        if h[of] % h[key]:
            raise FormatError(
                FORMAT,
                key,
                f"does not divide {of} = {h[of]}",
                offset=base + 4 * _DIMS.index(key),
                expected=f"a divisor of {h[of]}",
                actual=h[key],
            )
    if (h["dim"] // h["n_heads"]) % 2:
        raise FormatError(
            FORMAT,
            "n_heads",
            f"head_dim = dim / n_heads = {h['dim'] // h['n_heads']} must be even (RoPE rotates pairs)",
            offset=base + 4 * _DIMS.index("n_heads"),
            expected="dim / n_heads even",
            actual=h["n_heads"],
        )


def _read_header(buf: np.ndarray) -> tuple[dict[str, int], int, int, bool]:
    """The 7 dims, the version (0 legacy), the data offset, and whether the classifier is shared."""
    if buf.size < LEGACY_HEADER.size:
        raise FormatError(
            FORMAT, "header", "file too short for the header", offset=0, expected=28, actual=int(buf.size)
        )
    (first,) = struct.unpack_from("<I", buf.data, 0)
    if first != AK42_MAGIC:
        h = LEGACY_HEADER.parse(buf)
        _positive_dims(h, 0)
        shared = h["vocab_size"] > 0
        h["vocab_size"] = abs(h["vocab_size"])
        return h, 0, LEGACY_HEADER.size, shared
    if buf.size < 8:
        raise FormatError(
            FORMAT,
            "version",
            "file ends inside the ak42 header",
            offset=4,
            expected=256,
            actual=int(buf.size),
        )
    (version,) = struct.unpack_from("<i", buf.data, 4)
    if version == 2:
        group = struct.unpack_from("<i", buf.data, 37)[0] if buf.size >= 41 else "unknown"
        raise FormatError(
            FORMAT,
            "version",
            f"ak42 version 2 is int8 Q8_0 quantized (group size {group}); anekit reads float32 models "
            "only: export with llama2.c's export.py --version 0 (legacy) or --version 1",
            offset=4,
            expected="0 (legacy) or 1",
            actual=version,
        )
    if version != 1:
        raise FormatError(
            FORMAT, "version", "unknown ak42 version", offset=4, expected="1 (or 2, refused)", actual=version
        )
    if buf.size < AK42_HEADER_SIZE:
        raise FormatError(
            FORMAT,
            "header",
            "file too short for the ak42 header",
            offset=0,
            expected=AK42_HEADER_SIZE,
            actual=int(buf.size),
        )
    h = AK42_HEADER.parse(buf)
    if h["vocab_size"] < 0:
        raise FormatError(
            FORMAT,
            "vocab_size",
            "must be positive in ak42 files",
            offset=28,
            expected="> 0",
            actual=h["vocab_size"],
        )
    _positive_dims(h, 8)
    if h["shared_classifier"] not in (0, 1):
        raise FormatError(
            FORMAT,
            "shared_classifier",
            "must be 0 or 1",
            offset=36,
            expected="0 or 1",
            actual=h["shared_classifier"],
        )
    return {k: h[k] for k in _DIMS}, 1, AK42_HEADER_SIZE, bool(h["shared_classifier"])


def _extents(order: tuple, cfg: ModelConfig, shared: bool) -> list[tuple[str, str, int, int]]:
    """(key, scope, floats per array, arrays) of every run of arrays of a file, in file order: the
    arithmetic of ``_layout`` without one entry per layer, so a hostile n_layers costs nothing."""
    shapes = layer_shapes(cfg)
    out: list[tuple[str, str, int, int]] = []
    for key, scope in order:
        if scope == "layers":
            out.append((key, scope, int(np.prod(shapes[key])), cfg.n_layers))
        elif scope == "rope":
            out.append((key, scope, cfg.seq_len * (cfg.head_dim // 2), 1))
        elif scope == "model":
            out.append((key, scope, cfg.vocab_size * cfg.dim if key == "embed" else cfg.dim, 1))
        elif not shared:  # "head"
            out.append((key, scope, cfg.vocab_size * cfg.dim, 1))
    return out


def _checked_header(head: np.ndarray, size: int, name: str) -> tuple[ModelConfig, int, int, bool]:
    """The config, version, data offset and classifier flag of a model file of ``size`` bytes whose first
    bytes are ``head``; FormatError when the header's counts do not give exactly ``size`` bytes.
    Only the header is looked at: nothing is allocated from its counts."""
    h, version, start, shared = _read_header(head)
    cfg = ModelConfig(
        dim=h["dim"],
        hidden_dim=h["hidden_dim"],
        n_layers=h["n_layers"],
        n_heads=h["n_heads"],
        n_kv_heads=h["n_kv_heads"],
        vocab_size=h["vocab_size"],
        seq_len=h["seq_len"],
        rope=True,
        name=name,
    )
    extents = _extents(_ORDERS[version], cfg, shared)
    need = start + 4 * sum(n * k for _, _, n, k in extents)
    if size != need:
        raise _size_error(extents, start, size, need, shared)
    return cfg, version, start, shared


def parse_llama2c(
    data: bytes | bytearray | memoryview | np.ndarray, *, name: str = "llama2c"
) -> Llama2cModel:
    """Decode a llama2.c model file (legacy or ak42 version 1) from memory.

    The arrays are views of one float32 buffer (a writable copy when ``data`` is read-only). The header's
    counts are checked against the data's size before any array is made.
    """
    return _model_of(writable_bytes(data), name)


def read_llama2c_header(path: str | os.PathLike, *, name: str | None = None) -> Llama2cHeader:
    """A model file's header, checked against the file's size; nothing past the header is read."""
    name = name or Path(path).stem
    try:
        with open(os.fspath(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = np.frombuffer(f.read(AK42_HEADER_SIZE), np.uint8)
    except OSError as e:
        raise AnekitError(f"[{FORMAT}] cannot read model file {path}: {e}") from e
    cfg, version, start, shared = _checked_header(head, size, name)
    return Llama2cHeader(cfg, version, start, shared, size)


def open_llama2c(
    path: str | os.PathLike, *, name: str | None = None, windows: bool | None = None
) -> Llama2cModel:
    """A model file's weights as read-only views of maps of the file: nothing is read until used, so a
    model larger than RAM can be inspected, sampled and exported (training copies what it updates).

    The header is read and checked against the file's size before anything is mapped. The file is mapped
    whole when that takes at most half the address space the process has left (RLIMIT_AS); else, or with
    ``windows=True``, each tensor is mapped on its own when it is read (``anekit.llama.mapped``)."""
    header = read_llama2c_header(path, name=name)
    if windows is None:
        cap = addrspace.limit()
        windows = cap is not None and header.size > (cap - addrspace.in_use()) // 2
    if windows:
        return _windowed_model(path, header)
    return _model_of(map_file(path, f"[{FORMAT}] model file"), header.cfg.name)


def _windowed_model(path: str | os.PathLike, header: Llama2cHeader) -> Llama2cModel:
    """The model of ``header`` read through one window of the file per tensor."""
    from anekit.llama.mapped import FileWindows, MappedParams

    cfg, runs = header.cfg, header.runs()
    windows = FileWindows(path, f"[{FORMAT}] model file")
    tables = [
        windows.array(runs[k][0], runs[k][2], k) for k in ("freq_cis_real", "freq_cis_imag") if k in runs
    ]
    params = MappedParams(cfg, windows, runs)
    real, imag = tables if tables else (None, None)
    return Llama2cModel(params, real, imag, header.version)


def _model_of(buf: np.ndarray, name: str) -> Llama2cModel:
    """The model whose file bytes are ``buf`` (uint8): its arrays are views of ``buf``."""
    cfg, version, start, shared = _checked_header(buf[:AK42_HEADER_SIZE], int(buf.size), name)
    layout = _layout(_ORDERS[version], cfg, shared)

    floats = buf[start:].view("<f4")
    arrays: dict[tuple[str, int | None], np.ndarray] = {}
    pos = 0
    for _, key, layer, shape in layout:
        n = int(np.prod(shape))
        arrays[key, layer] = floats[pos : pos + n].reshape(shape)
        pos += n
    layers = [LayerParams(**{k: arrays[k, i] for k in LAYER_FIELDS}) for i in range(cfg.n_layers)]
    wcls = None if shared else arrays["wcls", None]
    params = Params(cfg, arrays["embed", None], layers, arrays["rms_final", None], wcls)
    return Llama2cModel(
        params, arrays.get(("freq_cis_real", None)), arrays.get(("freq_cis_imag", None)), version
    )


def _size_error(
    extents: list[tuple[str, str, int, int]], start: int, size: int, need: int, shared: bool
) -> FormatError:
    flag = "shared classifier" if shared else "unshared classifier (wcls at the end)"
    if size > need:
        return FormatError(
            FORMAT,
            "file size",
            f"{size - need} bytes after the last tensor (header: {flag})",
            offset=need,
            expected=need,
            actual=size,
        )
    at = start
    for key, scope, n, repeats in extents:
        run_end = at + 4 * n * repeats
        if size < run_end:
            layer = (size - at) // (4 * n) if n else 0
            label = f"layers.{layer}.{key}" if scope == "layers" else key
            tensor_at = at + 4 * n * layer
            return FormatError(
                FORMAT,
                label,
                f"truncated at byte {size}, expected {need}: the header's shapes need {need} bytes and the "
                f"file ends inside {label}, which starts at byte {tensor_at:#x} (header: {flag})",
                offset=size,
                expected=need,
                actual=size,
            )
        at = run_end
    raise AssertionError("unreachable: size < need but every tensor fits")


def read_llama2c(source: PathOrBytes, *, name: str | None = None) -> tuple[ModelConfig, Params]:
    """Read a llama2.c model file (a path, or its bytes): its config (named after the file) and weights,
    as writable arrays in memory (what training starts from; ``open_llama2c`` maps the file instead).

    From a path, the header is read and checked against the file's size before the rest is read."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        model = parse_llama2c(source, name=name or "llama2c")
    else:
        name = name or Path(source).stem
        try:
            with open(os.fspath(source), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = np.frombuffer(f.read(AK42_HEADER_SIZE), np.uint8)
                _checked_header(head, size, name)
                addrspace.check(size, FORMAT, f"reading {source} into memory")  # before it is allocated
                f.seek(0)
                buf = np.fromfile(f, dtype=np.uint8)
        except OSError as e:
            raise AnekitError(f"[{FORMAT}] cannot read model file {source}: {e}") from e
        model = parse_llama2c(buf, name=name)
    return model.cfg, model.params


def _arrays_to_write(model: Llama2cModel) -> tuple[bytes, list[Callable[[], np.ndarray]]]:
    """The header's bytes and, in file order, a function giving each array to write: every shape is
    checked first, and an array is fetched only when it is written (a mapped model holds one at a time)."""
    p, cfg = model.params, model.params.cfg
    problems = cfg.llama2c_problems()
    if problems:
        raise AnekitError(f"[{FORMAT}] llama2.c cannot represent {cfg.name}: it has {'; '.join(problems)}")
    shared = p.tied
    if model.version == 0:
        vocab = cfg.vocab_size if shared else -cfg.vocab_size
        header = LEGACY_HEADER.build(
            **{k: getattr(cfg, k) for k in _DIMS if k != "vocab_size"}, vocab_size=vocab
        )
    elif model.version == 1:
        header = AK42_HEADER.build(
            magic=AK42_MAGIC,
            version=1,
            **{k: getattr(cfg, k) for k in _DIMS},
            shared_classifier=int(shared),
            reserved=b"\0" * 219,
        )
    else:
        raise AnekitError(f"[{FORMAT}] cannot write version {model.version}: anekit writes 0 (legacy) or 1")
    if len(p.layers) != cfg.n_layers:
        raise AnekitError(f"[{FORMAT}] params has {len(p.layers)} layers, cfg.n_layers {cfg.n_layers}")
    computed: list[tuple[np.ndarray, np.ndarray]] = []

    def fetch(key: str, layer: int | None) -> np.ndarray:
        if key.startswith("freq_cis"):
            a = getattr(model, key)
            if a is None:
                computed[:] = computed or [rope_tables(cfg)]
                a = computed[0][key == "freq_cis_imag"]
            return np.asarray(a)
        return np.asarray(getattr(p if layer is None else p.layers[layer], key))

    out: list[Callable[[], np.ndarray]] = []
    for label, key, layer, shape in _layout(_ORDERS[model.version], cfg, shared):
        got = fetch(key, layer).shape
        if got != shape:
            raise AnekitError(f"[{FORMAT}] {label}: shape {got}, the model needs {shape}")
        out.append(functools.partial(fetch, key, layer))
    return header, out


def build_llama2c(model: Llama2cModel | Params) -> bytes:
    """The bytes of a model file (legacy unless ``model.version`` says 1)."""
    model = model if isinstance(model, Llama2cModel) else Llama2cModel(model)
    header, arrays = _arrays_to_write(model)
    return header + b"".join(np.ascontiguousarray(a(), dtype="<f4").tobytes() for a in arrays)


def write_llama2c(
    path: str | os.PathLike, model: Llama2cModel | Params, *, version: int | None = None
) -> None:
    """Write a model file atomically: legacy (run.c's format) by default, ``version=1`` for ak42 v1.

    Given ``Params``, the RoPE tables are computed; a parsed ``Llama2cModel`` keeps its stored tables.
    """
    model = model if isinstance(model, Llama2cModel) else Llama2cModel(model)
    if version is not None and version != model.version:
        model = Llama2cModel(model.params, model.freq_cis_real, model.freq_cis_imag, version)
    header, arrays = _arrays_to_write(model)
    try:
        with atomic_write(path) as f:
            f.write(header)
            for a in arrays:
                f.write(np.ascontiguousarray(a(), dtype="<f4").data.cast("B"))
    except OSError as e:
        raise AnekitError(f"[{FORMAT}] cannot write model file {path}: {e}") from e


# --------------------------------------------------------------------------------------------------------
# tokenizer.bin
# --------------------------------------------------------------------------------------------------------


class TokenizerError(AnekitError, ValueError):
    """Text or token ids the tokenizer cannot handle; the message names the id or position."""


_BYTE_PIECE = re.compile(rb"<0x([0-9A-Fa-f]{2})>")


class Tokenizer:
    """llama2.c's tokenizer: pieces (bytes) with merge scores; run.c's encode / decode rules."""

    bos_id = 1  # run.c hard-codes BOS = 1 and EOS = 2 (sentencepiece's llama defaults)
    eos_id = 2

    def __init__(self, vocab: Sequence[bytes], scores: Iterable[float], max_token_length: int | None = None):
        self.vocab: tuple[bytes, ...] = tuple(bytes(v) for v in vocab)
        self.scores = np.asarray(list(scores), dtype=np.float32)  # (vocab,)
        if self.scores.shape != (len(self.vocab),):
            raise TokenizerError(f"[tokenizer] {len(self.vocab)} pieces but {self.scores.size} scores")
        longest = max((len(v) for v in self.vocab), default=0)
        self.max_token_length = longest if max_token_length is None else int(max_token_length)
        self._ids: dict[bytes, int] = {}
        for i, piece in enumerate(self.vocab):
            self._ids.setdefault(piece, i)  # the first of duplicate pieces wins
        self._score = [float(s) for s in self.scores]
        self._byte_ids = [self._ids.get(b"<0x%02X>" % b, b + 3) for b in range(256)]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def piece(self, prev: int | None, token: int) -> bytes:
        """The bytes ``token`` prints as after ``prev`` (run.c's decode): the leading space of a piece
        is dropped right after BOS, and a ``<0xXX>`` piece is that raw byte."""
        piece = self.vocab[self._check(token, 0)]
        if prev == self.bos_id and piece[:1] == b" ":
            piece = piece[1:]
        m = _BYTE_PIECE.fullmatch(piece)
        return bytes([int(m.group(1), 16)]) if m else piece

    def decode(self, ids: Iterable[int]) -> str:
        """Text of a token sequence with run.c's rules (see ``piece``); BOS / EOS print nothing (run.c
        stops at BOS), and bytes that are not valid UTF-8 become U+FFFD."""
        out, prev = [], None
        for pos, tok in enumerate(ids):
            tok = self._check(tok, pos)
            if tok not in (self.bos_id, self.eos_id):
                out.append(self.piece(prev, tok))
            prev = tok
        return b"".join(out).decode("utf-8", errors="replace")

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        """run.c's encode: BOS, a dummy-prefix space (non-empty text), one token per UTF-8 character
        (its raw bytes' tokens when the character is not a piece), then greedily merge the adjacent pair
        whose merged piece has the highest score (leftmost on ties) until no pair is a piece; EOS."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenizerError(f"[tokenizer] text is not encodable as UTF-8 at character {e.start}") from e
        ids = [self.bos_id] if bos else []
        body: list[int] = []
        if data and b" " in self._ids:
            body.append(self._ids[b" "])
        i = 0
        while i < len(data):  # one UTF-8 character: a byte and its continuation bytes (at most 4 in all)
            j = i + 1
            while j < len(data) and data[j] & 0xC0 == 0x80 and j - i < 4:
                j += 1
            char = data[i:j]
            tok = self._ids.get(char)
            body += [tok] if tok is not None else [self._byte_ids[b] for b in char]
            i = j
        for t in body:
            if t >= len(self.vocab):
                raise TokenizerError(f"[tokenizer] byte fallback id {t} is outside the vocabulary")
        ids += self._merge(body)
        if eos:
            ids.append(self.eos_id)
        return ids

    def _merge(self, toks: list[int]) -> list[int]:
        """The greedy merge loop of run.c, with a heap over a linked list instead of rescanning every
        pair after each merge; ordering by (-score, position) picks the pair run.c's scan would."""
        n = len(toks)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        alive = [True] * n
        heap: list[tuple[float, int, int, int, int]] = []

        def push(i: int) -> None:
            if i < 0 or nxt[i] >= n:
                return
            j = nxt[i]
            merged = self._ids.get(self.vocab[toks[i]] + self.vocab[toks[j]])
            if merged is not None and self._score[merged] > -1e10:  # run.c's initial best_score
                heapq.heappush(heap, (-self._score[merged], i, toks[i], toks[j], merged))

        for i in range(n - 1):
            push(i)
        while heap:
            _, i, a, b, merged = heapq.heappop(heap)
            j = nxt[i] if alive[i] else n
            if j >= n or toks[i] != a or toks[j] != b:
                continue  # stale: one side was merged since this pair was pushed
            toks[i] = merged
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            push(prv[i])
            push(i)
        return [t for t, keep in zip(toks, alive) if keep]

    def _check(self, tok: int, pos: int) -> int:
        tok = int(tok)
        if not 0 <= tok < len(self.vocab):
            raise TokenizerError(
                f"[tokenizer] token id {tok} at position {pos} is outside the vocabulary "
                f"(0..{len(self.vocab) - 1})"
            )
        return tok

    def to_bytes(self) -> bytes:
        """The tokenizer.bin bytes (``build_tokenizer_bin``)."""
        return build_tokenizer_bin(self)


MAX_TOKEN_LENGTH = 1 << 16  # a piece longer than this is not a tokenizer's (llama's longest is 27 bytes)
_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)


def _plausible_score(score: float) -> bool:
    """A merge score as sentencepiece writes it: finite, and zero or a normal float32 (the log-probability
    like scores of llama's vocabulary are -1e6 .. 0). A subnormal is what small ints read as floats give."""
    return score == 0.0 or (np.isfinite(score) and abs(score) >= _SMALLEST_NORMAL)


def parse_tokenizer_bin(data: bytes | bytearray | memoryview) -> Tokenizer:
    """Decode tokenizer.bin from memory; every record up to the end of the data.

    The file stores no count or length of its own, so it is checked for plausibility instead: a
    max_token_length of 1 .. MAX_TOKEN_LENGTH, every score a finite normal float32 (or zero), every
    length within 0 .. max_token_length, and records that end exactly at the end of the file."""
    mv = memoryview(data).cast("B")
    if len(mv) < 4:
        raise FormatError(
            TOKENIZER_FORMAT, "max_token_length", "file too short", offset=0, expected=4, actual=len(mv)
        )
    (max_len,) = struct.unpack_from("<I", mv, 0)
    if not 1 <= max_len <= MAX_TOKEN_LENGTH:
        raise FormatError(
            TOKENIZER_FORMAT,
            "max_token_length",
            f"not a llama2.c tokenizer.bin: the longest piece must be 1 .. {MAX_TOKEN_LENGTH} bytes",
            offset=0,
            expected=f"1..{MAX_TOKEN_LENGTH}",
            actual=max_len,
        )
    vocab: list[bytes] = []
    scores: list[float] = []
    off = 4
    while off < len(mv):
        i = len(vocab)
        if off + 8 > len(mv):
            raise FormatError(
                TOKENIZER_FORMAT,
                f"token[{i}]",
                "file ends inside the record's score / length",
                offset=off,
                expected=8,
                actual=len(mv) - off,
            )
        score, n = struct.unpack_from("<fi", mv, off)
        if not _plausible_score(score):
            raise FormatError(
                TOKENIZER_FORMAT,
                f"token[{i}].score",
                "not a llama2.c tokenizer.bin: a merge score is a finite float32, zero or normal (NaN, "
                "inf or a subnormal here: the bits of a small integer, as in a model file's header)",
                offset=off,
                expected="a finite float32",
                actual=score,
            )
        if n < 0 or n > max_len:
            raise FormatError(
                TOKENIZER_FORMAT,
                f"token[{i}].len",
                "length must be in 0..max_token_length",
                offset=off + 4,
                expected=f"0..{max_len}",
                actual=n,
            )
        if off + 8 + n > len(mv):
            raise FormatError(
                TOKENIZER_FORMAT,
                f"token[{i}].bytes",
                "file ends inside the token",
                offset=off + 8,
                expected=n,
                actual=len(mv) - off - 8,
            )
        vocab.append(bytes(mv[off + 8 : off + 8 + n]))
        scores.append(score)
        off += 8 + n
    if not vocab:
        raise FormatError(TOKENIZER_FORMAT, "tokens", "no token records", offset=4, expected=">= 1", actual=0)
    return Tokenizer(vocab, scores, max_len)


def read_tokenizer_bin(source: PathOrBytes) -> Tokenizer:
    """Read llama2.c's tokenizer.bin (a path, or its bytes)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return parse_tokenizer_bin(source)
    try:
        data = Path(source).read_bytes()
    except OSError as e:
        raise AnekitError(f"[{TOKENIZER_FORMAT}] cannot read {source}: {e}") from e
    return parse_tokenizer_bin(data)


def build_tokenizer_bin(tok: Tokenizer) -> bytes:
    """The tokenizer.bin bytes of a tokenizer."""
    parts = [struct.pack("<I", tok.max_token_length)]
    for piece, score in zip(tok.vocab, tok.scores):
        parts.append(struct.pack("<fi", score, len(piece)) + piece)
    return b"".join(parts)


def write_tokenizer_bin(path: str | os.PathLike, tok: Tokenizer) -> None:
    """Write tokenizer.bin atomically."""
    try:
        with atomic_write(path) as f:
            f.write(build_tokenizer_bin(tok))
    except OSError as e:
        raise AnekitError(f"[{TOKENIZER_FORMAT}] cannot write {path}: {e}") from e
