"""mlx-lm fine-tuning data: tokens and trained positions checked against the tokenizers library called
directly and the chat templates' text written out here; windows, shuffling and the weighted loss."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from anekit.errors import AnekitError
from anekit.hf.datasets import (
    Example,
    batches,
    count_truncated,
    load_dir,
    load_split,
    trainable,
    truncated,
    validation_windows,
    weighted_cross_entropy,
    window,
)
from anekit.hf.tokenizer import HFTokenizer, load_hf_tokenizer
from anekit.llama.cpu_ops import cross_entropy
from tests.test_hf_tokenizer import CHATML  # SmolLM2's manner: a system line when none

SENTENCES = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little girl who liked to read.",
    "She read books about the sea, the sky and the stars every night.",
    "What is the capital of France? The capital of France is Paris.",
    "user: assistant: system: answer the question.",
]
SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"

# "role: content" lines; the generation prompt ends with a space, which byte-level BPE joins to the next word.
COLON = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
# Writes a different prompt when it is asked for the generation prompt: no boundary can be told.
DIFFERENT = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '>>> ' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    """A byte-level BPE trained on SENTENCES, the special tokens added after training."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(SENTENCES, trainer)
    tok.add_special_tokens(SPECIALS)
    return tok


def _model_dir(directory: Path, tok: Tokenizer, **config: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    config["added_tokens_decoder"] = {
        str(tok.token_to_id(s)): {"content": s, "special": True} for s in SPECIALS
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory, tok: Tokenizer) -> HFTokenizer:
    """Qwen-like: no BOS, EOS <|im_end|>, a ChatML template."""
    directory = tmp_path_factory.mktemp("chat")
    return load_hf_tokenizer(
        _model_dir(directory, tok, bos_token=None, eos_token="<|im_end|>", chat_template=CHATML)
    )


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, tok: Tokenizer) -> HFTokenizer:
    """Llama-2-like: BOS <s> added, EOS </s>, no chat template."""
    directory = tmp_path_factory.mktemp("plain")
    return load_hf_tokenizer(
        _model_dir(directory, tok, bos_token="<s>", eos_token="</s>", add_bos_token=True)
    )


def _templated(tmp_path: Path, tok: Tokenizer, template: str) -> HFTokenizer:
    return load_hf_tokenizer(
        _model_dir(tmp_path / "model", tok, bos_token=None, eos_token="<|im_end|>", chat_template=template)
    )


def _jsonl(path: Path, *lines: Any) -> Path:
    """A .jsonl file: dicts written as JSON, strings as they are."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def _text(tok: Tokenizer, ids: Any) -> str:
    return str(tok.decode([int(i) for i in ids], skip_special_tokens=False))


def _trained(tok: Tokenizer, example: Example) -> str:
    """The text of the targets a window long enough for the whole example trains."""
    _, targets, weights = window(example, len(example.tokens) + 3)
    return _text(tok, targets[weights > 0])


# ---------------------------------------------------------------------------------------------------------
# The three formats.


def test_text_is_the_library_ids_with_bos_and_eos(tmp_path: Path, tok: Tokenizer, plain: HFTokenizer) -> None:
    texts = ["Hello world", "The quick brown fox.\nA second line", "ends with its own end</s>"]
    examples = load_split(_jsonl(tmp_path / "t.jsonl", *({"text": t} for t in texts)), plain, "train")
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    assert [e.tokens.tolist() for e in examples] == [
        [bos, *_ids(tok, texts[0]), eos],
        [bos, *_ids(tok, texts[1]), eos],
        [bos, *_ids(tok, texts[2])],  # EOS already last: not doubled
    ]
    assert all(e.loss_from == 0 and e.tokens.dtype == np.int32 for e in examples)
    assert examples[1].source.endswith("t.jsonl:2")


def test_text_without_bos(tmp_path: Path, tok: Tokenizer, chat: HFTokenizer) -> None:
    (example,) = load_split(_jsonl(tmp_path / "t.jsonl", {"text": "Hello world"}), chat, "train")
    assert example.tokens.tolist() == [*_ids(tok, "Hello world"), tok.token_to_id("<|im_end|>")]


def test_completion_with_template_trains_exactly_the_completion(
    tmp_path: Path, tok: Tokenizer, chat: HFTokenizer
) -> None:
    prompt, completion = "What is the capital of France?", "The capital of France is Paris."
    (example,) = load_split(
        _jsonl(tmp_path / "c.jsonl", {"prompt": prompt, "completion": completion}), chat, "train"
    )
    head = f"{SYSTEM}<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    tail = f"{completion}<|im_end|>\n"
    assert example.tokens.tolist() == _ids(tok, head + tail)
    assert _text(tok, example.tokens[: example.loss_from]) == head
    assert _trained(tok, example) == tail


def test_completion_without_template(tmp_path: Path, tok: Tokenizer, plain: HFTokenizer) -> None:
    prompt, completion = "What is the capital of France?", " Paris."
    (example,) = load_split(
        _jsonl(tmp_path / "c.jsonl", {"prompt": prompt, "completion": completion}), plain, "train"
    )
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    assert example.tokens.tolist() == [bos, *_ids(tok, prompt), *_ids(tok, completion), eos]
    assert example.loss_from == 1 + len(_ids(tok, prompt))
    assert _trained(tok, example) == completion + "</s>"


def test_chat_trains_only_the_last_assistant_message(
    tmp_path: Path, tok: Tokenizer, chat: HFTokenizer
) -> None:
    messages = [
        {"role": "system", "content": "Answer the question."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello world"},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ]
    (example,) = load_split(_jsonl(tmp_path / "m.jsonl", {"messages": messages}), chat, "train")
    whole = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    assert _text(tok, example.tokens) == whole
    assert example.tokens.tolist() == _ids(tok, whole)
    assert _trained(tok, example) == "The capital of France is Paris.<|im_end|>\n"
    assert _text(tok, example.tokens[: example.loss_from]) == whole.removesuffix(_trained(tok, example))


def test_mask_prompt_false_trains_everything(tmp_path: Path, chat: HFTokenizer) -> None:
    path = _jsonl(tmp_path / "c.jsonl", {"prompt": "Hello", "completion": "world"})
    (example,) = load_split(path, chat, "train", mask_prompt=False)
    assert example.loss_from == 0


def test_boundary_merged_by_the_tokenizer_is_split_at_the_text(tmp_path: Path, tok: Tokenizer) -> None:
    tokenizer = _templated(tmp_path, tok, COLON)
    prompt_text, whole_text = "user: Hello\nassistant: ", "user: Hello\nassistant: The sea\n"
    # the premise: encoded whole, the prompt's trailing space joins "The", so the prefix does not hold
    assert _ids(tok, whole_text)[: len(_ids(tok, prompt_text))] != _ids(tok, prompt_text)
    (example,) = load_split(
        _jsonl(tmp_path / "c.jsonl", {"prompt": "Hello", "completion": "The sea"}), tokenizer, "train"
    )
    assert example.tokens.tolist() == _ids(tok, prompt_text) + _ids(tok, "The sea\n")
    assert example.loss_from == len(_ids(tok, prompt_text))
    assert _trained(tok, example) == "The sea\n"


def test_template_without_a_boundary_is_refused(tmp_path: Path, tok: Tokenizer) -> None:
    tokenizer = _templated(tmp_path, tok, DIFFERENT)
    path = _jsonl(tmp_path / "c.jsonl", {"prompt": "Hello", "completion": "The sea"})
    with pytest.raises(AnekitError, match=r"c\.jsonl:1: the chat template renders the prompt differently"):
        load_split(path, tokenizer, "train")


# ---------------------------------------------------------------------------------------------------------
# Bad input: one error line naming file:line.

BAD_LINES = {
    "not JSON": ("{'text': 1}", "not JSON"),
    "not an object": ('["text"]', "expected a JSON object, got list"),
    "unknown format": ('{"input": "x"}', "unknown format"),
    "unknown keys": ('{"text": "x", "id": 3}', r"unknown keys \['id'\]"),
    "completion missing": ('{"prompt": "x"}', r"missing \['completion'\]"),
    "text not a string": ('{"text": 3}', "'text' must be a string, got int"),
    "empty text": ('{"text": ""}', "'text' is empty"),
    "messages not a list": ('{"messages": "hi"}', "'messages' must be a non-empty list"),
    "messages empty": ('{"messages": []}', "got an empty list"),
    "message not an object": ('{"messages": ["hi"]}', r"messages\[0\] must be an object"),
    "content not a string": (
        '{"messages": [{"role": "assistant", "content": null}]}',
        r"messages\[0\]\['content'\] must be a string, got null",
    ),
    "role missing": (
        '{"messages": [{"content": "x"}]}',
        r"messages\[0\]\['role'\] must be a string, got nothing",
    ),
    "last not the assistant": (
        '{"messages": [{"role": "user", "content": "x"}]}',
        "the last message must be the assistant's",
    ),
    "tools given": (
        '{"messages": [{"role": "assistant", "content": "x"}], "tools": [{"type": "function"}]}',
        "'tools' given",
    ),
    "nested too deep": ('{"text": ' + "[" * 100 + "]" * 100 + "}", "nested 101 deep"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_line_is_one_error_naming_file_and_line(tmp_path: Path, chat: HFTokenizer, case: str) -> None:
    line, expected = BAD_LINES[case]
    path = _jsonl(tmp_path / "train.jsonl", "", "   ", line)  # two blank lines first: counted, skipped
    with pytest.raises(AnekitError) as info:
        load_split(path, chat, "train")
    message = info.value.one_line()
    assert message.startswith("[hf.datasets] train ")
    assert f"{path}:3: " in message
    assert "\n" not in str(info.value)
    assert re.search(expected, message), message


def test_mixed_formats_name_the_line(tmp_path: Path, chat: HFTokenizer) -> None:
    path = _jsonl(tmp_path / "d.jsonl", {"text": "a"}, {"text": "b"}, {"prompt": "x", "completion": "y"})
    with pytest.raises(
        AnekitError, match=r"d\.jsonl:3: a completions line in a file of text lines \(line 1\)"
    ):
        load_split(path, chat, "train")


def test_chat_needs_a_template(tmp_path: Path, plain: HFTokenizer) -> None:
    path = _jsonl(tmp_path / "d.jsonl", {"messages": [{"role": "assistant", "content": "x"}]})
    with pytest.raises(AnekitError, match=r"d\.jsonl:1: a chat line needs a tokenizer with a chat template"):
        load_split(path, plain, "train")


def test_blank_file_has_no_examples(tmp_path: Path, chat: HFTokenizer) -> None:
    with pytest.raises(AnekitError, match="no examples"):
        load_split(_jsonl(tmp_path / "d.jsonl", "", ""), chat, "train")


def test_not_utf8(tmp_path: Path, chat: HFTokenizer) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "caf\xe9"}\n')
    with pytest.raises(AnekitError, match="not UTF-8"):
        load_split(path, chat, "train")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_fifo_is_refused_without_blocking(tmp_path: Path, chat: HFTokenizer) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "train.jsonl")
    with pytest.raises(AnekitError, match=r"FIFO") as info:
        load_dir(data, chat)
    assert "\n" not in str(info.value)


def test_directory_as_split_file(tmp_path: Path, chat: HFTokenizer) -> None:
    (tmp_path / "train.jsonl").mkdir()
    with pytest.raises(AnekitError, match="a directory, not a JSON Lines file"):
        load_dir(tmp_path, chat)


# ---------------------------------------------------------------------------------------------------------
# Directories.


def test_load_dir_splits(tmp_path: Path, chat: HFTokenizer) -> None:
    _jsonl(tmp_path / "train.jsonl", {"text": "a"}, {"text": "b"})
    _jsonl(tmp_path / "valid.jsonl", {"text": "c"})
    splits = load_dir(tmp_path, chat)
    assert len(splits.train) == 2 and splits.valid is not None and len(splits.valid) == 1
    assert splits.test is None


def test_missing_train_names_it(tmp_path: Path, chat: HFTokenizer) -> None:
    _jsonl(tmp_path / "valid.jsonl", {"text": "c"})
    with pytest.raises(AnekitError, match=r"no train\.jsonl \(looked for .*train\.jsonl\)"):
        load_dir(tmp_path, chat)
    with pytest.raises(AnekitError, match="no such directory"):
        load_dir(tmp_path / "absent", chat)


def test_single_file_is_the_train_split(tmp_path: Path, chat: HFTokenizer) -> None:
    path = _jsonl(tmp_path / "mine.jsonl", {"text": "a"})
    splits = load_dir(path, chat)
    assert len(splits.train) == 1 and splits.valid is None and splits.test is None
    other = _jsonl(tmp_path / "mine.txt", {"text": "a"})
    with pytest.raises(AnekitError, match=r"not named \*\.jsonl"):
        load_dir(other, chat)


# ---------------------------------------------------------------------------------------------------------
# Windows.


def _expected_window(
    tokens: list[int], loss_from: int, s: int, pad: int
) -> tuple[list[int], list[int], list[float]]:
    """The window by its definition, one position at a time."""
    inputs, targets, weights = [], [], []
    for j in range(s):
        if j + 1 < len(tokens):
            inputs.append(tokens[j])
            targets.append(tokens[j + 1])
            weights.append(1.0 if j + 1 >= loss_from else 0.0)
        else:
            inputs.append(pad)
            targets.append(pad)
            weights.append(0.0)
    return inputs, targets, weights


@pytest.mark.parametrize(
    "n, loss_from, s", [(10, 4, 5), (10, 4, 20), (10, 0, 9), (10, 9, 9), (2, 1, 4), (6, 6, 8)]
)
def test_window_truncates_pads_and_weighs(n: int, loss_from: int, s: int) -> None:
    tokens = list(range(10, 10 + n))
    example = Example(np.array(tokens), loss_from)
    inputs, targets, weights = window(example, s, pad_id=3)
    want = _expected_window(tokens, loss_from, s, 3)
    assert inputs.tolist() == want[0] and targets.tolist() == want[1] and weights.tolist() == want[2]
    assert (inputs.dtype, targets.dtype, weights.dtype) == (np.int32, np.int32, np.float32)
    assert truncated(example, s) == (n > s + 1)
    assert trainable(example, s) == (sum(want[2]) > 0)


def test_untrainable_examples() -> None:
    assert not trainable(Example(np.array([5])), 4)  # one token: nothing to predict
    late = Example(np.arange(20), 12)  # its trained part lies past a window of 8
    assert not trainable(late, 8) and window(late, 8).weights.sum() == 0
    assert trainable(late, 12)
    assert count_truncated([late, Example(np.arange(5))], 8) == 1


def test_batches_shuffle_every_example_once_per_epoch() -> None:
    examples = [Example(np.array([i, i + 100, i + 200])) for i in range(7)]
    examples.append(Example(np.arange(300, 320), 15))  # untrainable at S = 4: skipped
    s, epochs = 4, 3

    def draw(seed: int) -> list[int]:
        stream = batches(examples, s, np.random.default_rng(seed))
        return [int(next(stream).inputs[0]) for _ in range(7 * epochs)]

    first = draw(1)
    assert first == draw(1)
    assert first != draw(2)
    for epoch in range(epochs):
        assert sorted(first[7 * epoch : 7 * epoch + 7]) == list(range(7))
    assert first[:7] != list(range(7)) or first[7:14] != list(range(7))


def test_batches_refuse_nothing_trainable() -> None:
    with pytest.raises(AnekitError, match="none of the 1 examples"):
        next(batches([Example(np.arange(20), 15)], 4, np.random.default_rng(0)))


def test_validation_windows_in_file_order() -> None:
    examples = [Example(np.array([i, i + 1, i + 2])) for i in range(5)]
    windows = list(validation_windows(examples, 4))
    assert [int(w.inputs[0]) for w in windows] == list(range(5))
    assert all(w.weights.tolist() == [1, 1, 0, 0] for w in windows)


# ---------------------------------------------------------------------------------------------------------
# The weighted loss.


def _reference(logits: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> tuple[float, np.ndarray]:
    """float64, by the textbook formula: log-softmax with scipy-free logsumexp."""
    x = logits.astype(np.float64)
    lse = np.log(np.exp(x - x.max(axis=0)).sum(axis=0)) + x.max(axis=0)
    cols = np.arange(x.shape[1])
    ce = lse - x[targets, cols]
    w = weights.astype(np.float64)
    p = np.exp(x - lse)
    onehot = np.zeros_like(x)
    onehot[targets, cols] = 1.0
    return float((w * ce).sum() / w.sum()), w * (p - onehot) / w.sum()


def test_weighted_cross_entropy_matches_float64() -> None:
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((11, 6)) * 3).astype(np.float32)
    targets = rng.integers(0, 11, 6)
    weights = np.array([1, 0, 2, 0.5, 0, 1], dtype=np.float32)
    loss, grad = weighted_cross_entropy(logits, targets, weights)
    want_loss, want_grad = _reference(logits, targets, weights)
    assert grad.dtype == np.float32 and grad.shape == logits.shape
    assert loss == pytest.approx(want_loss, rel=1e-6)
    np.testing.assert_allclose(grad, want_grad, atol=1e-7)
    assert np.all(grad[:, weights == 0] == 0)


def test_weighted_cross_entropy_finite_differences() -> None:
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((5, 4)).astype(np.float32)
    targets, weights = np.array([0, 4, 2, 2]), np.array([1, 0.25, 0, 3], dtype=np.float32)
    _, grad = weighted_cross_entropy(logits, targets, weights)
    eps = 1e-2
    for v in range(5):
        for s in range(4):
            up, down = logits.copy(), logits.copy()
            up[v, s] += eps
            down[v, s] -= eps
            numeric = (
                weighted_cross_entropy(up, targets, weights)[0]
                - weighted_cross_entropy(down, targets, weights)[0]
            ) / (2 * eps)
            assert grad[v, s] == pytest.approx(numeric, abs=2e-4)


def test_all_ones_is_the_plain_mean() -> None:
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((9, 7)).astype(np.float32)
    targets = rng.integers(0, 9, 7)
    loss, grad = weighted_cross_entropy(logits, targets, np.ones(7, np.float32))
    plain_loss, plain_grad = cross_entropy(logits.copy(), targets)
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    np.testing.assert_allclose(grad, plain_grad, atol=1e-7)


def test_zero_weights_and_large_logits() -> None:
    logits = np.array([[1e4, -1e4], [0.0, 3e4], [-5e3, 0.0]], dtype=np.float32)
    targets = np.array([2, 0])
    loss, grad = weighted_cross_entropy(logits, targets, np.zeros(2, np.float32))
    assert loss == 0.0 and not grad.any()
    loss, grad = weighted_cross_entropy(logits, targets, np.ones(2, np.float32))
    assert np.isfinite(loss) and np.all(np.isfinite(grad))
    assert loss == pytest.approx(_reference(logits, targets, np.ones(2))[0], rel=1e-6)


def test_weighted_cross_entropy_refuses_bad_shapes() -> None:
    with pytest.raises(AnekitError, match="targets must be integer ids"):
        weighted_cross_entropy(np.zeros((3, 2), np.float32), np.array([0, 3]), np.ones(2))
    with pytest.raises(AnekitError, match=r"must be \(2,\)"):
        weighted_cross_entropy(np.zeros((3, 2), np.float32), np.array([0]), np.ones(2))
