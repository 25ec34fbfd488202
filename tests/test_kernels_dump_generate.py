"""``anekit kernels dump --config MODEL --generate``: the decode and prefill kernels of the generation plan as
files (MIL text, weight files, an index naming the route, widths, capacities and what each kernel holds)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from anekit import mil
from anekit.cli.main import main
from anekit.kernels import preset
from anekit.llama.params import Params
from anekit.runtime.sim import SimBackend
from anekit.tools.weights import weight_map


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _run_from_folder(folder, **inputs):
    """The kernel in ``folder`` (model.mil + weights/) run in the simulator, as ``anekit run`` does."""
    prog = mil.parse((folder / "model.mil").read_text())
    return SimBackend().compile(prog, weight_map(None, prog, folder))(**inputs)


def _rmsnorm_logits(x, rms, wcls, eps=1e-5):
    """float64 reference of a head tile: wcls @ (x / rms(x) * rms) over columns x (dim, n)."""
    x = x.astype(np.float64)
    xn = x / np.sqrt(np.mean(x * x, axis=0, keepdims=True) + eps) * rms.astype(np.float64)[:, None]
    return wcls.astype(np.float64) @ xn


def test_generate_dump_writes_the_plan_s_decode_and_prefill_kernels(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["kernels", "dump", "--config", "stories260K", "--generate", str(out)]) == 0
    printed = capsys.readouterr().out
    index = json.loads((out / "kernels.json").read_text())
    cfg = preset("stories260K")  # 5 layers, 512 tokens, a context of 512
    assert index["config"] == "stories260K" and index["generate"] is True
    assert index["route"]["id"] == "legacy" and index["route"]["chip"] == "any"
    assert (index["decode_width"], index["prefill_width"]) == (32, 128)
    # the softmax axis (cache slots + the chunk) is a power of two: 1024 - 32, 1024 - 128
    assert index["capacity"] == _pow2_at_least(cfg.seq_len + 32) - 32 == 992
    assert index["prefill_capacity"] == _pow2_at_least(cfg.seq_len + 128) - 128 == 896
    assert index["groups"] == [[0, 5]] and index["tiles"] == [[0, 512]]
    names = ["gen_layers_0_5_w32", "gen_head_0_512_w32", "gen_layers_0_5_w128", "gen_head_0_512_w128"]
    assert list(index["kernels"]) == names
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "kernels.json"])
    decode, prefill = index["kernels"]["gen_layers_0_5_w32"], index["kernels"]["gen_layers_0_5_w128"]
    assert decode["phases"] == ["decode"] and prefill["phases"] == ["prefill"]
    assert decode["holds"] == {"layers": [0, 5]} and index["kernels"]["gen_head_0_512_w32"]["holds"] == {
        "vocab": [0, 512]
    }
    assert "generation route of any under every macOS: legacy" in printed
    assert "wrote 4 kernels of stories260K" in printed
    assert (
        "decode width 32 (cache 992 slots), prefill width 128 (cache 896 slots); 1 layer group, 1 " in printed
    )
    # Every program parses and verifies; its inputs and output are the shapes the index gives.
    files = sorted(str(p) for p in out.glob("*/model.mil"))
    assert main(["mil", "check", *files]) == 0
    assert capsys.readouterr().out.count(": ok,") == 4
    for name, rec in index["kernels"].items():
        prog = mil.parse((out / name / "model.mil").read_text())
        fn = prog.main
        shapes = {v.name: list(v.type.shape) for v in fn.inputs}
        assert shapes == {n: [1, s["channels"], 1, s["spatial"]] for n, s in rec["inputs"].items()}, name
        (y,) = fn.outputs
        assert list(y.type.shape) == [1, rec["output"]["channels"], 1, rec["output"]["spatial"]]
        assert rec["ops"] == prog.op_count() > 0
    kv = cfg.dim * cfg.n_kv_heads // cfg.n_heads
    assert decode["inputs"]["cache"]["channels"] == 2 * 5 * kv and decode["inputs"]["cache"]["spatial"] == 992
    assert decode["output"]["channels"] == cfg.dim + 2 * 5 * kv


def test_the_dumped_head_holds_the_model_s_own_weights(tmp_path):
    """The head tile run from its folder computes the final RMSNorm and the classifier of the preset's
    random weights (``--seed``), against a float64 reference of those weights."""
    out = tmp_path / "g"
    assert main(["kernels", "dump", "--config", "stories260K", "--generate", "--seed", "3", str(out)]) == 0
    params = Params.init(preset("stories260K"), 3)
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    got = _run_from_folder(out / "gen_head_0_512_w32", x=x.reshape(1, 64, 1, 32))["out"][0, :, 0, :]
    want = _rmsnorm_logits(x.astype(np.float16), params.rms_final, params.classifier.astype(np.float16))
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), np.abs(got - want).max()
    other = Params.init(preset("stories260K"), 4)  # another seed's weights do not fit
    assert (
        np.abs(got - _rmsnorm_logits(x, other.rms_final, other.classifier)).max() > 0.1 * np.abs(want).max()
    )


QWEN3_SMALL = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    vocab_size=512, num_hidden_layers=2,
)  # fmt: skip


@pytest.mark.parametrize(
    "shape, overrides, classifier, eps",
    [
        ("tiny_llama2c", {"num_hidden_layers": 2}, "lm_head.weight", 1e-5),
        ("qwen3", QWEN3_SMALL, "model.embed_tokens.weight", 1e-6),  # tied: the embedding classifies
    ],
)
def test_generate_dump_of_a_hugging_face_model_uses_its_weights(tmp_path, shape, overrides, classifier, eps):
    """The head tile of a Hugging Face model's dump computes its final norm and classifier (a float64
    reference of the checkpoint's own tensors); the layers are in one fused kernel."""
    from tests.hf_fixtures import make_checkpoint, small

    model = tmp_path / "hf"
    tensors = make_checkpoint(model, small(shape, **overrides), dtype="float32", seed=1)
    out = tmp_path / "g"
    assert main(["kernels", "dump", "--config", str(model), "--generate", str(out)]) == 0
    index = json.loads((out / "kernels.json").read_text())
    assert index["groups"] == [[0, 2]] and index["tiles"] == [[0, 512]]
    head = next(n for n, r in index["kernels"].items() if r["holds"] == {"vocab": [0, 512]})
    x = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    got = _run_from_folder(out / head, x=x.reshape(1, 64, 1, 32))["out"][0, :, 0, :]
    want = _rmsnorm_logits(x, tensors["model.norm.weight"], tensors[classifier], eps)
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    for name in index["kernels"]:
        mil.verify(mil.parse((out / name / "model.mil").read_text()))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dynamic"], "[kernels] --dynamic does not apply with --generate"),
        (["--macos", "26"], "[kernels] --macos applies with --chip only"),
    ],
)
def test_generate_dump_refuses_options_that_do_not_apply(tmp_path, capsys, argv, message):
    out = tmp_path / "g"
    assert main(["kernels", "dump", "--config", "stories260K", "--generate", *argv, str(out)]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_generate_dump_refuses_to_overwrite_and_replaces_a_previous_dump_with_force(tmp_path, capsys):
    out = tmp_path / "g"
    out.mkdir()
    assert main(["kernels", "dump", "--config", "stories260K", "--generate", str(out)]) == 1
    assert "exists (use --force" in capsys.readouterr().err
    out.rmdir()
    assert main(["kernels", "dump", "--config", "stories260K", str(out)]) == 0  # a training dump
    assert main(["kernels", "dump", "--config", "stories260K", "--generate", "--force", str(out)]) == 0
    assert json.loads((out / "kernels.json").read_text())["generate"] is True
    assert not (out / "ffn_fwd").exists()


@pytest.mark.parametrize("chip, macos", [("m1", ""), ("m3", "15"), ("m3", "26"), ("m5", "")])
def test_generate_dump_of_a_chip_holds_its_route_s_kernels_for_every_layer_and_token(tmp_path, chip, macos):
    """The index names the chip's generation route; each phase's kernels hold every layer once and every
    vocabulary token once, whatever the route cuts them into (fused layers, one block a kernel, the conv
    route's three kernels a layer); every program parses and verifies."""
    from anekit.engine.generation_routes import generation_route

    out = tmp_path / "g"
    argv = ["kernels", "dump", "--config", "stories260K", "--generate", "--chip", chip]
    assert main([*argv, *(["--macos", macos] if macos else []), str(out)]) == 0
    index = json.loads((out / "kernels.json").read_text())
    route = generation_route(chip, macos)
    assert (index["route"]["id"], index["route"]["chip"], index["route"]["macos"]) == (route.id, chip, macos)
    for phase in ("decode", "prefill"):
        kernels = {n: r for n, r in index["kernels"].items() if phase in r["phases"]}
        layers: list[int] = []
        blocks: dict[int, list[str]] = {}
        tokens: list[int] = []
        for r in kernels.values():
            holds = r["holds"]
            if "layers" in holds:
                layers += range(*holds["layers"])
            elif "layer" in holds:
                blocks.setdefault(holds["layer"], []).append(holds["block"])
            else:
                tokens += range(*holds["vocab"])
        assert sorted(layers + list(blocks)) == list(range(5)), (phase, layers, blocks)
        assert len({tuple(b) for b in blocks.values()}) <= 1  # every layer cut the same way
        assert sorted(tokens) == list(range(512)), phase
    for name in index["kernels"]:
        mil.verify(mil.parse((out / name / "model.mil").read_text()))
