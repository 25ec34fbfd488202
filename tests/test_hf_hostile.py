"""Hostile Hugging Face model directories, templates and data: each refused in one line, fast, with no
traceback; and the default rope_theta of a config.json that names none, against the float64 forward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from anekit.errors import AnekitError
from anekit.hf import template as template_module
from anekit.hf.config import parse_config
from anekit.hf.datasets import MAX_LINE_BYTES, load_split
from anekit.hf.model import load_model
from anekit.hf.tokenizer import load_hf_tokenizer
from anekit.llama.sample import forward_logits
from tests import hf_reference
from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 20  # seconds: a hang fails the test


def _model(directory: Path, **overrides) -> Path:
    info = make_tokenizer(directory, 512, "llama3")
    config = small("tiny_llama2c", vocab_size=512, bos_token_id=info.bos_id, eos_token_id=info.eos_id)
    config.update(overrides)
    make_checkpoint(directory, config, dtype="bfloat16", seed=5, std=0.08)
    return directory


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        [sys.executable, "-m", "anekit.cli.main", *args],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd, env=env,
    )  # fmt: skip


def _refused(result: subprocess.CompletedProcess, *says: str) -> str:
    """The one stderr line of a refusal (exit 1, no traceback, no numpy warning), holding ``says``."""
    err = result.stderr
    assert result.returncode == 1, (result.returncode, err)
    assert "Traceback" not in err and "Warning" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("anekit: "), err
    for text in says:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return _model(tmp_path_factory.mktemp("hostile") / "model")


def _copy(base: Path, tmp_path: Path, name: str = "m") -> Path:
    import shutil

    return Path(shutil.copytree(base, tmp_path / name))


# -- 1. a config.json shape the weights cannot hold: refused before any name is built ------------------


@pytest.mark.parametrize("command", ["sample", "export", "train"])
def test_a_million_layers_is_refused_at_once_by_every_command(base, tmp_path, command):
    model = _copy(base, tmp_path)
    _edit_json(model / "config.json", num_hidden_layers=1_000_000)
    args = {
        "sample": ["sample", str(model), "--steps", "3"],
        "export": ["export", str(model), "--to", "safetensors", str(tmp_path / "out")],
        "train": ["train", "--init", str(model), "--out", str(tmp_path / "run"), "--steps", "1"],
    }[command]
    _refused(_cli(*args, cwd=tmp_path), "config.json: num_hidden_layers 1000000: the weights hold 2 layers")
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "field, value",
    [
        ("hidden_size", 2**40),
        ("intermediate_size", 10**12),
        ("vocab_size", 10**12),
        ("num_hidden_layers", 10**9),
    ],
)
def test_a_shape_no_file_can_hold_is_refused_quickly_naming_the_field(base, tmp_path, field, value):
    model = _copy(base, tmp_path)
    _edit_json(model / "config.json", **{field: value})
    start = time.monotonic()
    with pytest.raises(AnekitError) as e:
        load_model(model)
    assert time.monotonic() - start < 5
    assert f"{field} {value}" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("weights", [True, False], ids=["with-weights", "config-only"])
@pytest.mark.parametrize("field, value", [("num_hidden_layers", 10**9), ("vocab_size", 10**12)])
def test_cost_refuses_the_shapes_every_other_command_refuses(base, tmp_path, field, value, weights):
    """`cost --config` of a Hugging Face directory gets the checks sample, export and train make: a shape
    no checkpoint holds is one line naming the field, weights or none (a config alone is 2^40 at most)."""
    model = _copy(base, tmp_path)
    if not weights:
        for f in model.glob("*.safetensors*"):
            f.unlink()
    _edit_json(model / "config.json", **{field: value})
    _refused(_cli("cost", "--config", str(model), cwd=tmp_path), f"{field} {value}")


def test_cost_of_a_config_alone_still_predicts(base, tmp_path):
    model = _copy(base, tmp_path)
    for f in model.glob("*.safetensors*"):
        f.unlink()
    result = _cli("cost", "--config", str(model), cwd=tmp_path)
    assert result.returncode == 0 and "where the time goes" in result.stdout, result.stderr


# -- 2. chat templates bounded in time and output -------------------------------------------------------


def _with_template(base: Path, tmp_path: Path, source: str) -> Path:
    model = _copy(base, tmp_path)
    _edit_json(model / "tokenizer_config.json", chat_template=source)
    return model


NESTED = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize(
    "source, says",
    [
        (NESTED, "ran for more than"),
        # no call inside the loops: only the bounded iteration sees the clock
        ("{% set xs = 'x' * 100000 %}{% for a in xs %}{% for b in xs %}{% endfor %}{% endfor %}", "ran for"),
        ("{% for a in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "output is over the 1048576-character"),
        ("{{ 'x' * 2000000000 }}", "'*' of a str would make 2000000000 characters"),
        ("{{ [0] * 2000000000 }}", "'*' of a list would make 2000000000"),
        ("{{ 2 ** 1000000000 }}", "'**' would make an integer"),
        ("{{ 'x'.ljust(2000000000) }}", "str.ljust would make 2000000000"),
        ("{{ 'x'|center(2000000000) }}", "the width given to a filter"),
        ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
         "'~' would make"),
        ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
         "ran for more than"),
    ],
)  # fmt: skip
def test_a_template_that_would_run_for_ever_or_fill_the_memory_is_one_error(
    base, tmp_path, monkeypatch, source, says
):
    monkeypatch.setattr(template_module, "MAX_SECONDS", 0.5)
    tok = load_hf_tokenizer(_with_template(base, tmp_path, source))
    start = time.monotonic()
    with pytest.raises(AnekitError) as e:
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < 5
    message = str(e.value)
    assert "tokenizer_config.json" in message and "chat_template: " in message
    assert says in message and "\n" not in message


def test_the_bounded_sandbox_renders_loops_macros_and_concatenation_as_jinja_does(base, tmp_path):
    source = (
        "{% macro tag(r) %}<{{ r ~ '>' }}{% endmacro %}"
        "{% for m in messages %}{{ tag(m.role) }}{{ m.content * 2 }}{{ loop.index }}{% if loop.last %}."
        "{% endif %}{% endfor %}{{ [1, 2] + [3] }}{{ 2 ** 10 }}"
    )
    tok = load_hf_tokenizer(_with_template(base, tmp_path, source))
    messages = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"}]
    assert tok.apply_chat_template(messages) == "<user>abab1<assistant>cc2.[1, 2, 3]1024"


def test_sample_chat_with_nested_loops_ends_in_one_line(base, tmp_path):
    model = _with_template(base, tmp_path, NESTED)
    _refused(_cli("sample", str(model), "--chat", "--prompt", "hi", cwd=tmp_path),
             "tokenizer_config.json", "chat_template: the template ran for more than")  # fmt: skip


def test_chat_format_training_with_nested_loops_ends_in_one_line(base, tmp_path):
    model = _with_template(base, tmp_path, NESTED)
    data = tmp_path / "data"
    data.mkdir()
    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (data / "train.jsonl").write_text(json.dumps(line) + "\n")
    out = tmp_path / "run"
    result = _cli("train", "--init", str(model), "--data", str(data), "--out", str(out), "--steps", "1",
                  cwd=tmp_path)  # fmt: skip
    _refused(result, "train.jsonl:1:", "chat_template: the template ran for more than")
    assert not out.exists()


def test_sample_chat_of_a_two_gigabyte_string_ends_in_one_line(base, tmp_path):
    model = _with_template(base, tmp_path, "{{ 'x' * 2000000000 }}")
    _refused(_cli("sample", str(model), "--chat", "--prompt", "hi", cwd=tmp_path), "chat_template", "'*'")


# -- 3. a jsonl line too long to tokenize ---------------------------------------------------------------


def test_a_line_over_the_bound_is_refused_before_it_is_tokenized(base, tmp_path, monkeypatch):
    tok = load_hf_tokenizer(base)
    data = tmp_path / "train.jsonl"
    text = "a" * MAX_LINE_BYTES
    data.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": text}) + "\n")
    encoded: list[int] = []
    original = tok.encode
    monkeypatch.setattr(tok, "encode", lambda t, *a, **k: encoded.append(len(t)) or original(t, *a, **k))
    with pytest.raises(AnekitError) as e:
        load_split(data, tok, "train")
    assert f"train.jsonl:2: a line of {MAX_LINE_BYTES + 12} bytes, over the {MAX_LINE_BYTES}-byte" in str(
        e.value
    )
    assert encoded == [4]  # only line 1's text reached the tokenizer
    # a line at the bound is taken
    data.write_text(json.dumps({"text": "a" * (MAX_LINE_BYTES - 12)}) + "\n")
    assert len(load_split(data, tok, "train", max_line_bytes=MAX_LINE_BYTES)) == 1


def test_train_on_a_long_jsonl_line_is_one_line(base, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"text": "b" * (2 * MAX_LINE_BYTES)}) + "\n")
    out = tmp_path / "run"
    result = _cli("train", "--init", str(base), "--data", str(data), "--out", str(out), "--steps", "1",
                  cwd=tmp_path)  # fmt: skip
    _refused(result, "train.jsonl:1: a line of", f"over the {MAX_LINE_BYTES}-byte bound")
    assert not out.exists()


def test_encode_refuses_a_text_over_the_bound(base):
    tok = load_hf_tokenizer(base)
    with pytest.raises(AnekitError, match=f"over the {MAX_LINE_BYTES}-byte bound"):
        tok.encode("é" * (MAX_LINE_BYTES // 2 + 1))  # 2 bytes each: the bound is in bytes


# -- 4. config.json fields of the wrong type ------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("model_type", ["llama"], "model_type must be a string"),
        ("model_type", {"a": 1}, "model_type must be a string"),
        ("architectures", "LlamaForCausalLM", "architectures must be a list of names"),
        ("architectures", [["LlamaForCausalLM"]], "architectures must be a list of names"),
        ("hidden_size", 64.0, "hidden_size must be an integer"),
        ("num_hidden_layers", "2", "num_hidden_layers must be an integer"),
        ("intermediate_size", True, "intermediate_size must be an integer"),
        ("vocab_size", [512], "vocab_size must be an integer"),
        ("num_attention_heads", {"n": 4}, "num_attention_heads must be an integer"),
        ("num_key_value_heads", 4.5, "num_key_value_heads must be an integer"),
        ("max_position_embeddings", "128", "max_position_embeddings must be an integer"),
        ("head_dim", "16", "head_dim must be an integer"),
        ("rope_theta", "10000", "rope_theta must be a number"),
        ("rms_norm_eps", "1e-5", "rms_norm_eps must be a number"),
        ("rope_scaling", [1], "rope_scaling must be an object"),
        ("rope_scaling", {"rope_type": "llama3", "factor": "8"}, "rope_scaling.factor must be a number"),
        ("tie_word_embeddings", "false", "tie_word_embeddings must be true or false"),
        ("attention_bias", "false", "attention_bias must be true or false"),
        ("mlp_bias", 0, "mlp_bias must be true or false"),
        ("use_sliding_window", "false", "use_sliding_window must be true or false"),
        ("hidden_act", ["silu"], "hidden_act must be a string"),
        ("torch_dtype", ["float32"], "torch_dtype ['float32'] is not supported"),
        ("rope_parameters", "x", "rope_parameters must be an object"),
    ],
)
def test_every_config_field_of_the_wrong_type_is_one_line_naming_it(field, value, says):
    raw = small("tiny_llama2c")
    raw[field] = value
    with pytest.raises(AnekitError) as e:
        parse_config(raw)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_sample_of_a_model_type_list_is_one_line(base, tmp_path):
    model = _copy(base, tmp_path)
    _edit_json(model / "config.json", model_type=["llama"])
    _refused(_cli("sample", str(model), cwd=tmp_path), "config.json: model_type must be a string")


# -- 5. tokenizer ids past the model's vocabulary -------------------------------------------------------


def test_a_tokenizer_json_entry_past_the_vocabulary_is_refused_naming_it(base, tmp_path):
    model = _copy(base, tmp_path)
    spec = json.loads((model / "tokenizer.json").read_text())
    spec["added_tokens"].append({"id": 700, "content": "<|far|>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})  # fmt: skip
    (model / "tokenizer.json").write_text(json.dumps(spec))
    _refused(_cli("sample", str(model), "--steps", "3", cwd=tmp_path),
             "tokenizer.json token '<|far|>' has id 700, outside the model's vocabulary of 512")  # fmt: skip


def test_a_bpe_vocab_entry_past_the_vocabulary_is_refused(base, tmp_path):
    model = _copy(base, tmp_path)
    spec = json.loads((model / "tokenizer.json").read_text())
    spec["model"]["vocab"]["zzz"] = 5000
    (model / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(AnekitError, match="token 'zzz' has id 5000, outside the model's vocabulary of 512"):
        load_hf_tokenizer(model, model_vocab=512)


def test_an_added_tokens_decoder_id_past_the_vocabulary_is_refused(base, tmp_path):
    model = _copy(base, tmp_path)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"]["600"] = {"content": "<|x|>", "special": True}
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(AnekitError, match="added_tokens_decoder token '<\\|x\\|>' has id 600, outside"):
        load_hf_tokenizer(model, model_vocab=512)


# -- 6. non-finite results from finite inputs ----------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("rope_theta", 1e308, "rope_theta must be a number > 1 and at most 1e+15, got 1e+308"),
        ("rms_norm_eps", 1e300, "rms_norm_eps must lie strictly between 0 and 1"),
        ("rms_norm_eps", 0, "rms_norm_eps must lie strictly between 0 and 1"),
    ],
)
def test_config_values_outside_what_float32_runs_are_refused(base, tmp_path, field, value, says):
    model = _copy(base, tmp_path)
    _edit_json(model / "config.json", **{field: value})
    result = _cli("sample", str(model), "--steps", "3", cwd=tmp_path)
    _refused(result, f"config.json: {says}")
    assert result.stdout == ""


def test_weights_too_large_for_float32_are_refused_before_the_first_token(base, tmp_path):
    from safetensors.numpy import save_file

    model = _copy(base, tmp_path)
    _edit_json(model / "config.json", torch_dtype="float32")
    tensors = {k: v.astype(np.float32) for k, v in hf_reference.load(model)[1].items()}
    for name in tensors:  # finite, but each projection's output overflows float32
        if name.endswith("mlp.down_proj.weight"):
            tensors[name] = np.clip(tensors[name], -0.3, 0.3) * np.float32(1e38)
    assert all(np.isfinite(v).all() for v in tensors.values())
    (model / "model.safetensors").unlink()
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    result = _cli("sample", str(model), "--prompt", "the cat", "--steps", "5", cwd=tmp_path)
    _refused(result, "[sample] layer 0's output at position 0 is too large for float32")
    assert result.stdout == ""  # not even the prompt was echoed


# -- 7. accurate words for a directory that is not a model ----------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "loop"])
def test_a_model_directory_without_a_usable_config_json_says_so(base, tmp_path, kind):
    model = _copy(base, tmp_path)
    config = model / "config.json"
    config.unlink()
    says = {
        "missing": "a directory without config.json, so not a Hugging Face model directory",
        "directory": "config.json: a directory, not a config.json file",
        "fifo": "config.json: a FIFO (named pipe), not a config.json file",
        "loop": "config.json: Too many levels of symbolic links",
    }[kind]
    if kind == "directory":
        config.mkdir()
    elif kind == "fifo":
        os.mkfifo(config)
    elif kind == "loop":
        config.symlink_to("config.json")
    for command in (
        ["sample", str(model)],
        ["export", str(model), "--to", "llama2c", str(tmp_path / "o.bin")],
    ):
        line = _refused(_cli(*command, cwd=tmp_path), says)
        assert "not a model file" not in line


def test_a_missing_init_directory_is_named_not_the_lora_flag(tmp_path):
    line = _refused(_cli("train", "--init", str(tmp_path / "nope"), "--lora", "4", "--out", str(tmp_path / "o"),
                         cwd=tmp_path), "--init", "nope: no such file or directory")  # fmt: skip
    assert "applies to a Hugging Face model" not in line


def test_an_init_directory_without_config_json_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    _refused(_cli("train", "--init", str(tmp_path / "empty"), "--lora", "4", "--out", str(tmp_path / "o"),
                  cwd=tmp_path), "a directory without config.json")  # fmt: skip


# -- 8. the default rope_theta -------------------------------------------------------------------------

# transformers' configuration classes default rope_theta to 10000.0 when config.json has none:
# LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config (src/transformers/models/*/configuration_*.py,
# ``rope_theta=10000.0`` in each __init__).
HF_DEFAULT_ROPE_THETA = 10000.0


@pytest.mark.parametrize("shape", ["tiny_llama2c", "qwen2"])
def test_a_config_without_rope_theta_runs_transformers_default(tmp_path, shape):
    config = small(shape, vocab_size=512)
    del config["rope_theta"]
    directory = tmp_path / shape
    make_checkpoint(directory, config, dtype="float32", seed=7, std=0.3)
    ids = [3, 100, 7, 250, 11, 60, 400, 2, 99, 5, 321, 17]
    got = forward_logits(load_model(directory).params, np.array(ids)).T  # (T, vocab)
    _, tensors = hf_reference.load(directory)
    want = hf_reference.forward(dict(config, rope_theta=HF_DEFAULT_ROPE_THETA), tensors, ids)
    other = hf_reference.forward(dict(config, rope_theta=1e6), tensors, ids)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * scale)
    assert np.abs(other - want).max() > 50 * 2e-4 * scale  # the test tells the two thetas apart
