"""The verifier finds SSA breaks, undefined uses, type mismatches and missing outputs, naming each."""

from __future__ import annotations

import pytest

from anekit import mil
from anekit.errors import MilTypeError, MilVerifyError


def _prog(body: str, inputs: str = "tensor<fp16, [1, 4]> x", outputs: str = "y") -> mil.Program:
    return mil.parse(
        f"program(1.3)\n{{\n    func main<ios18>({inputs}) {{\n{body}\n        }} -> ({outputs});\n}}\n"
    )


def test_a_well_typed_program_verifies():
    prog = _prog("            tensor<fp16, [1, 4]> y = relu(x = x);")
    assert mil.verify(prog) is prog
    assert mil.check(prog) == []


def test_use_of_an_undefined_name():
    prog = _prog("            tensor<fp16, [1, 4]> y = relu(x = nope);")
    with pytest.raises(MilVerifyError, match=r"line 4: 'nope' is used by relu before it is defined"):
        mil.verify(prog)


def test_use_before_definition():
    body = (
        "            tensor<fp16, [1, 4]> y = relu(x = z);\n            tensor<fp16, [1, 4]> z = relu(x = x);"
    )
    with pytest.raises(MilVerifyError, match="'z' is used by relu before it is defined"):
        mil.verify(_prog(body))


def test_a_name_assigned_twice_breaks_ssa():
    body = (
        "            tensor<fp16, [1, 4]> y = relu(x = x);\n            tensor<fp16, [1, 4]> y = relu(x = x);"
    )
    with pytest.raises(MilVerifyError, match="'y' is defined twice"):
        mil.verify(_prog(body))


def test_an_output_that_does_not_exist():
    with pytest.raises(MilVerifyError, match="function output 'w' is not defined"):
        mil.verify(_prog("            tensor<fp16, [1, 4]> y = relu(x = x);", outputs="w"))


def test_declared_type_differs_from_inferred_names_op_and_input_types():
    prog = _prog("            tensor<fp32, [1, 4]> y = relu(x = x);")
    with pytest.raises(MilTypeError) as info:
        mil.verify(prog)
    msg = str(info.value)
    assert msg.startswith("[relu]")
    assert (
        "tensor<fp32, [1, 4]>" in msg and "tensor<fp16, [1, 4]>" in msg and "x: tensor<fp16, [1, 4]>" in msg
    )


def test_ill_typed_inputs_name_the_op():
    prog = _prog(
        "            tensor<fp16, [1, 4]> y = add(x = x, y = z);",
        inputs="tensor<fp16, [1, 4]> x, tensor<fp16, [1, 3]> z",
    )
    with pytest.raises(MilTypeError, match=r"\[add\].*broadcast"):
        mil.verify(prog)


def test_const_type_must_match_its_value():
    prog = _prog("            tensor<int32, [3]> y = const()[val = tensor<int32, [2]>([1, 2])];")
    with pytest.raises(MilTypeError, match=r"\[const\].*does not match"):
        mil.verify(prog)


def test_every_problem_is_listed():
    body = "            tensor<fp16, [1, 4]> y = relu(x = nope);\n            tensor<fp16, [1, 4]> y = relu(x = x);"
    problems = mil.check(_prog(body))
    assert len(problems) == 2
    with pytest.raises(MilVerifyError) as info:
        mil.verify(_prog(body))
    assert len(info.value.problems) == 2


def test_symbolic_dims_are_compatible_with_concrete_ones():
    prog = _prog("            tensor<fp16, [1, 4]> y = relu(x = x);", inputs="tensor<fp16, [1, is0]> x")
    mil.verify(prog)


def test_a_type_error_raised_for_several_problems_lists_them_all():
    body = "            tensor<fp32, [1, 4]> y = relu(x = x);\n            tensor<fp16, [1, 4]> z = relu(x = nope);"
    with pytest.raises(MilTypeError, match=r"^\[relu\]") as info:
        mil.verify(_prog(body))
    assert len(info.value.problems) == 2
    assert "'nope' is used by relu before it is defined" in info.value.problems[1]


def test_a_type_error_of_one_problem_carries_an_empty_listing():
    with pytest.raises(MilTypeError) as info:
        mil.verify(_prog("            tensor<fp32, [1, 4]> y = relu(x = x);"))
    assert info.value.problems == []
