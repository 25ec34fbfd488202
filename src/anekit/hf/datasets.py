"""Fine-tuning data in mlx-lm's formats: JSON Lines files of text, prompt/completion or chat examples, made
into token sequences with the positions the loss trains on, fixed-length windows and a weighted loss.

The layout is ``mlx_lm.lora --data DIR``'s (ml-explore/mlx-lm ``mlx_lm/tuner/datasets.py``,
``load_local_dataset``): DIR holds ``train.jsonl`` (required), ``valid.jsonl`` and ``test.jsonl``
(optional here: None when absent). A ``--data`` that is one regular ``.jsonl`` file is the train split
alone. Each non-blank line is one JSON object in one of three formats, told apart by its keys; every line
of a file must have the format of its first line:

    {"text": "..."}                                   text
    {"prompt": "...", "completion": "..."}            completions    (optionally "tools": null / [])
    {"messages": [{"role": "...", "content": "..."}, ...]}   chat    (optionally "tools": null / [])

Other keys are refused (mlx-lm ignores them), so a misspelt key is not silently dropped. A message may
carry keys besides role and content (they reach the template). A non-empty "tools" list is refused:
``HFTokenizer.apply_chat_template`` renders templates with ``tools=None``.

An ``Example`` is the whole token sequence and ``loss_from``, the index of the first token whose
prediction is trained (the offset mlx-lm's datasets return beside the tokens). The rules:

- text: ``encode(text, bos=True)``, then EOS appended when the tokenizer has one and it is not already
  last (mlx-lm ``TextDataset.process``); ``loss_from = 0``: every token is trained.
- completions with a chat template: the whole is [user: prompt, assistant: completion] rendered with
  add_generation_prompt=False, the prompt part is [user: prompt] rendered with add_generation_prompt=True,
  both encoded with bos=False (templates write their own special tokens); ``loss_from`` is the prompt
  part's length, so the completion and the end tokens the template writes after it are trained (mlx-lm
  ``CompletionsDataset.process`` with ``mask_prompt``).
- completions without a chat template: ``encode(prompt, bos=True) + encode(completion, bos=False) + EOS``
  (when the tokenizer has one), ``loss_from = len(encode(prompt, bos=True))``. mlx-lm has no such case
  (its ``apply_chat_template`` needs a template).
- chat: needs a chat template; the last message must be the assistant's. The whole conversation is
  rendered with add_generation_prompt=False, the prefix ``messages[:-1]`` with add_generation_prompt=True,
  and only the last assistant message (and its end tokens) is trained (mlx-lm ``ChatDataset.process``
  with ``mask_prompt``; earlier assistant turns are context, as there).

Where the prompt part's tokens are not the first tokens of the whole (a tokenizer that merges across the
boundary: "assistant: " then "The" encodes as "Ġ" alone but as "ĠThe" together), the whole's text is split
where the prompt's text ends and the two parts are encoded separately and concatenated, so the boundary is
exact; when the whole's text does not even start with the prompt's, the line is refused, since no
boundary can be told. ``mask_prompt=False`` trains every token instead (mlx-lm's default).

Reading: each file through ``anekit.inputs`` (a regular file, at most ``MAX_FILE_BYTES``; a FIFO, a device
or a directory is one error line, never a hang), each line at most ``MAX_LINE_BYTES`` (1 MiB: the
tokenizer's bound, checked before the line is parsed), each through ``anekit.jsonio`` (its depth limit).
Every error is one ``AnekitError`` line starting ``[hf.datasets] {what} {file}:{line}:``.

Windows. A training step sees a fixed length S: ``window`` keeps the first S + 1 tokens (a longer example
is truncated, as mlx-lm truncates to max_seq_length with a warning: ``truncated`` / ``count_truncated``
tell the caller), takes inputs = tokens[:-1] and targets = tokens[1:], pads both to S with ``pad_id`` and
weighs target j 1 when it predicts a trained token (j + 1 >= loss_from) and is not padding, else 0 (mlx-lm
``default_loss``'s mask, ``steps >= offset``). An example whose window weighs nothing (``trainable`` is
False: the trained part lies past the window) is skipped by ``batches`` and ``validation_windows``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from anekit.errors import AnekitError
from anekit.hf.tokenizer import MAX_TEXT_BYTES, HFTokenizer, text_bytes
from anekit.inputs import kind_of, read_text, shown, stat_input
from anekit.jsonio import loads
from anekit.llama.cpu_ops import weighted_cross_entropy  # the step's loss, named here for the data's users

FMT = "hf.datasets"  # the bracketed name every message starts with
READ = f"[{FMT}] cannot read"
MAX_FILE_BYTES = 1 << 30  # 1 GiB per .jsonl file: far above a fine-tuning set, read whole into memory
MAX_LINE_BYTES = MAX_TEXT_BYTES  # one example: the most the tokenizer encodes at once
SPLITS = ("train", "valid", "test")
SUFFIX = ".jsonl"

TEXT, COMPLETIONS, CHAT = "text", "completions", "chat"
KEYS = {  # format -> (required keys, optional keys)
    TEXT: (("text",), ()),
    COMPLETIONS: (("prompt", "completion"), ("tools",)),
    CHAT: (("messages",), ("tools",)),
}


class DataError(AnekitError, ValueError):
    """A fine-tuning data file or line that is not in one of mlx-lm's formats."""


@dataclass(frozen=True, eq=False)  # eq=False: a dataclass __eq__ / __hash__ cannot compare arrays
class Example:
    """One training sequence: ``tokens`` (n,) int32, read-only, and ``loss_from``, the index of the first
    token whose prediction is trained (0: all; n: none); ``source`` says where it came from ("file:line")."""

    tokens: np.ndarray
    loss_from: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        tokens = np.array(self.tokens, dtype=np.int32)  # a copy: the example owns its tokens
        if tokens.ndim != 1:
            raise DataError(f"[{FMT}] Example {self.source}: tokens must be 1-D, got shape {tokens.shape}")
        if not 0 <= self.loss_from <= len(tokens):
            raise DataError(
                f"[{FMT}] Example {self.source}: loss_from {self.loss_from} outside 0 .. {len(tokens)}"
            )
        tokens.setflags(write=False)
        object.__setattr__(self, "tokens", tokens)


@dataclass(frozen=True)
class Splits:
    """The examples of a data directory: train always, valid and test when their files exist."""

    train: list[Example]
    valid: list[Example] | None = None
    test: list[Example] | None = None


class Window(NamedTuple):
    """One training step's data, all of length S: unpacks as (inputs, targets, weights)."""

    inputs: np.ndarray  # (S,) int32
    targets: np.ndarray  # (S,) int32
    weights: np.ndarray  # (S,) float32, 1 where the prediction is trained


# ---------------------------------------------------------------------------------------------------------
# Lines to examples.


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _format_of(obj: dict[str, Any], where: str) -> str:
    """The format a line's keys name; unknown or extra keys are an error."""
    if "messages" in obj:
        fmt = CHAT
    elif "prompt" in obj or "completion" in obj:
        fmt = COMPLETIONS
    elif "text" in obj:
        fmt = TEXT
    else:
        raise DataError(
            f"{where}: unknown format, keys {sorted(obj)}: expected "
            '{"text"}, {"prompt", "completion"} or {"messages"}'
        )
    required, optional = KEYS[fmt]
    missing = [k for k in required if k not in obj]
    if missing:
        raise DataError(f"{where}: a {fmt} line needs keys {list(required)}, missing {missing}")
    extra = sorted(k for k in obj if k not in required and k not in optional)
    if extra:
        raise DataError(
            f"{where}: unknown keys {extra} in a {fmt} line (it takes {list(required + optional)})"
        )
    return fmt


def _string(obj: dict[str, Any], key: str, where: str, *, empty: bool = False) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise DataError(f"{where}: {key!r} must be a string, got {_type_name(value)}")
    if not value and not empty:
        raise DataError(f"{where}: {key!r} is empty")
    return value


def _no_tools(obj: dict[str, Any], where: str) -> None:
    tools = obj.get("tools")
    if tools is None or tools == []:
        return
    if not isinstance(tools, list):
        raise DataError(f"{where}: 'tools' must be a list or null, got {_type_name(tools)}")
    raise DataError(
        f"{where}: 'tools' given ({len(tools)}), but tools are not rendered: "
        "HFTokenizer.apply_chat_template renders templates with tools=None"
    )


def _messages(obj: dict[str, Any], where: str) -> list[dict[str, Any]]:
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if messages == [] else _type_name(messages)
        raise DataError(f"{where}: 'messages' must be a non-empty list of {{role, content}}, got {got}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DataError(
                f"{where}: messages[{i}] must be an object {{role, content}}, got {_type_name(message)}"
            )
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "nothing" if key not in message else _type_name(message[key])
                raise DataError(f"{where}: messages[{i}][{key!r}] must be a string, got {got}")
    last = messages[-1]["role"]
    if last != "assistant":
        raise DataError(
            f"{where}: the last message must be the assistant's (it is the one trained), got role {last!r}"
        )
    return messages


def _split_rendered(
    tokenizer: HFTokenizer, prompt_text: str, whole_text: str, where: str
) -> tuple[list[int], int]:
    """Tokens of the rendered ``whole_text`` and the length of its prompt part ``prompt_text``."""
    prompt = tokenizer.encode(prompt_text, bos=False)
    whole = tokenizer.encode(whole_text, bos=False)
    if whole[: len(prompt)] == prompt:
        return whole, len(prompt)
    if not whole_text.startswith(prompt_text):  # the template writes the prompt differently: no boundary
        raise DataError(
            f"{where}: the chat template renders the prompt differently when the answer follows "
            "(the whole conversation's text does not start with the prompt's): cannot tell what to train"
        )
    # The tokenizer merges across the boundary: encode the two texts apart so the boundary is exact.
    return prompt + tokenizer.encode(whole_text[len(prompt_text) :], bos=False), len(prompt)


def _example(obj: dict[str, Any], fmt: str, tokenizer: HFTokenizer, where: str) -> tuple[list[int], int]:
    """The tokens and loss_from of one line of format ``fmt``."""
    eos = tokenizer.eos_id
    if fmt == TEXT:
        tokens = tokenizer.encode(_string(obj, "text", where), bos=True)
        if eos >= 0 and tokens[-1:] != [eos]:
            tokens.append(eos)
        return tokens, 0
    _no_tools(obj, where)
    if fmt == COMPLETIONS:
        prompt = _string(obj, "prompt", where, empty=True)
        completion = _string(obj, "completion", where)
        if not tokenizer.has_chat_template:
            head = tokenizer.encode(prompt, bos=True)
            return head + tokenizer.encode(completion, bos=False, eos=True), len(head)
        user = [{"role": "user", "content": prompt}]
        both = [*user, {"role": "assistant", "content": completion}]
        return _split_rendered(
            tokenizer,
            tokenizer.apply_chat_template(user, add_generation_prompt=True),
            tokenizer.apply_chat_template(both, add_generation_prompt=False),
            where,
        )
    messages = _messages(obj, where)
    if not tokenizer.has_chat_template:
        raise DataError(f"{where}: a chat line needs a tokenizer with a chat template; this one has none")
    return _split_rendered(
        tokenizer,
        tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True),
        tokenizer.apply_chat_template(messages, add_generation_prompt=False),
        where,
    )


def load_split(
    path: str | os.PathLike[str],
    tokenizer: HFTokenizer,
    what: str = "data",
    *,
    mask_prompt: bool = True,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> list[Example]:
    """The examples of the .jsonl file ``path`` (``what`` names it in messages: "train", "valid", ...), in
    file order, one per non-blank line (see the module docstring for the formats and the trained tokens).
    ``mask_prompt=False`` trains every token of every example (mlx-lm's default). A line over
    ``max_line_bytes`` (UTF-8) is refused before it is parsed or tokenized."""
    path = Path(path)
    name = f"[{FMT}] {what} {shown(path)}"
    text = read_text(path, f"{READ} {what}", MAX_FILE_BYTES, "a JSON Lines file")
    first_format: tuple[str, int] | None = None
    examples: list[Example] = []
    for number, line in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        size = text_bytes(line)
        if size > max_line_bytes:
            raise DataError(
                f"{where}: a line of {size} bytes, over the {max_line_bytes}-byte bound for one example "
                "(the tokenizer holds about 250 bytes of memory per byte of text)"
            )
        obj = loads(line, where)  # a JsonError naming file:line when not JSON or nested too deep
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {_type_name(obj)}")
        fmt = _format_of(obj, where)
        if first_format is None:
            first_format = (fmt, number)
        elif fmt != first_format[0]:
            raise DataError(
                f"{where}: a {fmt} line in a file of {first_format[0]} lines (line {first_format[1]}): "
                "every line of a file must have one format"
            )
        try:
            tokens, loss_from = _example(obj, fmt, tokenizer, where)
        except DataError:
            raise
        except AnekitError as e:  # the tokenizer's or the template's error, placed at its line
            raise DataError(f"{where}: {e.one_line()}") from None
        examples.append(
            Example(
                np.asarray(tokens, dtype=np.int32), loss_from if mask_prompt else 0, f"{shown(path)}:{number}"
            )
        )
    if not examples:
        raise DataError(f"{name}: no examples (every line is blank)")
    return examples


def load_dir(
    directory: str | os.PathLike[str], tokenizer: HFTokenizer, *, mask_prompt: bool = True
) -> Splits:
    """The splits of an mlx-lm data directory (train.jsonl required; valid.jsonl, test.jsonl optional), or
    of a single regular .jsonl file taken as the train split alone."""
    directory = Path(directory)
    st = stat_input(directory, READ)
    if st is None:
        raise DataError(f"{READ} {shown(directory)}: no such directory or file")
    if stat.S_ISREG(st.st_mode):
        if directory.suffix != SUFFIX:
            raise DataError(
                f"{READ} {shown(directory)}: a file not named *{SUFFIX}: expected a directory holding "
                f"train{SUFFIX} (and valid{SUFFIX}, test{SUFFIX}) or a single {SUFFIX} file"
            )
        return Splits(train=load_split(directory, tokenizer, "train", mask_prompt=mask_prompt))
    if not stat.S_ISDIR(st.st_mode):
        raise DataError(f"{READ} {shown(directory)}: {kind_of(st.st_mode)}, not a data directory")
    found: dict[str, list[Example] | None] = {}
    for split in SPLITS:
        path = directory / f"{split}{SUFFIX}"
        if stat_input(path, READ) is None:
            if split == "train":
                raise DataError(
                    f"{READ} {shown(directory)}: no train{SUFFIX} (looked for {shown(path)}); "
                    f"valid{SUFFIX} and test{SUFFIX} are optional"
                )
            found[split] = None
            continue
        found[split] = load_split(path, tokenizer, split, mask_prompt=mask_prompt)
    train = found["train"]
    assert train is not None  # a missing train.jsonl raised above
    return Splits(train=train, valid=found["valid"], test=found["test"])


# ---------------------------------------------------------------------------------------------------------
# Examples to fixed-length windows.


def _check_len(seq_len: int) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise DataError(f"[{FMT}] seq_len must be an integer >= 1, got {seq_len!r}")


def truncated(example: Example, seq_len: int) -> bool:
    """Whether the example is longer than one window (seq_len + 1 tokens) and loses its tail."""
    _check_len(seq_len)
    return len(example.tokens) > seq_len + 1


def count_truncated(examples: Sequence[Example], seq_len: int) -> int:
    """How many examples a window of ``seq_len`` truncates (mlx-lm warns about them)."""
    return sum(truncated(e, seq_len) for e in examples)


def trainable(example: Example, seq_len: int) -> bool:
    """Whether the example's window trains at least one prediction: some target j < min(n - 1, S) with
    j + 1 >= loss_from."""
    _check_len(seq_len)
    predictions = min(len(example.tokens) - 1, seq_len)
    return predictions >= max(example.loss_from, 1)


def window(example: Example, seq_len: int, pad_id: int = 0) -> Window:
    """The example as one step of length S = ``seq_len``: its first S + 1 tokens, inputs = tokens[:-1],
    targets = tokens[1:], padded at the end with ``pad_id`` (weight 0); weight 1 where target j predicts a
    trained token (j + 1 >= loss_from), else 0."""
    _check_len(seq_len)
    kept = example.tokens[: seq_len + 1]  # (m + 1,), m <= S
    m = max(len(kept) - 1, 0)
    inputs = np.full(seq_len, pad_id, dtype=np.int32)  # (S,)
    targets = np.full(seq_len, pad_id, dtype=np.int32)  # (S,)
    weights = np.zeros(seq_len, dtype=np.float32)  # (S,)
    inputs[:m] = kept[:m]
    targets[:m] = kept[1 : m + 1]
    weights[max(example.loss_from - 1, 0) : m] = 1.0
    return Window(inputs, targets, weights)


def batches(
    examples: Sequence[Example], seq_len: int, rng: np.random.Generator, pad_id: int = 0
) -> Iterator[Window]:
    """Training windows without end: each epoch draws every trainable example once, in an order shuffled by
    ``rng`` (one ``rng.permutation`` per epoch, so a generator seeded alike gives the same steps). One
    example per window: the step's length is fixed, so nothing is packed. Untrainable examples are
    skipped; none trainable is an error (an endless loop otherwise)."""
    kept = [e for e in examples if trainable(e, seq_len)]
    if not kept:
        raise DataError(
            f"[{FMT}] none of the {len(examples)} examples trains a token within a window of {seq_len}"
        )
    while True:
        for i in rng.permutation(len(kept)):
            yield window(kept[int(i)], seq_len, pad_id)


def validation_windows(examples: Sequence[Example], seq_len: int, pad_id: int = 0) -> Iterator[Window]:
    """The windows of the trainable examples in file order (untrainable ones weigh nothing: skipped)."""
    for example in examples:
        if trainable(example, seq_len):
            yield window(example, seq_len, pad_id)


__all__ = [
    "Example",
    "Splits",
    "Window",
    "batches",
    "load_dir",
    "load_split",
    "trainable",
    "validation_windows",
    "weighted_cross_entropy",
    "window",
]
