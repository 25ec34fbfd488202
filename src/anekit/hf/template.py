"""Chat templates rendered in jinja2's immutable sandbox with a time bound and an output-size bound.

A template is code from the model's files: the sandbox keeps it from Python's internals, and this module
keeps it from running for ever or filling the memory. ``BoundedSandbox`` is the environment transformers
sets up (trim_blocks, lstrip_blocks, loop controls; see ``anekit.hf.tokenizer``) with:

* a wall-clock deadline (``MAX_SECONDS``) checked at every iteration of every ``{% for %}`` (each loop's
  iterable is wrapped, at parse time, in the ``anekit_bounded`` filter), at every call (macros, methods,
  ``range``) and at every piece of output, so nested loops with no output end too;
* an output bound (``MAX_OUTPUT_CHARS``): the template is rendered through ``generate()`` and the running
  length checked piece by piece;
* sizes checked before they are made: ``*`` of a string or list, ``+`` and ``~`` of two (``~`` is
  rewritten at parse time into the ``anekit_concat`` filter), ``**`` and ``*`` of
  integers (by their bits), and the widths given to ``str.center`` / ``ljust`` / ``rjust`` / ``zfill``
  and the ``center`` / ``indent`` filters.

What escapes these checks (a format string's width, say) still ends at the deadline or in a
MemoryError, which the caller reports as one line.
"""

from __future__ import annotations

import contextvars
import operator
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeGuard

import jinja2
from jinja2 import nodes
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_SECONDS = 5.0  # one rendering: real templates take milliseconds
MAX_OUTPUT_CHARS = 1 << 20  # what the tokenizer encodes at once (anekit.hf.tokenizer.MAX_TEXT_BYTES)
MAX_INT_BITS = 1 << 16  # an integer a template computes: far beyond any index or count
LOOP_FILTER = "anekit_bounded"
CONCAT_FILTER = "anekit_concat"
WIDTH_METHODS = ("center", "ljust", "rjust", "zfill")


class TemplateLimit(Exception):
    """A bound the rendering crossed; the message says which."""


_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("anekit_template_deadline", default=0.0)


def _check_clock() -> None:
    deadline = _deadline.get()
    if deadline and time.monotonic() > deadline:
        raise TemplateLimit(f"the template ran for more than {MAX_SECONDS:g} s")


def _check_size(size: int, what: str) -> None:
    if size > MAX_OUTPUT_CHARS:
        raise TemplateLimit(
            f"{what} would make {size} characters (or items), over the {MAX_OUTPUT_CHARS} bound"
        )


def _bounded(iterable: Iterable[Any]) -> Iterator[Any]:
    """The items of ``iterable``, the clock looked at before each."""
    for item in iterable:
        _check_clock()
        yield item


def _concat(values: list[Any]) -> str:
    """``a ~ b ~ ...``: the strings joined once their total length is known to fit."""
    _check_clock()
    texts = [str(v) for v in values]
    _check_size(sum(map(len, texts)), "'~'")
    return "".join(texts)


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox with the bounds of the module docstring."""

    intercepted_binops = frozenset(["*", "**", "+"])

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        self.filters[LOOP_FILTER] = _bounded
        self.filters[CONCAT_FILTER] = _concat
        for name in ("center", "indent"):
            self.filters[name] = _width_checked(self.filters[name])

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        """The template's tree with every for-loop's iterable wrapped in the bounded filter and every
        ``~`` made the size-checked concatenation."""
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, LOOP_FILTER, [], [], None, None, lineno=loop.lineno)
        for parent in tree.find_all(nodes.Node):
            for field, value in parent.iter_fields():
                if isinstance(value, nodes.Concat):
                    setattr(parent, field, _checked_concat(value))
                elif isinstance(value, list):
                    value[:] = [_checked_concat(v) if isinstance(v, nodes.Concat) else v for v in value]
        tree.set_environment(self)
        return tree

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        _check_clock()
        if op == "*":
            count, item = (right, left) if _sized(left) is not None else (left, right)
            if _is_int(count) and _sized(item) is not None:
                _check_size(max(count, 0) * len(item), f"'*' of a {type(item).__name__}")
            elif _is_int(left) and _is_int(right):
                _check_bits(left.bit_length() + right.bit_length(), "'*'")
            return operator.mul(left, right)
        if op == "+":
            if _sized(left) is not None and _sized(right) is not None:
                _check_size(len(left) + len(right), f"'+' of a {type(left).__name__}")
            return operator.add(left, right)
        if _is_int(left) and _is_int(right) and right > 0:  # **
            _check_bits(max(left.bit_length() - 1, 0) * right, "'**'")
        return operator.pow(left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_clock()
        if getattr(__obj, "__name__", None) in WIDTH_METHODS and isinstance(
            getattr(__obj, "__self__", None), str
        ):
            width = args[0] if args else kwargs.get("width")
            if _is_int(width):
                _check_size(width, f"str.{__obj.__name__}")
        return super().call(__context, __obj, *args, **kwargs)


def _checked_concat(node: nodes.Concat) -> nodes.Filter:
    items = nodes.List(node.nodes, lineno=node.lineno)
    return nodes.Filter(items, CONCAT_FILTER, [], [], None, None, lineno=node.lineno)


def _check_bits(bits: int, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise TemplateLimit(
            f"{what} would make an integer of about {bits} bits, over the {MAX_INT_BITS} bound"
        )


def _width_checked(f: Any) -> Any:
    """The filter ``f`` (center, indent) with its width argument bounded first."""

    def checked(value: Any, width: Any = 80, *args: Any, **kwargs: Any) -> Any:
        if _is_int(width):
            lines = str(value).count("\n") + 1
            _check_size(max(width, 0) * lines, "the width given to a filter")
        return f(value, width, *args, **kwargs)

    return checked


def render(template: jinja2.Template, variables: dict[str, Any]) -> str:
    """The template's output, within ``MAX_SECONDS`` and ``MAX_OUTPUT_CHARS`` (TemplateLimit otherwise)."""
    token = _deadline.set(time.monotonic() + MAX_SECONDS)
    try:
        pieces: list[str] = []
        size = 0
        for piece in template.generate(**variables):
            size += len(piece)
            if size > MAX_OUTPUT_CHARS:
                raise TemplateLimit(f"the template's output is over the {MAX_OUTPUT_CHARS}-character bound")
            _check_clock()
            pieces.append(piece)
        return "".join(pieces)
    finally:
        _deadline.reset(token)
