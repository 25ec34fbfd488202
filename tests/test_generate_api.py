"""The Python generation API (``anekit.generate.api.Generator``) against the run.c-checked ``Sampler``: the
same seed gives the same tokens; continuing after a stop runs only the new positions (the cache is kept)
and samples what a fresh run over the whole sequence samples; ``reset`` starts again at position 0."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest

from anekit.errors import AnekitError
from anekit.generate.api import Generator
from anekit.kernels.config import ModelConfig
from anekit.llama.llama2c import Tokenizer, open_llama2c, read_tokenizer_bin
from anekit.llama.params import Params
from anekit.llama.sample import CpuDecoder, Sampler
from tests.conftest import corpus_path

CFG = ModelConfig(64, 96, 2, 4, 2, 64, 48, name="tiny")
FP16_GAP = 0.1  # above the largest logit error the simulated kernels showed on stories260K (0.09)


class Ids:
    """Prompts are space-separated ids; id i decodes to "<i>". BOS is 1, as in llama2.c."""

    bos_id = 1
    vocab_size = CFG.vocab_size

    def encode(self, text: str, bos: bool, eos: bool) -> list[int]:
        return [1] * bos + [int(t) for t in text.split()]

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


class Spy:
    """A decoder that records every forward call's (tokens, pos) and passes it on."""

    def __init__(self, inner: CpuDecoder) -> None:
        self.inner = inner
        self.cfg = inner.cfg
        self.calls: list[tuple[list[int], int]] = []

    def forward(self, tokens: Sequence[int] | np.ndarray, pos: int) -> np.ndarray:
        self.calls.append(([int(t) for t in tokens], pos))
        return self.inner.forward(tokens, pos)


@pytest.fixture(scope="module")
def params() -> Params:
    return Params.init(CFG, seed=3)


@pytest.mark.parametrize(("temperature", "top_p", "seed"), [(0.0, 0.9, 0), (1.0, 0.9, 7), (0.8, 1.0, 11)])
def test_the_same_seed_samples_the_samplers_tokens(
    params: Params, temperature: float, top_p: float, seed: int
):
    prompt = [1, 5, 6, 7]
    ref = list(Sampler(params, Ids()).generate_ids(prompt, 0, temperature, top_p, seed))[len(prompt) - 1 :]
    gen = Generator(CpuDecoder(params), Ids(), temperature=temperature, top_p=top_p, seed=seed)
    gen.feed("5 6 7")
    assert list(gen) == ref
    assert gen.stopped in ("context", "bos")


def test_stories260k_samples_the_samplers_text():
    model = open_llama2c(corpus_path("llama2c", "stories260K.bin")).params
    full = read_tokenizer_bin(corpus_path("llama2c", "tokenizer.bin"))
    tok = Tokenizer(full.vocab[:512], full.scores[:512])  # stories260K's 512 ids: llama2's first pieces
    sampler = Sampler(model, tok)
    ids = sampler.encode("Once upon a time")
    ref = list(itertools.islice(sampler.generate_ids(ids, 0, 1.0, 0.9, 42), len(ids) - 1, len(ids) + 39))
    gen = Generator(CpuDecoder(model), tok, temperature=1.0, top_p=0.9, seed=42)
    gen.feed(ids)
    assert list(itertools.islice(gen, 40)) == ref


def test_continuing_runs_only_the_new_positions_and_keeps_the_cache(params: Params):
    spy = Spy(CpuDecoder(params))
    gen = Generator(spy, Ids(), temperature=0.0)
    gen.feed("5 6 7")
    first = list(itertools.islice(gen, 4))  # stop after 4: the 4th is sampled, not run yet
    assert gen.position == 4 + 3
    gen.feed("9 10")
    more = list(itertools.islice(gen, 4))
    positions = [pos for _, pos in spy.calls]
    expected = list(itertools.accumulate((len(t) for t, _ in spy.calls[:-1]), initial=0))
    assert positions == expected  # each call starts where the last one ended: nothing recomputed
    assert spy.calls[0] == ([1, 5, 6, 7], 0)
    assert spy.calls[4] == ([first[3], 9, 10], 7)  # the pending sampled token goes in with the new text
    # A fresh greedy run over the whole sequence samples the same continuation.
    whole = [1, 5, 6, 7, *first, 9, 10]
    ref = list(Sampler(params, Ids()).generate_ids(whole, 0, 0.0))[len(whole) - 1 :][:4]
    assert more == ref


def test_reset_starts_again_at_position_zero(params: Params):
    spy = Spy(CpuDecoder(params))
    gen = Generator(spy, Ids(), temperature=1.0, top_p=0.9, seed=5)
    gen.feed("5 6")
    once = list(itertools.islice(gen, 6))
    gen.reset()
    assert gen.position == 0 and gen.ids == []
    gen.feed("5 6")
    assert spy.calls[-1] == ([1, 5, 6], 0)
    assert list(itertools.islice(gen, 6)) == once  # the seed restarts with the sequence


def test_the_context_ends_iteration_and_a_feed_past_it_is_refused(params: Params):
    gen = Generator(CpuDecoder(params), Ids(), temperature=0.0)
    gen.feed(list(range(1, 41)))
    tokens = list(gen)
    assert gen.stopped == "context" and len(tokens) == CFG.seq_len - 40 + 1  # the last has no slot to run
    with pytest.raises(AnekitError, match=r"exceed the model's context of 48"):
        gen.feed("5")
    with pytest.raises(AnekitError, match="feed"):
        next(iter(Generator(CpuDecoder(params), Ids())))


def test_pieces_are_the_samplers_text(params: Params):
    sampler = Sampler(params, Ids())
    ref = "".join(sampler.generate("5 6", 12, 1.0, 0.9, seed=3))  # the prompt echoed, 10 sampled tokens
    gen = Generator(CpuDecoder(params), Ids(), temperature=1.0, top_p=0.9, seed=3)
    gen.feed("5 6")
    assert "<5><6>" + "".join(gen.pieces(max_tokens=10)) == ref


def test_a_story_never_starts_with_bos_ends_at_one_and_continues_after_it():
    params = Params.init(CFG, seed=4, tied=False)
    assert params.wcls is not None
    params.embed[:] = 1.0  # every position's logits are the row sums of wcls: BOS's the largest
    for layer in params.layers:
        layer.wo[:] = 0.0
        layer.w2[:] = 0.0
    params.wcls[:] = 0.0
    params.wcls[1] = 2.0
    params.wcls[9] = 1.0
    ref = list(Sampler(params, Ids()).generate_ids([1], 0, 0.0))
    assert ref == [9]  # " 9" first (BOS is masked), then BOS: the end of the story
    gen = Generator(CpuDecoder(params), Ids(), temperature=0.0)
    gen.feed([1])
    assert list(gen) == ref and gen.stopped == "bos"
    gen.feed("9")  # the BOS that ended the story goes into the cache first
    assert gen.ids == [1, 9, 1, 9] and gen.position == 4
    assert list(gen) == [9] and gen.stopped == "bos"


def test_the_engine_decoder_continues_as_the_cpu_does():
    """The simulator's generation kernels (m1's route) under the Generator: greedy from BOS, stopped and
    continued, the CPU's tokens wherever the CPU's top-2 logit gap exceeds the fp16 error (at most 0.09
    measured over 100 positions from BOS: a gap under FP16_GAP may pick either token, and the runs part)."""
    from anekit.generate.engine import make_engine_decoder

    model = open_llama2c(corpus_path("llama2c", "stories260K.bin")).params
    full = read_tokenizer_bin(corpus_path("llama2c", "tokenizer.bin"))
    tok = Tokenizer(full.vocab[:512], full.scores[:512])
    runs = []
    for decoder in (CpuDecoder(model), make_engine_decoder(model, "sim", "m1")):
        gen = Generator(decoder, tok, temperature=0.0)
        gen.feed([1])
        first = list(itertools.islice(gen, 12))
        gen.feed(first[-1:])  # the last token again, as text fed after a stop would be
        runs.append(first + list(itertools.islice(gen, 20)))
    cpu = runs[0]
    sequence = [1, *cpu[:12], cpu[11], *cpu[12:-1]]  # every position run, in order
    logits = CpuDecoder(model).forward_all(sequence, 0)  # (vocab, T): one causal forward, no cache reuse
    at = [*range(12), *range(13, 13 + len(cpu) - 12)]  # the position whose logits chose each token
    top2 = np.sort(logits[:, at], axis=0)[-2:]  # (2, tokens)
    assert [int(t) for t in np.argmax(logits[:, at], axis=0)] == cpu  # the CPU's tokens are its argmax
    gaps = top2[1] - top2[0]
    parted = next((j for j, (a, b) in enumerate(zip(*runs)) if a != b), len(cpu))
    assert parted == len(cpu) or gaps[parted] < FP16_GAP, (parted, gaps[parted])  # only at a near tie
    assert parted > 13  # the runs agree past the continuation (they part at 21, a gap of 0.022)
