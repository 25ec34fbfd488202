"""``anekit.tools.model`` (a model at a path, one typed record) and the sample / export / fuse jobs of
``anekit.tools``, called from Python: each kind of path against the file's own bytes read here, and the
refusals (a missing path, a short file, a directory of the wrong kind, flags that do not go together)."""

from __future__ import annotations

import hashlib
import shutil
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig
from anekit.llama.params import Params
from anekit.tools import model_tokenizer, sample
from anekit.tools.export import ExportRequest, check_dtype_range, check_request, export
from anekit.tools.fuse import fuse_model
from anekit.tools.model import ModelPathError, OpenedModel, check_finite, open_model
from tests.conftest import corpus_path


def _llama2c_header(path: Path) -> tuple[int, ...]:
    """llama2.c's legacy header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative:
    an untied classifier), seq_len (run.c's Config, seven int32)."""
    return struct.unpack("<7i", path.read_bytes()[:28])


def test_a_llama2c_model_opens_with_its_header_weights_and_the_tokenizers_beside_it() -> None:
    path = corpus_path("llama2c", "stories260K.bin")
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = _llama2c_header(path)
    opened = open_model(path)
    assert isinstance(opened, OpenedModel) and opened.kind == "llama2c"
    cfg = opened.cfg
    assert (cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads) == (
        dim,
        hidden,
        n_layers,
        n_heads,
        n_kv,
    )
    assert (cfg.vocab_size, cfg.seq_len) == (abs(vocab), seq)
    embed = np.frombuffer(path.read_bytes(), "<f4", abs(vocab) * dim, 28).reshape(abs(vocab), dim)
    assert opened.params is not None
    np.testing.assert_array_equal(opened.params.embed, embed)
    assert opened.run is None and opened.decoder is None and opened.hf is None and opened.notes == ()
    beside = {p for p in (path.parent / "tokenizer.model", path.parent / "tokenizer.bin") if p.is_file()}
    assert set(opened.tokenizer_files) == beside


def test_a_blzt_checkpoint_opens_with_its_weights_and_run_record(tmp_path: Path) -> None:
    from anekit.llama.checkpoint import CheckpointMeta, save_checkpoint

    cfg = ModelConfig(16, 24, 2, 2, 2, 7, 16, name="tinymha")
    params = Params.init(cfg, seed=3, tied=False)
    path = tmp_path / "ckpt.bin"
    record = {"tokenizer": {"path": "tok.model", "sha256": "ab" * 32}}
    save_checkpoint(path, params, params.zeros_like(), params.zeros_like(), CheckpointMeta(), run=record)
    assert path.read_bytes()[:4] == b"TZLB"  # the BLZT magic, little-endian
    opened = open_model(path)
    assert opened.kind == "blzt" and opened.params is not None
    for (name, got), (_, want) in zip(opened.params.tensors(), params.tensors()):
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert opened.run is not None and opened.run["tokenizer"] == record["tokenizer"]
    assert model_tokenizer.recorded_tokenizer(opened.run) == ("tok.model", "ab" * 32)
    assert opened.tokenizer_files == ()


def test_a_hugging_face_directory_opens_as_its_model_with_its_tokenizer_files(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

    directory = tmp_path / "hf"
    info = make_tokenizer(directory, 512, "llama3")
    config = small("tiny_llama2c", vocab_size=512, bos_token_id=info.bos_id, eos_token_id=info.eos_id)
    tensors = make_checkpoint(directory, config, seed=5)
    opened = open_model(directory)
    assert opened.kind == "hf" and opened.hf is not None and opened.params is not None
    np.testing.assert_array_equal(opened.params.embed, tensors["model.embed_tokens.weight"])
    assert opened.cfg.vocab_size == 512 and opened.run is None
    assert directory / "tokenizer.json" in opened.tokenizer_files


def test_an_export_opens_as_its_decoder_and_only_where_exports_are_asked_for(tmp_path: Path) -> None:
    model = tmp_path / "stories260K.bin"
    shutil.copyfile(corpus_path("llama2c", "stories260K.bin"), model)  # no tokenizer beside it
    out = tmp_path / "s.mlpackage"
    result = export(ExportRequest(model=model, to="mlpackage", out=out))
    assert result.packages == (out,) and result.warnings == ()
    assert result.lines[0].startswith(f"wrote {out} (")
    assert result.lines[-1].startswith("no tokenizer beside MODEL")
    opened = open_model(out, exports=True)
    assert opened.kind == "export" and opened.params is None and opened.decoder is not None
    assert (opened.cfg.vocab_size, opened.cfg.seq_len) == (512, 512)
    with pytest.raises(AnekitError, match=r"^\[export\] cannot read .*s\.mlpackage"):
        open_model(out, where="[export]")  # a package is no model file to export


def test_a_missing_path_a_short_file_and_a_directory_of_the_wrong_kind_are_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nope.bin"
    with pytest.raises(AnekitError, match=rf"^\[sample\] cannot read {missing}"):
        open_model(missing)
    short = tmp_path / "short.bin"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(ModelPathError, match=rf"^\[fuse\] {short} is 2 bytes long: not a model file$"):
        open_model(short, where="[fuse]")
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(AnekitError, match=r"a directory without config\.json, so not a Hugging Face model"):
        open_model(folder)
    with pytest.raises(AnekitError, match=r"^\[fuse\] MODEL .*folder is not a Hugging Face model directory"):
        fuse_model(folder, tmp_path / "adapters", tmp_path / "out")


def test_the_tokenizer_must_be_the_models() -> None:
    model = corpus_path("llama2c", "stories260K.bin")
    cfg = open_model(model).cfg
    tok = corpus_path("llama2c", "tokenizer.bin")  # llama2's 32000 tokens, not stories260K's 512
    with pytest.raises(
        AnekitError, match=r"\(--tokenizer\) has 32000 tokens but the model's vocab_size is 512"
    ):
        model_tokenizer.find_tokenizer(model, cfg, None, tok)
    run = {"tokenizer": {"path": "trained.model", "sha256": "0" * 64}}
    with pytest.raises(AnekitError, match=r"is not the one the model was trained with: pass --tokenizer "):
        model_tokenizer.find_tokenizer(model, cfg, run, tok)
    right = {"tokenizer": {"path": str(tok), "sha256": hashlib.sha256(tok.read_bytes()).hexdigest()}}
    with pytest.raises(AnekitError, match=r"has 32000 tokens"):  # the sha256 agrees; the size still does not
        model_tokenizer.find_tokenizer(model, cfg, right, tok)


def test_options_that_do_not_apply_to_the_kind_are_refused() -> None:
    with pytest.raises(AnekitError, match=r"^\[sample\] --tokenizer does not apply to a Hugging Face"):
        sample.check_options(True, False, None, Path("t.model"), None)
    with pytest.raises(AnekitError, match=r"^\[sample\] --adapters needs a Hugging Face model directory$"):
        sample.check_options(False, False, Path("a"), None, None)
    sample.check_options(True, True, Path("a"), None, None)
    with pytest.raises(AnekitError, match=r"^\[export\] --quantize and --shard-mb apply to --to mlpackage"):
        check_request(ExportRequest(Path("m.bin"), "llama2c", Path("o.bin"), quantize="int8"))
    with pytest.raises(AnekitError, match=r"^\[export\] --dtype applies to --to safetensors only$"):
        check_request(ExportRequest(Path("m.bin"), "mlpackage", Path("o"), dtype="float16"))


def test_weights_past_a_dtype_or_not_finite_are_refused_naming_the_tensor() -> None:
    cfg = ModelConfig(16, 24, 1, 2, 2, 7, 16, name="tinymha")
    params = Params.init(cfg, seed=1, tied=True)
    check_dtype_range(params, "float16")
    params.layers[0].wq[1, 2] = 65520.0  # fp16's max 65504 plus half an ulp: rounds to inf
    with pytest.raises(AnekitError, match=r"tensor model\.layers\.0\.self_attn\.q_proj\.weight holds values"):
        check_dtype_range(params, "float16")
    check_dtype_range(params, "bfloat16")  # far inside bfloat16's range
    params.layers[0].wq[1, 2] = 65519.0  # the largest float32 below the halfway point rounds to 65504
    check_dtype_range(params, "float16")
    params.layers[0].w2[0, 0] = np.nan
    with pytest.raises(
        AnekitError, match=r"^\[sample\] m\.bin: weight .*w2 holds 1 NaN or inf values of 384"
    ):
        check_finite(params, Path("m.bin"), "sample")


@pytest.mark.parametrize(
    ("stop", "said"),
    [
        ("bos", "stopped at a BOS token, the end of a story"),
        ("eos", "stopped at an end token of the tokenizer"),
        ("context", "stopped at the model's context of 64 positions"),
        ("steps", "stopped after --steps 9 positions"),
        ("prompt", "nothing sampled: the prompt's 9 tokens (BOS included) fill --steps 9; raise --steps to"),
    ],
)
def test_why_generation_stopped_in_words(stop: str, said: str) -> None:
    assert sample.why_stopped(SimpleNamespace(stop=stop, prompt_tokens=9), 9, 64).startswith(said)


def test_prepare_samples_a_hugging_face_model_as_the_float64_forward_does(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer

    from tests.test_hf_cli import _greedy, _model

    directory, info = _model(tmp_path, "tiny_llama2c", "llama3")
    lib = Tokenizer.from_file(str(directory / "tokenizer.json"))
    prompt = "the little cat"
    ids = [info.bos_id, *lib.encode(prompt, add_special_tokens=False).ids]
    steps = 24
    want = _greedy(directory, ids, steps - len(ids) + 1, info.size, {info.eos_id})
    heard: list[tuple[str, str]] = []
    job = sample.prepare(
        directory, sample.SampleOptions(prompt=prompt, steps=steps, temperature=0), lambda *m: heard.append(m)
    )
    assert "".join(job.pieces()) == lib.decode(ids[1:] + want, skip_special_tokens=True)
    assert job.stats.generated_tokens == len(want)
    assert job.why_stopped() in (
        f"stopped after --steps {steps} positions",
        "stopped at an end token of the tokenizer",
    )
    assert all(kind == "note" for kind, _ in heard)


def test_prepare_takes_the_tokenizer_it_is_given_and_refuses_flags_of_another_kind(tmp_path: Path) -> None:
    model = corpus_path("llama2c", "stories260K.bin")
    asked: list[int] = []

    def tokenizer_of(cfg, run):
        asked.append(cfg.vocab_size)
        assert run is None  # a llama2.c model has no run record
        raise AnekitError("[test] no tokenizer here")

    with pytest.raises(AnekitError, match=r"^\[test\] no tokenizer here$"):
        sample.prepare(model, sample.SampleOptions(steps=4), tokenizer_of=tokenizer_of)
    assert asked == [512]
    with pytest.raises(AnekitError, match=r"^\[sample\] --chat needs a Hugging Face model directory$"):
        sample.prepare(model, sample.SampleOptions(chat=True))
    with pytest.raises(AnekitError, match=r"^\[sample\] --prompt is not UTF-8 text \(at character 1\)$"):
        sample.prepare(model, sample.SampleOptions(prompt="a\udcff"))
