"""``Params.init``: llama2.c model.py's initialisation (normal(0, 0.02), wo and w2 scaled by
1/sqrt(2 n_layers), norm scales one, biases zero), drawn in pieces on every core with the same values for
any number of cores, and different for another seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

import anekit.threads
from anekit.kernels import preset
from anekit.llama.params import INIT_PIECE, Params


def _tensors(p: Params) -> dict[str, np.ndarray]:
    return dict(p.tensors())


def test_the_weights_are_the_same_for_any_number_of_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = preset("stories15M")  # 15M values: many pieces, on threads
    many = _tensors(Params.init(cfg, seed=3))
    monkeypatch.setattr(anekit.threads, "cores", lambda: 1)
    one = _tensors(Params.init(cfg, seed=3))
    monkeypatch.setattr(anekit.threads, "cores", lambda: 3)
    three = _tensors(Params.init(cfg, seed=3))
    assert many.keys() == one.keys() == three.keys()
    for name in many:
        np.testing.assert_array_equal(many[name], one[name], err_msg=name)
        np.testing.assert_array_equal(many[name], three[name], err_msg=name)
    other = Params.init(cfg, seed=4)
    assert not np.array_equal(other.embed, many["embed"])


def test_the_values_follow_llama2c_initialisation() -> None:
    cfg = preset("stories15M")
    p = Params.init(cfg, seed=0, tied=False)
    assert p.wcls is not None and p.embed.size > 8 * INIT_PIECE  # the embedding spans several pieces
    out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
    for name, a in p.tensors():
        assert a.dtype == np.float32, name
        if "rms" in name:
            assert np.all(a == 1), name
            continue
        std = out_std if name.endswith(("wo", "w2")) else 0.02
        # the sample mean and standard deviation of n normal values: within 6 standard errors
        n = a.size
        assert abs(float(a.mean(dtype=np.float64))) < 6 * std / math.sqrt(n), name
        assert abs(float(a.std(dtype=np.float64)) / std - 1) < 6 / math.sqrt(2 * n), name
    # the pieces are independent streams: no two blocks of the embedding repeat each other
    rows = INIT_PIECE // cfg.dim
    assert not np.array_equal(p.embed[:rows], p.embed[rows : 2 * rows])
    assert not np.array_equal(p.embed, p.wcls)
