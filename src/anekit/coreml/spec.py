"""An anekit Program <-> the CoreML ``Model`` protobuf of an ML Program (Model.proto + MIL.proto).

Writing::

    Model
      specificationVersion   the highest any function needs (OPSET_SPEC), 9 at least for several
                             functions, a default function not called "main", or states
      description            input / output / state features of "main", or one FunctionDescription
                             per function and defaultFunctionName; metadata
      mlProgram              version 1, one Function per anekit function: inputs, opset "CoreML8" ...,
                             block_specializations {opset: Block(operations, outputs)}, and the
                             program's attributes (buildInfo)

Each op becomes an ``Operation`` (inputs as name bindings or immediate values, attributes, typed
outputs); ``const`` values go through the caller's ``place`` hook, which decides between an
immediate value and a weight-file value. ``coreml_update_state`` is stored as ``write_state`` +
``read_state`` and merged back on reading, as coremltools does. Opset names and specification versions
follow coremltools (``coremltools/__init__.py`` ``_OPSET``; ``_deployment_compatibility.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from anekit import __version__
from anekit.coreml._proto import proto
from anekit.coreml.values import (
    BlobReader,
    literal_to_value,
    type_from_proto,
    type_to_proto,
    value_to_literal,
)
from anekit.errors import CoreMLFormatError, UnknownOpError
from anekit.mil import types as T
from anekit.mil.ir import Arg, Block, Function, Op, Program, Var
from anekit.mil.registry import get_op
from anekit.mil.values import Literal, string_literal

# anekit opset -> (MIL.proto opset name, Model.specificationVersion): iOS15 = 6 ... iOS18 = 9.
OPSETS: dict[str, tuple[str, int]] = {
    "ios15": ("CoreML5", 6),
    "ios16": ("CoreML6", 7),
    "ios17": ("CoreML7", 8),
    "ios18": ("CoreML8", 9),
}
OPSET_OF_PROTO = {name: ours for ours, (name, _) in OPSETS.items()}
SPEC_IOS18 = 9  # several functions and states need iOS18 (coremltools refuses them below)

# Function input and output dtypes a CoreML feature can carry (FeatureTypes.proto ArrayDataType).
ARRAY_DTYPES = {"fp16": "FLOAT16", "fp32": "FLOAT32", "fp64": "DOUBLE", "int32": "INT32", "int8": "INT8"}

Place = Callable[[Literal, Function, str, bool], Any]
"""(literal, function, field path, may go to a weight file) -> its protobuf Value."""


def opset_info(fn: Function) -> tuple[str, int]:
    try:
        return OPSETS[fn.opset]
    except KeyError:
        raise CoreMLFormatError(
            f"function '{fn.name}'.opset",
            f"opset {fn.opset} has no CoreML equivalent (known: {', '.join(OPSETS)})",
        ) from None


def spec_version(program: Program, default_function: str) -> int:
    """The specification version a package of ``program`` needs."""
    version = max(opset_info(fn)[1] for fn in program.functions.values())
    has_state = any(isinstance(v.type, T.StateType) for f in program.functions.values() for v in f.inputs)
    if len(program.functions) > 1 or default_function != "main" or has_state:
        version = max(version, SPEC_IOS18)
    return version


# -- writing ----------------------------------------------------------------------------------------


def _feature(v: Var, where: str, output: bool) -> Any:
    p = proto()
    feature = p.Model.FeatureDescription(name=v.name)
    t = v.type
    wrapped = t.wrapped if isinstance(t, T.StateType) else t
    if not isinstance(wrapped, T.TensorType) or wrapped.dtype.name not in ARRAY_DTYPES:
        raise CoreMLFormatError(
            f"{where} '{v.name}'",
            f"type {t} cannot be a CoreML feature (tensors of {', '.join(ARRAY_DTYPES)} only)",
        )
    if not wrapped.is_static and not output:
        raise CoreMLFormatError(f"{where} '{v.name}'", f"shape {list(wrapped.shape)} must be static")
    array = p.Features.ArrayFeatureType(
        dataType=p.Features.ArrayFeatureType.ArrayDataType.Value(ARRAY_DTYPES[wrapped.dtype.name])
    )
    if wrapped.is_static:
        array.shape.extend([int(d) for d in wrapped.shape] or [1])
    if isinstance(t, T.StateType):
        feature.type.stateType.arrayType.CopyFrom(array)
    else:
        feature.type.multiArrayType.CopyFrom(array)
    return feature


def _features(fn: Function) -> tuple[list[Any], list[Any], list[Any]]:
    inputs: list[Any] = []  # FeatureDescription messages
    states: list[Any] = []
    for v in fn.inputs:
        f = _feature(v, f"function '{fn.name}' input", output=False)
        (states if isinstance(v.type, T.StateType) else inputs).append(f)
    outputs = [_feature(v, f"function '{fn.name}' output", output=True) for v in fn.outputs]
    return inputs, outputs, states


def _binding(arg: Var | Literal, fn: Function, where: str, place: Place, blob_ok: bool) -> Any:
    mil = proto().MIL
    if isinstance(arg, Var):
        return mil.Argument.Binding(name=arg.name)
    return mil.Argument.Binding(value=place(arg, fn, where, blob_ok))


def _operation(op: Op, fn: Function, place: Place) -> list[Any]:
    mil = proto().MIL
    where = f"function '{fn.name}' op '{op.name}'"
    outputs = [mil.NamedValueType(name=v.name, type=type_to_proto(v.type, where)) for v in op.outputs]
    attrs = {}
    for key, lit in op.attributes.items():
        attrs[key] = place(lit, fn, f"{where}.{key}", op.op_type == "const" and key == "val")
    if op.op_type == "coreml_update_state":  # stored as write_state + read_state (as coremltools does)
        state, value = op.inputs["state"], op.inputs["value"]
        if isinstance(state, tuple) or isinstance(value, tuple):
            raise CoreMLFormatError(where, "coreml_update_state takes one state and one value, not a tuple")
        write_attrs = {"name": literal_to_value(string_literal(f"{op.name}_write_state"), where)}
        write = mil.Operation(type="write_state", attributes=write_attrs)
        write.inputs["input"].arguments.append(_binding(state, fn, where, place, False))
        write.inputs["data"].arguments.append(_binding(value, fn, where, place, False))
        read = mil.Operation(type="read_state", attributes=attrs, outputs=outputs)
        read.inputs["input"].arguments.append(_binding(state, fn, where, place, False))
        return [write, read]
    operation = mil.Operation(type=op.op_type, attributes=attrs, outputs=outputs)
    blob_ok = op.op_type.startswith("constexpr_")  # constexpr inputs may live in the weight file
    for key, arg in op.inputs.items():
        items = arg if isinstance(arg, tuple) else (arg,)
        argument = operation.inputs[key]
        argument.SetInParent()
        for item in items:
            argument.arguments.append(_binding(item, fn, f"{where}.{key}", place, blob_ok))
    return [operation]


def _function(fn: Function, place: Place) -> Any:
    mil = proto().MIL
    opset, _ = opset_info(fn)
    block = mil.Block(outputs=[v.name for v in fn.outputs])
    for op in fn.ops:
        block.operations.extend(_operation(op, fn, place))
    out = mil.Function(opset=opset)
    for v in fn.inputs:
        out.inputs.append(mil.NamedValueType(name=v.name, type=type_to_proto(v.type, f"input '{v.name}'")))
    out.block_specializations[opset].CopyFrom(block)
    for key, lit in fn.attributes.items():
        out.attributes[key].CopyFrom(literal_to_value(lit, f"function '{fn.name}'.{key}"))
    return out


def program_to_model(
    program: Program,
    place: Place,
    *,
    default_function: str,
    description: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Any:
    """The ``Model`` protobuf of ``program`` (const values placed by ``place``); ``metadata``: more
    userDefined entries."""
    p = proto()
    if default_function not in program.functions:
        raise CoreMLFormatError(
            "default_function",
            f"no function '{default_function}' (functions: {', '.join(program.functions)})",
        )
    model = p.Model.Model(specificationVersion=spec_version(program, default_function))
    desc = model.description
    if len(program.functions) == 1 and default_function == "main":
        inputs, outputs, states = _features(program.functions["main"])
        desc.input.extend(inputs)
        desc.output.extend(outputs)
        desc.state.extend(states)
    else:
        for fn in program.functions.values():
            inputs, outputs, states = _features(fn)
            desc.functions.append(
                p.Model.FunctionDescription(name=fn.name, input=inputs, output=outputs, state=states)
            )
        desc.defaultFunctionName = default_function
    if description:
        desc.metadata.shortDescription = description
    desc.metadata.userDefined["com.github.apple.coremltools.source"] = f"anekit {__version__}"
    desc.metadata.userDefined.update(metadata or {})
    mlp = model.mlProgram
    mlp.version = 1
    for name, fn in program.functions.items():
        mlp.functions[name].CopyFrom(_function(fn, place))
    for key, lit in program.attributes.items():
        mlp.attributes[key].CopyFrom(literal_to_value(lit, f"program.{key}"))
    return model


# -- reading ----------------------------------------------------------------------------------------


def _function_order(model: Any) -> list[str]:
    """Functions in the description's order (protobuf maps keep none); "main" first otherwise."""
    names = list(model.mlProgram.functions.keys())
    described = [f.name for f in model.description.functions if f.name in names]
    rest = sorted(n for n in names if n not in described)
    if "main" in rest:
        rest.remove("main")
        rest.insert(0, "main")
    return described + rest


def default_function_of(model: Any, names: list[str]) -> str:
    name = model.description.defaultFunctionName
    if name:
        if name not in names:
            raise CoreMLFormatError(
                "Model.description.defaultFunctionName",
                f"names no function of the program (functions: {', '.join(names)})",
                actual=name,
            )
        return name
    return "main" if "main" in names or not names else names[0]


class _FunctionReader:
    def __init__(self, name: str, spec: Any, blob: BlobReader) -> None:
        self.name = name
        self.spec = spec
        self.blob = blob
        self.field = f"mlProgram.functions[{name}]"
        self.defined: dict[str, Var] = {}

    def var(self, name: str, field: str) -> Var:
        v = self.defined.get(name)
        if v is None:
            raise CoreMLFormatError(field, f"refers to '{name}', which is not defined before it", actual=name)
        return v

    def define(self, v: Var, field: str) -> Var:
        if v.name in self.defined:
            raise CoreMLFormatError(field, f"'{v.name}' is defined twice", actual=v.name)
        self.defined[v.name] = v
        return v

    def read(self) -> Function:
        spec = self.spec
        opset = OPSET_OF_PROTO.get(spec.opset)
        if opset is None:
            raise CoreMLFormatError(
                f"{self.field}.opset",
                f"unknown opset (known: {', '.join(OPSET_OF_PROTO)})",
                actual=spec.opset,
            )
        if spec.opset not in spec.block_specializations:
            raise CoreMLFormatError(f"{self.field}.block_specializations", f"no block for opset {spec.opset}")
        inputs = [
            self.define(Var(nv.name, type_from_proto(nv.type, f"{self.field}.inputs[{i}]")), self.field)
            for i, nv in enumerate(spec.inputs)
        ]
        attributes = {
            k: value_to_literal(v, f"{self.field}.attributes[{k}]") for k, v in spec.attributes.items()
        }
        block_spec = spec.block_specializations[spec.opset]
        bfield = f"{self.field}.block"
        ops = self.operations(block_spec.operations, bfield)
        outputs = [self.var(n, f"{bfield}.outputs[{i}]") for i, n in enumerate(block_spec.outputs)]
        return Function(self.name, inputs, Block(ops, outputs), opset=opset, attributes=attributes)

    def operations(self, specs: Any, bfield: str) -> list[Op]:
        ops: list[Op] = []
        i = 0
        while i < len(specs):
            s = specs[i]
            field = f"{bfield}.operations[{i}]"
            if s.type == "write_state":
                following = specs[i + 1] if i + 1 < len(specs) else None
                op, used = self.update_state(s, following, field)
                ops.append(op)
                i += used
                continue
            ops.append(self.operation(s, field))
            i += 1
        return ops

    def _args(self, s: Any, key: str, field: str, blob_ok: bool) -> list[Var | Literal]:
        if key not in s.inputs:
            raise CoreMLFormatError(f"{field}.inputs", f"missing input '{key}'")
        out: list[Var | Literal] = []
        for j, b in enumerate(s.inputs[key].arguments):
            bfield = f"{field}.inputs[{key}][{j}]"
            kind = b.WhichOneof("binding")
            if kind == "name":
                out.append(self.var(b.name, bfield))
            elif kind == "value":
                out.append(value_to_literal(b.value, bfield, self.blob if blob_ok else None))
            else:
                raise CoreMLFormatError(bfield, "binding has neither a name nor a value")
        return out

    def _attributes(self, s: Any, field: str) -> dict[str, Literal]:
        return {
            k: value_to_literal(v, f"{field}.attributes[{k}]", self.blob if k == "val" else None)
            for k, v in s.attributes.items()
        }

    def _outputs(self, s: Any, field: str) -> list[Var]:
        return [
            Var(o.name, type_from_proto(o.type, f"{field}.outputs[{j}]")) for j, o in enumerate(s.outputs)
        ]

    def update_state(self, s: Any, following: Any, field: str) -> tuple[Op, int]:
        """``write_state`` (+ the ``read_state`` of the same state right after it) as one
        ``coreml_update_state``; returns the op and how many operations it used."""
        (state,) = self._one(self._args(s, "input", field, False), field, "input")
        (value,) = self._one(self._args(s, "data", field, False), field, "data")
        merged = (
            following is not None
            and following.type == "read_state"
            and "input" in following.inputs
            and len(following.inputs["input"].arguments) == 1
            and following.inputs["input"].arguments[0].name == getattr(state, "name", None)
        )
        if merged:
            attrs = self._attributes(following, field)
            outputs = self._outputs(following, field)
        else:
            attrs = self._attributes(s, field)
            base = str(attrs["name"].scalar()) if "name" in attrs else "update_state"
            base = base.removesuffix("_write_state")
            attrs["name"] = string_literal(base)
            wrapped = state.type.wrapped if isinstance(state.type, T.StateType) else state.type
            outputs = [Var(base, wrapped)]
        op = Op("coreml_update_state", {"state": state, "value": value}, outputs, attrs)
        for v in outputs:
            self.define(v, field)
        return op, 2 if merged else 1

    @staticmethod
    def _one(args: list[Var | Literal], field: str, key: str) -> list[Var | Literal]:
        if len(args) != 1:
            raise CoreMLFormatError(
                f"{field}.inputs[{key}]", "expected one binding", expected=1, actual=len(args)
            )
        return args

    def operation(self, s: Any, field: str) -> Op:
        op_type = s.type
        if s.blocks:
            raise CoreMLFormatError(f"{field}.blocks", f"op '{op_type}' has nested blocks (control flow)")
        try:
            opdef = get_op(op_type)
        except UnknownOpError:
            raise CoreMLFormatError(
                f"{field}.type",
                f"unknown op '{op_type}': no such op in the anekit MIL registry",
                actual=op_type,
            ) from None
        attrs = self._attributes(s, field)
        inputs: dict[str, Arg] = {}
        blob_ok = op_type == "const" or op_type.startswith("constexpr_")
        for key in s.inputs:
            args = self._args(s, key, field, blob_ok)
            spec = opdef.inputs.get(key)
            variadic = spec is not None and spec.variadic
            inputs[key] = tuple(args) if variadic or len(args) != 1 else args[0]
        outputs = self._outputs(s, field)
        if not outputs:
            raise CoreMLFormatError(f"{field}.outputs", f"op '{op_type}' has no outputs")
        op = Op(op_type, inputs, outputs, attrs)
        for j, v in enumerate(outputs):
            self.define(v, f"{field}.outputs[{j}]")
        return op


def model_to_program(model: Any, blob: BlobReader) -> tuple[Program, str]:
    """The Program of an ML Program ``Model`` and its default function (BLOBFILE values via ``blob``)."""
    kind = model.WhichOneof("Type")
    if kind != "mlProgram":
        raise CoreMLFormatError(
            "Model.Type",
            f"a {kind or 'model without a type'} model, not an ML Program: anekit reads ML Programs only",
            actual=kind,
        )
    mlp = model.mlProgram
    if mlp.version != 1:
        raise CoreMLFormatError(
            "mlProgram.version", "unsupported program version", expected=1, actual=mlp.version
        )
    names = _function_order(model)
    if not names:
        raise CoreMLFormatError("mlProgram.functions", "the program has no functions")
    functions = {name: _FunctionReader(name, mlp.functions[name], blob).read() for name in names}
    attributes = {k: value_to_literal(v, f"mlProgram.attributes[{k}]") for k, v in mlp.attributes.items()}
    old = all(f.opset in ("ios15", "ios16") for f in functions.values())
    program = Program(functions, version="1.0" if old else "1.3", attributes=attributes)
    return program, default_function_of(model, names)
