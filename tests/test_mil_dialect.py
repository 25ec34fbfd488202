"""MIL dialects: programs written in the verbose program(1.0) / <ios16> form parse back, print back
identically and compute the same in the simulator; what iOS16 lacks is refused by name.

The references are independent of the printer: the corpus holds coremlc's own program(1.0) text
(``coremltools-add_model.mil``), and the simulator runs the original and the re-parsed program.
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil
from anekit.errors import MilDialectError
from anekit.kernels import catalog, preset
from anekit.mil import tensor
from anekit.mil.dialect import check, dialect_for_chip
from anekit.runtime.sim import SimBackend
from tests.conftest import corpus_files, corpus_path

CORPUS_MIL = corpus_files("mil", "*.mil")
# Corpus programs made of compiler-internal ios17 ops and tensor_buffer types: they have no ios16 form.
NOT_IOS16 = {"751k-ctx-conv3x3.mil"}


def _run(prog: mil.Program, weights: dict[str, bytes] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    fn = prog.main
    feeds = {
        v.name: rng.standard_normal([int(d) for d in v.type.shape]).astype(np.float32) for v in fn.inputs
    }
    with SimBackend().compile(prog, weights or {}) as kernel:
        return kernel(**feeds)


def _conv_program() -> tuple[mil.Program, dict[str, bytes]]:
    from anekit.blob import fp16_blob

    b = mil.Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 16, 1, 32]))
    w = f.weight(tensor("fp16", [16, 16, 1, 1]), "@model_path/weights/w.bin", 64, name="w")
    y = f.conv(x=x, weight=w, pad_type="valid", strides=[1, 1], dilations=[1, 1], pad=[0, 0, 0, 0], groups=1)
    f.output(f.mul(x=y, y=0.5, name="y"))
    weights = np.random.default_rng(1).standard_normal((16, 16, 1, 1)).astype(np.float32)
    return b.build(), {"@model_path/weights/w.bin": fp16_blob(weights)}


def test_ios16_text_has_the_verbose_header_opset_and_scalars():
    prog, _ = _conv_program()
    text = mil.to_text(prog, dialect="ios16")
    assert text.startswith("program(1.0)\n[buildInfo = dict<tensor<string, []>, tensor<string, []>>(")
    assert "func main<ios16>(tensor<fp16, [1, 16, 1, 32]> x)" in text
    assert 'name = tensor<string, []>("y")' in text
    assert 'val = tensor<string, []>("valid")' in text
    assert "tensor<int32, []> " in text and "int32(" not in text
    assert (
        'BLOBFILE(path = tensor<string, []>("@model_path/weights/w.bin"), offset = tensor<uint64, []>(64))'
        in text
    )
    assert "string(" not in text.replace("tensor<string, []>(", "")
    # The canonical form is untouched by the option's existence.
    assert mil.to_text(prog) == mil.to_text(prog, dialect="ios18")
    assert mil.to_text(prog).startswith("program(1.3)\n")


def test_ios16_text_parses_back_prints_back_and_runs_identically():
    prog, weights = _conv_program()
    text = mil.to_text(prog, dialect="ios16")
    back = mil.verify(mil.parse(text))
    assert back.version == "1.0" and back.main.opset == "ios16"
    assert mil.to_text(back) == text
    assert mil.to_text(back, dialect="ios18") == mil.to_text(prog)
    a, b = _run(prog, weights), _run(back, weights)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_coremlc_ios16_text_is_what_the_dialect_writes():
    """coremlc's own program(1.0) model.mil is a fixed point of the ios16 dialect."""
    text = corpus_path("mil", "coremltools-add_model.mil").read_text(encoding="utf-8")
    prog = mil.verify(mil.parse(text))
    assert mil.to_text(prog, dialect="ios16") == text.rstrip("\n") + "\n"


@pytest.mark.parametrize("path", CORPUS_MIL, ids=lambda p: p.name)
def test_every_corpus_program_round_trips_through_ios16(path):
    prog = mil.verify(mil.parse(path.read_text(encoding="utf-8"), str(path)))
    if path.name in NOT_IOS16:
        with pytest.raises(MilDialectError, match=r"tensor_buffer_to_tensor.*not in the ios16 opset"):
            mil.to_text(prog, dialect="ios16")
        return
    text = mil.to_text(prog, dialect="ios16")
    back = mil.verify(mil.parse(text))
    assert mil.to_text(back) == text
    assert mil.to_text(back, dialect=None if prog.version == "1.0" else "ios18") == mil.to_text(
        prog, dialect=None if prog.version == "1.0" else "ios18"
    )


@pytest.mark.parametrize("name", ["sdpa_fwd", "ffn_bwd", "classifier_fwd", "ffn_fwd_dynamic"])
def test_generated_kernel_round_trips_through_ios16_and_runs_identically(name):
    cfg = preset("stories260K")
    spec = catalog.build(name, cfg, catalog.random_weights(cfg))
    text = mil.to_text(spec.program, dialect="ios16")
    back = mil.verify(mil.parse(text))
    assert mil.to_text(back) == text
    assert mil.to_text(back, dialect="ios18") == spec.text()
    a, b = _run(spec.program, spec.weight_files()), _run(back, spec.weight_files())
    np.testing.assert_array_equal(a["out"], b["out"])


def test_an_ios18_op_is_refused_naming_the_op_and_the_dialect():
    b = mil.Builder()
    f = b.function("main")
    q = f.input("q", tensor("fp16", [1, 2, 32, 16]))
    f.output(f.scaled_dot_product_attention(query=q, key=q, value=q, name="att"))
    prog = b.build()
    with pytest.raises(MilDialectError) as e:
        mil.to_text(prog, dialect="ios16")
    message = str(e.value)
    assert message.startswith("[mil.dialect ios16]")
    assert "op 'scaled_dot_product_attention' is not in the ios16 opset (added in ios18)" in message
    assert "att = scaled_dot_product_attention" in message
    assert mil.to_text(prog, dialect="ios18")  # the canonical dialect has it


def test_an_ios17_op_version_and_a_subbyte_dtype_are_refused():
    text = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 4]> x) {
            tensor<fp16, [1, 4]> y = relu<ios17>(x = x)[name = string("y")];
            tensor<int4, [4]> q = const()[name = string("q"), val = tensor<int4, [4]>([1, 2, 3, 4])];
        } -> (y);
}
"""
    problems = check(mil.parse(text), "ios16")
    assert any("relu<ios17>" in p for p in problems)
    assert any("dtype int4 (added in ios18)" in p for p in problems)
    assert check(mil.parse(text), "ios18") == []


def test_an_unknown_dialect_is_an_anekit_error():
    prog, _ = _conv_program()
    with pytest.raises(
        MilDialectError, match=r"\[mil.dialect ios99\] unknown dialect \(known: ios18, ios16\)"
    ):
        mil.to_text(prog, dialect="ios99")


@pytest.mark.parametrize(
    ("chip", "expected"),
    [
        ("m1", "ios16"),
        ("M2", "ios16"),
        ("Apple M1 Pro", "ios16"),
        ("Apple M2 Max", "ios16"),
        ("m3", "ios18"),
        ("Apple M4 Max", "ios18"),
        ("Apple M10", "ios18"),
        ("x86_64", "ios18"),
        ("", "ios18"),
        (None, "ios18"),
    ],
)
def test_dialect_for_chip(chip, expected):
    assert dialect_for_chip(chip) == expected
