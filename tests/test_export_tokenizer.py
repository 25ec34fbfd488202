"""An export carries its model's tokenizer and ``anekit sample`` of the export finds it by itself.

A Hugging Face model (tokenizer.json with its tokenizer_config.json and generation_config.json) exported
as a package samples the text that the ``tokenizers`` library decodes from the package's own greedy ids;
a llama2.c-style model exported to llama2.c and to a package in one directory (either order) samples from
both; a different tokenizer already beside OUT is refused in one line, before anything is written, unless
--force replaces it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from anekit.cli.main import main
from anekit.kernels.config import ModelConfig
from anekit.llama.params import Params
from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

pytest.importorskip("tokenizers")
pytest.importorskip("coremltools")
from tokenizers import Tokenizer

PROMPT = "the little cat"
STEPS = "12"


def _hf_model(tmp_path: Path, shape: str = "tiny_llama2c", style: str = "llama3") -> tuple[Path, object]:
    """A Hugging Face directory whose weights are float16 already: the package stores them unchanged."""
    directory = tmp_path / "hf"
    vocab = small(shape)["vocab_size"] if shape == "tiny_llama2c" else 512
    info = make_tokenizer(directory, vocab, style)
    config = small(shape, vocab_size=vocab, bos_token_id=info.bos_id, eos_token_id=info.eos_id)
    make_checkpoint(directory, config, dtype="float16", seed=11, std=0.08)
    assert (directory / "generation_config.json").is_file()
    return directory, info


def _sample(capsys: pytest.CaptureFixture[str], model: Path, *more: str) -> tuple[int, str, str]:
    rc = main(["sample", str(model), "--prompt", PROMPT, "--temperature", "0", "--steps", STEPS, *more])
    out, err = capsys.readouterr()
    return rc, out, err


def _package_greedy_ids(export: Path, prompt_ids: list[int], eos: set[int], size: int) -> list[int]:
    """The export's greedy ids after the prompt, run in the simulator, ending before an end id, never an
    id past the tokenizer's ``size`` (the model's vocabulary is padded past it)."""
    from anekit.coreml.decoder import PackageDecoder
    from anekit.llama.sample import Sampler

    class Ids:  # a tokenizer that knows nothing of text: the ids alone
        bos_id, eos_ids, vocab_size = prompt_ids[0], tuple(eos), size

    sampler = Sampler(PackageDecoder.open(export), Ids())
    return list(sampler.generate_ids(prompt_ids, int(STEPS), temperature=0.0))


@pytest.mark.parametrize("sharded", [False, True])
def test_a_hugging_face_export_samples_with_its_own_tokenizer(tmp_path, capsys, sharded):
    source, info = _hf_model(tmp_path)
    out = tmp_path / "out" / ("shards" if sharded else "m.mlpackage")
    out.parent.mkdir()
    argv = ["export", str(source), "--to", "mlpackage", str(out)] + (["--shard-mb", "1"] if sharded else [])
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    folder = out if sharded else out.parent
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (folder / name).read_bytes() == (source / name).read_bytes(), name
        assert f"wrote {folder / name}" in printed
    rc, text, err = _sample(capsys, out)
    assert rc == 0 and "warning" not in err, err
    lib = Tokenizer.from_file(str(source / "tokenizer.json"))  # the library itself, not anekit's reader
    prompt_ids = [info.bos_id, *lib.encode(PROMPT, add_special_tokens=False).ids]
    ids = _package_greedy_ids(out, prompt_ids, {info.eos_id}, info.size)
    assert text == lib.decode(ids, skip_special_tokens=True) + "\n"
    assert text.startswith(PROMPT)


def test_tokenizer_takes_a_tokenizer_json_or_a_model_directory(tmp_path, capsys):
    source, _ = _hf_model(tmp_path)
    bare = tmp_path / "bare.mlpackage"  # an export carrying nothing: no tokenizer beside it
    assert main(["export", str(source), "--to", "mlpackage", str(bare), "--tokenizer", str(source)]) == 0
    capsys.readouterr()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (tmp_path / name).unlink()
    texts = []
    for tok in (source / "tokenizer.json", source):
        rc, text, err = _sample(capsys, bare, "--tokenizer", str(tok))
        assert rc == 0 and "warning" not in err, err
        texts.append(text)
    assert texts[0] == texts[1] and texts[0].startswith(PROMPT)
    rc, text, err = _sample(capsys, bare, "--tokenizer", str(tmp_path / "nothing.json"))
    assert rc == 1 and text == "" and err.count("\n") == 1 and "nothing.json" in err, err


def test_a_tokenizer_changed_after_the_export_is_named(tmp_path, capsys):
    source, _ = _hf_model(tmp_path)
    out = tmp_path / "m.mlpackage"
    assert main(["export", str(source), "--to", "mlpackage", str(out)]) == 0
    capsys.readouterr()
    (tmp_path / "tokenizer_config.json").write_text("{}\n")
    rc, text, err = _sample(capsys, out)
    assert (rc, text) == (1, "")
    assert err == (
        f"anekit: [sample] {tmp_path / 'tokenizer_config.json'} is not the tokenizer file the export "
        "carried (its sha256 differs): export again, or pass the model's tokenizer with --tokenizer\n"
    )
    shutil.copy(source / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    assert _sample(capsys, out)[0] == 0
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")  # read by the loader with the others
    rc, text, err = _sample(capsys, out)
    assert (rc, text) == (1, "")
    assert err == (
        f"anekit: [sample] {tmp_path / 'chat_template.jinja'} is not one of the tokenizer files the export "
        "carried, and the Hugging Face loader would read it with them: remove it, or pass --tokenizer\n"
    )


def test_a_stale_hugging_face_file_beside_out_is_refused_then_replaced(tmp_path, capsys):
    source, _ = _hf_model(tmp_path)
    out = tmp_path / "out" / "m.mlpackage"
    out.parent.mkdir()
    (out.parent / "tokenizer.model").write_bytes(b"another model's")  # unread beside a tokenizer.json
    (out.parent / "chat_template.jinja").write_text("{{ messages }}")  # another model's: the loader reads it
    assert main(["export", str(source), "--to", "mlpackage", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"anekit: [export] {out.parent / 'chat_template.jinja'}: a different tokenizer")
    assert "(--force replaces it" in err and not out.exists()
    assert main(["export", str(source), "--to", "mlpackage", str(out), "--force"]) == 0
    assert f"removed {out.parent / 'chat_template.jinja'}" in capsys.readouterr().out
    assert not (out.parent / "chat_template.jinja").exists()
    assert (out.parent / "tokenizer.model").read_bytes() == b"another model's"
    rc, _, err = _sample(capsys, out)
    assert rc == 0 and "warning" not in err, err


# -- two exports into one directory ----------------------------------------------------------------------

CFG = ModelConfig(32, 48, 2, 4, 2, 512, 32, name="tiny")  # 512: the built-in tokenizer's vocabulary


def _llama_source(tmp_path: Path, tokenizer: str) -> Path:
    """A llama2.c model with its tokenizer beside it: the built-in sentencepiece tokenizer.model, or the
    tokenizer.bin llama2.c's tokenizer.py makes of it."""
    pytest.importorskip("sentencepiece")
    from anekit.coreml.model_export import to_llama2c_tokenizer
    from anekit.llama.llama2c import write_llama2c, write_tokenizer_bin
    from anekit.llama.tokenizer import default_tokenizer

    model = tmp_path / "src" / "ckpt.bin"
    model.parent.mkdir()
    write_llama2c(model, Params.init(CFG, seed=3))
    tok = default_tokenizer(CFG.vocab_size)
    if tokenizer == "tokenizer.model":
        (model.parent / tokenizer).write_bytes(tok.sp.serialized_model_proto())
    else:
        write_tokenizer_bin(model.parent / tokenizer, to_llama2c_tokenizer(tok))
    return model


@pytest.fixture
def llama_source(tmp_path: Path) -> Path:
    return _llama_source(tmp_path, "tokenizer.model")


@pytest.mark.parametrize("tokenizer", ["tokenizer.model", "tokenizer.bin"])
@pytest.mark.parametrize("order", [("llama2c", "mlpackage"), ("mlpackage", "llama2c")])
def test_two_exports_into_one_directory_both_sample(tmp_path, capsys, order, tokenizer):
    """The second export finds the first one's tokenizer.bin (the same bytes): kept, not refused."""
    llama_source = _llama_source(tmp_path, tokenizer)
    out = tmp_path / "out"
    out.mkdir()
    targets = {"llama2c": out / "model.bin", "mlpackage": out / "m.mlpackage"}
    for kind in order:
        assert main(["export", str(llama_source), "--to", kind, str(targets[kind])]) == 0, capsys.readouterr()
    capsys.readouterr()
    rc, want, err = _sample(capsys, llama_source)
    assert rc == 0 and want.startswith(PROMPT), (want, err)
    rc, text, err = _sample(capsys, targets["llama2c"])
    assert rc == 0 and "warning" not in err and text == want, (text, err)
    rc, text, err = _sample(capsys, targets["mlpackage"])
    explicit = _sample(capsys, targets["mlpackage"], "--tokenizer", str(llama_source.parent / tokenizer))
    assert rc == 0 and "warning" not in err and (rc, text) == explicit[:2], (text, err)


def test_a_different_tokenizer_bin_beside_a_llama2c_export_is_refused_unless_force(
    tmp_path, capsys, llama_source
):
    from anekit.llama.llama2c import write_tokenizer_bin
    from tests.test_cli_sample_tokenizer import numbered_tokenizer

    out = tmp_path / "out"
    out.mkdir()
    write_tokenizer_bin(out / "tokenizer.bin", numbered_tokenizer(512))
    other = (out / "tokenizer.bin").read_bytes()
    argv = ["export", str(llama_source), "--to", "llama2c", str(out / "model.bin")]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        f"anekit: [export] {out / 'tokenizer.bin'}: a different tokenizer is there (--force replaces it "
        f"with the model's, {llama_source.parent / 'tokenizer.model'})\n"
    )
    assert not (out / "model.bin").exists() and (out / "tokenizer.bin").read_bytes() == other
    assert main([*argv, "--force"]) == 0
    capsys.readouterr()
    assert (out / "tokenizer.bin").read_bytes() != other
    rc, text, err = _sample(capsys, out / "model.bin")
    assert rc == 0 and text == _sample(capsys, llama_source)[1], err
    shutil.rmtree(out)


def test_the_package_prints_what_sample_prints_of_the_model_directory(tmp_path, capsys):
    """The weights are float16 already: the package's greedy text is the directory's, token for token."""
    source, _ = _hf_model(tmp_path)
    out = tmp_path / "m.mlpackage"
    assert main(["export", str(source), "--to", "mlpackage", str(out)]) == 0
    capsys.readouterr()
    rc, want, err = _sample(capsys, source)
    assert rc == 0, err
    assert _sample(capsys, out)[:2] == (0, want)
