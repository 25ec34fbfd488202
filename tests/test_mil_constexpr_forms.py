"""The constexpr ops in every opset form coremltools writes: parameters as attributes (its iOS16
definitions, used in iOS16 / iOS17 programs) or as inputs (its iOS18 definitions).

coremltools is the oracle twice: it builds each op for each target and its serialised program says
where the parameters go (proto ``inputs`` or ``attributes``), and its own ``value_inference`` gives the
dense values. A third, independent float64 reference is computed here from the parameters with plain
Python bit arithmetic. The MIL text under test is written from coremltools' placement and values (the
literals spelled by anekit's literal printer, which the round-trip tests cover on their own); it is then
parsed, verified and run in the simulator by anekit.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.errors import MilTypeError
from anekit.mil import format_literal
from anekit.mil.values import tensor_literal

ct = pytest.importorskip("coremltools")
logging.getLogger("coremltools").setLevel(logging.ERROR)
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types as ct_types  # noqa: E402

RNG = np.random.default_rng(13)
TARGETS = {"ios16": ct.target.iOS16, "ios17": ct.target.iOS17, "ios18": ct.target.iOS18}


# -- independent float64 references ----------------------------------------------------------------------


def _bitfield(packed: np.ndarray, nbits: int, count: int) -> list[int]:
    """``count`` unsigned fields of ``nbits`` bits, the first in the lowest bits of the first byte."""
    stream = int.from_bytes(bytes(packed.astype(np.uint8)), "little")
    return [(stream >> (p * nbits)) & ((1 << nbits) - 1) for p in range(count)]


def _pack(values: list[int], nbits: int) -> np.ndarray:
    stream = sum(v << (p * nbits) for p, v in enumerate(values))
    return np.frombuffer(stream.to_bytes((len(values) * nbits + 7) // 8, "little"), np.uint8).copy()


def _scatter(mask: np.ndarray, values: list[float]) -> np.ndarray:
    out = np.zeros(mask.shape)
    it = iter(values)
    for pos in zip(*np.nonzero(mask)):  # row-major order
        out[pos] = next(it)
    return out


# -- cases: (ops builder for coremltools, float64 reference) ---------------------------------------------


def _affine() -> tuple[dict[str, Any], np.ndarray]:
    q = RNG.integers(-128, 128, (3, 4)).astype(np.int8)
    zp = RNG.integers(-5, 5, 4).astype(np.int8)
    scale = RNG.uniform(0.1, 2, 4).astype(np.float32)
    ref = (q.astype(np.float64) - zp.astype(np.float64)[None, :]) * scale.astype(np.float64)[None, :]
    return {"quantized_data": q, "zero_point": zp, "scale": scale, "axis": 1}, ref


def _cast() -> tuple[dict[str, Any], np.ndarray]:
    src = RNG.standard_normal((3, 4)).astype(np.float16)
    return {"source_val": src, "output_dtype": "fp32"}, src.astype(np.float64)


def _lut16(nbits: int) -> Callable[[], tuple[dict[str, Any], np.ndarray]]:
    def case() -> tuple[dict[str, Any], np.ndarray]:
        lut = RNG.standard_normal(2**nbits).astype(np.float32)
        idx = [int(i) for i in RNG.integers(0, 2**nbits, 12)]
        ref = np.array([float(lut[i]) for i in _bitfield(_pack(idx, nbits), nbits, 12)]).reshape(3, 4)
        return {"indices": _pack(idx, nbits), "lut": lut, "shape": np.array([3, 4], np.uint32)}, ref

    return case


def _sparse16() -> tuple[dict[str, Any], np.ndarray]:
    bits = [int(b) for b in RNG.integers(0, 2, 12)]
    data = RNG.standard_normal(sum(bits)).astype(np.float32)
    mask = _pack(bits, 1)
    ref = _scatter(np.array(_bitfield(mask, 1, 12)).reshape(3, 4), [float(v) for v in data])
    return {"nonzero_data": data, "mask": mask, "shape": np.array([3, 4], np.uint32)}, ref


def _blockwise() -> tuple[dict[str, Any], np.ndarray]:
    data = RNG.integers(-128, 128, (4, 6)).astype(np.int8)
    scale = RNG.uniform(0.1, 2, (2, 3)).astype(np.float32)
    offset = RNG.integers(-4, 4, (2, 3)).astype(np.int8)
    ref = np.zeros((4, 6))
    for i in range(4):
        for j in range(6):
            ref[i, j] = float(scale[i // 2, j // 2]) * (int(data[i, j]) - int(offset[i // 2, j // 2]))
    return {"data": data, "scale": scale, "offset": offset}, ref


def _lut18(vector: int) -> Callable[[], tuple[dict[str, Any], np.ndarray]]:
    def case() -> tuple[dict[str, Any], np.ndarray]:
        idx = RNG.integers(0, 4, (4, 4))
        lut = RNG.standard_normal((2, 1, 4, vector)).astype(np.float32)  # two row blocks of 2 rows
        ref = np.zeros((4 * vector, 4))
        for i in range(4):
            for j in range(4):
                for v in range(vector):
                    ref[i * vector + v, j] = float(lut[i // 2, 0, idx[i, j], v])
        params = {"indices": idx.astype(ct_types.np_uint2_dtype), "lut": lut}
        if vector > 1:
            params["vector_axis"] = 0
        return params, ref

    return case


def _sparse18() -> tuple[dict[str, Any], np.ndarray]:
    mask = RNG.integers(0, 2, (3, 4))
    data = RNG.standard_normal(int(mask.sum())).astype(np.float32)
    ref = _scatter(mask, [float(v) for v in data])
    return {"nonzero_data": data, "mask": mask.astype(ct_types.np_uint1_dtype)}, ref


def _lut_to_sparse() -> tuple[dict[str, Any], np.ndarray]:
    mask = RNG.integers(0, 2, (4, 4))
    idx = RNG.integers(0, 4, int(mask.sum()))
    lut = RNG.standard_normal((1, 1, 4, 1)).astype(np.float32)
    ref = np.array([float(lut[0, 0, i, 0]) for i in idx])  # the decoded values at the set positions
    params = {
        "indices_mask": mask.astype(ct_types.np_uint1_dtype),
        "indices_nonzero_data": idx.astype(ct_types.np_uint2_dtype),
        "lut": lut,
    }
    return params, ref


def _sparse_blockwise() -> tuple[dict[str, Any], np.ndarray]:
    mask = RNG.integers(0, 2, (4, 4))
    data = RNG.integers(-100, 100, int(mask.sum())).astype(np.int8)
    scale = RNG.uniform(0.1, 2, (2, 2)).astype(np.float32)
    offset = RNG.integers(-4, 4, (2, 2)).astype(np.int8)
    positions = list(zip(*np.nonzero(mask)))
    ref = np.array(
        [
            float(scale[i // 2, j // 2]) * (int(d) - int(offset[i // 2, j // 2]))
            for (i, j), d in zip(positions, data)
        ]
    )
    params = {"data_mask": mask.astype(ct_types.np_uint1_dtype), "nonzero_data": data, "scale": scale}
    params["offset"] = offset
    return params, ref


OLD = [
    ("constexpr_affine_dequantize", _affine),
    ("constexpr_cast", _cast),
    ("constexpr_lut_to_dense", _lut16(2)),
    ("constexpr_lut_to_dense", _lut16(6)),  # 6-bit indices straddle bytes
    ("constexpr_sparse_to_dense", _sparse16),
]
NEW = [
    ("constexpr_affine_dequantize", _affine),  # never redefined: still the attribute form in iOS18
    ("constexpr_cast", _cast),
    ("constexpr_blockwise_shift_scale", _blockwise),
    ("constexpr_lut_to_dense", _lut18(1)),
    ("constexpr_lut_to_dense", _lut18(2)),
    ("constexpr_sparse_to_dense", _sparse18),
    ("constexpr_lut_to_sparse", _lut_to_sparse),
    ("constexpr_sparse_blockwise_shift_scale", _sparse_blockwise),
]
CASES = [(o, op, c) for o in ("ios16", "ios17") for op, c in OLD] + [("ios18", op, c) for op, c in NEW]


# -- coremltools side -------------------------------------------------------------------------------------


def _coremltools(opset: str, op_type: str, params: dict[str, Any]) -> tuple[str, dict[str, Any], Any]:
    """Build the op with coremltools for that target: where its serialised form puts the parameters,
    the parameter values as coremltools holds them (value and MIL dtype), and its value_inference."""
    found: dict[str, Any] = {}

    @mb.program(input_specs=[mb.TensorSpec(shape=(1,))], opset_version=TARGETS[opset])
    def prog(x: Any) -> Any:
        out = getattr(mb, op_type)(**params, name="w")
        found["op"] = (out[0] if isinstance(out, (tuple, list)) else out).op
        return mb.identity(x=x)

    op = found["op"]
    values = {k: (v.val, ct_types.builtin_to_string(v.dtype)) for k, v in op.inputs.items()}
    dense = op.materialized_val_inference()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ct.convert(
            prog,
            convert_to="mlprogram",
            minimum_deployment_target=TARGETS[opset],
            skip_model_load=True,
            pass_pipeline=ct.PassPipeline.EMPTY,
        )
    fn = model.get_spec().mlProgram.functions["main"]
    (proto,) = [o for o in fn.block_specializations[fn.opset].operations if o.type == op_type]
    params_in_attributes = set(params) <= set(proto.attributes)
    assert params_in_attributes or set(params) <= set(proto.inputs)
    return ("attributes" if params_in_attributes else "inputs"), values, dense


def _mil_text(opset: str, op_type: str, place: str, values: dict[str, Any], out_types: list[str]) -> str:
    style = "tensor" if opset != "ios18" else "scalar"
    lits = {
        k: format_literal(tensor_literal(dt, np.asarray(v, dtype=object if dt == "string" else None)), style)
        for k, (v, dt) in sorted(values.items())
    }
    name = format_literal(tensor_literal("string", np.asarray("w", dtype=object)), style)
    params = ", ".join(f"{k} = {v}" for k, v in lits.items())
    if place == "attributes":
        call = f"{op_type}()[name = {name}, {params}]"
    else:
        call = f"{op_type}({params})[name = {name}]"
    outs = ", ".join(f"{t} w{i}" for i, t in enumerate(out_types))
    result = f"w{len(out_types) - 1}"
    dense_t = out_types[-1]
    return (
        "program(1.0)\n{\n"
        f"    func main<{opset}>({dense_t} x) {{\n"
        f"            {outs} = {call};\n"
        f"            {dense_t} y = add(x = x, y = {result})[name = {name.replace('w', 'y')}];\n"
        "        } -> (y);\n}\n"
    )


def _out_types(op_type: str, ref: np.ndarray, params: dict[str, Any]) -> list[str]:
    dense = f"tensor<fp32, [{', '.join(map(str, ref.shape))}]>"
    if op_type in ("constexpr_lut_to_sparse", "constexpr_sparse_blockwise_shift_scale"):
        mask = params.get("indices_mask", params.get("data_mask"))
        return [f"tensor<uint1, [{', '.join(map(str, np.shape(mask)))}]>", dense]
    return [dense]


@pytest.mark.parametrize(("opset", "op_type", "case"), CASES, ids=lambda v: getattr(v, "__name__", v))
def test_every_constexpr_form_coremltools_writes_parses_verifies_and_runs(opset, op_type, case):
    params, ref = case()
    place, values, dense = _coremltools(opset, op_type, params)
    assert place == (
        "attributes" if opset != "ios18" or op_type == "constexpr_affine_dequantize" else "inputs"
    )
    ct_dense = np.asarray(dense[-1] if isinstance(dense, tuple) else dense, np.float64)
    np.testing.assert_allclose(ct_dense, ref, rtol=1e-6)  # coremltools' semantics == the float64 reference

    text = _mil_text(opset, op_type, place, values, _out_types(op_type, ref, params))
    prog = mil.verify(mil.parse(text))
    op = prog.functions["main"].ops[0]
    assert (op.inputs == {}) == (place == "attributes")
    assert mil.parse(mil.to_text(prog)) == prog
    kernel = runtime.open("sim", precision="fp32", strict=False).compile(text)
    got = kernel(x=np.zeros(ref.shape, np.float32))["y"]
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=1e-6)


def _program(opset: str, statement: str) -> str:
    return (
        "program(1.0)\n{\n"
        f"    func main<{opset}>(tensor<fp32, [2]> x) {{\n"
        f"            {statement}\n"
        '            tensor<fp32, [2]> y = add(x = x, y = w)[name = string("y")];\n'
        "        } -> (y);\n}\n"
    )


CAST_ATTRS = 'constexpr_cast()[name = string("w"), output_dtype = string("fp32"), source_val = {}]'
CAST_INPUTS = 'constexpr_cast(output_dtype = string("fp32"), source_val = {})[name = string("w")]'
SRC = "tensor<fp16, [2]>([0x1p+0, 0x1p+1])"


@pytest.mark.parametrize(
    ("opset", "statement", "said"),
    [
        # the iOS18 input form in an iOS16 program, and the reverse
        ("ios16", "tensor<fp32, [2]> w = " + CAST_INPUTS.format(SRC) + ";", "parameters as inputs"),
        ("ios18", "tensor<fp32, [2]> w = " + CAST_ATTRS.format(SRC) + ";", "parameters as attributes"),
        # split between inputs and attributes: no form at all
        (
            "ios17",
            'tensor<fp32, [2]> w = constexpr_cast(output_dtype = string("fp32"))[name = string("w"), '
            f"source_val = {SRC}];",
            "inputs and attributes",
        ),
        # the iOS16 lut form (with shape) as inputs in an iOS18 program
        (
            "ios18",
            "tensor<fp32, [2]> w = constexpr_lut_to_dense(indices = tensor<uint8, [1]>([1]), "
            'lut = tensor<fp32, [2]>([0x1p+0, 0x1p+1]), shape = tensor<uint32, [1]>([2]))[name = string("w")];',
            "parameters as inputs",
        ),
        # an iOS18-only op in an iOS16 program
        (
            "ios16",
            "tensor<fp32, [2]> w = constexpr_blockwise_shift_scale(data = tensor<int8, [2]>([1, 2]), "
            'scale = tensor<fp32, [2]>([0x1p+0, 0x1p+1]))[name = string("w")];',
            "no form in opset ios16",
        ),
    ],
)
def test_a_constexpr_in_no_form_of_its_opset_names_the_op_the_opset_and_the_forms(opset, statement, said):
    with pytest.raises(MilTypeError) as e:
        mil.verify(mil.parse(_program(opset, statement)))
    msg = str(e.value)
    assert said in msg and opset in msg and msg.startswith("[")
    op = statement.split("= ")[1].split("(")[0]
    assert op in msg
    if op == "constexpr_cast":  # both forms named: attributes (ios16, ios17) and inputs (ios18)
        assert "constexpr_cast()[source_val, output_dtype]" in msg
        assert "constexpr_cast(source_val, output_dtype)" in msg


def test_the_builder_writes_the_form_of_the_functions_opset():
    """The builder puts the parameters where coremltools does for the function's opset."""
    for opset, place in (("ios16", "attributes"), ("ios17", "attributes"), ("ios18", "inputs")):
        b = mil.Builder()
        f = b.function("main", opset=opset)
        x = f.input("x", mil.tensor("fp32", [2]))
        w = f.constexpr_cast(source_val=np.array([1, 2], np.float16), output_dtype="fp32", name="w")
        f.output(f.add(x=x, y=w, name="y"))
        prog = mil.verify(b.build())
        op = next(o for o in prog.functions["main"].ops if o.op_type == "constexpr_cast")
        assert ("source_val" in op.attributes) == (place == "attributes")
        assert mil.parse(mil.to_text(prog)) == prog
