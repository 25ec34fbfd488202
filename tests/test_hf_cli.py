"""``anekit sample`` and ``anekit export`` on Hugging Face model directories, against the independent float64
forward of tests/hf_reference.py and the `tokenizers` library called directly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from tests import hf_reference
from tests.hf_fixtures import make_checkpoint, make_tokenizer, small
from tests.test_export_llama2c import parse_run_c, run_c_logits

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer


def _model(tmp_path: Path, shape: str, style: str, **overrides) -> tuple[Path, object]:
    directory = tmp_path / shape
    vocab = overrides.pop("vocab_size", small(shape)["vocab_size"] if shape == "tiny_llama2c" else 512)
    info = make_tokenizer(directory, vocab, style)
    ids = {"bos_token_id": info.bos_id, "eos_token_id": info.eos_id}
    config = small(shape, vocab_size=vocab, **ids, **overrides)
    make_checkpoint(directory, config, dtype="bfloat16", seed=11, std=0.08)
    return directory, info


def _greedy(directory: Path, ids: list[int], n: int, allowed: int, stop: set[int]) -> list[int]:
    """The float64 forward's greedy continuation over the tokenizer's ids (padded ids never chosen),
    ending before an end token."""
    config, tensors = hf_reference.load(directory)
    out: list[int] = []
    for _ in range(n):
        logits = hf_reference.forward(config, tensors, ids + out)[-1, :allowed]
        token = int(np.argmax(logits))
        if token in stop:
            break
        out.append(token)
    return out


def test_sample_prints_what_the_float64_forward_generates(tmp_path, capsys):
    directory, info = _model(tmp_path, "tiny_llama2c", "llama3")
    lib = Tokenizer.from_file(str(directory / "tokenizer.json"))
    prompt = "the little cat"
    ids = [info.bos_id, *lib.encode(prompt, add_special_tokens=False).ids]
    steps = 24
    want = _greedy(directory, ids, steps - len(ids) + 1, info.size, {info.eos_id})
    assert (
        main(["sample", str(directory), "--prompt", prompt, "--temperature", "0", "--steps", str(steps)]) == 0
    )
    out = capsys.readouterr().out
    assert out == lib.decode(ids[1:] + want, skip_special_tokens=True) + "\n"


def test_sample_chat_renders_the_template_and_echoes_only_the_answer(tmp_path, capsys):
    directory, info = _model(tmp_path, "qwen3", "qwen")
    lib = Tokenizer.from_file(str(directory / "tokenizer.json"))
    rendered = "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    ids = lib.encode(rendered, add_special_tokens=False).ids
    stops = {info.eos_id, info.specials["<|endoftext|>"]}
    want = _greedy(directory, ids, 10, info.size, stops)
    code = main(["sample", str(directory), "--chat", "--prompt", "hello there", "--temperature", "0",
                 "--steps", str(len(ids) + 10)])  # fmt: skip
    assert code == 0
    # random weights emit bytes that are not UTF-8: streamed and whole decodes differ only in U+FFFD
    printed = capsys.readouterr().out.replace("\ufffd", "")
    assert printed == lib.decode(want, skip_special_tokens=True).replace("\ufffd", "") + "\n"


def test_export_llama2c_runs_greedy_in_a_run_c_forward_like_the_model(tmp_path, capsys):
    directory, info = _model(tmp_path, "tiny_llama2c", "llama3")
    out = tmp_path / "model.bin"
    assert main(["export", str(directory), "--to", "llama2c", str(out)]) == 0
    w = parse_run_c(out.read_bytes())
    ids = [info.bos_id, 40, 71, 99]
    run_c: list[int] = []
    for _ in range(8):  # run.c's greedy: argmax of the last position's logits, whole vocabulary
        run_c.append(int(np.argmax(run_c_logits(w, ids + run_c))))
    config, tensors = hf_reference.load(directory)
    assert run_c == hf_reference.greedy(config, tensors, ids, 8)
    assert "no tokenizer.bin" in capsys.readouterr().out  # a tokenizer.json has no run.c form


def test_export_llama2c_refuses_what_run_c_cannot_represent_in_one_line(tmp_path, capsys):
    directory, _ = _model(tmp_path, "smollm2", "llama3", num_hidden_layers=1)
    out = tmp_path / "model.bin"
    assert main(["export", str(directory), "--to", "llama2c", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "llama2.c cannot represent" in err and "rope_theta 100000" in err, err
    assert not out.exists()


def test_export_safetensors_then_sample_the_export_gives_the_same_text(tmp_path, capsys):
    directory, _ = _model(tmp_path, "qwen2", "qwen", num_hidden_layers=1)
    out = tmp_path / "exported"
    assert main(["export", str(directory), "--to", "safetensors", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'model.safetensors'}" in printed and f"wrote {out / 'tokenizer.json'}" in printed
    args = ["--prompt", "a dog", "--temperature", "0", "--steps", "16"]
    assert main(["sample", str(directory), *args]) == 0
    first = capsys.readouterr().out
    assert main(["sample", str(out), *args]) == 0
    assert capsys.readouterr().out == first
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"


def test_export_a_llama2c_model_to_safetensors_reads_back_as_a_llama(tmp_path, capsys):
    from anekit.kernels.config import ModelConfig
    from anekit.llama.llama2c import write_llama2c
    from anekit.llama.params import Params

    cfg = ModelConfig(32, 48, 2, 4, 2, 64, 16, name="tiny")
    params = Params.init(cfg, seed=2, tied=False)
    write_llama2c(tmp_path / "m.bin", params)
    out = tmp_path / "hf"
    assert (
        main(["export", str(tmp_path / "m.bin"), "--to", "safetensors", "--dtype", "float32", str(out)]) == 0
    )
    config, tensors = hf_reference.load(out)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is False
    from anekit.llama.sample import forward_logits

    ids = [1, 5, 9, 33, 2]
    want = forward_logits(params, np.array(ids)).T
    np.testing.assert_allclose(hf_reference.forward(config, tensors, ids), want, rtol=1e-4, atol=1e-5)


def test_hf_flags_that_do_not_apply_are_refused(tmp_path, capsys):
    directory, _ = _model(tmp_path, "tiny_llama2c", "llama3")
    assert main(["sample", str(directory), "--tokenizer", str(directory / "tokenizer.json")]) == 1
    assert "--tokenizer does not apply to a Hugging Face directory" in capsys.readouterr().err
    assert main(["sample", str(tmp_path / "nope.bin"), "--chat"]) == 1
    assert "--chat needs a Hugging Face model directory" in capsys.readouterr().err
    assert main(["export", str(directory), "--to", "llama2c", "--dtype", "float16", str(tmp_path / "m")]) == 1
    assert "--dtype applies to --to safetensors only" in capsys.readouterr().err


@pytest.mark.parametrize("shape", ["smollm2", "qwen3"])
def test_kernels_of_a_hugging_face_model_dump_and_lint_without_errors(tmp_path, capsys, shape):
    """The kernels a fine-tuning run of the model executes (dynamic weights; its real head counts and
    sizes, one layer), dumped with its own weights: the rule book finds no error on any chip."""
    directory = tmp_path / shape
    make_checkpoint(directory, small(shape, num_hidden_layers=1, vocab_size=512), dtype="bfloat16", seed=1)
    assert main(["kernels", "dump", "--config", str(directory), str(tmp_path / "k")]) == 0
    assert "wrote 8 kernels" in capsys.readouterr().out
    assert main(["lint", str(tmp_path / "k")]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("8 programs: 0 errors"), summary
    assert main(["cost", "--config", str(directory), "--weights", "dynamic"]) == 0
    assert "step, engine part" in capsys.readouterr().out


@pytest.mark.parametrize("shape", ["qwen3", "smollm2"])
def test_export_a_hugging_face_model_to_sharded_packages_coremltools_loads(tmp_path, capsys, shape):
    pytest.importorskip("coremltools")
    from tests.test_coreml_export_coremltools import _assert_coremltools_loads

    directory = tmp_path / shape
    config = small(
        shape, num_hidden_layers=3, intermediate_size=512, vocab_size=512, max_position_embeddings=256
    )
    make_checkpoint(directory, config, dtype="bfloat16", seed=1)
    out = tmp_path / "shards"
    assert main(["export", str(directory), "--to", "mlpackage", "--shard-mb", "32", str(out)]) == 0
    capsys.readouterr()
    packages = sorted(out.glob("*.mlpackage"))
    assert len(packages) >= 3 and (out / "shards.json").is_file()
    _assert_coremltools_loads(packages)
