"""Every MIL program anekit emits, held to the sha256 it had when it was recorded.

The programs: every cataloged kernel (baked with weights, dynamic, the dynamic step's helpers) of every
preset and of the Hugging Face shapes the tests build; every training route's kernels of those configs
(``kernels.route_specs``); the composable kernels; the CoreML export's two-function programs of those
shapes; the smoke ladder's first rungs and its construct rungs. Each is hashed as its MIL text and,
where it has them, its weight files. A change to any of them is either a deliberate fix (then record
again, ``python tests/test_program_hashes.py --record``, and name the change) or a regression.

The recorded hashes are a snapshot of what the generators emitted, not a statement of correctness: the
numeric tests of each kernel say whether a program computes the right thing; this test says a program
did not change by accident while the code around it moved.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anekit.kernels import catalog, composable
from anekit.kernels.config import PRESETS, ModelConfig, RopeScaling
from anekit.llama.params import Params
from anekit.mil.printer import print_program

RECORD = Path(__file__).with_name("program_hashes.json")

HF_BASE = ModelConfig(32, 48, 2, 4, 2, 64, 32)  # the step and kernel tests' Hugging Face shapes
HF_CONFIGS = {
    "qwen3-like": HF_BASE.with_(attn_head_dim=16, qkv_bias=True, qk_norm=True),
    "bias": HF_BASE.with_(qkv_bias=True),
    "qk-norm": HF_BASE.with_(qk_norm=True),
    "head-dim": HF_BASE.with_(attn_head_dim=16),
    "rope-scaling": HF_BASE.with_(rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8)),
    "head-dim-narrow": HF_BASE.with_(attn_head_dim=4, qk_norm=True),
    "rope-scaling-bias": HF_BASE.with_(rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8), qkv_bias=True),
    "mqa-norm-norope": HF_BASE.with_(n_kv_heads=1, qk_norm=True, rope=False, attn_head_dim=12),
}
# Gemma 3 in small: (1 + w) norms, post-norms, GeGLU, scaled embeddings, its own score scale, sliding layers
# (window 8 < seq 32) with their own RoPE base beside a full one; recorded when Gemma 3 was added.
GEMMA_BASE = HF_BASE.with_(
    n_layers=3, attn_head_dim=16, qk_norm=True, norm_offset=1.0, post_norms=True, mlp_act="gelu_tanh",
    embed_scale=32**0.5, attn_scale=24**-0.5, sliding_window=8, layer_types=("sliding", "full", "sliding"),
    rope_theta=1e6, rope_local_theta=1e4,
)  # fmt: skip
GEMMA_CONFIGS = {"gemma3-like": GEMMA_BASE}
EXPORT_BASE = ModelConfig(
    dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, seq_len=16
)
EXPORT_CONFIGS = {
    "llama": EXPORT_BASE,
    "qwen3-like": EXPORT_BASE.with_(
        attn_head_dim=16, qkv_bias=True, qk_norm=True, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8)
    ),
    "bias": EXPORT_BASE.with_(qkv_bias=True),
    "qk-norm": EXPORT_BASE.with_(qk_norm=True),
    "head-dim": EXPORT_BASE.with_(attn_head_dim=4),
    "rope-scaling": EXPORT_BASE.with_(rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8)),
    "stories260K": PRESETS["stories260K"],
    "gemma3-like": GEMMA_BASE.with_(seq_len=16),
}


def _digest(text: str, files: dict[str, bytes] | None = None) -> str:
    h = hashlib.sha256(text.encode())
    for path in sorted(files or {}):
        h.update(b"\0" + path.encode() + b"\0" + hashlib.sha256(files[path]).digest())  # type: ignore[index]
    return h.hexdigest()


def _weights(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """One layer's weights (the extras its config has included) and the head's, seeded."""
    return Params.init(cfg, seed=7, tied=False).kernel_weights(0)


def _kernel_programs() -> Iterator[tuple[str, Callable[[], str]]]:
    configs = {
        **{f"preset:{k}": v for k, v in PRESETS.items()},
        **{f"hf:{k}": v for k, v in HF_CONFIGS.items()},
        **{f"hf:{k}": v for k, v in GEMMA_CONFIGS.items()},
    }
    for label, cfg in configs.items():
        baked = catalog.with_kinds(cfg, [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS])
        dynamic = catalog.with_kinds(cfg, [*catalog.DYNAMIC_KERNELS, *catalog.DYNAMIC_HELPERS])
        small = cfg.dim <= 64
        for name in baked:
            weighted = small or name in ("softmax_vocab",)

            def make(name: str = name, cfg: ModelConfig = cfg, weighted: bool = weighted) -> str:
                spec = catalog.build(name, cfg, _weights(cfg) if weighted else None)
                return _digest(spec.text(), spec.weight_files() if weighted else spec.shared_files)

            yield f"{label}/{name}{'' if weighted else ' (shapes)'}", make
        for name in dynamic:

            def make_dynamic(name: str = name, cfg: ModelConfig = cfg) -> str:
                spec = catalog.build(name, cfg, None)
                return _digest(spec.text(), spec.weight_files())

            yield f"{label}/{name}", make_dynamic


def _route_programs() -> Iterator[tuple[str, Callable[[], str]]]:
    """Every kernel of every training route (``kernels.route.ROUTES``), per config; baked with weights
    where the config is small, from shapes otherwise (recorded when the routes were added)."""
    from anekit.kernels.route import ROUTES
    from anekit.kernels.route_specs import route_specs

    configs = {
        **{f"preset:{k}": v for k, v in PRESETS.items()},
        **{f"hf:{k}": v for k, v in HF_CONFIGS.items()},
        **{f"hf:{k}": v for k, v in GEMMA_CONFIGS.items()},
    }
    for label, cfg in configs.items():
        weighted = cfg.dim <= 64
        for route_id, route in ROUTES.items():
            try:
                names = list(route_specs(cfg, route, None))
            except Exception as e:  # a config the route refuses is recorded as its refusal
                refused = f"refused: {type(e).__name__}"
                yield f"route:{route_id}/{label}", lambda refused=refused: refused
                continue
            for name in names:

                def make(
                    name: str = name, cfg: ModelConfig = cfg, route: Any = route, weighted: bool = weighted
                ) -> str:
                    spec = route_specs(cfg, route, _weights(cfg) if weighted else None)[name]
                    return _digest(spec.text(), spec.weight_files() if weighted else spec.shared_files)

                yield f"route:{route_id}/{label}/{name}{'' if weighted else ' (shapes)'}", make


def _composable_programs() -> Iterator[tuple[str, Callable[[], str]]]:
    rng = np.random.default_rng(3)

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    def program_kernel(k: composable.ProgramKernel) -> str:
        return _digest(print_program(k.program))

    def spec(s: Any) -> str:
        return _digest(s.text(), s.weight_files())

    yield "composable/matmul_inputs", lambda: program_kernel(composable.matmul_inputs(64, 32, 64))
    yield "composable/matmul_inputs fp16", lambda: program_kernel(composable.matmul_inputs(64, 32, 64, False))
    yield "composable/conv_baked", lambda: spec(composable.conv_baked(64, 32, 64, w(32, 64)))
    yield "composable/fused_qkv", lambda: spec(composable.fused_qkv(64, 64, w(64, 64), w(64, 64), w(64, 64)))
    yield (
        "composable/fused_ffn_up",
        lambda: spec(composable.fused_ffn_up(64, 128, 64, w(128, 64), w(128, 64))),
    )
    yield "composable/dynamic_matmul", lambda: spec(composable.dynamic_matmul(64, 32, 64))


def _export_programs() -> Iterator[tuple[str, Callable[[], str]]]:
    from anekit.coreml.export import Stage, WeightSink, build_program

    for label, cfg in EXPORT_CONFIGS.items():
        for tied in (True, False):

            def make(cfg: ModelConfig = cfg, tied: bool = tied) -> str:
                blobs = hashlib.sha256()
                offset = [64]

                def append(data: Any, dtype: str) -> int:
                    a = np.ascontiguousarray(data)
                    blobs.update(dtype.encode() + a.dtype.str.encode() + str(a.shape).encode() + a.tobytes())
                    at = offset[0]
                    offset[0] += 64 + (a.nbytes + 63) // 64 * 64
                    return at

                params = Params.init(cfg, seed=5, tied=tied)
                program = build_program(params, Stage.whole(cfg), WeightSink(append))
                return _digest(print_program(program), {"weights": blobs.digest()})

            yield f"export:{label}/{'tied' if tied else 'untied'}", make


def _smoke_programs() -> Iterator[tuple[str, Callable[[], str]]]:
    from anekit.tools import smoke

    for i, name in enumerate(("elementwise", "conv1x1", "multi_io")):

        def make(i: int = i) -> str:
            rng = np.random.default_rng(0)
            rungs = [smoke.elementwise_rung, smoke.conv_rung, smoke.multi_io_rung]
            for r in rungs[:i]:
                r(None, rng)  # the ladder draws its rungs' weights from one generator, in order
            rung = rungs[i](None, rng)
            return _digest(rung.text, rung.weights)

        yield f"smoke/{name}", make
    from anekit.tools import smoke_constructs

    for build in smoke_constructs.RUNGS:

        def make_construct(build: Any = build) -> str:
            rung = build(np.random.default_rng(0))
            return _digest(print_program(rung.program), rung.weights)

        yield f"smoke/constructs/{build.__name__}", make_construct


_GENERATION_SETS: dict[tuple[str, Any, int], dict[str, Any]] = {}  # one build of each kernel set


def _generation_programs() -> Iterator[tuple[str, Callable[[], str]]]:
    """Every prefill and decode kernel of every generation route (``engine.generation_routes``, cut by
    ``generate.plan``) for the small presets, with weights where the config is small, and the smoke
    ladder's generation rungs (recorded when generation was added)."""
    from anekit.engine.generation_routes import ROUTE_IDS, candidate
    from anekit.generate.plan import generation_plan
    from anekit.kernels.generation import gen_weights, kernel_set
    from anekit.kernels.route import KernelRoute
    from anekit.llama.params import Params
    from anekit.tools import smoke_constructs

    for label in ("stories260K", "stories15M"):
        cfg = PRESETS[label]
        weighted = cfg.dim <= 64
        for route_id in ROUTE_IDS:
            c = candidate(route_id)
            route = KernelRoute(c.weights, c.attention, c.norm, c.rope)
            plan = generation_plan(cfg, route_id)
            for width in plan.widths:

                def make_set(
                    cfg: ModelConfig = cfg, route: KernelRoute = route, plan: Any = plan, width: int = width
                ) -> dict[str, Any]:
                    key = (cfg.name, route, width)
                    if key in _GENERATION_SETS:
                        return _GENERATION_SETS[key]
                    weights = gen_weights(Params.init(cfg, 0)) if cfg.dim <= 64 else None
                    _GENERATION_SETS[key] = kernel_set(
                        cfg,
                        route,
                        width=width,
                        capacity=plan.capacity_for(width),
                        groups=plan.groups,
                        tiles=plan.tiles,
                        weights=weights,
                    )
                    return _GENERATION_SETS[key]

                for name in make_set():

                    def make(name: str = name, make_set: Any = make_set, weighted: bool = weighted) -> str:
                        spec = make_set()[name].spec
                        return _digest(spec.text(), spec.weight_files() if weighted else spec.shared_files)

                    yield f"generate:{route_id}/preset:{label}/{name}{'' if weighted else ' (shapes)'}", make
    for build in smoke_constructs.GENERATION_RUNGS:

        def make_rung(build: Any = build) -> str:
            rung = build(np.random.default_rng(0))
            return _digest(print_program(rung.program), rung.weights)

        yield f"smoke/generation/{build.__name__}", make_rung


def programs() -> Iterator[tuple[str, Callable[[], str]]]:
    yield from _kernel_programs()
    yield from _route_programs()
    yield from _composable_programs()
    yield from _export_programs()
    yield from _smoke_programs()
    yield from _generation_programs()


def compute() -> dict[str, str]:
    out = {}
    for label, make in programs():
        try:
            out[label] = make()
        except Exception as e:  # a shape a generator refuses is recorded as its refusal
            out[label] = f"refused: {type(e).__name__}"
    return out


def test_every_program_is_emitted_as_recorded() -> None:
    if not RECORD.exists():
        pytest.fail(f"{RECORD.name} is missing: record it with python tests/{Path(__file__).name} --record")
    want = json.loads(RECORD.read_text())
    got = compute()
    assert sorted(got) == sorted(want), "the set of programs changed: record again if that is deliberate"
    changed = [k for k in want if got[k] != want[k]]
    assert not changed, f"{len(changed)} programs changed, e.g. {changed[:8]}"
    assert sum(not v.startswith("refused") for v in want.values()) > 240


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(f"usage: python tests/{Path(__file__).name} --record")
    hashes = compute()
    RECORD.write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    print(f"{len(hashes)} programs recorded, {sum(v.startswith('refused') for v in hashes.values())} refused")
