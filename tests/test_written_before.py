"""Files written by anekit before the model families moved into ``anekit.models`` (commit c497994) still
load, and give what that version computed from them.

``tests/data/written_before/`` was written by that version: a BLZT checkpoint of a tiny model with Adam
moments and training state (``tiny.ckpt``, no run record), its CoreML export (``tiny.mlpackage``), a Qwen
3-shaped Hugging Face model (``qwen/``) and the PEFT adapters a 2-step LoRA run trained on it
(``adapters/``; its ``base_model_name_or_path`` rewritten to the relative "qwen"). ``expected.npz`` holds
what that version computed: the checkpoint's logits (CPU forward), the package's prefill logits (the
simulator), and the logits of the model fused with the adapters (``anekit fuse``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from anekit.coreml import open_session
from anekit.hf.adapters import fuse, read_adapters
from anekit.hf.model import load_model
from anekit.llama import checkpoint
from anekit.llama.sample import forward_logits
from anekit.models.config import ModelConfig

DATA = Path(__file__).parent / "data" / "written_before"
EXPECTED = np.load(DATA / "expected.npz")
TOKENS = [int(t) for t in EXPECTED["tokens"]]
TINY = ModelConfig(16, 32, 2, 2, 2, 64, 32, name="tiny")


def test_a_blzt_checkpoint_loads_with_its_moments_and_state_and_gives_the_same_logits() -> None:
    params, m, v, meta = checkpoint.load_checkpoint(DATA / "tiny.ckpt", TINY)
    assert (meta.step, meta.total_steps, meta.adam_t, meta.cum_batches) == (7, 10, 7, 7)
    assert np.float32(meta.lr) == np.float32(3e-4) and np.float32(meta.loss) == np.float32(2.5)
    for i, ((_, a), (_, b)) in enumerate(zip(m.tensors(), v.tensors())):
        assert np.all(a == np.float32(0.01 * (i + 1))) and np.all(b == np.float32(0.001 * (i + 1)))
    # The same float32 values, up to the last bits of a BLAS sum: OpenBLAS picks its kernels by CPU, and the
    # expected values come from another CPU kind (on an AMD EPYC: at most 2e-5 relative, in the last bits).
    np.testing.assert_allclose(forward_logits(params, TOKENS), EXPECTED["tiny"], rtol=1e-4, atol=0)


def test_a_coreml_package_runs_its_prefill_as_it_did() -> None:
    t = np.zeros((1, 1, TINY.seq_len, 1), np.int32)
    t[0, 0, : len(TOKENS), 0] = TOKENS
    last = np.array([[[[len(TOKENS) - 1]]]], np.int32)
    with open_session(DATA / "tiny.mlpackage") as session:
        got = session.run("prefill", tokens=t, last=last)["logits"]
    # That version computed with the simulator's engine numerics before the MAC's first stage was refitted
    # to the ane-guide's survivor sweep (each 4-lane tile truncated to fp16 on the conservative profile:
    # ``mac.first-stage``); the package loads and runs the same program, within what the refit moved
    # (at most 0.0015 on logits of |0.01 .. 0.1|, measured).
    np.testing.assert_allclose(got, EXPECTED["package"], rtol=0, atol=2e-3)
    assert np.argmax(got) == np.argmax(EXPECTED["package"])


def test_peft_adapters_read_and_fuse_to_the_same_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("tokenizers")
    base = load_model(DATA / "qwen")
    adapters = read_adapters(DATA / "adapters", base.cfg)
    assert adapters.spec.rank == 2 and adapters.spec.targets == ("q", "v")
    assert main(["fuse", str(DATA / "qwen"), str(DATA / "adapters"), str(tmp_path / "fused")]) == 0
    capsys.readouterr()
    fused = load_model(tmp_path / "fused").params  # stored in the model's bf16, as that version stored it
    np.testing.assert_allclose(
        forward_logits(fused, TOKENS), EXPECTED["fused"], rtol=1e-4, atol=1e-6
    )  # as above
    unrounded = forward_logits(fuse(base.params, adapters), TOKENS)  # the float32 fusion, before bf16
    np.testing.assert_allclose(unrounded, EXPECTED["fused"], rtol=0, atol=1e-2)
