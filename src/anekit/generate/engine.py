"""Generation on the engine: the sampler's decoder over the prefill and decode kernel sets of a route.

``EngineDecoder(params, backend, route=None, *, prefill_width=None)`` is a ``anekit.llama.sample.Decoder``
(``cfg``, ``forward(tokens, pos) -> logits (vocab,) float32``) plus ``reset()``, ``close()`` and
``position``. The route is the engine layer's choice for the backend's chip
(``anekit.engine.generation_routes.generation_route``; chip "any": the legacy kernels) unless one is
given; the plan (``anekit.generate.plan``) fixes the widths, the cache capacity, the layer groups and the
vocabulary tiles.

A prompt runs in chunks of ``prefill_width`` tokens through the prefill kernel set; each token after it
runs through the decode kernel set (width 32, the token in column 0). Keys and values of every position
run are kept by the route's runner, so a forward at position p reads positions 0 .. p-1 from the cache
(they must have been run) and overwrites what lay past p: going back to an earlier position continues
from there. The logits are the head tiles' for the last real token, concatenated.

``make_engine_decoder(params, backend_name, chip="any", macos="", numerics=None)`` opens the backend
("sim": the simulator with the chip's numerics; "ane": the macOS backend, refused off a Mac in one line)
and builds the decoder on the route the chip gets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from anekit import runtime
from anekit.engine.generation_routes import GenerationRoute, asked_route, generation_route
from anekit.errors import AnekitError
from anekit.generate.block_route import BlockRunner
from anekit.generate.host_attention import HostAttentionRunner
from anekit.generate.layers import LayersRunner
from anekit.generate.plan import GenerationPlan, generation_plan
from anekit.kernels.config import ModelConfig
from anekit.kernels.route import KernelRoute
from anekit.llama.params import Params
from anekit.runtime.base import Backend

BACKENDS = ("sim", "ane")


class ContextExceeded(AnekitError, ValueError):
    """Tokens that would run past the model's context (seq_len), or skip positions never run."""

    def __str__(self) -> str:
        return str(self.args[0])


class Runner(Protocol):
    """A route's kernels for one model: runs a chunk, keeps the keys and values of every position run."""

    def run(self, tokens: np.ndarray, pos: int, width: int) -> np.ndarray: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


def _runner(params: Params, backend: Backend, route: GenerationRoute, plan: GenerationPlan) -> Runner:
    if route.attention == "host":
        return HostAttentionRunner(params, backend, plan)
    kernels = KernelRoute(*route.kernel_route)
    if route.fused:
        return LayersRunner(params, backend, plan, kernels)
    return BlockRunner(params, backend, plan, kernels)


def _route(route: GenerationRoute | str | None, backend: Backend) -> GenerationRoute:
    chip = getattr(backend, "chip", "any")
    if route is None:
        return generation_route(chip)
    if isinstance(route, GenerationRoute):
        return route
    return asked_route(route, chip)  # refuses an unknown id in one line


class EngineDecoder:
    """The sampler's decoder on the engine's kernels (the module docstring)."""

    def __init__(
        self,
        params: Params,
        backend: Backend,
        route: GenerationRoute | str | None = None,
        *,
        prefill_width: int | None = None,
    ) -> None:
        self.params = params
        self.backend = backend
        self.route = _route(route, backend)
        self.plan = generation_plan(params.cfg, self.route, prefill_width=prefill_width)
        self.runner = _runner(params, backend, self.route, self.plan)
        self.position = 0  # the next position to run: positions 0 .. position-1 are in the cache

    @property
    def cfg(self) -> ModelConfig:
        return self.params.cfg

    def forward(self, tokens: Sequence[int] | np.ndarray, pos: int) -> np.ndarray:
        """Tokens (n,) at positions pos .. pos+n-1: the logits (vocab,) float32 of the last one."""
        toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n, seq = toks.shape[0], self.cfg.seq_len
        if n == 0 or pos < 0 or pos + n > seq:
            raise ContextExceeded(
                f"[generate] cannot run {n} token(s) at position {pos}: positions must lie in [0, {seq}) "
                f"(the model's context, seq_len {seq})"
            )
        if pos > self.position:
            raise ContextExceeded(
                f"[generate] position {pos} skips positions {self.position}..{pos - 1}, which were never run"
            )
        if n == 1:
            logits = self.runner.run(toks, pos, self.plan.decode_width)
        else:
            w = self.plan.prefill_width
            for start in range(0, n, w):
                logits = self.runner.run(toks[start : start + w], pos + start, w)
        self.position = pos + n
        return np.asarray(logits, dtype=np.float32)

    def reset(self) -> None:
        """Start again at position 0 (the kernels stay compiled)."""
        self.position = 0
        self.runner.reset()

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> EngineDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_engine_decoder(
    params: Params,
    backend_name: str,
    chip: str = "any",
    macos: str = "",
    numerics: str | None = None,
    *,
    prefill_width: int | None = None,
    lazy_columns: bool = True,
) -> EngineDecoder:
    """Open backend ``backend_name`` ("sim" with ``chip``'s numerics, or "ane") and build the decoder on
    the route ``chip`` gets under ``macos`` (sim with chip "any": the legacy kernels). One line when the
    backend is unknown or not available here. ``lazy_columns`` (sim): kernels whose caller reads only their
    first columns compute only those where that gives the same bits (``anekit.runtime.sim.columns``);
    False computes every column of every kernel."""
    if backend_name not in BACKENDS:
        raise AnekitError(
            f"[generate] unknown backend '{backend_name}' (choose one of: {', '.join(BACKENDS)})"
        )
    if backend_name == "ane" and "ane" not in runtime.available():
        raise AnekitError(
            "[generate] backend 'ane' needs macOS on a Mac with a Neural Engine (the private framework did "
            "not load here): use backend 'sim' or 'cpu'"
        )
    if backend_name == "ane":
        chip = runtime.default_chip()
    route = generation_route(chip, macos)
    plan = generation_plan(params.cfg, route, prefill_width=prefill_width)
    options: dict[str, object] = {}
    if backend_name == "sim":
        options = {
            "chip": chip,
            "numerics": numerics or "engine",
            "compile_budget": max(100, plan.kernel_count),
            "lazy_columns": lazy_columns,
        }
    backend = runtime.open(backend_name, **options)
    return EngineDecoder(params, backend, route, prefill_width=prefill_width)


__all__ = ["BACKENDS", "ContextExceeded", "EngineDecoder", "make_engine_decoder"]
