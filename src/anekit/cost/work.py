"""The work of one kernel, counted from its MIL program: FLOPs, element ops, bytes moved, weight bytes.

Counted per op of the main function, from the types the IR already carries (no values are needed, so a
kernel generated from shapes only is costed exactly like one with weights):

* ``conv``: 2 x output elements x (input channels per group x kernel window);
  ``conv_transpose``: 2 x input elements x (output channels per group x kernel window);
  ``matmul``: 2 x output elements x the contracted size; ``linear``: 2 x output elements x in features;
  ``einsum``: 2 x the product of every index size; ``scaled_dot_product_attention``: both products
  (2 L S E + 2 L S Ev per batch) plus a softmax over L x S.
* element ops (the engine's non-MAC work): one per output element of an elementwise op or activation,
  one per input element of a reduction, ``ELEMENT_OPS`` per element for softmax and the norms.
  Layout ops (reshape, transpose, slice, concat, ...) do no arithmetic.
* bytes: the function's inputs and outputs (the surfaces), the BLOBFILE weights and every intermediate
  tensor. ``live_bytes`` (the most intermediate bytes alive at one time) is reported for the reader.

``layers`` keeps, per op, what the cost model needs beyond the totals: its MAC work, its
weights, its output channels and kernel window (a 1x1 conv runs in output-channel-group passes, a dense
3x3 stride-1 conv by Winograd) and the size of each intermediate it writes (one as large as the chip's
working set spills to DRAM). Which of these the engine does is ``anekit.cost.model``'s business.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from anekit.mil import types as T
from anekit.mil.ir import Op, Program, Var
from anekit.mil.registry import arg_value

# Element ops per element for ops that are several passes (assumed: max, subtract, exp, sum, divide).
ELEMENT_OPS = {"softmax": 5, "layer_norm": 5, "batch_norm": 2, "instance_norm": 5, "l2_norm": 3}
LAYOUT_OPS = frozenset(
    {
        "reshape", "transpose", "expand_dims", "squeeze", "flatten2d", "concat", "split", "stack",
        "slice_by_size", "slice_by_index", "crop", "tile", "reverse", "pad", "gather", "gather_along_axis",
        "depth_to_space", "space_to_depth", "pixel_shuffle", "pixel_unshuffle", "identity", "shape",
        "cast", "tensor_buffer_to_tensor", "tensor_to_tensor_buffer",
    }
)  # fmt: skip
REDUCTIONS = frozenset({"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod",
                        "reduce_l1_norm", "reduce_l2_norm", "reduce_sum_square", "reduce_log_sum",
                        "reduce_log_sum_exp", "reduce_argmax", "reduce_argmin", "cumsum"})  # fmt: skip


@dataclass(frozen=True)
class Layer:
    """One op of the program (const ops aside), as the cost model sees it."""

    op: str
    flops: float  # multiply-adds x 2
    element_ops: float
    weight_bytes: float  # BLOBFILE constants it reads
    out_channels: int  # a conv's output channels (0 for other ops)
    kernel: tuple[int, ...]  # a conv's window ((), for other ops)
    winograd: bool  # a dense 3x3 conv with unit stride and dilation: the engine's Winograd path
    intermediates: tuple[float, ...]  # bytes of each output that is not a function output


@dataclass(frozen=True)
class Work:
    """What one evaluation of a kernel does."""

    name: str
    flops: float  # multiply-adds x 2 (conv, matmul, linear, einsum, attention)
    element_ops: float  # everything else that computes
    io_bytes: float  # function inputs + outputs
    weight_bytes: float  # BLOBFILE constants
    intermediate_bytes: float  # every intermediate tensor, once
    live_bytes: float  # the most intermediate bytes alive at one time
    ops: int  # ops other than const
    layers: tuple[Layer, ...] = ()

    @property
    def bytes_moved(self) -> float:
        """Bytes to and from memory: surfaces, weights, intermediates written and read back."""
        return self.io_bytes + self.weight_bytes + 2 * self.intermediate_bytes


def tensor_bytes(t: T.Type) -> float:
    """Bytes of a static tensor (0 for anything else: scalars' size is negligible, symbolic dims unknown)."""
    if not isinstance(t, T.TensorType) or not t.is_static:
        return 0.0
    return float(t.numel or 0) * max(t.dtype.bits, 8) / 8


def _numel(t: T.Type | None) -> float:
    return float(t.numel or 0) if isinstance(t, T.TensorType) and t.is_static else 0.0


def _type(arg: object) -> T.Type | None:
    """The type of an op argument (a Var or a Literal), None for a tuple or a missing one."""
    return arg.type if isinstance(arg, Var) else getattr(arg, "type", None)


def _shape(arg: object) -> tuple[int, ...]:
    t = _type(arg)
    if isinstance(t, T.TensorType) and t.is_static:
        return tuple(int(d) for d in t.shape)
    return ()


def _flag(op: Op, name: str) -> bool:
    arg = op.inputs.get(name)
    if arg is None:
        return False
    value = arg_value(arg)
    return bool(value) if value is not None else False


def op_flops(op: Op) -> float:
    """2 x multiply-adds of a MAC op (0 for every other op)."""
    out = _numel(op.outputs[0].type) if op.outputs else 0.0
    kind = op.op_type
    if kind == "conv":
        w = _shape(op.inputs.get("weight"))
        return 2 * out * math.prod(w[1:]) if w else 0.0
    if kind == "conv_transpose":
        w = _shape(op.inputs.get("weight"))
        return 2 * _numel(_type(op.inputs["x"])) * math.prod(w[1:]) if w else 0.0
    if kind == "matmul":
        x = _shape(op.inputs.get("x"))
        if not x:
            return 0.0
        inner = x[-2] if _flag(op, "transpose_x") and len(x) > 1 else x[-1]
        return 2 * out * inner
    if kind == "linear":
        x = _shape(op.inputs.get("x"))
        return 2 * out * x[-1] if x else 0.0
    if kind == "einsum":
        return _einsum_flops(op)
    if kind == "scaled_dot_product_attention":
        q, k, v = (_shape(op.inputs.get(n)) for n in ("query", "key", "value"))
        if not (q and k and v):
            return 0.0
        batch = math.prod(q[:-2])
        return 2.0 * batch * q[-2] * k[-2] * (q[-1] + v[-1])
    return 0.0


def _einsum_flops(op: Op) -> float:
    eq = arg_value(op.inputs["equation"]) if "equation" in op.inputs else None
    values = op.inputs.get("values")
    if eq is None or not isinstance(values, tuple):
        return 0.0
    lhs = str(eq.item() if hasattr(eq, "item") else eq).replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for letters, arg in zip(lhs, values):
        for letter, n in zip(letters, _shape(arg)):
            sizes[letter] = n
    return 2.0 * math.prod(sizes.values()) if sizes else 0.0


def op_element_ops(op: Op) -> float:
    """Non-MAC arithmetic of one op, in element operations."""
    kind = op.op_type
    if kind in LAYOUT_OPS or kind == "const" or not op.outputs:
        return 0.0
    out = _numel(op.outputs[0].type)
    if kind in REDUCTIONS:
        return sum(_numel(v.type) for v in op.input_vars())
    if kind == "scaled_dot_product_attention":
        q, k = _shape(op.inputs.get("query")), _shape(op.inputs.get("key"))
        return ELEMENT_OPS["softmax"] * math.prod(q[:-1]) * k[-2] if q and k else 0.0
    if op_flops(op):
        return 0.0
    return ELEMENT_OPS.get(kind, 1) * out


def count(program: Program, name: str = "") -> Work:
    """The work of one evaluation of ``program``'s main function."""
    fn = program.main
    io = sum(tensor_bytes(v.type) for v in fn.inputs) + sum(tensor_bytes(v.type) for v in fn.outputs)
    outputs = {v.name for v in fn.outputs}
    weight = flops = element = intermediate = 0.0
    last_use: dict[str, int] = {}
    for i, op in enumerate(fn.ops):
        for v in op.input_vars():
            last_use[v.name] = i
    live: dict[str, float] = {}
    blobs: dict[str, float] = {}
    layers: list[Layer] = []
    peak = 0.0
    n_ops = 0
    for i, op in enumerate(fn.ops):
        if op.op_type == "const":
            lit = op.attributes.get("val")
            if lit is not None and lit.is_blob:
                blobs[op.outputs[0].name] = tensor_bytes(op.outputs[0].type)
                weight += blobs[op.outputs[0].name]
            continue
        n_ops += 1
        flops += op_flops(op)
        element += op_element_ops(op)
        written = []
        for v in op.outputs:
            if v.name not in outputs:
                size = tensor_bytes(v.type)
                intermediate += size
                live[v.name] = size
                written.append(size)
        layers.append(_layer(op, blobs, tuple(written)))
        peak = max(peak, sum(live.values()))
        for v in list(op.input_vars()):
            if last_use.get(v.name) == i:
                live.pop(v.name, None)
    return Work(name or fn.name, flops, element, io, weight, intermediate, peak, n_ops, tuple(layers))


def _ints(op: Op, name: str) -> tuple[int, ...]:
    arg = op.inputs.get(name)
    value = arg_value(arg) if arg is not None else None
    return () if value is None else tuple(int(v) for v in np.atleast_1d(np.asarray(value)).ravel())


def _layer(op: Op, blobs: dict[str, float], written: tuple[float, ...]) -> Layer:
    weights = sum(blobs.get(v.name, 0.0) for v in op.input_vars())
    out_channels, winograd = 0, False
    kernel: tuple[int, ...] = ()
    if op.op_type == "conv":
        w = _shape(op.inputs.get("weight"))
        if w:
            out_channels, kernel = w[0], w[2:]
            groups = _ints(op, "groups") or (1,)
            unit = all(s == 1 for s in _ints(op, "strides")) and all(d == 1 for d in _ints(op, "dilations"))
            winograd = kernel == (3, 3) and unit and groups[0] == 1
    return Layer(
        op.op_type, op_flops(op), op_element_ops(op), weights, out_channels, kernel, winograd, written
    )
