"""A BOS sampled first does not end generation before it starts: the first token is drawn from the other
tokens, a later BOS ends the story as in run.c, and ``anekit sample`` says on stderr why it stopped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from anekit.kernels.config import ModelConfig
from anekit.llama.llama2c import Tokenizer, write_llama2c, write_tokenizer_bin
from anekit.llama.params import Params
from anekit.llama.sample import Sampler

CFG = ModelConfig(8, 16, 1, 2, 2, 10, 16, name="bos-first")
# "a b" encodes as BOS, " a", " b": the dummy-prefix space and each letter, merged into the pieces 7, 8.
PIECES = [b"<unk>", b"\n<s>\n", b"\n</s>\n", b" ", b"a", b" hello", b"b", b" a", b" b", b"c"]


def bos_first_model() -> Params:
    """A model whose logits are the same after every token, BOS (16) above " hello" (8) above the rest (0).

    The layers add nothing (wo and w2 are zero), every embedding row is ones, and rmsnorm(ones) is ones,
    so the logits are the row sums of wcls."""
    params = Params.init(CFG, seed=0, tied=False)
    for layer in params.layers:
        layer.wo[:] = 0.0
        layer.w2[:] = 0.0
    params.embed[:] = 1.0
    assert params.wcls is not None
    params.wcls[:] = 0.0
    params.wcls[1] = 2.0  # BOS: 2 * dim
    params.wcls[5] = 1.0  # " hello": dim
    return params


class Ids:
    """Prompts are space-separated ids; id i decodes to "<i>"."""

    bos_id = 1
    vocab_size = CFG.vocab_size

    def encode(self, text: str, bos: bool, eos: bool) -> list[int]:
        return [1] * bos + [int(t) for t in text.split()]

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


def test_the_first_token_is_never_bos_and_a_later_bos_ends_the_story():
    sampler = Sampler(bos_first_model(), Ids())
    logits = sampler.decoder.forward([1], 0)
    assert int(np.argmax(logits)) == 1 and logits[1] - logits[5] == pytest.approx(8.0, abs=1e-4)
    for temperature in (0.0, 1.0):
        ids = list(sampler.generate_ids([1], 10, temperature=temperature, top_p=1.0, seed=5))
        assert ids == [5], temperature  # " hello" (BOS is masked first), then BOS: the end of the story
        assert sampler.stats.generated_tokens == 1 and sampler.stats.stop == "bos"


def test_why_generation_stopped():
    sampler = Sampler(Params.init(CFG, seed=1), Ids())
    assert list(sampler.generate_ids([1, 3, 4], 1, temperature=0.0)) == [3]
    assert sampler.stats.stop == "prompt" and sampler.stats.generated_tokens == 0
    list(sampler.generate_ids([1], 4, temperature=0.0))
    assert sampler.stats.stop in ("steps", "bos")
    long = list(sampler.generate_ids([1], 0, temperature=0.0))  # 0: the model's whole context
    assert sampler.stats.stop == "bos" or (sampler.stats.stop == "context" and len(long) == CFG.seq_len)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    write_llama2c(tmp_path / "model.bin", bos_first_model())
    write_tokenizer_bin(tmp_path / "tokenizer.bin", Tokenizer(PIECES, [0.0] * len(PIECES)))
    return tmp_path


def test_cli_prints_the_first_token_and_says_it_stopped_at_bos(model_dir, capsys):
    for temperature in ("0", "1"):
        rc = main(["sample", str(model_dir / "model.bin"), "--temperature", temperature, "--seed", "2"])
        out, err = capsys.readouterr()
        assert rc == 0, err
        assert out.strip() == "hello"
        assert err.startswith("1 token generated, 2 positions in ") and err.count("\n") == 1, err
        assert err.rstrip().endswith("tokens/s; stopped at a BOS token, the end of a story"), err


def test_cli_says_when_the_prompt_fills_the_steps(model_dir, capsys):
    rc = main(["sample", str(model_dir / "model.bin"), "--prompt", "a b", "--steps", "2"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip() == "a b"
    assert "0 tokens generated" in err
    assert "nothing sampled: the prompt's 3 tokens (BOS included) fill --steps 2; raise --steps" in err


def test_cli_says_it_stopped_at_the_steps_asked_for(model_dir, capsys):
    rc = main(["sample", str(model_dir / "model.bin"), "--prompt", "a", "--steps", "2", "--temperature", "0"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip() == "a hello"  # BOS, " a" forced; " hello" sampled at the last position
    assert "1 token generated, 2 positions" in err and "stopped after --steps 2 positions" in err
