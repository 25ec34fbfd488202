"""The op registry: one class per MIL op holding its input spec, type rule and numpy reference.

An op is declared like this (CONVENTIONS.md 1)::

    @register_op
    class relu(OpDef):
        \"\"\"relu(x): max(x, 0) elementwise.\"\"\"

        inputs = {"x": Input(FLOATS)}

        def infer(self, a: InferArgs) -> Type:
            return a.type("x")

        def reference(self, a: RefArgs) -> np.ndarray:
            return np.maximum(a["x"], 0)

The framework checks input names, presence, dtypes, ranks, constness and shared dtypes before
``infer`` runs, so ``infer`` only states the type rule. ``reference`` receives numpy arrays (the
caller chooses their precision) with defaults filled in, and returns one array per output.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from anekit.errors import MilTypeError, UnknownOpError
from anekit.mil import types as T
from anekit.mil.ir import Arg, Op, Var
from anekit.mil.values import BlobRef, Literal

_MISSING = object()


class Input:
    """The spec of one op input.

    dtypes: allowed element dtype names (a frozenset from ``anekit.mil.types``, or a single name).
    rank: allowed rank(s) of a tensor input; None for any.
    optional: the input may be omitted (implied by a default).
    const: the input must be a compile-time constant (a const op's output or an inline literal).
    variadic: the input is a tuple of tensors (``values = (a, b, c)``).
    default: the value ``reference`` sees when the input is omitted.
    """

    __slots__ = ("const", "default", "dtypes", "optional", "rank", "variadic")

    def __init__(
        self,
        dtypes: Iterable[str] | str = T.ANY_DTYPE,
        *,
        rank: int | tuple[int, ...] | None = None,
        optional: bool = False,
        const: bool = False,
        variadic: bool = False,
        default: Any = _MISSING,
    ) -> None:
        self.dtypes = frozenset([dtypes]) if isinstance(dtypes, str) else frozenset(dtypes)
        self.rank = (rank,) if isinstance(rank, int) else rank
        self.default = default
        self.optional = optional or default is not _MISSING
        self.const = const
        self.variadic = variadic

    @property
    def has_default(self) -> bool:
        return self.default is not _MISSING


def _arg_type(arg: Arg) -> T.Type:
    if isinstance(arg, (Var, Literal)):
        return arg.type
    return T.TupleType(tuple(_arg_type(a) for a in arg))


def arg_value(arg: Arg) -> Any:
    """The constant value of an argument (numpy array, or tuple for tuples), or None when not known."""
    if isinstance(arg, tuple):
        vals = tuple(arg_value(a) for a in arg)
        return None if any(v is None for v in vals) else vals
    lit = arg.const if isinstance(arg, Var) else arg
    if lit is None or isinstance(lit.value, BlobRef):
        return None
    return lit.value


def describe_types(args: dict[str, Arg]) -> dict[str, str]:
    return {k: str(_arg_type(v)) for k, v in args.items()}


class InferArgs:
    """What ``OpDef.infer`` sees: the types of the inputs and the values of the constant ones."""

    __slots__ = ("args", "opdef", "where")

    def __init__(self, opdef: OpDef, args: dict[str, Arg], where: str = "") -> None:
        self.opdef = opdef
        self.args = args
        self.where = where

    def has(self, name: str) -> bool:
        return name in self.args

    def type(self, name: str) -> T.Type:
        return _arg_type(self.args[name])

    def tensor(self, name: str) -> T.TensorType:
        t = self.type(name)
        if not isinstance(t, T.TensorType):
            raise self.error(f"input '{name}' must be a tensor, got {t}")
        return t

    def types(self, name: str) -> tuple[T.TensorType, ...]:
        """The element types of a variadic (tuple) input."""
        arg = self.args[name]
        items = arg if isinstance(arg, tuple) else (arg,)
        out = []
        for a in items:
            t = _arg_type(a)
            if not isinstance(t, T.TensorType):
                raise self.error(f"input '{name}' must hold tensors, got {t}")
            out.append(t)
        return tuple(out)

    def value(self, name: str, default: Any = None) -> Any:
        """The constant value of an input (numpy array), the spec default when omitted, else ``default``."""
        if name in self.args:
            v = arg_value(self.args[name])
            return default if v is None else v
        spec = self.opdef.inputs.get(name)
        if spec is not None and spec.has_default:
            return spec.default
        return default

    def const(self, name: str) -> Any:
        """The constant value of an input that the type rule needs; raises when it is not constant."""
        v = self.value(name, _MISSING)
        if v is _MISSING:
            if name not in self.args:
                raise self.error(f"missing input '{name}'")
            raise self.error(f"input '{name}' must be a compile-time constant to infer the output type")
        return v

    def int(self, name: builtins.str) -> builtins.int:
        return int(np.asarray(self.const(name)).item())

    def ints(self, name: builtins.str) -> tuple[builtins.int, ...]:
        return tuple(int(x) for x in np.asarray(self.const(name)).ravel())

    def bool(self, name: builtins.str) -> builtins.bool:
        return bool(np.asarray(self.const(name)).item())

    def str(self, name: builtins.str) -> builtins.str:
        return str(np.asarray(self.const(name), dtype=object).item())

    def float(self, name: builtins.str) -> builtins.float:
        return float(np.asarray(self.const(name)).item())

    def error(self, message: builtins.str) -> MilTypeError:
        return MilTypeError(self.opdef.name, message, input_types=describe_types(self.args), where=self.where)


class RefArgs:
    """What ``OpDef.reference`` sees: input arrays (defaults filled in) and the inferred output types."""

    __slots__ = ("opdef", "out_types", "values")

    def __init__(self, opdef: OpDef, values: dict[str, Any], out_types: tuple[T.Type, ...] = ()) -> None:
        self.opdef = opdef
        self.values = values
        self.out_types = out_types

    def __getitem__(self, name: str) -> Any:
        if name in self.values:
            return self.values[name]
        spec = self.opdef.inputs.get(name)
        if spec is not None and spec.has_default:
            return spec.default
        raise KeyError(f"[{self.opdef.name}] missing input '{name}'")

    def get(self, name: str, default: Any = None) -> Any:
        try:
            v = self[name]
        except KeyError:
            return default
        return default if v is None else v

    def has(self, name: str) -> bool:
        return name in self.values

    def int(self, name: builtins.str) -> builtins.int:
        return int(np.asarray(self[name]).item())

    def ints(self, name: builtins.str) -> tuple[builtins.int, ...]:
        return tuple(int(x) for x in np.asarray(self[name]).ravel())

    def bool(self, name: builtins.str) -> builtins.bool:
        return bool(np.asarray(self[name]).item())

    def str(self, name: builtins.str) -> builtins.str:
        return str(np.asarray(self[name], dtype=object).item())

    def float(self, name: builtins.str) -> builtins.float:
        return float(np.asarray(self[name]).item())


OPSETS = ("ios15", "ios16", "ios17", "ios18")  # the opsets whose op forms anekit knows; others: any form


@dataclass(frozen=True)
class Form:
    """One way an op is written in some opsets: where its parameters sit and what they are called.

    coremltools writes the constexpr ops of its iOS16 definitions (used in iOS16 and iOS17 programs, and
    in later ones for ops never redefined) with every parameter as an *attribute*,
    ``constexpr_cast()[name = ..., output_dtype = ..., source_val = ...]``, and those of its iOS18
    definitions with *inputs*, ``constexpr_cast(output_dtype = ..., source_val = ...)[name = ...]``
    (apple/coremltools ``converters/mil/backend/mil/load.py`` ``translate_constexpr``: attributes when the
    op's definition is of opset iOS17 or older).
    """

    label: str  # the coremltools definition it follows, e.g. "ios16" (defs/iOS16/constexpr_ops.py)
    opsets: frozenset[str]  # the opsets in which coremltools writes the op this way
    place: str  # "inputs" or "attributes"
    params: tuple[str, ...]
    optional: tuple[str, ...] = ()

    def describe(self, op_type: str) -> str:
        """The form as text: ``constexpr_cast()[source_val, output_dtype]`` (ios16, ios17)."""
        names = ", ".join(p + "?" * (p in self.optional) for p in self.params)
        body = f"()[{names}]" if self.place == "attributes" else f"({names})"
        return f"{op_type}{body} ({', '.join(sorted(self.opsets))}: parameters as {self.place})"

    def fits(self, place: str, given: Iterable[str]) -> bool:
        names = set(given)
        required = set(self.params) - set(self.optional)
        return place == self.place and names <= set(self.params) and required <= names


class OpDef:
    """Base class of every op. Subclasses are named exactly like the MIL op (a trailing ``_`` is
    dropped, for names such as ``round_``) and registered with ``@register_op``."""

    name: ClassVar[str] = ""
    inputs: ClassVar[dict[str, Input]] = {}
    # Inputs that must share one dtype (the ``T`` of the MIL spec), checked before ``infer``.
    same_dtype: ClassVar[tuple[str, ...]] = ()
    # How the op is written, per opset, when that differs from "every parameter an input" (the
    # constexpr ops: ``Form``). Empty: the parameters are always the inputs.
    forms: ClassVar[tuple[Form, ...]] = ()

    def infer(self, a: InferArgs) -> T.Type | tuple[T.Type, ...]:
        raise NotImplementedError

    def reference(self, a: RefArgs) -> Any:
        raise NotImplementedError(f"op '{self.name}' has no numpy reference")

    # -- framework ---------------------------------------------------------------------------------

    def check(self, args: dict[str, Arg], where: str = "") -> InferArgs:
        """Check inputs against the spec; returns the InferArgs for ``infer``."""
        a = InferArgs(self, args, where)
        spec = self.inputs
        for key in args:
            if key not in spec:
                raise a.error(f"unexpected input '{key}' (expected inputs: {', '.join(spec) or 'none'})")
        for key, inp in spec.items():
            if key not in args:
                if not inp.optional:
                    raise a.error(f"missing required input '{key}'")
                continue
            arg = args[key]
            if inp.variadic:
                items = arg if isinstance(arg, tuple) else (arg,)
                if not items:
                    raise a.error(f"input '{key}' must hold at least one value")
            elif isinstance(arg, tuple):
                raise a.error(f"input '{key}' takes one value, not a tuple")
            else:
                items = (arg,)
            for item in items:
                self._check_item(a, key, inp, item)
        if self.same_dtype:
            seen: dict[str, str] = {}
            for key in self.same_dtype:
                if key in args:
                    arg = args[key]
                    for item in arg if isinstance(arg, tuple) else (arg,):
                        t = _arg_type(item)
                        if isinstance(t, T.TensorType):
                            seen.setdefault(t.dtype.name, key)
            if len(seen) > 1:
                names = ", ".join(f"{k} ({v})" for v, k in seen.items())
                raise a.error(f"inputs must share one dtype, got {names}")
        return a

    def _check_item(self, a: InferArgs, key: str, inp: Input, item: Arg) -> None:
        t = _arg_type(item)
        if isinstance(t, (T.TensorType, T.TensorBufferType)):
            if t.dtype.name not in inp.dtypes:
                allowed = ", ".join(sorted(inp.dtypes))
                raise a.error(f"input '{key}' has dtype {t.dtype.name}; expected one of {allowed}")
            if inp.rank is not None and len(t.shape) not in inp.rank:
                want = " or ".join(map(str, inp.rank))
                raise a.error(f"input '{key}' has rank {len(t.shape)}; expected rank {want}")
        elif isinstance(t, T.StateType):
            pass
        else:
            raise a.error(f"input '{key}' has type {t}; expected a tensor")
        if inp.const and arg_value(item) is None and not _is_blob(item):
            raise a.error(f"input '{key}' must be a compile-time constant")

    def type_outputs(self, args: dict[str, Arg], where: str = "") -> tuple[T.Type, ...]:
        """Check the inputs and apply the type rule: the output types."""
        a = self.check(args, where)
        try:
            out = self.infer(a)
        except MilTypeError:
            raise
        except (ArithmeticError, IndexError, KeyError, TypeError, ValueError) as e:
            # The one boundary where a type rule's own slip becomes an anekit error naming the op.
            raise a.error(f"cannot type this op ({type(e).__name__}: {e})") from e
        return out if isinstance(out, tuple) else (out,)

    def run(self, values: dict[str, Any], out_types: tuple[T.Type, ...] = ()) -> tuple[Any, ...]:
        """Run the numpy reference; always returns a tuple of outputs."""
        out = self.reference(RefArgs(self, values, out_types))
        return out if isinstance(out, tuple) else (out,)


def op_arguments(opdef: OpDef, op: Op, opset: str | None = None) -> dict[str, Arg]:
    """The parameters of ``op`` by name: its inputs, or, for an op written in a form that carries them as
    attributes (``opdef.forms``), those attributes. ``opset`` is the function's opset (``op.version``
    wins when the op names its own); in a known opset only the forms coremltools writes there are
    accepted, in an unknown one (or None) any form of the op. MilTypeError naming the op, the opset, how
    it was written and every form of the op when none fits."""
    if not opdef.forms:
        return op.inputs
    known = {p for f in opdef.forms for p in f.params}
    attrs: dict[str, Arg] = {k: v for k, v in op.attributes.items() if k in known}
    if attrs and op.inputs:
        place, given = "inputs and attributes", {**op.inputs, **attrs}
    elif attrs:
        place, given = "attributes", attrs
    else:
        place, given = "inputs", op.inputs
    opset = op.version or opset
    strict = opset in OPSETS
    candidates = [f for f in opdef.forms if not strict or opset in f.opsets]
    if any(f.fits(place, given) for f in candidates):
        return given
    written = f"{opdef.name}{'' if place == 'attributes' else '(' + ', '.join(op.inputs) + ')'}"
    if attrs:
        written += f"[{', '.join(attrs)}]"
    if not candidates:
        since = sorted({o for f in opdef.forms for o in f.opsets}, key=OPSETS.index)[0]
        expect = f"{opdef.name} has no form in opset {opset} (coremltools defines it from {since} on)"
    else:
        expect = f"opset {opset or '(unknown)'} takes " + " or ".join(
            f.describe(opdef.name) for f in candidates
        )
    others = [f for f in opdef.forms if f not in candidates]
    if others:
        expect += "; other opsets take " + " or ".join(f.describe(opdef.name) for f in others)
    raise MilTypeError(
        opdef.name,
        f"written as {written} (parameters as {place}), which fits no form of the op: {expect}",
        input_types=describe_types(given),
        where=op.where(),
    )


def _is_blob(item: Arg) -> bool:
    lit = item.const if isinstance(item, Var) else item
    return isinstance(lit, Literal) and isinstance(lit.value, BlobRef)


REGISTRY: dict[str, OpDef] = {}

_C = TypeVar("_C", bound=type[OpDef])


def register_op(cls: _C) -> _C:
    """Class decorator: instantiate the op class and enter it in the registry under its MIL name."""
    name = cls.__dict__.get("name") or cls.__name__.rstrip("_")
    cls.name = name
    if name in REGISTRY:
        raise ValueError(f"op '{name}' registered twice")
    REGISTRY[name] = cls()
    return cls


def get_op(name: str, where: str = "") -> OpDef:
    """The registered op of that name; UnknownOpError (naming it) otherwise."""
    _load_ops()
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownOpError(name, where=where) from None


def known_ops() -> list[str]:
    _load_ops()
    return sorted(REGISTRY)


_loaded = False


def _load_ops() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import anekit.mil.ops  # noqa: F401  (registers every op family)


def unary_same(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[OpDef, RefArgs], np.ndarray]:
    """A reference that applies ``fn`` to input ``x``."""

    def reference(self: OpDef, a: RefArgs) -> np.ndarray:
        return fn(a["x"])

    return reference
