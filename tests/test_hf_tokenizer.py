"""HFTokenizer against the tokenizers and sentencepiece libraries called directly, on tiny tokenizers trained here."""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
spm = pytest.importorskip("sentencepiece")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

from anekit.errors import AnekitError, FormatError  # noqa: E402
from anekit.hf.tokenizer import HFTokenizer, load_hf_tokenizer  # noqa: E402
from anekit.llama.corpus import generate_corpus  # noqa: E402
from anekit.llama.tokenizer import Tokenizer as TokenizerProtocol  # noqa: E402
from anekit.llama.tokenizer import train_bpe  # noqa: E402

SENTENCES = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little girl who liked to read.",
    "She read books about the sea, the sky and the stars every night.",
    "Numbers like 12 and 345 appear too, with punctuation: yes!",
    "Tokenizers split text into pieces, and pieces into ids.",
]
TEXTS = [
    "Hello world",
    "The little girl read about the stars.",
    "  two leading spaces, a tab\tand a newline\n",
    "café, naïve, 東京 and an emoji 🙂",
    "x",
]

LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# A ChatML template in the manner of SmolLM2's: a system line when the conversation has none.
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A ChatML template in the manner of Qwen2.5's: written over several lines with whitespace control.
QWEN_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (loop.first and message['role'] == 'system') %}
        {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CONVERSATION = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}]


# ---------------------------------------------------------------------------------------------------------
# Building directories.


def _train(specials_at_end: list[str]) -> Tokenizer:
    """A byte-level BPE trained on SENTENCES; the special tokens are added after training (the end of the
    vocabulary, as Llama-3's and Qwen's are)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(SENTENCES, trainer)
    tok.add_special_tokens(specials_at_end)
    return tok


def _added_tokens_decoder(tok: Tokenizer, specials: list[str]) -> dict[str, Any]:
    return {
        str(tok.token_to_id(s)): {"content": s, "special": True, "lstrip": False, "rstrip": False}
        for s in specials
    }


def _write(directory: Path, tokenizer_json: str | None = None, **files: Any) -> Path:
    """A model directory: tokenizer.json text and JSON files by name (file_name with . as __)."""
    directory.mkdir(parents=True, exist_ok=True)
    if tokenizer_json is not None:
        (directory / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    for name, value in files.items():
        file = name.replace("__", ".")
        text = value if isinstance(value, str) else json.dumps(value)
        (directory / file).write_text(text, encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def llama_tok() -> Tokenizer:
    """Llama-3 style: a TemplateProcessing post-processor that adds <|begin_of_text|> itself."""
    tok = _train(LLAMA_SPECIALS)
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
            ),
        ]
    )
    return tok


@pytest.fixture(scope="module")
def qwen_tok() -> Tokenizer:
    """Qwen style: no BOS anywhere; the special tokens at the end of the vocabulary."""
    tok = _train(QWEN_SPECIALS)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _llama_config(tok: Tokenizer, **changes: Any) -> dict[str, Any]:
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": {"content": "<|im_end|>", "special": True},
        "chat_template": CHATML,
        "added_tokens_decoder": _added_tokens_decoder(tok, LLAMA_SPECIALS),
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    config.update(changes)
    return config


def _qwen_config(tok: Tokenizer, **changes: Any) -> dict[str, Any]:
    config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_prefix_space": False,
        "chat_template": QWEN_TEMPLATE,
        "added_tokens_decoder": _added_tokens_decoder(tok, QWEN_SPECIALS),
    }
    config.update(changes)
    return config


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory, llama_tok: Tokenizer) -> Path:
    end = llama_tok.token_to_id("<|end_of_text|>")
    return _write(
        tmp_path_factory.mktemp("llama"),
        llama_tok.to_str(),
        tokenizer_config__json=_llama_config(llama_tok),
        generation_config__json={
            "bos_token_id": llama_tok.token_to_id("<|begin_of_text|>"),
            "eos_token_id": end,
        },
    )


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory, qwen_tok: Tokenizer) -> Path:
    endoftext, im_end = qwen_tok.token_to_id("<|endoftext|>"), qwen_tok.token_to_id("<|im_end|>")
    return _write(
        tmp_path_factory.mktemp("qwen"),
        qwen_tok.to_str(),
        tokenizer_config__json=_qwen_config(qwen_tok),
        # config.json names a BOS, as Qwen2's does: the tokenizer must not take it from there
        config__json={"bos_token_id": endoftext, "eos_token_id": im_end, "vocab_size": 1000},
        generation_config__json={"bos_token_id": endoftext, "eos_token_id": [im_end, endoftext]},
    )


@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama2.c-style sentencepiece model (unk 0, bos 1, eos 2) as tokenizer.model, no config."""
    work = tmp_path_factory.mktemp("sp-train")
    model = train_bpe(generate_corpus(300, seed=7), 512, work / "m")
    directory = tmp_path_factory.mktemp("sp")
    (directory / "tokenizer.model").write_bytes(model.read_bytes())
    return directory


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A short relative directory path, so that messages show "model/tokenizer_config.json" in full."""
    monkeypatch.chdir(tmp_path)
    return Path("model")


def _ref(directory: Path) -> Tokenizer:
    return Tokenizer.from_file(str(directory / "tokenizer.json"))


# ---------------------------------------------------------------------------------------------------------
# BOS and EOS.


@pytest.mark.parametrize("text", TEXTS)
def test_llama_style_encode_adds_bos_exactly_once_as_the_library_does(llama_dir: Path, text: str):
    tok, ref = load_hf_tokenizer(llama_dir), _ref(llama_dir)
    bos = ref.token_to_id("<|begin_of_text|>")
    assert tok.bos_id == bos and tok.adds_bos
    assert tok.encode(text) == ref.encode(text).ids  # the post-processor's own BOS
    assert tok.encode(text).count(bos) == 1 and tok.encode(text)[0] == bos
    assert tok.encode(text, bos=False) == ref.encode(text, add_special_tokens=False).ids


def test_special_ids_are_looked_up_not_assumed(llama_dir: Path, qwen_dir: Path):
    llama, qwen = load_hf_tokenizer(llama_dir), load_hf_tokenizer(qwen_dir)
    assert llama.bos_id == llama.vocab_size - len(LLAMA_SPECIALS) != 1
    assert qwen.eos_id == qwen.vocab_size - 1  # <|im_end|>, last, as Qwen's 151645
    assert qwen.eos_ids == (qwen.vocab_size - 1, qwen.vocab_size - 3)  # (<|im_end|>, <|endoftext|>)


def test_qwen_style_has_no_bos_even_though_config_json_names_one(qwen_dir: Path):
    tok, ref = load_hf_tokenizer(qwen_dir), _ref(qwen_dir)
    assert tok.bos_id == -1 and not tok.adds_bos
    for text in TEXTS:
        assert (
            tok.encode(text, bos=True)
            == ref.encode(text).ids
            == ref.encode(text, add_special_tokens=False).ids
        )
        assert ref.token_to_id("<|endoftext|>") not in tok.encode(text, bos=True)


def test_eos_ids_are_the_eos_token_then_generation_config(llama_dir: Path, qwen_dir: Path):
    llama, ref = load_hf_tokenizer(llama_dir), _ref(llama_dir)
    assert llama.eos_ids == (ref.token_to_id("<|im_end|>"), ref.token_to_id("<|end_of_text|>"))
    assert llama.eos_id == ref.token_to_id("<|im_end|>")
    qwen, qref = load_hf_tokenizer(qwen_dir), _ref(qwen_dir)
    assert qwen.eos_ids == (qref.token_to_id("<|im_end|>"), qref.token_to_id("<|endoftext|>"))
    assert qwen.encode("Hello", eos=True) == [*qref.encode("Hello").ids, qwen.eos_id]


def test_tokenizer_json_alone_takes_bos_from_its_post_processor(tmp_path: Path, llama_tok: Tokenizer):
    tok = load_hf_tokenizer(_write(tmp_path, llama_tok.to_str()))
    bos = llama_tok.token_to_id("<|begin_of_text|>")
    assert tok.bos_id == bos and tok.adds_bos and tok.eos_ids == () and tok.eos_id == -1
    assert tok.encode("Hello world") == llama_tok.encode("Hello world").ids
    assert not tok.has_chat_template


def test_add_bos_token_false_wins_over_the_post_processor(tmp_path: Path, llama_tok: Tokenizer):
    directory = _write(
        tmp_path, llama_tok.to_str(), tokenizer_config__json=_llama_config(llama_tok, add_bos_token=False)
    )
    tok = load_hf_tokenizer(directory)
    assert not tok.adds_bos
    assert (
        tok.encode("Hello world", bos=True) == llama_tok.encode("Hello world", add_special_tokens=False).ids
    )


def test_add_bos_token_true_without_a_post_processor_adds_bos_once(tmp_path: Path, qwen_tok: Tokenizer):
    config = _qwen_config(qwen_tok, bos_token="<|im_start|>", add_bos_token=True, add_eos_token=True)
    tok = load_hf_tokenizer(_write(tmp_path, qwen_tok.to_str(), tokenizer_config__json=config))
    start = qwen_tok.token_to_id("<|im_start|>")
    assert tok.encode("Hello world") == [start, *qwen_tok.encode("Hello world").ids]
    assert tok.adds_eos and tok.encode("Hello world")[-1] != tok.eos_id  # add_eos_token is only reported


def test_special_tokens_map_names_what_tokenizer_config_does_not(tmp_path: Path, qwen_tok: Tokenizer):
    config = _qwen_config(qwen_tok)
    del config["eos_token"]
    directory = _write(
        tmp_path,
        qwen_tok.to_str(),
        tokenizer_config__json=config,
        special_tokens_map__json={"eos_token": {"content": "<|endoftext|>"}, "bos_token": "<|im_start|>"},
    )
    tok = load_hf_tokenizer(directory)
    assert tok.eos_ids == (qwen_tok.token_to_id("<|endoftext|>"),)
    assert tok.bos_id == -1  # tokenizer_config.json's null wins
    assert tok.special_tokens == {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}


# ---------------------------------------------------------------------------------------------------------
# Decoding, pieces, sizes.


@pytest.mark.parametrize("which", ["llama_dir", "qwen_dir", "sp_dir"])
@pytest.mark.parametrize("text", TEXTS)
def test_decode_inverts_encode_and_skips_special_tokens(
    request: pytest.FixtureRequest, which: str, text: str
):
    tok = load_hf_tokenizer(request.getfixturevalue(which))
    if which == "sp_dir":
        text = " ".join(text.split())  # sentencepiece's default normalisation folds runs of whitespace
    assert tok.decode(tok.encode(text, bos=False)) == text
    assert tok.decode(tok.encode(text, bos=True, eos=True)) == text


@pytest.mark.parametrize("which", ["llama_dir", "qwen_dir", "sp_dir"])
def test_decode_of_a_growing_list_grows_the_text(request: pytest.FixtureRequest, which: str):
    tok = load_hf_tokenizer(request.getfixturevalue(which))
    text = "The quick brown fox read about the stars, 12 times."
    ids = tok.encode(text)
    shown = [tok.decode(ids[:k]) for k in range(len(ids) + 1)]
    assert all(b.startswith(a) for a, b in itertools.pairwise(shown)) and shown[-1] == text
    assert tok.decode(ids) == tok.decode(list(ids))  # deterministic


def test_vocab_size_and_pieces_match_the_library(llama_dir: Path, qwen_dir: Path):
    for directory in (llama_dir, qwen_dir):
        tok, ref = load_hf_tokenizer(directory), _ref(directory)
        assert tok.vocab_size == ref.get_vocab_size(with_added_tokens=True)
        assert [tok.piece(i) for i in range(tok.vocab_size)] == [
            ref.id_to_token(i) for i in range(tok.vocab_size)
        ]
        assert isinstance(tok, TokenizerProtocol) and isinstance(tok, HFTokenizer)


@pytest.mark.parametrize("bad", [-1, 10_000, 1.5, True])
def test_ids_outside_the_vocabulary_are_refused(qwen_dir: Path, bad: Any):
    tok = load_hf_tokenizer(qwen_dir)
    with pytest.raises(AnekitError, match=r"\[hf.tokenizer\] tokenizer.json: id .* outside the vocabulary"):
        tok.decode([5, bad])
    with pytest.raises(AnekitError, match="outside the vocabulary"):
        tok.piece(bad)


def test_sentencepiece_model_bos_1_eos_2_as_the_library(sp_dir: Path):
    tok = load_hf_tokenizer(sp_dir)
    ref = spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
    assert (tok.bos_id, tok.eos_id, tok.eos_ids, tok.adds_bos) == (1, 2, (2,), True)
    assert tok.vocab_size == ref.get_piece_size()
    for text in TEXTS:
        assert tok.encode(text) == [1, *ref.encode(text)]
        assert tok.encode(text, bos=False, eos=True) == [*ref.encode(text), 2]
    assert [tok.piece(i) for i in range(5)] == [ref.id_to_piece(i) for i in range(5)]


def test_sentencepiece_model_with_a_config(tmp_path: Path, sp_dir: Path):
    directory = _write(
        tmp_path, tokenizer_config__json={"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False}
    )
    (directory / "tokenizer.model").write_bytes((sp_dir / "tokenizer.model").read_bytes())
    tok = load_hf_tokenizer(directory)
    assert (tok.bos_id, tok.eos_id, tok.adds_bos) == (1, 2, False)
    assert tok.encode("Hello")[0] != 1


# ---------------------------------------------------------------------------------------------------------
# Chat templates.


def test_smollm2_style_chat_template(llama_dir: Path):
    tok = load_hf_tokenizer(llama_dir)
    body = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi there<|im_end|>\n"
    )
    assert tok.has_chat_template
    assert tok.apply_chat_template(CONVERSATION, add_generation_prompt=False) == body
    assert tok.apply_chat_template(CONVERSATION) == body + "<|im_start|>assistant\n"


def test_qwen_style_chat_template_with_its_default_system_message(qwen_dir: Path):
    tok, ref = load_hf_tokenizer(qwen_dir), _ref(qwen_dir)
    body = (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi there<|im_end|>\n"
    )
    assert tok.apply_chat_template(CONVERSATION, add_generation_prompt=False) == body
    prompt = tok.apply_chat_template(CONVERSATION, add_generation_prompt=True)
    assert prompt == body + "<|im_start|>assistant\n"
    system = [{"role": "system", "content": "Be brief."}, CONVERSATION[0]]
    assert tok.apply_chat_template(system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
    )
    ids = tok.encode(prompt, bos=False)  # special tokens in the text are single ids
    assert ids == ref.encode(prompt).ids and ids.count(ref.token_to_id("<|im_start|>")) == 4


def test_template_variables_and_globals(tmp_path: Path, llama_tok: Tokenizer):
    template = (
        "{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{{ documents is none }}|"
        "{{ messages | length }}|{{ {'k': 'é<'} | tojson }}|{{ strftime_now('%Y') | length }}"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}|{{ m.role }}{% endfor %}"
    )
    config = _llama_config(llama_tok, chat_template=template)
    tok = load_hf_tokenizer(_write(tmp_path, llama_tok.to_str(), tokenizer_config__json=config))
    assert (
        tok.apply_chat_template(CONVERSATION) == '<|begin_of_text|>|<|im_end|>|True|True|2|{"k": "é<"}|4|user'
    )


def test_chat_template_named_list_uses_default_and_jinja_file_wins(tmp_path: Path, qwen_tok: Tokenizer):
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "default"}]
    config = _qwen_config(qwen_tok, chat_template=named)
    directory = _write(tmp_path, qwen_tok.to_str(), tokenizer_config__json=config)
    assert load_hf_tokenizer(directory).apply_chat_template(CONVERSATION) == "default"
    (directory / "chat_template.jinja").write_text("from the file", encoding="utf-8")
    assert load_hf_tokenizer(directory).apply_chat_template(CONVERSATION) == "from the file"


def test_raise_exception_in_a_template_is_an_anekit_error(model: Path, qwen_tok: Tokenizer):
    template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('System message\nfirst, please') }}{% endif %}"
    tok = load_hf_tokenizer(
        _write(
            model, qwen_tok.to_str(), tokenizer_config__json=_qwen_config(qwen_tok, chat_template=template)
        )
    )
    with pytest.raises(
        AnekitError, match=r"tokenizer_config.json chat_template: raise_exception: System message; first"
    ) as e:
        tok.apply_chat_template(CONVERSATION)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% for m in messages %}{{ m.role }", r"chat_template: line 1: unexpected '}'"),  # syntax
        (
            "{{ messages[0].content.__class__.__mro__ }}",
            r"chat_template: access to attribute '__class__' .* unsafe",
        ),
        ("{{ messages.append(1) }}", r"chat_template: access to attribute 'append' of 'list' .* unsafe"),
        ("{{ 1 / 0 }}", r"chat_template: division by zero"),
        ("{{ nothing.here }}", r"chat_template: 'nothing' is undefined"),
    ],
)
def test_template_errors_are_one_line(tmp_path: Path, qwen_tok: Tokenizer, template: str, message: str):
    config = _qwen_config(qwen_tok, chat_template=template)
    tok = load_hf_tokenizer(_write(tmp_path, qwen_tok.to_str(), tokenizer_config__json=config))
    assert tok.encode("Hello") == qwen_tok.encode("Hello").ids  # a broken template leaves encoding usable
    with pytest.raises(AnekitError, match=message) as e:
        tok.apply_chat_template(CONVERSATION)
    assert "\n" not in str(e.value)


def test_no_chat_template(tmp_path: Path, qwen_tok: Tokenizer):
    config = _qwen_config(qwen_tok)
    del config["chat_template"]
    tok = load_hf_tokenizer(_write(tmp_path, qwen_tok.to_str(), tokenizer_config__json=config))
    assert not tok.has_chat_template
    with pytest.raises(AnekitError, match="the tokenizer has no chat template"):
        tok.apply_chat_template(CONVERSATION)


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ({"role": "user", "content": "x"}, r"messages: expected a list of dicts, got dict"),
        (["hello"], r"messages\[0\]: expected a dict, got str"),
        ([{"content": "x"}], r"messages\[0\]\['role'\]: expected a string, got nothing"),
        (
            [{"role": "user", "content": "x"}, {"role": "user", "content": 3}],
            r"messages\[1\]\['content'\]: .* got int",
        ),
        ([{"role": "user", "content": None}], r"messages\[0\]\['content'\]: expected a string, got null"),
    ],
)
def test_messages_are_validated(qwen_dir: Path, messages: Any, message: str):
    with pytest.raises(AnekitError, match=message):
        load_hf_tokenizer(qwen_dir).apply_chat_template(messages)


# ---------------------------------------------------------------------------------------------------------
# Bad directories: each one AnekitError line naming the file and field.


BAD_CONFIGS = [
    ("not json {", FormatError, r"tokenizer_config.json: not JSON"),
    ("[1, 2]", FormatError, r"tokenizer_config.json: expected a JSON object"),
    ({"bos_token": 1}, FormatError, r"tokenizer_config.json bos_token: expected a string, null or"),
    ({"eos_token": {"text": "x"}}, FormatError, r"tokenizer_config.json eos_token: expected a string"),
    ({"eos_token": "<|nope|>"}, FormatError, r"tokenizer_config.json eos_token: '<\|nope\|>' is not a token"),
    (
        {"add_bos_token": "yes"},
        FormatError,
        r"tokenizer_config.json add_bos_token: expected true, false or null",
    ),
    (
        {"chat_template": [{"name": "rag", "template": "x"}]},
        FormatError,
        r"tokenizer_config.json chat_template: no template named 'default'",
    ),
    (
        {"chat_template": [{"name": "default"}]},
        FormatError,
        r"tokenizer_config.json chat_template\[0\].template: expected a string",
    ),
    ({"chat_template": 5}, FormatError, r"tokenizer_config.json chat_template: expected a string or a list"),
    (
        {"added_tokens_decoder": {"x": {"content": "a"}}},
        FormatError,
        r"tokenizer_config.json added_tokens_decoder\['x'\]: the key",
    ),
    (
        {"added_tokens_decoder": {"0": {"content": "<|im_end|>"}}},
        FormatError,
        r"tokenizer_config.json added_tokens_decoder\['0'\]: .* has id",
    ),
    ('{"a": ' * 100 + "1" + "}" * 100, FormatError, r"tokenizer_config.json: JSON nested 100 deep"),
]


@pytest.mark.parametrize(("config", "error", "message"), BAD_CONFIGS)
def test_bad_tokenizer_config(model: Path, qwen_tok: Tokenizer, config: Any, error: type, message: str):
    directory = _write(model, qwen_tok.to_str(), tokenizer_config__json=config)
    with pytest.raises(error, match=r"^\[hf.tokenizer\] model/" + message) as e:
        load_hf_tokenizer(directory)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("generation", "message"),
    [
        ({"eos_token_id": "2"}, r"generation_config.json eos_token_id: expected a token id"),
        ({"eos_token_id": [1, None]}, r"generation_config.json eos_token_id\[1\]: expected a token id"),
        (
            {"eos_token_id": 99_999},
            r"generation_config.json eos_token_id: id 99999 is outside the vocabulary",
        ),
        ({"bos_token_id": True}, r"generation_config.json bos_token_id: expected a token id"),
        ("{", r"generation_config.json: not JSON"),
    ],
)
def test_bad_generation_config(model: Path, qwen_tok: Tokenizer, generation: Any, message: str):
    directory = _write(model, qwen_tok.to_str(), generation_config__json=generation)
    with pytest.raises(FormatError, match=message):
        load_hf_tokenizer(directory)


@pytest.mark.parametrize(
    ("tokenizer_json", "message"),
    [
        ("{ not json", r"tokenizer.json: the tokenizers library rejects it: "),
        ('{"model": {"type": "Nope"}}', r"tokenizer.json: the tokenizers library rejects it: "),
    ],
)
def test_tokenizer_json_the_library_rejects(model: Path, tokenizer_json: str, message: str):
    with pytest.raises(FormatError, match=message) as e:
        load_hf_tokenizer(_write(model, tokenizer_json))
    assert "\n" not in str(e.value)


def test_tokenizer_json_not_utf8(model: Path):
    model.mkdir()
    (model / "tokenizer.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(AnekitError, match=r"tokenizer.json: not UTF-8 text"):
        load_hf_tokenizer(model)


def test_bad_sentencepiece_model(model: Path):
    model.mkdir()
    (model / "tokenizer.model").write_bytes(b"not a model")
    with pytest.raises(FormatError, match=r"tokenizer.model.*not a sentencepiece model"):
        load_hf_tokenizer(model)


def test_a_tokenizer_json_file_reads_with_the_files_beside_it(qwen_dir: Path):
    """``anekit sample --tokenizer .../tokenizer.json``: the file named, with its directory's
    tokenizer_config.json (end tokens, chat template) and generation_config.json."""
    whole, file = load_hf_tokenizer(qwen_dir), load_hf_tokenizer(qwen_dir / "tokenizer.json")
    text = "Hello world, a test"
    assert file.encode(text) == whole.encode(text) and file.vocab_size == whole.vocab_size
    assert (file.bos_id, file.eos_ids, file.has_chat_template) == (whole.bos_id, whole.eos_ids, True)


def test_bad_paths(tmp_path: Path, qwen_dir: Path):
    with pytest.raises(AnekitError, match=r"no tokenizer: looked for tokenizer.json and tokenizer.model"):
        load_hf_tokenizer(tmp_path)
    (tmp_path / "vocab.txt").write_text("a\n")
    with pytest.raises(AnekitError, match=r"vocab.txt: a regular file, not a model directory"):
        load_hf_tokenizer(tmp_path / "vocab.txt")
    with pytest.raises(AnekitError, match=r"missing: no such directory"):
        load_hf_tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer.json").mkdir()
    with pytest.raises(AnekitError, match=r"tokenizer.json: a directory, not a tokenizer.json file"):
        load_hf_tokenizer(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "generation_config.json"])
def test_a_fifo_is_refused_without_blocking(model: Path, qwen_tok: Tokenizer, name: str):
    _write(model, qwen_tok.to_str() if name != "tokenizer.json" else None)
    os.mkfifo(model / name)
    with pytest.raises(AnekitError, match=rf"{name}: a FIFO \(named pipe\), not a") as e:
        load_hf_tokenizer(model)
    assert "\n" not in str(e.value)


def test_without_the_tokenizers_package(tmp_path: Path, qwen_tok: Tokenizer, monkeypatch: pytest.MonkeyPatch):
    directory = _write(tmp_path, qwen_tok.to_str())
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers now raises ImportError
    with pytest.raises(AnekitError, match=r"needs the tokenizers package: pip install -e '\.\[hf\]'"):
        load_hf_tokenizer(directory)


def test_encode_refuses_what_is_not_text(qwen_dir: Path):
    with pytest.raises(AnekitError, match=r"encode: expected a string, got bytes"):
        load_hf_tokenizer(qwen_dir).encode(b"Hello")  # type: ignore[arg-type]
