"""Text generation on the CPU: the model's forward with a KV cache, and run.c's samplers, in float32 numpy.

The forward is the model family's layer (``anekit.models``) lowered to numpy (``anekit.llama.cpu_forward``
``CpuDecoder``): for a Llama model what run.c's ``forward()`` computes, for Qwen and Gemma 3 what their
family files state. It runs a single decode step (T = 1, run.c's case) or a whole prompt at once (the
prefill), both reading and writing the same cache.

Sampling follows run.c's ``sample()``: temperature 0 is argmax; otherwise softmax(logits / temperature)
and one coin from run.c's xorshift* generator, spent on plain multinomial sampling (top_p <= 0 or >= 1)
or on nucleus sampling. Same seed, same coins as run.c, so the same model samples the same text as
run.c up to float rounding. Where the time goes: the matrix-vector products of each decode step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from anekit import addrspace
from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig
from anekit.llama.cpu_forward import (
    TOO_LARGE,
    CpuDecoder,
    check_norm_input,
    rope_table,
)
from anekit.llama.params import Params
from anekit.models import Rope

__all__ = ["TOO_LARGE", "CpuDecoder", "Decoder", "Sampler", "forward_logits", "make_decoder", "rope_tables"]

BOS_ID = 1  # llama2.c's sentencepiece vocabulary: <unk> 0, <s> 1, </s> 2
_MASK64 = (1 << 64) - 1
_SEED_ZERO_STATE = 0x9E3779B97F4A7C15  # the state seed 0 maps to (any odd constant)


# -- the forward: the model's family lowered to numpy (anekit.llama.cpu_forward) ------------------------


def rope_tables(cfg: ModelConfig, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (head_dim / 2, n_pos) of RoPE's angles at ``rope_theta`` (Llama 3's scaling applied
    where the model has it), in float32 arithmetic as run.c computes them (``cpu_forward.rope_table``)."""
    return rope_table(Rope(cfg.rope_theta, cfg.rope_scaling), cfg.head_dim, n_pos)


class DecoderShape(Protocol):
    """What the sampler reads of a decoder's model: a ModelConfig, or an exported package's shape."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def seq_len(self) -> int: ...


class Decoder(Protocol):
    """What the sampler drives: a forward that caches keys and values by position."""

    @property
    def cfg(self) -> DecoderShape: ...

    def forward(self, tokens: Sequence[int] | np.ndarray, pos: int) -> np.ndarray:
        """Run tokens at positions pos, pos+1, ...; logits (vocab,) of the last one."""
        ...


def sampling_need(params: Params, positions: int, prompt_tokens: int = 1) -> tuple[int, str]:
    """The address space a ``CpuDecoder`` generation of ``positions`` positions (a prompt of
    ``prompt_tokens`` run in one prefill) needs beyond what the process maps now, and its parts in words.

    The KV cache is counted at 1.5 times its final size (growing, the old and the new cache are both held
    for a moment); a model read through windows (``anekit.llama.mapped``) adds its largest tensor, the one
    window mapped at a time; the prefill's activations, attention scores and the logits are added."""
    cfg, t = params.cfg, max(1, prompt_tokens)
    kv = 2 * cfg.n_layers * positions * cfg.kv_dim * 4  # keys and values, float32
    window = getattr(params, "largest_tensor_bytes", lambda: 0)()
    acts = 4 * t * (4 * cfg.dim + 2 * cfg.q_dim + 2 * cfg.kv_dim + 3 * cfg.hidden_dim)  # (C, T) columns
    scores = 4 * 3 * cfg.n_heads * t * positions  # scores, their mask and exp: (heads, T, positions)
    rest = acts + scores + 4 * 4 * cfg.vocab_size + 2 * 4 * cfg.head_dim * positions  # logits, RoPE tables
    growing = addrspace.words(kv + kv // 2)
    parts = f"a KV cache of {addrspace.words(kv)} for {positions} positions, {growing} while it grows"
    if window:
        parts += f", {addrspace.words(window)} for the largest tensor's window"
    return kv + kv // 2 + window + rest, parts + f", {addrspace.words(rest)} of activations"


def check_sampling_memory(params: Params, positions: int, prompt_tokens: int, what: str) -> None:
    """Refuse, in words and before anything is allocated, a generation that cannot fit the address space
    the process may use (``anekit.addrspace``)."""
    need, parts = sampling_need(params, positions, prompt_tokens)
    addrspace.check(need, "sample", what, parts)


_check_norm_input = check_norm_input  # the name tests and older callers know


PRECISIONS: dict[str, Callable[[Params], Decoder]] = {
    # Activations and weights in float32, as run.c. An "fp16" entry (activations rounded as the engine
    # rounds them, e.g. a decoder running the simulator backend's kernels) slots in here.
    "fp32": CpuDecoder,
}


def make_decoder(params: Params, precision: str = "fp32") -> Decoder:
    try:
        factory = PRECISIONS[precision]
    except KeyError:
        raise AnekitError(
            f"[sample] precision {precision!r} is not available (known: {', '.join(PRECISIONS)})"
        ) from None
    return factory(params)


def forward_logits(params: Params, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Logits (vocab, T) at every position of tokens (T,), T <= seq_len, in one causal forward."""
    return CpuDecoder(params).forward_all(tokens, 0)


# -- sampling -------------------------------------------------------------------------------------------


class XorShiftRng:
    """run.c's random generator: xorshift* on a 64-bit state, 24-bit floats in [0, 1).

    The state starts at the seed, as run.c's ``-s``; seed 0 (which run.c replaces by the time, since a
    zero state would stay zero) starts from a fixed constant here, so it is reproducible too.
    """

    def __init__(self, seed: int) -> None:
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise AnekitError(f"[sample] seed must be an integer >= 0, got {seed!r}")
        self.state = (int(seed) & _MASK64) or _SEED_ZERO_STATE

    def u32(self) -> int:
        s = self.state
        s ^= s >> 12
        s ^= (s << 25) & _MASK64
        s ^= s >> 27
        self.state = s
        return ((s * 0x2545F4914F6CDD1D) & _MASK64) >> 32

    def f32(self) -> float:
        return (self.u32() >> 8) / 16777216.0


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities (n,) from logits (n,), max subtracted first."""
    e = np.exp(logits - logits.max())
    return e / e.sum()


def sample_argmax(logits: np.ndarray) -> int:
    """The index of the largest value (the first one on ties, as run.c)."""
    return int(np.argmax(logits))


def sample_mult(probs: np.ndarray, coin: float) -> int:
    """The first index whose cumulative probability exceeds coin in [0, 1) (the last on rounding)."""
    cdf = np.cumsum(probs, dtype=np.float32)  # sequential float32 sums, as run.c's loop
    return min(int(np.searchsorted(cdf, np.float32(coin), side="right")), probs.shape[0] - 1)


def _descending(values: np.ndarray) -> np.ndarray:
    """Positive finite float32 ``values`` sorted, the largest first: one sort of their bit patterns
    inverted (positive floats order as their patterns do; numpy sorts 32-bit integers fastest)."""
    if values.dtype != np.float32:
        return -np.sort(-values)
    return (~np.sort(~values.view(np.uint32))).view(np.float32)


def sample_topp(probs: np.ndarray, topp: float, coin: float) -> int:
    """Nucleus sampling: draw from the smallest most-probable set whose mass exceeds topp, renormalised.

    As run.c: tokens below (1 - topp) / (n - 1) cannot be in the set and are dropped before sorting;
    the set ends at the first token whose running sum exceeds topp; coin scales to the set's mass. The
    candidates are ordered by probability, highest first, ties in token order (a stable sort).

    Only the probabilities are sorted, not the tokens: the running sums depend on the values alone (tied
    tokens add the same value in either order), and the token drawn is then found among the candidates
    of the drawn value: the j-th of them in token order, j its place among its ties. The same token as
    sorting the tokens themselves, in half the time on a 32000-token vocabulary.
    """
    n = probs.shape[0]
    if n == 1:
        return 0
    cutoff = np.float32((1.0 - topp) / (n - 1))
    cand = np.flatnonzero(probs >= cutoff)
    if cand.size == 0:  # only when topp < 1 / n: the set is the single most probable token
        return sample_argmax(probs)
    values = probs[cand]  # (k,) in token order
    ordered = _descending(values)  # (k,) the candidates' probabilities, highest first
    cum = np.cumsum(ordered, dtype=np.float32)
    over = np.flatnonzero(cum > np.float32(topp))
    last = int(over[0]) if over.size else ordered.shape[0] - 1
    r = np.float32(coin) * cum[last]
    i = min(int(np.searchsorted(cum[: last + 1], r, side="right")), last)
    drawn = ordered[i]
    ahead = int(np.count_nonzero(values > drawn))  # candidates sorted before every token of this value
    return int(cand[np.flatnonzero(values == drawn)[i - ahead]])


def sample_next(logits: np.ndarray, temperature: float, top_p: float, rng: XorShiftRng) -> int:
    """run.c's sample(): argmax at temperature 0, else one coin on the tempered softmax."""
    if temperature == 0.0:
        return sample_argmax(logits)
    probs = softmax(logits.astype(np.float32) / np.float32(temperature))  # (vocab,)
    coin = rng.f32()
    if top_p <= 0 or top_p >= 1:
        return sample_mult(probs, coin)
    return sample_topp(probs, top_p, coin)


# -- text -----------------------------------------------------------------------------------------------


class TextStream:
    """Turns a growing token list into the text pieces to print, through any ``decode(ids) -> str``.

    It decodes the whole list each time and yields what is new, so a decoder that strips the leading
    space of the first piece or joins byte tokens into UTF-8 does so exactly as on the full text. A
    decode ending in U+FFFD (an unfinished UTF-8 sequence) is held back until more tokens complete it.
    ``context`` (BOS) is decoded with the tokens but never printed.
    """

    def __init__(self, decode: Callable[[list[int]], str], context: Sequence[int] = ()) -> None:
        self._decode = decode
        self._ids: list[int] = [int(t) for t in context]  # decoded with the rest, never printed
        self._text = decode(list(self._ids)) if self._ids else ""

    def push(self, token: int) -> str:
        self._ids.append(int(token))
        text = self._decode(list(self._ids))
        return "" if text.endswith("\ufffd") else self._take(text)

    def flush(self) -> str:
        return self._take(self._decode(list(self._ids))) if self._ids else ""

    def _take(self, text: str) -> str:
        # Earlier text is normally unchanged; if a decoder rewrote it, print from the first difference.
        start = 0
        limit = min(len(text), len(self._text))
        while start < limit and text[start] == self._text[start]:
            start += 1
        self._text = text
        return text[start:]


@dataclass
class GenerationStats:
    """Counts and wall time of the last generation (forwards and sampling, not tokenizing)."""

    prompt_tokens: int = 0  # the prompt's ids, BOS included
    generated_tokens: int = 0  # sampled ids (prompt ids echoed are not counted)
    positions: int = 0  # forward positions run: prompt plus generated, as run.c's tok/s counts them
    seconds: float = 0.0
    # Why generation ended: "bos" (a sampled BOS, the end of a story), "steps" (the positions asked for),
    # "context" (the model's seq_len), "prompt" (the positions asked for end inside the prompt).
    stop: str = ""

    @property
    def tokens_per_second(self) -> float:
        return self.positions / self.seconds if self.seconds > 0 else 0.0


class Sampler:
    """Generates text from a model and a tokenizer (any object with ``encode(text, bos, eos)`` /
    ``decode(ids)``), as llama2.c's run.c: the prompt is forced, then tokens are sampled until
    ``steps`` positions (prompt included) or a BOS token, which delimits stories. Unlike run.c, the first
    token sampled is never BOS (it is drawn from the other tokens), so output always begins with text
    rather than ending at once."""

    def __init__(self, params: Params | Decoder, tokenizer: Any, precision: str = "fp32") -> None:
        # A Decoder given directly (e.g. an exported package run in the simulator) is used as it is.
        self.decoder = make_decoder(params, precision) if isinstance(params, Params) else params
        self.cfg = self.decoder.cfg
        self.tokenizer = tokenizer
        bos = getattr(tokenizer, "bos_id", BOS_ID)  # a property, or a method as sentencepiece's own
        self.bos_id = int(bos() if callable(bos) else bos)
        size = getattr(tokenizer, "vocab_size", None)
        size = size() if callable(size) else size
        if isinstance(size, int) and size > self.cfg.vocab_size:
            raise AnekitError(
                f"[sample] the tokenizer has {size} tokens but the model's vocab_size is "
                f"{self.cfg.vocab_size}: use the tokenizer the model was trained with"
            )
        # A model whose vocabulary is padded past the tokenizer's never samples ids the tokenizer lacks.
        self.decodable = size if isinstance(size, int) and size < self.cfg.vocab_size else None
        # A Hugging Face tokenizer names its end tokens (``eos_ids``): generation stops at any of them.
        # llama2.c's stories end at BOS instead (run.c), which is what a tokenizer without them gets.
        self.eos_ids = frozenset(int(i) for i in getattr(tokenizer, "eos_ids", ()))
        self.stats = GenerationStats()
        self.pending_text = ""  # after a KeyboardInterrupt in ``generate``: the text the stream held back

    def encode(self, prompt: str, bos: bool = True) -> list[int]:
        """The prompt's ids, BOS first where the tokenizer has one and ``bos``."""
        ids = [int(i) for i in self.tokenizer.encode(prompt, bos, False)]
        if not ids:
            raise AnekitError(
                "[sample] the prompt is no tokens (and the tokenizer adds no BOS): give a --prompt"
                if self.bos_id < 0 or not bos
                else "[sample] the tokenizer returned no tokens for the prompt (expected at least BOS)"
            )
        bad = [i for i in ids if not 0 <= i < self.cfg.vocab_size]
        if bad:
            raise AnekitError(
                f"[sample] prompt token {bad[0]} is outside the model's vocab of {self.cfg.vocab_size}: "
                "the tokenizer does not match the model"
            )
        if len(ids) > self.cfg.seq_len:
            raise AnekitError(
                f"[sample] the prompt is {len(ids)} tokens, longer than the model's context of "
                f"{self.cfg.seq_len} (seq_len)"
            )
        return ids

    def generate_ids(
        self,
        prompt_ids: Sequence[int],
        steps: int,
        temperature: float = 1.0,
        top_p: float = 0.9,
        seed: int | None = None,
    ) -> Iterator[int]:
        """The token ids run.c prints: prompt_ids[1:] (forced), then sampled ones.

        ``steps`` counts positions, the prompt included (0, or more than seq_len, means seq_len). The
        prompt runs in one prefill forward; each sampled token then costs one cached decode step.
        """
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
            raise AnekitError(f"[sample] temperature must be a finite number >= 0, got {temperature!r}")
        if not (isinstance(top_p, (int, float)) and math.isfinite(top_p)):
            raise AnekitError(f"[sample] top_p must be a finite number, got {top_p!r}")
        if steps < 0:
            raise AnekitError(f"[sample] steps must be >= 0 (0 means the model's seq_len), got {steps}")
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise AnekitError("[sample] the prompt must hold at least one token (BOS)")
        context = steps == 0 or steps >= self.cfg.seq_len
        limit = self.cfg.seq_len if context else steps
        rng = XorShiftRng(seed if seed is not None else time.time_ns())
        n = len(ids)
        self.stats = stats = GenerationStats(prompt_tokens=n)
        if limit <= n - 1:  # the steps end inside the prompt: nothing is sampled
            stats.positions, stats.stop = limit, "prompt"
            yield from ids[1 : limit + 1]
            return
        if isinstance(self.decoder, CpuDecoder):  # refused before the cache or a window is allocated
            check_sampling_memory(self.decoder.params, limit, n, f"sampling {limit} positions")
        clock = time.perf_counter
        t0 = clock()
        logits = self.decoder.forward(ids, 0)  # (vocab,) at position n - 1, after the whole prompt
        stats.positions, pos = n, n
        spent = clock() - t0
        yield from ids[1:]  # after the prefill: a model that cannot run prints nothing
        t0 = clock() - spent  # the consumer's time is not counted
        while True:
            if self.decodable is not None:
                logits[self.decodable :] = -np.inf
            first = stats.generated_tokens == 0 and not self.eos_ids  # llama2.c's stories only
            if first and logits.shape[0] > 1 and 0 <= self.bos_id < logits.shape[0]:
                logits[self.bos_id] = -np.inf  # BOS first would end the story before it starts
            token = sample_next(logits, temperature, top_p, rng)
            stats.seconds += clock() - t0
            if token in self.eos_ids:
                stats.stop = "eos"
                return
            if token == self.bos_id and not self.eos_ids:
                stats.stop = "bos"
                return
            stats.generated_tokens += 1
            yield token  # the consumer's time (decoding, printing) is not counted
            if pos >= limit:
                stats.stop = "context" if context else "steps"
                return
            t0 = clock()
            logits = self.decoder.forward([token], pos)  # (vocab,)
            pos += 1
            stats.positions = pos

    def generate(
        self,
        prompt: str,
        steps: int,
        temperature: float = 1.0,
        top_p: float = 0.9,
        seed: int | None = None,
        echo_prompt: bool = True,
        bos: bool = True,
    ) -> Iterator[str]:
        """Text pieces as they are generated; the prompt's text comes first when echo_prompt (as run.c).
        ``bos`` False: the prompt holds its own (a chat template's rendering)."""
        ids = self.encode(prompt, bos)
        # BOS, when the prompt starts with it, is the stream's context: run.c's decode (llama2.c's
        # tokenizer.bin) drops the leading space of the piece right after BOS, and only there.
        stream = TextStream(self.tokenizer.decode, ids[:1] if ids[0] == self.bos_id else ())
        if ids[0] != self.bos_id:  # a tokenizer without BOS: the first prompt token is text too
            piece = stream.push(ids[0])
            if piece and echo_prompt:
                yield piece
        n_forced = len(ids) - 1
        self.pending_text = ""
        try:
            for i, token in enumerate(self.generate_ids(ids, steps, temperature, top_p, seed)):
                piece = stream.push(token)
                if piece and (echo_prompt or i >= n_forced):
                    yield piece
        except KeyboardInterrupt:  # what the stream holds back (an unfinished UTF-8 sequence) is printable
            self.pending_text = stream.flush()
            raise
        tail = stream.flush()
        if tail:
            yield tail
