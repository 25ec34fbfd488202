"""A dynamic kernel's ``run`` packs into a buffer its spec keeps: each call gives what packing a fresh
input gives, whatever the call before it held (other weights, other activations)."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import dynamic, preset
from anekit.kernels.catalog import random_weights


@pytest.mark.parametrize("gen", [dynamic.sdpa_fwd_dynamic, dynamic.ffn_fwd_dynamic, dynamic.qkv_bwd_dynamic])
def test_a_kept_input_buffer_runs_as_a_fresh_one(gen):
    cfg = preset("default")
    spec = gen(cfg)
    kernel = spec.compile(runtime.open("sim")).load()
    rng = np.random.default_rng(0)
    names = spec.activations.names
    for seed in (1, 2, 3):
        w = random_weights(cfg, seed)
        w.update({k: v * (1 + seed) for k, v in w.items() if k.startswith("w")})
        parts = {
            n: rng.standard_normal((c, cfg.seq_len)).astype(np.float32) for n, c in spec.activations.parts
        }
        fresh = spec.run_packed(kernel, spec.pack(w, **parts))
        kept = spec.run(kernel, w, **parts)
        assert sorted(fresh) == sorted(kept) and list(parts) == list(names)
        for name in fresh:
            assert np.array_equal(fresh[name], kept[name]), (seed, name)
