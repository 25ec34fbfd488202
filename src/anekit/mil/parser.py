"""The MIL text parser: reads MIL as real tools write it into the IR of ``anekit.mil.ir``.

It accepts program(1.0) .. program(1.3) headers, both buildInfo spellings, free whitespace and ``//``
comments, decimal and C hex-float literals, inline tensor literals (flat or nested lists), rank-0
tensors, string / bool / int scalars, tuple arguments, several outputs per statement, versioned op
names (``op<ios17>(...)``), attribute lists, BLOBFILE consts inline or as op arguments, several
functions, and types anekit does not model (kept as OpaqueType for the verifier to report).

The parser checks syntax only; ``anekit.mil.verify`` checks SSA and types. Malformed text raises
MilSyntaxError with line:column and the offending line with a caret.
"""

from __future__ import annotations

import bisect
import math
import re
from functools import lru_cache
from typing import Any, NoReturn

import numpy as np

from anekit.errors import MilSyntaxError
from anekit.mil import types as T
from anekit.mil.ir import Arg, Block, Function, Op, Program, Var
from anekit.mil.values import BlobRef, Literal

# Leading whitespace and comments are folded into each token (half as many matches to make). Simple
# scalar literals (``string("x")``, ``int32(1)``, ``fp16(0x1p-1)``) and flat numeric tensor literals are
# single tokens, converted once per distinct text through a cache.
_DTYPE_RE = r"(?:fp16|fp32|fp64|bf16|u?int\d+|bool|string)"
_TOKEN = re.compile(
    r"""
    \s*(?:(?://[^\n]*|/\*.*?\*/)\s*)*
    (?:
      (?P<p>[()\[\]{}<>,=;?])
    | (?P<id>(?!tensor\s*<|"""
    + _DTYPE_RE
    + r"""\()[A-Za-z_]\w*)
    | (?P<slit>"""
    + _DTYPE_RE
    + r"""\((?:"(?:[^"\\\n]|\\.)*"|[-+.\w]*)\))
    | (?P<tlit>tensor\s*<\s*[A-Za-z_]\w*\s*,\s*\[[^\[\]<>()]*\]\s*>\(\[[-+.\w\s,]*\]\))
    | (?P<ttype>tensor\s*<\s*[A-Za-z_]\w*\s*,\s*\[[^\[\]<>()]*\]\s*>)
    | (?P<arrow>->)
    | (?P<hex>[-+]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][-+]?\d+)
    | (?P<num>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)|[-+](?:inf|nan)\b)
    | (?P<str>"(?:[^"\\\n]|\\.)*")
    | (?P<eof>\Z)
    | (?P<bad>.)
    )
    """,
    re.VERBOSE | re.DOTALL,
)

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "r": "\r", "0": "\0"}
_SCALAR_NAMES = frozenset(T.DTYPES)
_KEYWORD_FLOATS = {"inf": float("inf"), "nan": float("nan")}
# The largest finite value of each float dtype (IEEE 754 binary16 / binary32 / binary64; bfloat16 keeps
# binary32's exponent with 8 significant bits). A value written beyond it is checked by rounding it.
_FLOAT_MAX = {"fp16": 65504.0, "bf16": (2.0 - 2.0**-7) * 2.0**127, "fp32": float(np.finfo(np.float32).max)}
_FLOAT_MAX["fp64"] = float(np.finfo(np.float64).max)


def _rounds_to_inf(value: float, dt: T.DType) -> bool:
    """Whether ``value`` (a float64, finite as written) becomes inf when stored as ``dt``, round to nearest
    even as the literal is stored (fp16 and fp32 by numpy's cast, bf16 in one rounding from float64)."""
    if math.isinf(value):  # a decimal past float64's range (1e400): float() already gave inf
        return True
    with np.errstate(over="ignore"):
        if dt.name == "bf16":
            from anekit.fp16 import round_f64_to_bf16

            return bool(np.isinf(round_f64_to_bf16(np.array([value]))[0]))
        return bool(np.isinf(np.asarray(value, dtype=np.float64).astype(dt.np)))


def _unescape(body: str) -> str:
    if "\\" not in body:
        return body
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


@lru_cache(maxsize=4096)
def _simple_tensor_type(text: str) -> T.TensorType | str:
    """Type of a one-token ``tensor<dt, [dims]>``; an error message string when malformed."""
    inner = text[text.index("<") + 1 : text.rindex(">")]
    dt_name, _, dims_text = inner.partition(",")
    dt_name = dt_name.strip()
    if dt_name not in T.DTYPES:
        return f"unknown dtype '{dt_name}' in {text!r}"
    dims_text = dims_text.strip()[1:-1].strip()
    dims: list[T.Dim] = []
    if dims_text:
        for part in dims_text.split(","):
            p = part.strip()
            if p.isdigit():
                dims.append(int(p))
            elif p == "?" or re.fullmatch(r"[A-Za-z_]\w*", p):
                dims.append(p)
            else:
                return f"bad dimension '{p}' in {text!r}"
    return T.TensorType(T.DTYPES[dt_name], tuple(dims))


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self._line_starts: list[int] | None = None
        self.starts: list[int] = []
        kinds: list[str] = []
        vals: list[str] = []
        starts: list[int] = []
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup
            assert kind is not None
            start = m.start(kind)
            if kind == "bad":
                self._fail(f"unexpected character {m.group(kind)!r}", start)
            kinds.append(kind)
            vals.append(m.group(kind))
            starts.append(start)
            if kind == "eof":
                break
        self.kinds = kinds
        self.vals = vals
        self.starts = starts
        self.i = 0

    # -- errors ------------------------------------------------------------------------------------

    def _fail(self, message: str, pos: int | None = None) -> NoReturn:
        if pos is None:
            pos = self.starts[self.i] if self.i < len(self.starts) else len(self.text)
        line = self.line_of(pos)
        ls = self._line_starts
        assert ls is not None
        start = ls[line - 1]
        end = self.text.find("\n", start)
        line_text = self.text[start : end if end >= 0 else len(self.text)]
        col = pos - start + 1
        caret = col
        if len(line_text) > 200:  # show a window of long generated lines around the caret
            lo = max(0, col - 100)
            line_text = line_text[lo : lo + 200]
            caret = col - lo
        raise MilSyntaxError(
            message, line=line, column=col, line_text=line_text, source=self.source, caret_column=caret
        )

    def line_of(self, pos: int) -> int:
        if self._line_starts is None:
            self._line_starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
        return bisect.bisect_right(self._line_starts, pos)

    def _describe(self, i: int) -> str:
        return "end of input" if self.kinds[i] == "eof" else repr(self.vals[i])

    # -- token helpers -----------------------------------------------------------------------------

    def expect(self, value: str) -> None:
        if self.vals[self.i] != value or self.kinds[self.i] in ("str", "eof"):
            self._fail(f"expected '{value}', found {self._describe(self.i)}")
        self.i += 1

    def accept(self, value: str) -> bool:
        if self.vals[self.i] == value and self.kinds[self.i] in ("p", "id", "arrow"):
            self.i += 1
            return True
        return False

    def ident(self, what: str = "a name") -> str:
        if self.kinds[self.i] != "id":
            self._fail(f"expected {what}, found {self._describe(self.i)}")
        v = self.vals[self.i]
        self.i += 1
        return v

    def integer(self, what: str = "an integer") -> int:
        if self.kinds[self.i] != "num" or not re.fullmatch(r"[-+]?\d+", self.vals[self.i]):
            self._fail(f"expected {what}, found {self._describe(self.i)}")
        v = int(self.vals[self.i])
        self.i += 1
        return v

    # -- program structure -------------------------------------------------------------------------

    def program(self) -> Program:
        if self.vals[self.i] != "program":
            self._fail(f"expected 'program(<version>)' header, found {self._describe(self.i)}")
        self.i += 1
        self.expect("(")
        if self.kinds[self.i] != "num":
            self._fail(f"expected a program version such as 1.3, found {self._describe(self.i)}")
        version = self.vals[self.i]
        self.i += 1
        self.expect(")")
        attributes = self.attributes() if self.vals[self.i] == "[" else {}
        self.expect("{")
        prog = Program(version=version, attributes=attributes)
        while not self.accept("}"):
            name_pos = self.starts[min(self.i + 1, len(self.starts) - 1)]
            fn = self.function()
            if fn.name in prog.functions:
                self._fail(f"function '{fn.name}' is defined twice", name_pos)
            prog.add_function(fn)
        if self.kinds[self.i] != "eof":
            self._fail(f"unexpected text after the program: {self._describe(self.i)}")
        return prog

    def attributes(self) -> dict[str, Literal]:
        self.expect("[")
        out: dict[str, Literal] = {}
        if self.accept("]"):
            return out
        while True:
            pos = self.starts[self.i]
            key = self.ident("an attribute name")
            self.expect("=")
            if key in out:
                self._fail(f"attribute '{key}' given twice", pos)
            out[key] = self.literal()
            if self.accept("]"):
                return out
            self.expect(",")

    def function(self) -> Function:
        if self.vals[self.i] != "func":
            self._fail(f"expected 'func' or '}}', found {self._describe(self.i)}")
        line = self.line_of(self.starts[self.i])
        self.i += 1
        name = self.ident("a function name")
        opset = ""
        if self.accept("<"):
            opset = self.ident("an opset name such as ios18")
            self.expect(">")
        self.expect("(")
        scope: dict[str, Var] = {}
        inputs: list[Var] = []
        if not self.accept(")"):
            while True:
                t = self.type_()
                vname = self.ident("an input name")
                v = Var(vname, t)
                inputs.append(v)
                scope[vname] = v
                if self.accept(")"):
                    break
                self.expect(",")
        attributes = self.attributes() if self.vals[self.i] == "[" else {}
        self.expect("{")
        ops: list[Op] = []
        while not self.accept("}"):
            ops.append(self.statement(scope))
        self.expect("->")
        self.expect("(")
        outputs: list[Var] = []
        if not self.accept(")"):
            while True:
                outputs.append(self.reference(scope))
                if self.accept(")"):
                    break
                self.expect(",")
        self.expect(";")
        return Function(name, inputs, Block(ops, outputs), opset=opset, attributes=attributes, line=line)

    def reference(self, scope: dict[str, Var]) -> Var:
        name = self.ident("a variable name")
        v = scope.get(name)
        if v is None:  # kept unresolved: the verifier reports the undefined use with its line
            v = Var(name, T.OpaqueType("<undefined>"))
        return v

    def statement(self, scope: dict[str, Var]) -> Op:
        line = self.line_of(self.starts[self.i])
        outputs: list[Var] = []
        while True:
            t = self.type_()
            outputs.append(Var(self.ident("an output name"), t))
            if self.accept("="):
                break
            self.expect(",")
        op_type = self.ident("an op name")
        version = None
        if self.accept("<"):
            version = self.ident("an opset name such as ios17")
            self.expect(">")
        self.expect("(")
        inputs: dict[str, Arg] = {}
        if not self.accept(")"):
            while True:
                pos = self.starts[self.i]
                key = self.ident("an input name")
                self.expect("=")
                if key in inputs:
                    self._fail(f"input '{key}' given twice", pos)
                inputs[key] = self.argument(scope)
                if self.accept(")"):
                    break
                self.expect(",")
        attributes = self.attributes() if self.vals[self.i] == "[" else {}
        self.expect(";")
        op = Op(op_type, inputs, outputs, attributes, version=version, line=line)
        for v in outputs:
            scope[v.name] = v
        return op

    def argument(self, scope: dict[str, Var]) -> Arg:
        kind, val = self.kinds[self.i], self.vals[self.i]
        if kind == "p" and val == "(":
            self.i += 1
            items: list[Arg] = []
            if not self.accept(")"):
                while True:
                    items.append(self.argument(scope))
                    if self.accept(")"):
                        break
                    self.expect(",")
            return tuple(items)
        if kind in ("slit", "tlit", "ttype") or (kind == "id" and self.vals[self.i + 1] in ("(", "<")):
            return self.literal()
        if kind == "id":
            return self.reference(scope)
        self._fail(f"expected a variable, a literal or a tuple, found {self._describe(self.i)}")
        raise AssertionError  # unreachable

    # -- types -------------------------------------------------------------------------------------

    def type_(self) -> T.Type:
        kind, val = self.kinds[self.i], self.vals[self.i]
        pos = self.starts[self.i]
        if kind == "ttype":
            t = _simple_tensor_type(val)
            if isinstance(t, str):
                self._fail(t, pos)
            self.i += 1
            return t
        if kind != "id":
            self._fail(f"expected a type, found {self._describe(self.i)}")
        self.i += 1
        if val in _SCALAR_NAMES and self.vals[self.i] != "<":
            return T.TensorType(T.DTYPES[val], ())
        if val == "tensor":
            self.expect("<")
            dt = self.dtype()
            self.expect(",")
            dims = self.dims()
            self.expect(">")
            return T.TensorType(dt, dims)
        if val == "list":
            self.expect("<")
            elem = self.type_()
            self.expect(",")
            length: int | None
            if self.accept("?"):
                length = None
            else:
                length = self.integer("a list length")
            self.expect(">")
            return T.ListType(elem, length)
        if val == "dict":
            self.expect("<")
            key = self.type_()
            self.expect(",")
            value = self.type_()
            self.expect(">")
            return T.DictType(key, value)
        if val == "state":
            self.expect("<")
            wrapped = self.type_()
            self.expect(">")
            return T.StateType(wrapped)
        if val == "tensor_buffer":
            return self.tensor_buffer()
        if self.vals[self.i] == "<":  # a type anekit does not model: keep its text
            start = pos
            depth = 0
            while True:
                v, k = self.vals[self.i], self.kinds[self.i]
                if k == "eof":
                    self._fail(f"unterminated type '{val}<...'", start)
                if k == "p" and v == "<":
                    depth += 1
                elif k == "p" and v == ">":
                    depth -= 1
                    if depth == 0:
                        self.i += 1
                        break
                self.i += 1
            end = self.starts[self.i - 1] + 1
            return T.OpaqueType(re.sub(r"\s+", " ", self.text[start:end]))
        self._fail(f"unknown type '{val}'", pos)
        raise AssertionError  # unreachable

    def dtype(self) -> T.DType:
        pos = self.starts[self.i]
        name = self.ident("a dtype")
        if name not in T.DTYPES:
            self._fail(f"unknown dtype '{name}' (expected one of {', '.join(T.DTYPES)})", pos)
        return T.DTYPES[name]

    def dims(self) -> tuple[T.Dim, ...]:
        self.expect("[")
        dims: list[T.Dim] = []
        if self.accept("]"):
            return ()
        while True:
            if self.accept("?"):
                dims.append("?")
            elif self.kinds[self.i] == "id":
                dims.append(self.ident())
            else:
                d = self.integer("a dimension")
                if d < 0:
                    self._fail(f"negative dimension {d}", self.starts[self.i - 1])
                dims.append(d)
            if self.accept("]"):
                return tuple(dims)
            self.expect(",")

    def int_list(self, what: str) -> tuple[int, ...]:
        self.expect("[")
        out: list[int] = []
        if self.accept("]"):
            return ()
        while True:
            out.append(self.integer(what))
            if self.accept("]"):
                return tuple(out)
            self.expect(",")

    def tensor_buffer(self) -> T.TensorBufferType:
        self.expect("<")
        dt = self.dtype()
        fields: dict[str, Any] = {}
        while self.accept(","):
            pos = self.starts[self.i]
            key = self.ident("shape=, strides= or interleave_factors=")
            self.expect("=")
            if key == "shape":
                fields[key] = self.dims()
            elif key in ("strides", "interleave_factors"):
                fields[key] = self.int_list(key)
            else:
                self._fail(f"unknown tensor_buffer field '{key}'", pos)
        self.expect(">")
        shape = fields.get("shape", ())
        return T.TensorBufferType(
            dt, shape, fields.get("strides", ()), fields.get("interleave_factors", (1,) * len(shape))
        )

    # -- literals ----------------------------------------------------------------------------------

    def literal(self) -> Literal:
        kind = self.kinds[self.i]
        if kind == "slit" or kind == "tlit":
            lit = _cached_literal(self.vals[self.i])
            if isinstance(lit, str):
                self._literal_error()
            self.i += 1
            return lit
        return self.literal_general()

    def _literal_error(self) -> NoReturn:
        """Re-read a malformed one-token literal token by token, to fail at the exact column."""
        pos = self.starts[self.i]
        sub = _plain_parser(self.vals[self.i])
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                sub.literal_general()
            message = f"unexpected {sub._describe(sub.i)}"
            column = sub.starts[sub.i] + 1
        except MilSyntaxError as e:
            message, column = e.message, e.column
        self._fail(message, pos + column - 1)

    def literal_general(self) -> Literal:
        pos = self.starts[self.i]
        t = self.type_()
        self.expect("(")
        lit = self.payload(t, pos)
        self.expect(")")
        return lit

    def payload(self, t: T.Type, pos: int) -> Literal:
        if isinstance(t, T.TensorType):
            if self.vals[self.i] == "BLOBFILE" and self.kinds[self.i] == "id":
                return Literal(t, self.blobfile())
            if self.vals[self.i] == "[" and self.kinds[self.i] == "p":
                flat: list[Any] = []
                self.elements(flat, t.dtype)
                return self.tensor_value(t, flat, pos)
            if t.shape and t.numel != 1:
                self._fail(f"expected '[' with the elements of {t}, found {self._describe(self.i)}")
            return self.tensor_value(t, [self.scalar(t.dtype)], pos)
        if isinstance(t, T.ListType):
            self.expect("[")
            items: list[Literal] = []
            if not self.accept("]"):
                while True:
                    items.append(self.payload(t.elem, self.starts[self.i]))
                    if self.accept("]"):
                        break
                    self.expect(",")
            if t.length is not None and len(items) != t.length:
                self._fail(f"{t} holds {len(items)} elements, expected {t.length}", pos)
            return Literal(t, tuple(items))
        if isinstance(t, T.DictType):
            self.expect("{")
            pairs: list[tuple[Literal, Literal]] = []
            if not self.accept("}"):
                while True:
                    self.expect("{")
                    k = self.payload(t.key, self.starts[self.i])
                    self.expect(",")
                    v = self.payload(t.value, self.starts[self.i])
                    self.expect("}")
                    pairs.append((k, v))
                    if self.accept("}"):
                        break
                    self.expect(",")
            return Literal(t, tuple(pairs))
        self._fail(f"a literal of type {t} is not supported", pos)
        raise AssertionError  # unreachable

    def tensor_value(self, t: T.TensorType, flat: list[Any], pos: int) -> Literal:
        n = t.numel
        if n is None:
            self._fail(f"a literal needs a static shape, got {t}", pos)
        if len(flat) != n:
            self._fail(f"{t} needs {n} element(s), found {len(flat)}", pos)
        dt = t.dtype
        try:
            if dt.kind == "string":
                arr = np.empty(len(flat), dtype=object)
                arr[:] = flat
            elif dt.kind == "float":
                arr = np.array(flat, dtype=np.float64)
                if dt.name == "bf16":  # one rounding from the value written (no float32 detour)
                    from anekit.fp16 import round_f64_to_bf16

                    arr = round_f64_to_bf16(arr)
                else:
                    arr = arr.astype(dt.np)
            else:
                lo, hi = dt.int_range()
                bad = [x for x in flat if not lo <= x <= hi]
                if bad:
                    self._fail(f"value {bad[0]} is out of range for {dt.name} ({lo}..{hi})", pos)
                arr = np.array(flat, dtype=dt.np)
        except (OverflowError, TypeError, ValueError) as e:
            self._fail(f"bad element for {t}: {e}", pos)
        return Literal(t, arr.reshape(t.shape))

    def elements(self, flat: list[Any], dt: T.DType) -> None:
        self.expect("[")
        if self.accept("]"):
            return
        while True:
            if self.vals[self.i] == "[" and self.kinds[self.i] == "p":
                self.elements(flat, dt)
            else:
                flat.append(self.scalar(dt))
            if self.accept("]"):
                return
            self.expect(",")

    def scalar(self, dt: T.DType) -> Any:
        kind, val = self.kinds[self.i], self.vals[self.i]
        if dt.kind == "string":
            if kind != "str":
                self._fail(f"expected a string literal, found {self._describe(self.i)}")
            self.i += 1
            return _unescape(val[1:-1])
        if dt.kind == "bool":
            if val in ("true", "false") and kind == "id":
                self.i += 1
                return val == "true"
            if kind == "num" and val in ("0", "1"):
                self.i += 1
                return val == "1"
            self._fail(f"expected true or false, found {self._describe(self.i)}")
        if dt.kind == "float":
            if kind == "hex":
                try:
                    value = float.fromhex(val)
                except OverflowError:  # 0x1p99999: beyond every float type, not silently inf
                    self._fail(f"{dt.name} literal {val} is too large: it overflows every float type")
                self._check_float_range(value, val, dt)
                self.i += 1
                return value
            if kind == "num":
                value = float(val)
                if not val.lstrip("+-").startswith(("inf", "nan")):  # +inf / -inf are written, not overflow
                    self._check_float_range(value, val, dt)
                self.i += 1
                return value
            if kind == "id" and val in _KEYWORD_FLOATS:
                self.i += 1
                return _KEYWORD_FLOATS[val]
            self._fail(f"expected a {dt.name} number, found {self._describe(self.i)}")
        # integers (also accept a float spelling with an integral value, e.g. 1.0)
        if kind == "num":
            self.i += 1
            try:
                return int(val)
            except ValueError:
                f = float(val)
                if f.is_integer():
                    return int(f)
                self._fail(f"expected an integer for {dt.name}, found {val!r}", self.starts[self.i - 1])
        if kind == "id" and val in ("true", "false"):
            self.i += 1
            return int(val == "true")
        self._fail(f"expected a {dt.name} integer, found {self._describe(self.i)}")
        raise AssertionError  # unreachable

    def _check_float_range(self, value: float, text: str, dt: T.DType) -> None:
        """A finite number written for a float dtype that rounds to inf there is refused at its column, as
        an integer outside its dtype's range is (an infinity is written ``inf``)."""
        largest = _FLOAT_MAX.get(dt.name)
        if largest is None or not abs(value) > largest or not _rounds_to_inf(value, dt):
            return
        self._fail(
            f"value {text} is out of range for {dt.name}: it rounds to inf (largest finite {dt.name} is "
            f"{largest:.8g}; write inf for an infinity)"
        )

    def blobfile(self) -> BlobRef:
        start = self.starts[self.i]
        self.i += 1  # BLOBFILE
        self.expect("(")
        fields: dict[str, Any] = {}
        while True:
            pos = self.starts[self.i]
            key = self.ident("path or offset")
            self.expect("=")
            if key == "path":
                lit = self.literal()
                if not (isinstance(lit.type, T.TensorType) and lit.type.dtype.kind == "string"):
                    self._fail("BLOBFILE path must be a string", pos)
                fields[key] = str(lit.scalar())
            elif key == "offset":
                lit = self.literal()
                if not (isinstance(lit.type, T.TensorType) and lit.type.dtype.is_int and lit.type.is_scalar):
                    self._fail("BLOBFILE offset must be an integer scalar such as uint64(64)", pos)
                fields[key] = int(lit.scalar())
            else:
                self._fail(f"unknown BLOBFILE field '{key}' (expected path and offset)", pos)
            if self.accept(")"):
                break
            self.expect(",")
        missing = [k for k in ("path", "offset") if k not in fields]
        if missing:
            self._fail(f"BLOBFILE is missing {' and '.join(missing)}", start)
        return BlobRef(fields["path"], fields["offset"])


@lru_cache(maxsize=8192)
def _cached_literal(text: str) -> Literal | str:
    """Literal of a one-token simple literal, or an error message string (then parsed the long way)."""
    try:
        sub = _plain_parser(text)
        with np.errstate(over="ignore", invalid="ignore"):
            lit = sub.literal_general()
        if sub.kinds[sub.i] != "eof":
            return "trailing text"
    except MilSyntaxError as e:
        return e.message
    if isinstance(lit.value, np.ndarray):
        lit.value.flags.writeable = False  # shared between every op that spells it the same way
    return lit


_PLAIN = re.compile(
    r"""\s*(?:(?P<ttype>tensor\s*<\s*[A-Za-z_]\w*\s*,\s*\[[^\[\]<>()]*\]\s*>)
    | (?P<hex>[-+]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][-+]?\d+)
    | (?P<num>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)|[-+](?:inf|nan)\b)
    | (?P<str>"(?:[^"\\\n]|\\.)*") | (?P<id>[A-Za-z_]\w*) | (?P<p>[()\[\],]) | (?P<eof>\Z) | (?P<bad>.))""",
    re.VERBOSE | re.DOTALL,
)


def _plain_parser(text: str) -> _Parser:
    """A parser over one literal's text, tokenized without the one-token literal shortcuts."""
    sub = _Parser.__new__(_Parser)
    sub.text, sub.source, sub._line_starts, sub.i = text, "", None, 0
    sub.kinds, sub.vals, sub.starts = _tokenize_plain(text)
    return sub


def _tokenize_plain(text: str) -> tuple[list[str], list[str], list[int]]:
    kinds: list[str] = []
    vals: list[str] = []
    starts: list[int] = []
    for m in _PLAIN.finditer(text):
        kind = m.lastgroup
        assert kind is not None
        kinds.append(kind)
        vals.append(m.group(kind))
        starts.append(m.start(kind))
        if kind == "eof":
            break
    return kinds, vals, starts


def parse_program(text: str, source: str = "") -> Program:
    """Parse MIL text into a Program (syntax only: run ``verify`` for SSA and types)."""
    if not isinstance(text, str):
        raise TypeError(f"parse_program takes str, not {type(text).__name__}")
    p = _Parser(text, source)
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return p.program()
    except RecursionError:
        p._fail("nesting is too deep")
        raise AssertionError from None  # unreachable


def parse_type(text: str) -> T.Type:
    """Parse a MIL type such as ``tensor<fp16, [1, 64, 1, 16]>``."""
    p = _Parser(text, "")
    t = p.type_()
    if p.kinds[p.i] != "eof":
        p._fail(f"unexpected text after the type: {p._describe(p.i)}")
    return t


def parse_literal(text: str) -> Literal:
    """Parse a MIL literal such as ``tensor<int32, [2]>([1, 1])`` or ``fp16(0x1p-1)``."""
    p = _Parser(text, "")
    lit = p.literal()
    if p.kinds[p.i] != "eof":
        p._fail(f"unexpected text after the literal: {p._describe(p.i)}")
    return lit
