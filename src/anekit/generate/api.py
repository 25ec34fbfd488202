"""Generation from Python: a generator object that yields tokens one at a time, holds its cache, and can be
continued.

    gen = Generator(decoder, tokenizer, temperature=0.8, top_p=0.9, seed=42)
    gen.feed("Once upon a time")          # the prefill: the prompt's keys and values go into the cache
    for token in itertools.islice(gen, 20):   # token ids, sampled one at a time
        print(gen.decode([token]), end="")
    gen.feed(" and then")                 # continue: only the new positions run, the cache is kept
    text = "".join(gen.pieces(max_tokens=20))  # or text pieces, as ``anekit sample`` prints them
    gen.reset()                           # a new sequence from position 0

Iteration yields token ids (``pieces`` yields text). Each sampled token is run through the decoder only
when the next one is asked for (or more text is fed), so stopping costs nothing and the cache always holds
exactly the positions run: ``position``. Iteration ends at the tokenizer's end tokens (a llama2.c story
ends at BOS), or when the context is full; a later ``feed`` continues after it (the end token, if any,
goes into the cache first). Any ``Decoder`` of ``anekit.llama.sample`` works (``CpuDecoder``, the
engine's ``EngineDecoder``, a package's); the sampling is ``anekit.llama.sample``'s (run.c's rules, its
random generator), so the same seed gives the same tokens as ``Sampler.generate_ids``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from anekit.errors import AnekitError
from anekit.llama.sample import Decoder, Sampler, TextStream, XorShiftRng, sample_next


class Generator:
    """Tokens from ``decoder`` sampled at ``temperature`` / ``top_p`` (0: greedy), the KV cache kept."""

    def __init__(
        self,
        decoder: Decoder,
        tokenizer: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 0.9,
        seed: int | None = None,
    ) -> None:
        self._sampler = Sampler(decoder, tokenizer)  # the tokenizer's checks, BOS, end tokens, padding
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.reset()

    @property
    def cfg(self) -> Any:
        return self.decoder.cfg

    @property
    def position(self) -> int:
        """Positions in the cache: every token fed or sampled and run."""
        return len(self.ids) - (self._pending is not None)

    def reset(self) -> None:
        """Forget the sequence: the next ``feed`` starts at position 0 (a decoder's own cache reset too)."""
        reset = getattr(self.decoder, "reset", None)
        if callable(reset):
            reset()
        self.ids: list[int] = []  # every token of the sequence: fed, and sampled (the last maybe not run)
        self._pending: int | None = None  # the last token sampled, not yet run through the decoder
        self._logits: np.ndarray | None = None  # (vocab,) after the last position run
        self._fresh = True  # no token sampled since the last feed (a llama2.c story's first is never BOS)
        self._rng = XorShiftRng(self.seed if self.seed is not None else time.time_ns())
        self.stopped = ""  # why the last iteration ended: "eos", "bos", "context" (or "" while it runs)

    def feed(self, prompt: str | Sequence[int], bos: bool | None = None) -> None:
        """Run ``prompt`` (text, or token ids as they are) at the next positions: one prefill forward.

        Text is encoded with BOS first at position 0 (``bos`` says otherwise), never later."""
        if isinstance(prompt, str):
            with_bos = not self.ids if bos is None else bos
            ids = [int(i) for i in self.tokenizer.encode(prompt, with_bos, False)]
        else:
            ids = [int(i) for i in prompt]
        bad = [i for i in ids if not 0 <= i < self.cfg.vocab_size]
        if bad:
            vocab = self.cfg.vocab_size
            raise AnekitError(f"[generate] token {bad[0]} is outside the model's vocab of {vocab}")
        run = ([self._pending] if self._pending is not None else []) + ids
        if not run:
            raise AnekitError("[generate] nothing to feed: give text or token ids")
        self._forward(run)
        self.ids += ids
        self._fresh, self.stopped = True, ""

    def _forward(self, run: list[int]) -> None:
        pos = self.position
        if pos + len(run) > self.cfg.seq_len:
            raise AnekitError(
                f"[generate] {len(run)} more token(s) at position {pos} exceed the model's context of "
                f"{self.cfg.seq_len} (seq_len): reset() to start again"
            )
        self._logits = np.array(self.decoder.forward(run, pos), np.float32)  # (vocab,)
        self._pending = None

    def __iter__(self) -> Generator:
        return self

    def __next__(self) -> int:
        if self._logits is None:
            raise AnekitError("[generate] feed() a prompt before sampling")
        if self._pending is not None:
            if self.position >= self.cfg.seq_len:  # the last token sampled has no slot to run in
                self.stopped = "context"
                raise StopIteration
            self._forward([self._pending])
        if self.stopped:
            raise StopIteration
        logits = self._logits.copy()  # (vocab,)
        s = self._sampler
        if s.decodable is not None:
            logits[s.decodable :] = -np.inf  # padded vocabulary ids the tokenizer cannot decode
        if self._fresh and not s.eos_ids and logits.shape[0] > 1 and 0 <= s.bos_id < logits.shape[0]:
            logits[s.bos_id] = -np.inf  # a llama2.c story's first token is never BOS (Sampler's rule)
        token = sample_next(logits, self.temperature, self.top_p, self._rng)
        self._fresh = False
        self.ids.append(token)
        self._pending = token
        if token in s.eos_ids or (token == s.bos_id and not s.eos_ids):
            self.stopped = "eos" if s.eos_ids else "bos"
            raise StopIteration
        return token

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode([int(i) for i in ids]))

    def pieces(self, max_tokens: int | None = None) -> Iterator[str]:
        """The text of up to ``max_tokens`` more tokens (None: until the end), piece by piece, decoded in
        the context of the sequence so far (a piece's leading space, UTF-8 split over tokens)."""
        stream = TextStream(self.tokenizer.decode, self.ids)
        for n, token in enumerate(self):
            piece = stream.push(token)
            if piece:
                yield piece
            if max_tokens is not None and n + 1 >= max_tokens:
                break
        tail = stream.flush()
        if tail:
            yield tail
