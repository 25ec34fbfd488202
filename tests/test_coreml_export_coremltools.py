"""Every package ``anekit export`` writes loads through coremltools' own MIL reader, and stores each weight once.

coremltools' milproto loader (``coremltools.converters.mil.frontend.milproto.load``, what its tools use)
rebuilds every op with its own type inference and refuses a package where one op's output type differs
from the type the package declares. Each model configuration the tests use, each quantization, whole
and sharded, goes through it: every function of every shard.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from anekit.blob import BlobFile
from anekit.coreml.manifest import WEIGHT_FILE
from anekit.coreml.model_export import export_mlpackage
from anekit.coreml.quantize import QUANT_MODES
from anekit.coreml.shards import SHARDS_FILE
from anekit.kernels.config import ModelConfig, preset
from anekit.llama.params import Params
from tests.conftest import corpus_path
from tests.coreml_oracle import coremltools, ct_load

coremltools()

TINY = ModelConfig(64, 96, 3, 4, 2, 64, 32, name="tiny")  # tests/test_coreml_export.py's GQA model
# the embedding is most of the weights, as in stories15M, and the only [vocab, dim] table
WIDE_VOCAB = ModelConfig(32, 64, 1, 2, 2, 2048, 16, name="wide-vocab")


def _params(name: str, tied: bool = True) -> Params:
    if name == "stories260K":  # the corpus model, as the sampling tests use it
        from anekit.llama.llama2c import read_llama2c

        return read_llama2c(corpus_path("llama2c", "stories260K.bin"))[1]
    cfg = TINY if name == "tiny" else preset(name)
    return Params.init(cfg, seed=7, tied=tied)


def _export(params: Params, out: Path, quant: str, shard_mb: float | None = None) -> list[Path]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # int4-block warns that it leaves the engine
        return export_mlpackage(params, out, quant=quant, shard_mb=shard_mb).packages


def _weight_file(package: Path) -> Path:
    return package / "Data" / "com.apple.CoreML" / "weights" / WEIGHT_FILE


def _assert_coremltools_loads(packages: list[Path]) -> None:
    for path in packages:
        spec, prog = ct_load(path)  # AssertionError "Mismatch between var types" on any disagreement
        described = sorted(f.name for f in spec.description.functions)
        assert sorted(prog.functions) == described == ["decode", "prefill"], path
        for name, fn in prog.functions.items():
            ours = next(f for f in spec.description.functions if f.name == name)
            assert [v.name for v in fn.outputs] == [o.name for o in ours.output], (path, name)


@pytest.mark.parametrize("quant", QUANT_MODES)
@pytest.mark.parametrize(
    "model, tied, shard_mb",
    [
        ("tiny", False, 0.3),  # untied, grouped-query attention
        ("tiny", True, 0.3),
        ("default", True, 0.2),  # anekit train's model
        ("stories260K", True, 1.0),  # the corpus model
    ],
)
def test_coremltools_loads_every_exported_package(
    tmp_path: Path, model: str, tied: bool, shard_mb: float, quant: str
) -> None:
    params = _params(model, tied)
    whole = _export(params, tmp_path / "m.mlpackage", quant)
    shards = _export(params, tmp_path / "shards", quant, shard_mb)
    assert len(shards) >= 3 and (tmp_path / "shards" / SHARDS_FILE).is_file()
    _assert_coremltools_loads(whole + shards)


@pytest.mark.parametrize("quant", QUANT_MODES)
def test_coremltools_loads_a_stories15m_shaped_export(tmp_path: Path, quant: str) -> None:
    _assert_coremltools_loads(_export(_params("stories15M"), tmp_path / "m.mlpackage", quant))


def test_decode_has_no_select_sized_by_its_condition(tmp_path: Path) -> None:
    """coremltools types ``select`` by broadcasting ``a`` with ``b`` alone; a condition larger than both
    (decode's mask once was one: a [1, 1, S, 1] condition over [1, 1, 1, 1] values) is typed differently
    by anekit and refused by coremltools."""
    from anekit.coreml import load_mlpackage

    (path,) = _export(_params("tiny"), tmp_path / "m.mlpackage", "none")
    for fn in load_mlpackage(path).program.functions.values():
        for op in fn.ops:
            if op.op_type == "select":
                a, b = (tuple(op.inputs[k].type.shape) for k in ("a", "b"))
                assert np.broadcast_shapes(a, b) == tuple(op.outputs[0].type.shape), op.name


def _ct_convert_each_function(package: Path) -> list[str]:
    """Every function of ``package``, loaded by coremltools' milproto reader, through ``ct.convert``: its
    whole default pass pipeline (canonicalize_inplace_pattern first) and its serialiser. The names of the
    functions converted."""
    ct = coremltools()
    done = []
    for name in ("prefill", "decode"):
        spec, prog = ct_load(package)
        ours = next(f for f in spec.description.functions if f.name == name)
        for other in [n for n in prog.functions if n != name]:
            del prog.functions[other]
        prog.default_function_name = name
        model = ct.convert(
            prog,
            convert_to="mlprogram",
            minimum_deployment_target=ct.target.iOS18,
            skip_model_load=True,  # nothing compiles off macOS; the passes and the spec are what is checked
        )
        converted = model.get_spec().description
        assert sorted(s.name for s in converted.state) == sorted(s.name for s in ours.state), (package, name)
        assert [o.name for o in converted.output] == [o.name for o in ours.output], (package, name)
        done.append(name)
    return done


@pytest.mark.parametrize("model, shard_mb", [("tiny", 0.3), ("stories260K", 1.0)])
def test_ct_convert_runs_every_exported_function(tmp_path: Path, model: str, shard_mb: float) -> None:
    """coremltools' canonicalize_inplace_pattern inserts each coreml_update_state before the op that follows
    the op making its value; an update written after another update (decode's two selects, then the two
    updates) left it an anchor it had already removed: KeyError."""
    params = _params(model)
    packages = _export(params, tmp_path / "m.mlpackage", "none") + _export(
        params, tmp_path / "s", "int8", shard_mb
    )
    for path in packages:
        assert _ct_convert_each_function(path) == ["prefill", "decode"], path


def test_ct_convert_runs_a_hugging_face_variant(tmp_path: Path) -> None:
    """Qwen 3's shape in small: biases after the projections, the per-head q / k norm, q_dim != dim."""
    from tests.test_coreml_export_hf import CFGS, hf_params

    (path,) = _export(hf_params(CFGS["qwen3-like"]), tmp_path / "m.mlpackage", "none")
    assert _ct_convert_each_function(path) == ["prefill", "decode"]


# -- each weight stored once -----------------------------------------------------------------------------


def _blobs(package: Path) -> list[tuple[str, int, bytes]]:
    """(dtype, elements, data) of every blob in a package's weight file."""
    blob = BlobFile(_weight_file(package))
    try:
        return [(e.dtype, e.elements, bytes(blob.raw(e.metadata_offset))) for e in blob.entries]
    finally:
        blob.close()


@pytest.mark.parametrize("quant", QUANT_MODES)
@pytest.mark.parametrize("tied", [True, False])
def test_each_weight_is_stored_once(tmp_path: Path, quant: str, tied: bool) -> None:
    params = Params.init(WIDE_VOCAB, seed=2, tied=tied)
    (path,) = _export(params, tmp_path / "m.mlpackage", quant)
    blobs = _blobs(path)
    datas = [data for _, _, data in blobs]
    assert len(set(datas)) == len(datas), "two blobs hold the same bytes"
    vocab, dim = WIDE_VOCAB.vocab_size, WIDE_VOCAB.dim
    tables = [dtype for dtype, n, _ in blobs if n == vocab * dim]  # the embedding and the classifier
    assert len(tables) == (1 if tied else 2), tables


def test_a_tied_int8_export_is_smaller_than_fp16(tmp_path: Path) -> None:
    """stories15M's shape in small: the tied embedding / classifier is most of the weights, so storing it
    twice (fp16 for the lookup, int8 for the classifier) made int8 larger than fp16."""
    params = Params.init(WIDE_VOCAB, seed=1, tied=True)
    sizes = {}
    for quant in QUANT_MODES:
        (path,) = _export(params, tmp_path / f"{quant}.mlpackage", quant)
        sizes[quant] = _weight_file(path).stat().st_size
    table = WIDE_VOCAB.vocab_size * WIDE_VOCAB.dim
    assert sizes["none"] > 2 * table  # fp16: two bytes a value
    assert sizes["int8"] < 0.6 * sizes["none"], sizes
    assert sizes["int4-block"] < sizes["int8"], sizes
