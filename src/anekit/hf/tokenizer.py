"""The tokenizer of a Hugging Face model directory as anekit's ``Tokenizer``: ids, BOS / EOS, chat template.

Files read from the directory (one of the first two is required; the others are optional):

    tokenizer.json            the ``tokenizers`` library's tokenizer (preferred when present)
    tokenizer.model           a sentencepiece model, used when there is no tokenizer.json
    tokenizer_config.json     bos_token, eos_token, pad_token, unk_token (a string, null or {"content": ...}),
                              add_bos_token, add_eos_token, chat_template, added_tokens_decoder
    special_tokens_map.json   the same four tokens, for those tokenizer_config.json does not name
    generation_config.json    eos_token_id (an int or a list): more end ids; bos_token_id: checked, never used
    chat_template.jinja       the chat template as its own file (newer transformers save it there); it wins
                              over tokenizer_config.json's chat_template, as transformers loads it

config.json is never read: BOS and EOS come from the tokenizer's files. Qwen2's config.json and
generation_config.json name a bos_token_id (151643, <|endoftext|>), yet its tokenizer has bos_token null
and never adds one.

BOS rule. ``bos_id`` is the id of the bos_token named by tokenizer_config.json (else special_tokens_map.json);
a bos_token named null means no BOS (-1). When neither file names one: a sentencepiece model's own BOS
(unless it has none), or for tokenizer.json the single token its post-processor puts before a text, if it
puts exactly one (else no BOS). Whether ``encode(text, bos=True)`` adds it: never without a BOS; else
add_bos_token when tokenizer_config.json gives it (the flag wins, as transformers' Llama and Gemma fast
tokenizers rebuild their post-processor from it); else, for tokenizer.json, whether its post-processor adds
it (encoding "" with special tokens yields [bos] first: Llama-3's TemplateProcessing does); else, for a
sentencepiece model, yes (transformers' LlamaTokenizer default). Text is always encoded without the
library's special tokens (``add_special_tokens=False``) and BOS is prepended here, so it appears exactly
once whatever the post-processor does. Special ids are looked up, never assumed: Qwen's sit at the end of
the vocabulary (<|endoftext|> 151643, <|im_end|> 151645), Llama-3's too (<|begin_of_text|> 128000).

EOS rule. ``eos_ids`` is every end id: the eos_token of tokenizer_config.json (else special_tokens_map.json;
else a sentencepiece model's own EOS), then generation_config.json's eos_token_id in its order, each id
once; ``eos_id`` is the first (-1 when there is none). ``encode(text, eos=True)`` appends ``eos_id``
whenever there is one: the caller asks for it explicitly, so add_eos_token is only reported (``adds_eos``).

``decode`` skips special tokens and is a pure function of the ids, so decoding a growing list (as the
sampler streams text) gives growing text for ordinary text. ``apply_chat_template`` renders the template
with jinja2's immutable sandbox configured as transformers configures it (trim_blocks, lstrip_blocks, loop
controls, a ``tojson`` that keeps non-ASCII, ``raise_exception`` and ``strftime_now``), bounded in time and
output size (``anekit.hf.template``).

Every error is one ``AnekitError`` line naming the file and the field (``FormatError`` for a malformed file).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, Protocol

from anekit.errors import AnekitError, FormatError, install_hint
from anekit.inputs import LIMITS, kind_of, read_bytes, read_text, shown, stat_input
from anekit.jsonio import JsonError, loads

FMT = "hf.tokenizer"  # the bracketed name every message starts with
TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE_MODEL = "tokenizer.model"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKEN_FIELDS = ("bos_token", "eos_token", "pad_token", "unk_token")
INSTALL_HINT = install_hint("hf")
READ = f"[{FMT}] cannot read"  # what InputError messages say failed
# The longest text encode takes, in UTF-8 bytes. The tokenizers library holds about 250 bytes per byte of
# text while it encodes (and aborts the process when an allocation fails): 1 MiB needs some 250 MB and a
# few seconds, and is already longer than any context a model here is run or trained with.
MAX_TEXT_BYTES = 1 << 20


def _one_line(text: str) -> str:
    """``text`` with its lines joined by "; " (a template's error can span lines)."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _bad(path: Path, field: str, message: str, *, expected: Any = None, actual: Any = None) -> FormatError:
    """The FormatError of ``field`` in the file ``path`` ("got X" alone when nothing more is expected)."""
    where = f"{shown(path)} {field}" if field else shown(path)
    if expected is None and actual is not None:
        error = FormatError(FMT, where, f"{message}, got {actual!r}")
        error.actual = actual
        return error
    return FormatError(FMT, where, message, expected=expected, actual=actual)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def text_bytes(text: str) -> int:
    """The UTF-8 size of ``text`` (a lone surrogate, as argv carries bytes that are not UTF-8, counted as
    its three bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


# ---------------------------------------------------------------------------------------------------------
# The two libraries behind a tokenizer, behind one small interface.


class _Backend(Protocol):
    """What HFTokenizer needs from the library that holds the vocabulary."""

    path: Path

    def size(self) -> int: ...

    def encode(self, text: str, special: bool) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_id(self, token: str) -> int | None: ...

    def token(self, token_id: int) -> str | None: ...

    def highest(self) -> tuple[str, int]:
        """The entry (token, id) with the highest id, added tokens included."""
        ...

    def own_bos(self) -> int:
        """The BOS the tokenizer file itself implies when no config names one (-1: none)."""
        ...

    def own_eos(self) -> int: ...

    def adds_bos(self, bos_id: int) -> bool:
        """Whether the library would add ``bos_id`` by itself (when no add_bos_token says)."""
        ...


def _import_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as e:
        raise AnekitError(
            f"[{FMT}] reading a {TOKENIZER_JSON} needs the tokenizers package: {INSTALL_HINT}"
        ) from e
    return tokenizers


class _FastBackend:
    """A ``tokenizers.Tokenizer`` read from tokenizer.json."""

    def __init__(self, path: Path) -> None:
        tokenizers = _import_tokenizers()
        text = read_text(path, READ, LIMITS["tokenizer"], "a tokenizer.json file")
        try:
            self.tok = tokenizers.Tokenizer.from_str(text)
        except Exception as e:  # the library raises plain Exceptions carrying serde's message
            raise _bad(path, "", f"the tokenizers library rejects it: {_one_line(str(e))}") from None
        self.path = path
        self.declared = _declared_ids(json.loads(text))  # what the library accepted is JSON

    def size(self) -> int:
        return int(self.tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, special: bool) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=special).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))

    def token_id(self, token: str) -> int | None:
        found = self.tok.token_to_id(token)
        return None if found is None else int(found)

    def token(self, token_id: int) -> str | None:
        return self.tok.id_to_token(token_id)

    def highest(self) -> tuple[str, int]:
        """The highest id the file declares (the library renumbers an added token past its vocabulary, so
        its own ids alone would hide it) or the library's vocabulary holds."""
        vocab = self.tok.get_vocab(with_added_tokens=True)
        entries = [*self.declared, *vocab.items()]
        return max(entries, key=lambda entry: entry[1], default=("", -1))

    def own_bos(self) -> int:
        """The one id the post-processor puts before a text ("a"), when it puts exactly one."""
        plain, full = self.encode("a", False), self.encode("a", True)
        if not plain:
            return -1
        for start in range(len(full) - len(plain) + 1):
            if full[start : start + len(plain)] == plain:
                return full[0] if start == 1 else -1
        return -1

    def own_eos(self) -> int:
        return -1

    def adds_bos(self, bos_id: int) -> bool:
        return self.encode("", True)[:1] == [bos_id]


def _declared_ids(spec: Any) -> list[tuple[str, int]]:
    """(token, id) of every entry tokenizer.json itself numbers: model.vocab as {token: id} (BPE,
    WordPiece, WordLevel; a Unigram's list is numbered by position) and added_tokens' {"id", "content"}.
    Entries the library would refuse are left to it."""
    entries: list[tuple[str, int]] = []
    vocab = (
        spec.get("model", {}).get("vocab")
        if isinstance(spec, dict) and isinstance(spec.get("model"), dict)
        else None
    )
    if isinstance(vocab, dict):
        entries += [(str(t), i) for t, i in vocab.items() if isinstance(i, int) and not isinstance(i, bool)]
    added = spec.get("added_tokens") if isinstance(spec, dict) else None
    for entry in added if isinstance(added, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int) and not isinstance(entry["id"], bool):
            entries.append((str(entry.get("content", "")), entry["id"]))
    return entries


class _SentencePieceBackend:
    """A sentencepiece model read from tokenizer.model."""

    def __init__(self, path: Path) -> None:
        from anekit.llama.tokenizer import SentencePieceTokenizer

        data = read_bytes(path, READ, LIMITS["tokenizer"], "a sentencepiece model")
        self.sp = SentencePieceTokenizer.from_bytes(data, shown(path)).sp
        self.path = path

    def size(self) -> int:
        return int(self.sp.GetPieceSize())

    def encode(self, text: str, special: bool) -> list[int]:
        return [int(i) for i in self.sp.EncodeAsIds(text)]  # sentencepiece adds no special ids itself

    def decode(self, ids: list[int]) -> str:
        return str(self.sp.DecodeIds(ids))  # control pieces (BOS, EOS) decode to nothing

    def token_id(self, token: str) -> int | None:
        found = int(self.sp.PieceToId(token))  # an unknown piece gives the unk id: check it round-trips
        return found if self.sp.IdToPiece(found) == token else None

    def token(self, token_id: int) -> str | None:
        return str(self.sp.IdToPiece(token_id))

    def highest(self) -> tuple[str, int]:
        last = self.size() - 1  # sentencepiece numbers its pieces 0 .. size - 1
        return (str(self.sp.IdToPiece(last)), last) if last >= 0 else ("", -1)

    def own_bos(self) -> int:
        return int(self.sp.bos_id())

    def own_eos(self) -> int:
        return int(self.sp.eos_id())

    def adds_bos(self, bos_id: int) -> bool:
        return True  # transformers' LlamaTokenizer: add_bos_token defaults to true


def _backend(directory: Path) -> _Backend:
    """The library tokenizer of ``directory``: tokenizer.json, else tokenizer.model, else an error."""
    json_path, model_path = directory / TOKENIZER_JSON, directory / SENTENCEPIECE_MODEL
    if stat_input(json_path, READ) is not None:
        return _FastBackend(json_path)
    if stat_input(model_path, READ) is not None:
        return _SentencePieceBackend(model_path)
    raise AnekitError(
        f"[{FMT}] {shown(directory)}: no tokenizer: looked for {TOKENIZER_JSON} and {SENTENCEPIECE_MODEL}"
    )


# ---------------------------------------------------------------------------------------------------------
# The JSON files beside it, field by field.


def _read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is no such file."""
    if stat_input(path, READ) is None:
        return None
    text = read_text(path, READ, LIMITS["json"], "a JSON file")
    what = f"[{FMT}] {shown(path)}"
    try:
        value = loads(text, what)
    except JsonError as e:
        raise _bad(path, "", str(e).removeprefix(what + ": ")) from None
    if not isinstance(value, dict):
        raise _bad(path, "", f"expected a JSON object, got {_type_name(value)}")
    return value


def _token_field(value: Any, path: Path, field: str) -> str | None:
    """A special token as configs write it: a string, null, or an AddedToken {"content": "..."}."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise _bad(path, field, 'expected a string, null or {"content": "..."}', actual=value)


def _bool_field(value: Any, path: Path, field: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise _bad(path, field, "expected true, false or null", actual=value)


def _ids_field(value: Any, path: Path, field: str) -> tuple[int, ...]:
    """Token ids as generation_config.json writes them: an int, a list of ints, or null."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            at = f"{field}[{i}]" if isinstance(value, list) else field
            raise _bad(path, at, "expected a token id (an integer >= 0) or a list of them", actual=item)
    return tuple(items)


def _chat_template_field(value: Any, path: Path) -> str | None:
    """A chat template: a string, or a list of {"name", "template"} whose "default" is used."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _bad(path, "chat_template", "expected a string or a list of named templates", actual=value)
    named: dict[str, str] = {}
    for i, item in enumerate(value):
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)):
            raise _bad(path, f"chat_template[{i}]", 'expected {"name": "...", "template": "..."}')
        if not isinstance(item.get("template"), str):
            raise _bad(path, f"chat_template[{i}].template", "expected a string", actual=item.get("template"))
        named[item["name"]] = item["template"]
    if "default" not in named:
        raise _bad(path, "chat_template", f"no template named 'default' among {sorted(named)}")
    return named["default"]


def _added_tokens_field(value: Any, path: Path) -> dict[int, str]:
    """added_tokens_decoder: {"<id>": {"content": "<token>", ...}} as {id: token}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(
            path, "added_tokens_decoder", "expected an object of id -> token", actual=_type_name(value)
        )
    added: dict[int, str] = {}
    for key, entry in value.items():
        if not key.isdigit():
            raise _bad(path, f"added_tokens_decoder[{key!r}]", "the key must be a token id", actual=key)
        content = _token_field(entry, path, f"added_tokens_decoder[{key!r}]")
        if content is None:
            raise _bad(path, f"added_tokens_decoder[{key!r}]", "expected a token, not null")
        added[int(key)] = content
    return added


class _Named:
    """A special token as the files name it: its text (None: named null) and the file and field saying so."""

    def __init__(self, text: str | None, path: Path, field: str) -> None:
        self.text, self.path, self.field = text, path, field


def _named_tokens(directory: Path, config: dict[str, Any]) -> dict[str, _Named]:
    """bos/eos/pad/unk named by tokenizer_config.json, else by special_tokens_map.json; absent: not named."""
    sources = [(directory / TOKENIZER_CONFIG, config)]
    special_map = _read_object(directory / SPECIAL_TOKENS_MAP)
    if special_map is not None:
        sources.append((directory / SPECIAL_TOKENS_MAP, special_map))
    named: dict[str, _Named] = {}
    for field in TOKEN_FIELDS:
        for path, values in sources:
            if field in values:
                named[field] = _Named(_token_field(values[field], path, field), path, field)
                break
    return named


def _chat_template(directory: Path, config: dict[str, Any]) -> tuple[str | None, str]:
    """The chat template and where it comes from ("<file>" or "<file> chat_template", for messages)."""
    file = directory / CHAT_TEMPLATE_FILE
    if stat_input(file, READ) is not None:
        return read_text(file, READ, LIMITS["json"], "a Jinja template"), shown(file)
    path = directory / TOKENIZER_CONFIG
    return _chat_template_field(config.get("chat_template"), path), f"{shown(path)} chat_template"


# ---------------------------------------------------------------------------------------------------------
# Special ids, by the rules of the module docstring.


class _Vocabulary:
    """Token text -> id through the library, then added_tokens_decoder; every answer checked in range."""

    def __init__(self, backend: _Backend, added: dict[int, str], config_path: Path) -> None:
        self.backend, self.size = backend, backend.size()
        self.added = {text: i for i, text in added.items()}
        for token_id, text in added.items():
            found = backend.token_id(text)
            if found is not None and found != token_id:
                raise _bad(
                    config_path,
                    f"added_tokens_decoder[{str(token_id)!r}]",
                    f"{text!r} has id {found} in {backend.path.name}",
                    expected=found,
                    actual=token_id,
                )

    def resolve(self, named: _Named) -> int:
        assert named.text is not None
        found = self.backend.token_id(named.text)
        if found is None:
            found = self.added.get(named.text)
        if found is None or not 0 <= found < self.size:
            raise _bad(named.path, named.field, f"{named.text!r} is not a token of {self.backend.path.name}")
        return found


def _bos_id(named: dict[str, _Named], vocab: _Vocabulary) -> int:
    if "bos_token" not in named:
        return vocab.backend.own_bos()
    token = named["bos_token"]
    return -1 if token.text is None else vocab.resolve(token)


def _adds_bos(bos_id: int, flag: bool | None, backend: _Backend) -> bool:
    if bos_id < 0:
        return False
    return flag if flag is not None else backend.adds_bos(bos_id)


def _eos_ids(
    named: dict[str, _Named], vocab: _Vocabulary, generation: dict[str, Any] | None, path: Path
) -> tuple[int, ...]:
    """Every end id: the eos_token (or the model's own EOS), then generation_config's, each once."""
    ids: list[int] = []
    token = named.get("eos_token")
    if token is None:
        own = vocab.backend.own_eos()
        ids += [own] if own >= 0 else []
    elif token.text is not None:
        ids.append(vocab.resolve(token))
    if generation is not None:
        _ids_field(generation.get("bos_token_id"), path, "bos_token_id")  # checked; BOS is the tokenizer's
        for i, token_id in enumerate(_ids_field(generation.get("eos_token_id"), path, "eos_token_id")):
            if token_id >= vocab.size:
                field = (
                    "eos_token_id" if isinstance(generation["eos_token_id"], int) else f"eos_token_id[{i}]"
                )
                raise _bad(path, field, f"id {token_id} is outside the vocabulary (0 .. {vocab.size - 1})")
            ids += [] if token_id in ids else [token_id]
    return tuple(ids)


# ---------------------------------------------------------------------------------------------------------
# Chat templates.


class _TemplateRaised(AnekitError):
    """raise_exception(message) called by a chat template."""


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRaised(str(message))


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kwargs: Any) -> str:
    """transformers' tojson: plain json.dumps, non-ASCII kept (Jinja's own would HTML-escape "<")."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kwargs)


def _compile_template(source: str, where: str) -> Any:
    """The jinja2 template of ``source`` in the immutable sandbox, set up as transformers sets it up."""
    try:
        import jinja2

        from anekit.hf.template import BoundedSandbox
    except ImportError as e:
        raise AnekitError(f"[{FMT}] chat templates need the jinja2 package: {INSTALL_HINT}") from e
    env = BoundedSandbox()  # trim_blocks, lstrip_blocks, loop controls; bounded in time and size
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise AnekitError(f"[{FMT}] {where}: line {e.lineno}: {_one_line(e.message or str(e))}") from None


def _check_messages(messages: Any) -> None:
    """messages must be a list of dicts, each with a string "role" and a string "content"."""
    if not isinstance(messages, list):
        raise AnekitError(f"[{FMT}] messages: expected a list of dicts, got {_type_name(messages)}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise AnekitError(f"[{FMT}] messages[{i}]: expected a dict, got {_type_name(message)}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "nothing" if key not in message else _type_name(message[key])
                raise AnekitError(f"[{FMT}] messages[{i}][{key!r}]: expected a string, got {got}")


# ---------------------------------------------------------------------------------------------------------
# The tokenizer.


class HFTokenizer:
    """A Hugging Face tokenizer directory as anekit's ``Tokenizer`` (see the module docstring's rules)."""

    def __init__(
        self,
        backend: _Backend,
        *,
        bos_id: int,
        adds_bos: bool,
        adds_eos: bool,
        eos_ids: tuple[int, ...],
        special: dict[str, str],
        chat_template: str | None,
        template_source: str,
    ) -> None:
        self._backend = backend
        self._size = backend.size()
        self._bos_id, self._adds_bos, self._adds_eos, self._eos_ids = bos_id, adds_bos, adds_eos, eos_ids
        self._special = special  # bos_token / eos_token / pad_token / unk_token text, for templates
        self._template_text, self._template_source = chat_template, template_source
        self._template: Any = None  # compiled on first use: a broken template leaves plain encoding usable

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer knows, added tokens included."""
        return self._size

    @property
    def bos_id(self) -> int:
        """The BOS id, -1 when the tokenizer has none (Qwen)."""
        return self._bos_id

    @property
    def adds_bos(self) -> bool:
        """Whether ``encode(text, bos=True)`` puts BOS first."""
        return self._adds_bos

    @property
    def adds_eos(self) -> bool:
        """tokenizer_config.json's add_eos_token (reported only: ``encode`` adds EOS when asked)."""
        return self._adds_eos

    @property
    def eos_id(self) -> int:
        """The first end id, -1 when there is none."""
        return self._eos_ids[0] if self._eos_ids else -1

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: the eos_token, then generation_config.json's eos_token_id."""
        return self._eos_ids

    @property
    def special_tokens(self) -> dict[str, str]:
        """The named special tokens' text (bos_token, eos_token, pad_token, unk_token; those set)."""
        return dict(self._special)

    @property
    def has_chat_template(self) -> bool:
        return self._template_text is not None

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        """The ids of ``text``: BOS first when ``bos`` and the tokenizer adds one, EOS last when ``eos``."""
        if not isinstance(text, str):
            raise AnekitError(f"[{FMT}] encode: expected a string, got {_type_name(text)}")
        size = text_bytes(text)
        if size > MAX_TEXT_BYTES:
            raise AnekitError(
                f"[{FMT}] encode: a text of {size} bytes is over the {MAX_TEXT_BYTES}-byte bound for one "
                "text (the tokenizers library holds about 250 bytes of memory per byte it encodes)"
            )
        ids = self._backend.encode(text, False)
        head = [self._bos_id] if bos and self._adds_bos else []
        tail = [self.eos_id] if eos and self.eos_id >= 0 else []
        return head + ids + tail

    def _check_id(self, token: Any, position: int | None = None) -> int:
        where = "" if position is None else f" at position {position}"
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self._size:
            raise AnekitError(
                f"[{FMT}] {self._backend.path.name}: id {token!r}{where} is outside the vocabulary "
                f"(0 .. {self._size - 1})"
            )
        return int(token)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens skipped."""
        return self._backend.decode([self._check_id(t, i) for i, t in enumerate(ids)])

    def piece(self, token: int) -> str:
        """The token's own text as the vocabulary writes it ("Ġthe", "▁the", "<|im_end|>")."""
        text = self._backend.token(self._check_id(token))
        if text is None:
            raise AnekitError(f"[{FMT}] {self._backend.path.name}: id {token} has no token")
        return text

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The conversation as the model's chat template writes it (a prompt to ``encode(bos=False)``:
        templates that want BOS write it themselves)."""
        if self._template_text is None:
            raise AnekitError(
                f"[{FMT}] {shown(self._backend.path.parent)}: the tokenizer has no chat template "
                f"(none in {TOKENIZER_CONFIG} or {CHAT_TEMPLATE_FILE})"
            )
        _check_messages(messages)
        if self._template is None:
            self._template = _compile_template(self._template_text, self._template_source)
        variables: dict[str, Any] = dict(self._special)
        variables.update(
            messages=messages, add_generation_prompt=bool(add_generation_prompt), tools=None, documents=None
        )
        from anekit.hf.template import render

        try:
            return render(self._template, variables)
        except MemoryError:
            raise AnekitError(f"[{FMT}] {self._template_source}: the template ran out of memory") from None
        except _TemplateRaised as e:
            raise AnekitError(
                f"[{FMT}] {self._template_source}: raise_exception: {_one_line(str(e))}"
            ) from None
        except Exception as e:  # a template is code: any failure while it runs is the template's error
            message = _one_line(str(e)) or type(e).__name__
            raise AnekitError(f"[{FMT}] {self._template_source}: {message}") from None

    def __repr__(self) -> str:
        return (
            f"HFTokenizer({shown(self._backend.path)!r}, vocab_size={self._size}, bos_id={self._bos_id}, "
            f"eos_ids={self._eos_ids})"
        )


def _check_model_vocab(backend: _Backend, added: dict[int, str], config_path: Path, model_vocab: int) -> None:
    """Every id the tokenizer can produce indexes the model's embedding (0 .. model_vocab - 1): the
    highest entry of the tokenizer file, then added_tokens_decoder's."""
    token, token_id = backend.highest()
    where = f"{backend.path.name} token {token!r}"
    if token_id < model_vocab:
        found = max(added, default=-1)
        token, token_id = added.get(found, ""), found
        where = f"{config_path.name} added_tokens_decoder token {token!r}"
    if token_id >= model_vocab:
        raise AnekitError(
            f"[{FMT}] {where} has id {token_id}, outside the model's vocabulary of {model_vocab} "
            "(config.json vocab_size)"
        )


def load_hf_tokenizer(directory: str | os.PathLike[str], model_vocab: int | None = None) -> HFTokenizer:
    """The tokenizer of the Hugging Face model directory ``directory`` (see the module docstring), or of a
    tokenizer.json file named itself, with the other files of the directory that holds it. ``model_vocab``
    is the model's vocab_size, when known: a token with an id past it is refused."""
    directory = Path(directory)
    st = stat_input(directory, READ)
    if st is None:
        raise AnekitError(f"{READ} {shown(directory)}: no such directory")
    tokenizer_json = None
    if stat.S_ISREG(st.st_mode) and directory.suffix == ".json":
        tokenizer_json, directory = directory, directory.parent
    elif not stat.S_ISDIR(st.st_mode):
        raise AnekitError(f"{READ} {shown(directory)}: {kind_of(st.st_mode)}, not a model directory")
    backend = _backend(directory) if tokenizer_json is None else _FastBackend(tokenizer_json)
    config_path = directory / TOKENIZER_CONFIG
    config = _read_object(config_path) or {}
    named = _named_tokens(directory, config)
    added = _added_tokens_field(config.get("added_tokens_decoder"), config_path)
    if model_vocab is not None:
        _check_model_vocab(backend, added, config_path, model_vocab)
    vocab = _Vocabulary(backend, added, config_path)
    bos_id = _bos_id(named, vocab)
    generation_path = directory / GENERATION_CONFIG
    template, template_source = _chat_template(directory, config)
    return HFTokenizer(
        backend,
        bos_id=bos_id,
        adds_bos=_adds_bos(
            bos_id, _bool_field(config.get("add_bos_token"), config_path, "add_bos_token"), backend
        ),
        adds_eos=bool(_bool_field(config.get("add_eos_token"), config_path, "add_eos_token")),
        eos_ids=_eos_ids(named, vocab, _read_object(generation_path), generation_path),
        special={field: token.text for field, token in named.items() if token.text is not None},
        chat_template=template,
        template_source=template_source,
    )
