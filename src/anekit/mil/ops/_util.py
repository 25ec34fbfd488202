"""Helpers shared by the op families: axis handling, broadcasting and reduction shapes."""

from __future__ import annotations

from collections.abc import Iterable

from anekit.mil import types as T
from anekit.mil.registry import InferArgs


def norm_axis(a: InferArgs, axis: int, rank: int, what: str = "axis") -> int:
    """A non-negative axis in [0, rank); a clear error naming the op otherwise."""
    if not -rank <= axis < rank:
        raise a.error(f"{what} {axis} is out of range for rank {rank} (expected {-rank}..{rank - 1})")
    return axis % rank


def norm_axes(a: InferArgs, axes: Iterable[int], rank: int, what: str = "axes") -> tuple[int, ...]:
    """Normalised, duplicate-free axes."""
    out = tuple(norm_axis(a, int(x), rank, what) for x in axes)
    if len(set(out)) != len(out):
        raise a.error(f"{what} {list(axes)} repeat an axis")
    return out


def broadcast(a: InferArgs, *names: str) -> tuple[T.Dim, ...]:
    """The broadcast shape of the named tensor inputs; a clear error when they do not broadcast."""
    shape: tuple[T.Dim, ...] = ()
    for n in names:
        s = a.tensor(n).shape
        b = T.broadcast_shapes(shape, s)
        if b is None:
            shapes = ", ".join(f"{m}: {list(a.tensor(m).shape)}" for m in names)
            raise a.error(f"shapes do not broadcast ({shapes})")
        shape = b
    return shape


def reduced_shape(shape: tuple[T.Dim, ...], axes: tuple[int, ...], keep_dims: bool) -> tuple[T.Dim, ...]:
    """The shape after reducing ``axes`` (already normalised)."""
    if keep_dims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)
