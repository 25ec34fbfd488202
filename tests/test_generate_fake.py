"""Generation on the macOS backend, driven through the fake engine (tests/fake_objc.py): the rules bite.

The fake binds surfaces as the engine was measured to (alphabetically by MIL name, one allocation size per
direction, packed data, rows of 64 bytes or more: mechramc/Orion docs/ane_constraints.md) and refuses what
hardware refused (state ops on the direct route: sbryngelson/ane-guide part-4-workloads/14-llm-case-study.md,
"Two residency mechanisms"). A generation kernel has two inputs ("x" and "cache", declared in that order,
bound in the other) whose sizes differ, so it is the case those rules were written for.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from anekit.engine.generation_routes import generation_route
from anekit.errors import CompilationFailed, EvalFailed
from anekit.generate.engine import EngineDecoder
from anekit.kernels.config import ModelConfig
from anekit.llama.params import Params
from anekit.llama.sample import Sampler
from anekit.mil import Builder, StateType, tensor
from anekit.mil.parser import parse_program
from anekit.mil.printer import print_program
from anekit.runtime.ane import AneBackend, binding, lifecycle
from anekit.runtime.ane.lifecycle import EngineModel
from anekit.runtime.sim import SimBackend
from tests.fake_objc import FakeObjC

S = 32  # rows of 64 bytes in fp16: the smallest width the engine runs (rule surface.min-row-bytes)
C = 64


def _cache_program(stateful: bool):
    """out = 2 (cache + x), the cache a ``state<>`` input updated in the graph (CoreML's form) or a plain
    input the host writes (the direct route's form)."""
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, C, 1, S]))
    if stateful:
        cache = f.input("cache", StateType(tensor("fp16", [1, C, 1, S])))
        total = f.coreml_update_state(state=cache, value=f.add(x=f.read_state(input=cache), y=x))
    else:
        cache = f.input("cache", tensor("fp16", [1, C, 1, S]))
        total = f.add(x=cache, y=x, name="total")
    f.output(f.mul(x=total, y=2.0, name="out"))
    return b.build()


@pytest.fixture
def backend(fake, monkeypatch):
    monkeypatch.setattr(lifecycle, "LOAD_RETRY_DELAY", 0.0)
    return AneBackend(runtime=fake.runtime(), dialect="ios18")


def test_a_state_op_in_a_direct_route_program_is_refused(fake, backend):
    """The backend refuses a state<> input before anything reaches the engine; the fake engine, given the
    text anyway, refuses it at compile as the unentitled backend does; the same program with the cache as
    a plain input (what the generation kernels do) compiles and runs."""
    stateful = _cache_program(stateful=True)
    with pytest.raises(CompilationFailed, match=r"'cache' has type state<.*rule program\.state-ops-direct"):
        backend.compile(stateful)
    assert fake.sent() == []  # refused before any message to the engine
    engine = EngineModel(fake.runtime(), "main", 21, None, None)
    with pytest.raises(CompilationFailed, match=r"ANECCompile\(\) FAILED: state input 'cache', "):
        engine.compile(print_program(stateful, dialect="ios18"), {})
    engine.close()
    rng = np.random.default_rng(0)
    x, cache = (rng.standard_normal((1, C, 1, S)).astype(np.float32) for _ in range(2))
    plain = _cache_program(stateful=False)
    with backend.compile(plain) as k:
        got = k(x=x, cache=cache)["out"]
    want = 2 * (cache.astype(np.float16).astype(np.float64) + x.astype(np.float16).astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(got, SimBackend().compile(plain)(x=x, cache=cache)["out"])


# -- an EngineDecoder over the fake engine --------------------------------------------------------------

CFG = ModelConfig(64, 128, 2, 4, 2, 128, 64, name="tiny")  # 2 layers, 128 tokens, a context of 64
PROMPT = [1, *range(5, 44)]  # 40 tokens: one prefill chunk (width 64), then decode steps (width 32)


class _Tokens:
    """What the sampler asks of a tokenizer when it is handed ids: BOS and the vocabulary size."""

    bos_id = 1
    vocab_size = CFG.vocab_size


def _params() -> Params:
    """Random weights of unit gain (std 1 / sqrt(fan-in)), so that every layer and the cache move the
    logits: a wrongly bound surface cannot hide under llama2.c's small initialisation."""
    params = Params.init(CFG, seed=5)
    for layer in params.layers:
        for a in layer.as_dict().values():
            if a.ndim == 2:
                a *= 1 / (
                    0.02 * np.sqrt(a.shape[1])
                )  # in place: std 0.02 (or less) -> about 1 / sqrt(fan-in)
    params.embed *= 50.0  # entries about 1
    return params


def _fake_backend(tmp_path, chip: str, macos: str = "15.1") -> tuple[FakeObjC, AneBackend]:
    fake = FakeObjC(tmp_path / f"T-{chip}", chip=chip, macos=macos)
    (tmp_path / f"T-{chip}").mkdir()
    return fake, AneBackend(runtime=fake.runtime(), dialect="ios18")


def _generate(decoder: EngineDecoder, steps: int = 52) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens through the sampler, and the logits of every forward."""
    seen: list[np.ndarray] = []
    forward = decoder.forward

    def recording(tokens, pos):
        logits = forward(tokens, pos)
        seen.append(logits.copy())
        return logits

    decoder.forward = recording  # type: ignore[method-assign]
    tokens = list(Sampler(decoder, _Tokens()).generate_ids(PROMPT, steps, temperature=0.0, seed=1))
    return tokens, seen


@pytest.mark.parametrize(
    "chip, macos, route",
    [
        ("m5", "26.3", "baked-engine-attention"),
        ("m3", "26.3", "baked-engine-attention-rope-matmul"),
        ("m5", "26.3", "baked-fused"),  # asked for: no chip's route until a report holds its in-kernel norm
        ("m3", "15.1", "dynamic-engine-attention"),
        ("m1", "26.3", "conv-host-attention"),
    ],
)
def test_engine_decoder_over_the_fake_engine_generates_the_simulator_s_tokens(
    tmp_path, monkeypatch, chip, macos, route
):
    """The fake engine binds, sizes and reads the surfaces as the engine does, computes with the chip's
    numerics and refuses what the chip's compiler refused (matmul on the M1 under macOS 26), so the macOS
    backend's decoder on the route of the chip and macOS must give the simulator's logits bit for bit,
    hence its tokens: a prompt in one prefill chunk, then decode steps (the cache copied once from the
    prefill kernels' surfaces to the decode kernels')."""
    monkeypatch.setattr(lifecycle, "LOAD_RETRY_DELAY", 0.0)
    params = _params()
    fake, backend = _fake_backend(tmp_path, chip, macos)
    chosen: Any = generation_route(chip, macos)
    if route.startswith("baked-fused"):
        chosen = route
    else:
        assert chosen.id == route
    with (
        EngineDecoder(params, backend, chosen) as on_fake,
        EngineDecoder(params, SimBackend(chip=chip), chosen) as on_sim,
    ):
        got, got_logits = _generate(on_fake)
        want, want_logits = _generate(on_sim)
    assert got == want and len(got) == 52  # 39 forced prompt tokens, 13 sampled
    assert all(not np.array_equal(a, b) for a, b in itertools.pairwise(want_logits))  # positions matter
    for g, w in zip(got_logits, want_logits):
        np.testing.assert_array_equal(g, w)
    assert fake.refusals == [] and fake.errors == []
    sent = [
        parse_program(c.values[0].decode()).main for c in fake.find("modelWithMILText:weights:optionsPlist:")
    ]
    with_cache = [[v.name for v in fn.inputs] for fn in sent if len(fn.inputs) == 2]
    if route != "conv-host-attention":  # kernels with a cache: declared x, cache; handed to the engine sorted
        assert with_cache and all(names == ["cache", "x"] for names in with_cache)
    else:
        assert not with_cache  # the conv route's kernels read one input each, the cache stays on the host


def test_binding_the_generation_kernel_s_inputs_in_declaration_order_corrupts_its_numbers(
    tmp_path, monkeypatch
):
    """Rule surface.bind-alphabetical (mechramc/Orion docs/ane_constraints.md §13): the engine binds "cache"
    before "x". A backend binding them as declared is refused by its own plan check; with the check off, the
    fake (as the engine) runs it without a word and the logits are garbage."""
    monkeypatch.setattr(lifecycle, "LOAD_RETRY_DELAY", 0.0)
    monkeypatch.setattr(binding, "binding_order", lambda names: list(range(len(names))))
    params = _params()
    fake, backend = _fake_backend(tmp_path, "m5")
    with pytest.raises(CompilationFailed, match=r"surface\.bind-alphabetical error input surfaces"):
        EngineDecoder(params, backend)
    backend.strict = False
    with EngineDecoder(params, backend) as on_fake, EngineDecoder(params, SimBackend(chip="m5")) as on_sim:
        with np.errstate(all="ignore"):
            got = on_fake.forward(PROMPT, 0)
        want = on_sim.forward(PROMPT, 0)
    assert not np.allclose(got, want, rtol=0.1, atol=0.1, equal_nan=False)
    assert fake.refusals == [] and fake.errors == []  # silent, as on the engine


def test_inputs_of_different_allocation_sizes_are_refused_by_the_fake(tmp_path, monkeypatch):
    """Rule surface.uniform-input-size (Orion §12): "x" and "cache" differ in size, so the backend pads both
    to one allocation; a backend that sized each input to its own tensor fails at the first evaluation."""
    from anekit.runtime.ane import kernel as kernel_module

    monkeypatch.setattr(lifecycle, "LOAD_RETRY_DELAY", 0.0)
    real = kernel_module.AneSurface

    def own_size(rt, shape, dtype, name, alloc):  # each surface as big as its tensor (at least the floor)
        return real(rt, shape, dtype, name, 0)

    monkeypatch.setattr(kernel_module, "AneSurface", own_size)
    fake, backend = _fake_backend(tmp_path, "m5")
    with EngineDecoder(_params(), backend) as on_fake, pytest.raises(EvalFailed, match="status=0x1d"):
        on_fake.forward(PROMPT, 0)
    assert fake.refusals and fake.refusals[0].startswith("input surfaces of different allocation sizes")
    assert fake.errors == []
