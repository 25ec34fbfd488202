"""Gemma 3 in the kernel tools: ``anekit kernels dump --config`` of a Gemma 3 model directory holds its
sliding layers' kernels beside the full ones, ``anekit lint`` of that dump is clean for every chip, and
the cost model (``anekit cost --config``) prices each layer kind's attention kernels over the layers of
that kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import anekit.hf.model as hf_model
from anekit.cli.main import main
from anekit.cost import step_kernels
from anekit.hf.config import parse_config
from anekit.kernels import catalog
from anekit.llama import Params
from anekit.rules import CHIPS
from anekit.tools.dump import dump_names

# A tiny Gemma3ForCausalLM: two sliding layers (window 16) and a full one, q_dim 128 != dim 64.
CONFIG = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "vocab_size": 96,
    "max_position_embeddings": 64,
    "query_pre_attn_scalar": 32,
    "sliding_window": 16,
    "rope_theta": 1e6,
    "rope_local_base_freq": 1e4,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "torch_dtype": "float32",
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
}
CFG = parse_config(CONFIG, name="gemma", seq_len=64).cfg
TRAINED = [*catalog.DYNAMIC_KERNELS, *catalog.DYNAMIC_HELPERS, "sdpa_bwd2"]  # what a model dir's dump holds
SLIDING = [f"{n}_sliding" for n in TRAINED if n in catalog.BY_KIND]


@pytest.fixture
def gemma_dir(tmp_path: Path) -> Path:
    """The tiny model as a Hugging Face directory (config.json + model.safetensors)."""
    hc = parse_config(CONFIG, name="gemma", seq_len=64)
    params = Params.init(hc.cfg, seed=3, tied=True)
    out = tmp_path / "gemma"
    hf_model.write_model(params, out, source=hf_model.HFModel(params, hc, tmp_path / "none"))
    return out


def test_a_model_dirs_dump_names_each_kinds_attention_kernels(gemma_dir):
    names = dump_names(str(gemma_dir), CFG)
    assert SLIDING == [
        "sdpa_fwd_dynamic_sliding",
        "sdpa_bwd1_weightless_sliding",
        "sdpa_bwd2_sliding",
    ]
    assert [n for n in names if n.endswith("_sliding")] == SLIDING
    assert [n for n in names if not n.endswith("_sliding")] == TRAINED
    # a model of full layers only: the names as they always were
    assert dump_names(str(gemma_dir), CFG.with_(layer_types=(), sliding_window=0)) == TRAINED
    # a preset's dump (every kernel, and asked, the dynamic ones) takes the kinds of the config it is given
    every = [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS, *catalog.DYNAMIC_KERNELS]
    assert dump_names("stories260K", CFG, dynamic=True) == catalog.with_kinds(CFG, every)


def test_kernels_dump_of_a_gemma_dir_holds_the_sliding_kernels_and_lints_clean(gemma_dir, tmp_path, capsys):
    out = tmp_path / "dump"
    assert main(["kernels", "dump", "--config", str(gemma_dir), str(out)]) == 0
    index = json.loads((out / "kernels.json").read_text())
    assert set(index["kernels"]) == {*TRAINED, *SLIDING}
    assert f"wrote {len(TRAINED) + len(SLIDING)} kernels" in capsys.readouterr().out
    full = (out / "sdpa_fwd_dynamic" / "weights").iterdir()
    sliding = (out / "sdpa_fwd_dynamic_sliding" / "weights").iterdir()
    assert "mask.bin" in {p.name for p in full} and "mask_window16.bin" in {p.name for p in sliding}
    for target in ("any", *CHIPS):
        assert main(["lint", str(out), "--errors-only", "--chip", target]) == 0, target
        assert f"{len(TRAINED) + len(SLIDING)} programs: 0 errors" in capsys.readouterr().out, target
    # the cost model reads the dump back: one row per program, the sliding ones included
    assert main(["cost", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["kernels"]
    assert {r["name"] for r in rows} >= set(SLIDING)


@pytest.mark.parametrize("weights", ["baked", "dynamic"])
def test_the_step_prices_each_kinds_kernels_over_its_layers(weights):
    kernels = step_kernels(CFG, weights)
    calls = {k.work.name: k.calls for k in kernels}
    attention = ["sdpa_fwd_dynamic" if weights == "dynamic" else "sdpa_fwd", "sdpa_bwd1", "sdpa_bwd2"]
    for name in attention:
        assert calls[name] == 1 and calls[f"{name}_sliding"] == 2, name  # one full layer, two sliding
    others = {n: c for n, c in calls.items() if n not in attention and not n.endswith("_sliding")}
    assert others and all(c == 3 for c in others.values()), others  # every layer runs the same program
    assert sum(calls.values()) == (6 if weights == "baked" else 8) * CFG.n_layers
    for k in kernels:
        if k.work.name.endswith("_sliding"):
            assert k.layers == 2 and k.kind == "attention"


def test_cost_config_of_a_gemma_dir_names_the_sliding_kernels(gemma_dir, capsys):
    for weights, first in (("baked", "sdpa_fwd"), ("dynamic", "sdpa_fwd_dynamic")):
        assert main(["cost", "--config", str(gemma_dir), "--weights", weights, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        calls = {r["name"]: r["calls"] for r in doc["kernels"]}
        assert calls[first] == 1 and calls[f"{first}_sliding"] == 2, weights
        assert calls["sdpa_bwd2"] == 1 and calls["sdpa_bwd2_sliding"] == 2, weights
        assert sum(calls.values()) == (6 if weights == "baked" else 8) * 3
        assert doc["engine_ms"] > 0
    assert main(["cost", "--config", str(gemma_dir)]) == 0
    assert "sdpa_fwd_sliding" in capsys.readouterr().out
