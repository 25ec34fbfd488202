"""The MIL parser reads real and hand-written MIL text, and reports malformed text with line:column."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anekit import mil
from anekit.errors import AnekitError, MilSyntaxError, MilTypeError
from anekit.mil import types as T
from anekit.mil.values import BlobRef
from tests.conftest import corpus_files

CORPUS_MIL = corpus_files("mil", "*.mil")

# The shape of the ANE training kernels' generated text: no spaces, decimal fp16, consts with attributes.
GENERATED = """program(1.3)
[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, {"coremlc-version", "3505.4.1"}, \
{"coremltools-component-milinternal", ""}, {"coremltools-version", "9.0"}})]
{
    func main<ios18>(tensor<fp16, [1, 64, 1, 16]> x, tensor<fp16, [1,64,1,1]> rw) {
        tensor<fp16, [1,64,1,16]> sq = mul(x=x,y=x);
        tensor<int32, [1]> rax = const()[name=string("rax"), val=tensor<int32, [1]>([1])];
        bool kd = const()[name=string("kd"), val=bool(true)];
        tensor<fp16, [1,1,1,16]> ss = reduce_sum(x=sq,axes=rax,keep_dims=kd);
        fp16 invd = const()[name=string("invd"), val=fp16(0.015625)];
        tensor<fp16, [1,1,1,16]> ss2 = mul(x=ss,y=invd);
        fp16 eps = const()[name=string("eps"), val=fp16(0.00001)];
        tensor<fp16, [1,1,1,16]> ss3 = add(x=ss2,y=eps);
        fp16 nhalf = const()[name=string("nhalf"), val=fp16(-0.5)];
        tensor<fp16, [1,1,1,16]> rrms = pow(x=ss3,y=nhalf);
        tensor<fp16, [1,64,1,16]> xr = mul(x=x,y=rrms);
        tensor<fp16, [1,64,1,16]> xn = mul(x=xr,y=rw);
        int32 cax = const()[name=string("cax"), val=int32(1)];
        bool cid = const()[name=string("cid"), val=bool(false)];
        tensor<fp16, [1,128,1,16]> out = concat(axis=cax,interleave=cid,values=(xn,x));
    } -> (out);
}
"""


@pytest.mark.parametrize("path", CORPUS_MIL, ids=lambda p: p.name)
def test_every_corpus_file_parses_verifies_and_prints_back_identically(path):
    text = path.read_text(encoding="utf-8")
    prog = mil.verify(mil.parse(text, str(path)))
    assert prog.op_count() > 0
    # Some corpus files were stored without their final newline; the canonical text ends with one.
    assert mil.to_text(prog) == text.rstrip("\n") + "\n"
    assert mil.parse(mil.to_text(prog)) == prog


def test_corpus_is_present_or_tests_say_why():
    if not CORPUS_MIL:
        pytest.skip("../shared/corpus/mil is not present in this checkout")
    assert len(CORPUS_MIL) >= 3


def test_generated_kernel_text_parses_and_verifies():
    prog = mil.verify(mil.parse(GENERATED))
    fn = prog.main
    assert fn.opset == "ios18"
    assert [v.name for v in fn.inputs] == ["x", "rw"]
    assert fn.outputs[0].type == T.tensor("fp16", [1, 128, 1, 16])
    eps = next(op for op in fn.ops if op.outputs[0].name == "eps").attributes["val"]
    assert eps.value.dtype == np.float16 and eps.value == np.float16(0.00001)
    concat = fn.ops[-1]
    assert isinstance(concat.inputs["values"], tuple) and [v.name for v in concat.inputs["values"]] == [
        "xn",
        "x",
    ]
    assert prog.attributes["buildInfo"].type == T.DictType(T.scalar("string"), T.scalar("string"))


def test_free_whitespace_and_comments_do_not_matter():
    spaced = mil.parse(GENERATED)
    squeezed = GENERATED.replace("x=x,y=x", "x = x ,  y=x").replace("tensor<int32, [1]>", "tensor<int32,[1]>")
    commented = squeezed.replace("{\n    func", "{\n    // a comment\n    /* a block\n comment */ func")
    assert mil.parse(commented) == spaced


@pytest.mark.parametrize(
    "literal, expected",
    [
        ("fp16(0x1.5p-17)", np.float16(1.3125 * 2**-17)),
        ("fp32(0x1.4f8b58p-17)", np.float32(float.fromhex("0x1.4f8b58p-17"))),
        ("fp32(-0x1p+0)", np.float32(-1.0)),
        ("fp16(1e-5)", np.float16(1e-5)),
        ("fp16(.5)", np.float16(0.5)),
        ("fp32(inf)", np.float32(np.inf)),
        ("fp32(-inf)", np.float32(-np.inf)),
        ("int32(-7)", np.int32(-7)),
        ("uint64(18446744073709551615)", np.uint64(2**64 - 1)),
        ("bool(true)", np.bool_(True)),
        ('string("a \\"quoted\\" \\\\ name")', 'a "quoted" \\ name'),
        ('tensor<string, []>("op_3")', "op_3"),
    ],
)
def test_scalar_literals(literal, expected):
    lit = mil.parse_literal(literal)
    assert lit.type.is_scalar
    assert lit.value.item() == (expected.item() if hasattr(expected, "item") else expected)


def test_nan_literal():
    assert np.isnan(mil.parse_literal("fp16(nan)").value)


def test_nested_and_flat_tensor_literals_are_the_same_value():
    flat = mil.parse_literal("tensor<int32, [2, 2]>([1, 2, 3, 4])")
    nested = mil.parse_literal("tensor<int32, [2, 2]>([[1, 2], [3, 4]])")
    assert flat == nested
    np.testing.assert_array_equal(flat.value, [[1, 2], [3, 4]])


def test_list_and_dict_literals():
    lit = mil.parse_literal('list<string, 2>(["bnns", "ane"])')
    assert [e.scalar() for e in lit.value] == ["bnns", "ane"]
    d = mil.parse_literal('dict<string, fp64>({{"ane", 0.0046742807655237523}, {"bnns", 0}})')
    assert [(k.scalar(), v.scalar()) for k, v in d.value] == [("ane", 0.0046742807655237523), ("bnns", 0.0)]
    assert mil.parse_literal("dict<string, string>({})").value == ()


def test_blobfile_const_and_blobfile_argument():
    text = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 4, 1, 8]> x) {
        tensor<fp16, [4, 4, 1, 1]> w = const()[name = string("w"), val = tensor<fp16, [4, 4, 1, 1]>(\
BLOBFILE(path = string("@model_path/weights/w.bin"), offset = uint64(64)))];
        tensor<fp16, [1, 4, 1, 8]> y = conv(x = x, weight = w);
        tensor<fp16, [1, 4, 1, 8]> z = conv(x = y, weight = tensor<fp16, [4, 4, 1, 1]>(\
BLOBFILE(path = string("@model_path/weights/w.bin"), offset = uint64(192))));
    } -> (z);
}
"""
    prog = mil.verify(mil.parse(text))
    w = prog.main.ops[0].attributes["val"]
    assert w.value == BlobRef("@model_path/weights/w.bin", 64)
    inline = prog.main.ops[2].inputs["weight"]
    assert isinstance(inline, mil.Literal) and inline.value == BlobRef("@model_path/weights/w.bin", 192)


def test_several_functions_several_outputs_versioned_ops_and_rank0_tensors():
    text = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 4]> x) {
        tensor<fp16, [1, 2]> a, tensor<fp16, [1, 2]> b = split(x = x, num_splits = int32(2), axis = int32(1));
        tensor<fp16, []> s = const()[name = string("s"), val = tensor<fp16, []>(0x1p-1)];
        tensor<fp16, [1, 2]> c = mul<ios17>(x = a, y = s)[name = string("c"), milId = uint64(3)];
    } -> (c, b);
    func helper<ios17>(fp32 y) {
        fp32 z = exp(x = y);
    } -> (z);
}
"""
    prog = mil.verify(mil.parse(text))
    assert list(prog.functions) == ["main", "helper"]
    split = prog.main.ops[0]
    assert [v.name for v in split.outputs] == ["a", "b"]
    assert prog.main.ops[1].outputs[0].type == T.scalar("fp16")
    mul = prog.main.ops[2]
    assert mul.version == "ios17" and mul.attributes["milId"].scalar() == 3
    assert [v.name for v in prog.main.outputs] == ["c", "b"]
    assert prog.functions["helper"].opset == "ios17"


def test_program_1_0_dialect_round_trips_with_tensor_scalars():
    text = """program(1.0)
[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{"coremltools-version", "8.1"}})]
{
    func main<ios16>(tensor<fp16, [1, 10]> x, tensor<fp16, [1, 10]> y) {
            tensor<fp16, [1, 10]> var_3 = mul(x = x, y = y)[name = tensor<string, []>("op_3_cast_fp16")];
        } -> (var_3);
}
"""
    prog = mil.verify(mil.parse(text))
    assert mil.to_text(prog) == text


def test_types_anekit_cannot_model_are_kept_and_reported_by_the_verifier():
    text = """program(1.3)
{
    func main<ios18>(tensor<fp16, [4]> x, mystery<fp16, 3> m) {
        tensor<fp16, [4]> y = relu(x = x);
    } -> (y);
}
"""
    prog = mil.parse(text)
    assert prog.main.inputs[1].type == T.OpaqueType("mystery<fp16, 3>")
    problems = mil.check(prog)
    assert (
        len(problems) == 1 and "cannot model" in str(problems[0]) and "mystery<fp16, 3>" in str(problems[0])
    )
    assert "mystery<fp16, 3> m" in mil.to_text(prog)


def test_an_unknown_op_parses_and_the_verifier_names_it():
    text = "program(1.3)\n{\n    func main<ios18>(fp16 x) {\n        fp16 y = frobnicate(x = x);\n    } -> (y);\n}\n"
    prog = mil.parse(text)
    with pytest.raises(MilTypeError, match="frobnicate"):
        mil.verify(prog)


@pytest.mark.parametrize(
    "text, line, column, fragment",
    [
        ("", 1, 1, "expected 'program(<version>)'"),
        (
            "program(1.3)\n{\n  func main<ios18>(fp16 x) {\n    fp16 y = relu(x = x)\n  } -> (y);\n}",
            5,
            3,
            "';'",
        ),
        ("program(1.3)\n{\n  func main<ios18>(tensor<fp17, [1]> x) {\n  } -> (x);\n}", 3, 20, "fp17"),
        (
            'program(1.3)\n{\n  func main(fp16 x) {\n    fp16 y = relu(x = "oops);\n  } -> (y);\n}',
            4,
            23,
            "'\"'",
        ),
        (
            "program(1.3)\n{\n  func main(fp16 x) {\n    tensor<int32, [3]> c = const()[val = tensor<int32, [3]>"
            "([1, 2])];\n  } -> (c);\n}",
            4,
            42,
            "needs 3 element(s), found 2",
        ),
        (
            "program(1.3)\n{\n  func main(fp16 x) {\n    int8 c = const()[val = int8(300)];\n  } -> (c);\n}",
            4,
            28,
            "out of range for int8",
        ),
        (
            "program(1.3)\n{\n  func main(fp16 x) {\n    tensor<fp16, [1]> c = const()[val = tensor<fp16, [1]>"
            '(BLOBFILE(path = string("w.bin")))];\n  } -> (c);\n}',
            4,
            59,
            "missing offset",
        ),
        ("program(1.3)\n{\n} trailing", 3, 3, "unexpected text after the program"),
        (
            "program(1.3)\n{\n  func main(fp16 x) {\n    fp16 y = relu(x = x, x = x);\n  } -> (y);\n}",
            4,
            26,
            "given twice",
        ),
        (
            "program(1.3) {\n  func main(fp16 x) { fp16 y = relu(x = x); } -> (y);\n  func main(fp16 x) "
            "{ fp16 y = relu(x = x); } -> (y);\n}",
            3,
            8,
            "defined twice",
        ),
        (
            "program(1.3) { func main(fp16 x) { fp16 y = relu(x = @); } -> (y); }",
            1,
            54,
            "unexpected character",
        ),
    ],
)
def test_syntax_errors_give_line_column_and_a_caret(text, line, column, fragment):
    with pytest.raises(MilSyntaxError) as info:
        mil.parse(text, "bad.mil")
    err = info.value
    assert fragment in str(err)
    assert (err.line, err.column) == (line, column), str(err)
    assert f"bad.mil:{line}:{column}:" in str(err)
    assert "^" in str(err).splitlines()[-1]


# The largest finite value of each float format and the smallest magnitude that rounds to infinity under
# round-to-nearest-even (IEEE 754-2019 section 7.4: a value at or past max + half an ulp of max overflows):
# binary16 (10 fraction bits, emax 15), binary32 (23, 127), bfloat16 (7 fraction bits, emax 127).
FLOAT_EDGES = {
    "fp16": ((2 - 2**-10) * 2.0**15, (2 - 2**-11) * 2.0**15),  # 65504, 65520
    "fp32": ((2 - 2**-23) * 2.0**127, (2 - 2**-24) * 2.0**127),
    "bf16": ((2 - 2**-7) * 2.0**127, (2 - 2**-8) * 2.0**127),
}


def _const_program(literal: str) -> str:
    return (
        f"program(1.3)\n{{\n  func main(fp16 x) {{\n    fp32 c = const()[val = {literal}];\n  }} -> (c);\n}}"
    )


@pytest.mark.parametrize("dtype", sorted(FLOAT_EDGES))
def test_a_finite_float_literal_that_rounds_to_inf_is_refused_at_its_column(dtype):
    largest, overflows = FLOAT_EDGES[dtype]
    below = math.nextafter(overflows, 0.0)  # rounds down to the largest finite value
    for text in (float.hex(below), repr(below), float.hex(-below)):
        assert abs(float(mil.parse_literal(f"{dtype}({text})").value)) == largest, text
    for text in (float.hex(overflows), repr(overflows), float.hex(-overflows), "0x1p200", "1e400"):
        with pytest.raises(MilSyntaxError) as info:
            mil.parse(_const_program(f"{dtype}({text})"), "big.mil")
        err = info.value
        assert (err.line, err.column) == (4, len("    fp32 c = const()[val = ") + len(dtype) + 2), str(err)
        assert f"value {text} is out of range for {dtype}" in str(err)
        assert f"largest finite {dtype} is {largest:.8g}" in str(err)
    for text in ("inf", "-inf", "+inf"):  # an infinity written as one stays allowed
        assert np.isinf(mil.parse_literal(f"{dtype}({text})").value)


def test_a_decimal_just_past_fp16_max_that_rounds_to_it_is_finite():
    # 65519 lies within half an ulp (16) of 65504: round-to-nearest-even gives 65504, not inf
    assert float(mil.parse_literal("fp16(65519)").value) == 65504.0
    lit = mil.parse_literal("tensor<fp16, [3]>([1, 65519.99, -65510])")
    assert lit.value.tolist() == [1.0, 65504.0, -65504.0]
    with pytest.raises(MilSyntaxError, match=r"value 7e4 is out of range for fp16"):
        mil.parse_literal("tensor<fp16, [2]>([1, 7e4])")


def test_syntax_error_is_an_anekit_error():
    with pytest.raises(AnekitError):
        mil.parse("program(")


def test_parse_type_and_literal_helpers():
    assert mil.parse_type("tensor<fp16, [1, ?, is0]>") == T.tensor("fp16", [1, "?", "is0"])
    assert mil.parse_type("list<tensor<int32, [2]>, ?>") == T.ListType(T.tensor("int32", [2]), None)
    assert mil.parse_type("state<tensor<fp16, [1, 8]>>") == T.StateType(T.tensor("fp16", [1, 8]))
    buf = mil.parse_type("tensor_buffer<fp16, shape=[1, 2], strides=[2, 1], interleave_factors=[1, 1]>")
    assert buf == T.TensorBufferType(T.fp16, (1, 2), (2, 1), (1, 1))
    with pytest.raises(MilSyntaxError):
        mil.parse_type("tensor<fp16, [1]> junk")
