"""The sample job: a model opened for generation (its checks), the model's own tokenizer, the decoder of
the backend asked for, and the text generated with the reason it stopped. ``prepare`` does it all from a
path and ``SampleOptions``; the steps are callable one by one too. The tokenizer is found and checked by
``anekit.tools.model_tokenizer``; the backend (``cpu``, ``sim``, ``ane``, ``coreml``) is checked and its
decoder made by ``anekit.generate.backends``, and the same ``Sampler`` drives every one.

Order matters for what is refused early: a backend this machine cannot run is refused before the model is
read; an engine backend's prompt is encoded and checked against the context before any kernel is compiled.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anekit.errors import AnekitError
from anekit.generate.backends import ENGINE_BACKENDS, check_backend, default_backend, engine_decoder
from anekit.inputs import stat_input
from anekit.kernels.config import preset
from anekit.tools.model import OpenedModel, check_finite, is_export, is_hf_dir, open_model
from anekit.tools.model_tokenizer import find_tokenizer

if TYPE_CHECKING:
    from anekit.llama.sample import DecoderShape

Report = Callable[[str, str], None]  # ("note" or "warning", text): what the job has to say on the way
TokenizerOf = Callable[["DecoderShape", "dict[str, Any] | None"], Any]  # (cfg, run record) -> tokenizer


@dataclass(frozen=True)
class SampleOptions:
    """What to generate (``anekit sample``'s flags)."""

    prompt: str = ""  # the text to start from ("": a story from BOS)
    steps: int = 256  # positions to run, prompt included (capped at the model's seq_len)
    temperature: float = 1.0  # 0 is greedy
    top_p: float = 0.9  # nucleus mass; 1 turns it off
    seed: int | None = None  # None: from the clock
    chat: bool = False  # a Hugging Face model: the prompt as a user message through its chat template
    adapters: Path | None = None  # a Hugging Face model: LoRA adapters (PEFT's format) merged in first
    tokenizer: Path | None = None  # the model's tokenizer (None: found as the module docstring says)
    config: str | None = None  # the preset of a BLZT checkpoint without a run record
    backend: str | None = None  # cpu, sim, ane or coreml (None: anekit.generate.backends.default_backend)
    chip: str | None = None  # sim: the chip whose route and numerics the kernels use (None: any)
    macos: str | None = None  # sim / ane: the macOS version the route is chosen for (None: every one)
    numerics: str | None = None  # sim: engine, exact or ieee (None: the chip's measured numerics)


@dataclass(frozen=True)
class Generation:
    """A sampler ready to run: ``pieces()`` yields the text, then ``stats`` and ``why_stopped()`` say
    what happened."""

    sampler: Any
    prompt: str  # what the sampler starts from (a chat's rendered template)
    options: SampleOptions
    backend: str = "cpu"  # the backend that generates (named in the speed line)

    def pieces(self) -> Iterator[str]:
        o = self.options
        return generate(self.sampler, self.prompt, o.steps, o.temperature, o.top_p, o.seed, o.chat)

    def pending(self) -> str:
        """Text the sampler holds back (an unfinished UTF-8 sequence) when generation is interrupted."""
        return str(getattr(self.sampler, "pending_text", ""))

    def close(self) -> None:
        """Release the decoder's kernels (an engine decoder's), if it holds any."""
        close = getattr(self.sampler.decoder, "close", None)
        if callable(close):
            close()

    @property
    def stats(self) -> Any:
        return self.sampler.stats

    def why_stopped(self) -> str:
        return why_stopped(self.stats, self.options.steps, self.sampler.cfg.seq_len)


def _warn(kind: str, text: str) -> None:
    if kind == "warning":
        warnings.warn(text, stacklevel=3)


def prepare(
    model: Path, options: SampleOptions, report: Report = _warn, tokenizer_of: TokenizerOf | None = None
) -> Generation:
    """The model at ``model`` opened and checked, with its tokenizer, as a ``Generation``. ``report``
    hears the notes and warnings on the way (default: warnings as Python warnings); ``tokenizer_of``
    replaces ``find_tokenizer`` for a model that is not a Hugging Face directory (which names its own)."""
    from anekit.llama.sample import Sampler

    if options.config is not None:  # an unknown name is refused even where the model's header says all
        preset(options.config)
    try:
        options.prompt.encode("utf-8")  # bytes that are not UTF-8 reach argv as lone surrogates
    except UnicodeEncodeError as e:
        raise AnekitError(f"[sample] --prompt is not UTF-8 text (at character {e.start})") from None
    stat_input(model, "[sample] cannot read")  # a path the OS cannot look up (too long): one line
    hf = is_hf_dir(model)
    check_options(hf, options.chat, options.adapters, options.tokenizer, options.config)
    package = not hf and is_export(model)
    backend = options.backend or default_backend(package)
    engine_options = (options.chip, options.macos, options.numerics) != (None, None, None)
    machine_options = (options.chip, options.numerics) != (None, None)
    check_backend(  # before the model is read
        backend, package=package, engine_options=engine_options, machine_options=machine_options
    )
    opened = open_model(model, options.config, exports=True, package_backend=backend)
    for note in opened.notes:
        report("note", note)
    source = ready(opened, options.steps, options.adapters, check_cpu_memory=backend == "cpu")
    if hf:
        tok = hf_tokenizer(opened)
        prompt = chat_prompt(tok, options.prompt) if options.chat else options.prompt
    else:
        prompt = options.prompt
        if tokenizer_of is None:
            found = find_tokenizer(model, opened.cfg, opened.run, options.tokenizer)
            if found.warning is not None:
                report("warning", found.warning)
            tok = found.tokenizer
        else:
            tok = tokenizer_of(opened.cfg, opened.run)
    if package or backend not in ENGINE_BACKENDS:
        return Generation(Sampler(source, tok), prompt, options, backend)  # the parameters, or a package's
    sampler = Sampler(Unopened(source.cfg), tok)
    sampler.encode(prompt, not options.chat)  # the prompt's length against the context: no kernel yet
    engine = engine_decoder(source, backend, options.chip or "any", options.macos or "", options.numerics)
    sampler.decoder = engine
    route = getattr(engine, "route", None)  # the route the chip got (a stand-in decoder may have none)
    chip = getattr(route, "chip", None) or options.chip or "any"
    label = f"{backend}, chip {chip}" + (f", route {route.id}" if route is not None else "")
    return Generation(sampler, prompt, options, label)


@dataclass(frozen=True)
class Unopened:
    """The model's shape before its decoder is made: what the sampler checks a prompt against."""

    cfg: Any

    def forward(self, tokens: Any, pos: int) -> Any:
        raise AnekitError("[sample] the decoder is not open yet")


def check_options(
    hf: bool, chat: bool, adapters: Path | None, tokenizer: Path | None, config: str | None
) -> None:
    """Refuse options that do not apply to the model's kind (``hf``: a Hugging Face directory)."""
    if hf:
        if tokenizer is not None or config is not None:
            flag = "--tokenizer" if tokenizer is not None else "--config"
            raise AnekitError(f"[sample] {flag} does not apply to a Hugging Face directory: it names its own")
    elif chat or adapters is not None:
        flag = "--chat" if chat else "--adapters"
        raise AnekitError(f"[sample] {flag} needs a Hugging Face model directory")


def check_memory(params: Any, model: Path, steps: int) -> None:
    """Refuse, before anything is read, a generation of ``steps`` positions that cannot fit the address
    space the process may use (a one-token prompt: the sampler checks again once the prompt is
    tokenized)."""
    from anekit.llama.sample import check_sampling_memory

    positions = min(steps, params.cfg.seq_len)
    check_sampling_memory(params, positions, 1, f"{model}: sampling {positions} positions")


def ready(
    opened: OpenedModel, steps: int, adapters: Path | None = None, check_cpu_memory: bool = True
) -> Any:
    """What the sampler decodes with: an export's decoder; else the parameters (a Hugging Face model's
    with ``adapters`` merged in), checked to be finite and, for the CPU's forward (``check_cpu_memory``),
    to fit in memory (not a Hugging Face one's)."""
    if opened.decoder is not None:
        return opened.decoder
    params = opened.params
    assert params is not None
    if opened.kind == "hf":
        if adapters is not None:
            from anekit.hf.adapters import fuse, read_adapters

            params = fuse(params, read_adapters(adapters, params.cfg))
        return check_finite(params, adapters or opened.path, "sample")
    if check_cpu_memory:
        check_memory(params, opened.path, steps)  # before the weights are read to check them
    return check_finite(params, opened.path, "sample")


def hf_tokenizer(opened: OpenedModel) -> Any:
    """A Hugging Face directory's own tokenizer (and chat template)."""
    from anekit.hf.tokenizer import load_hf_tokenizer

    return load_hf_tokenizer(opened.path, model_vocab=opened.cfg.vocab_size)


def chat_prompt(tokenizer: Any, prompt: str) -> str:
    """``prompt`` as one user message through the tokenizer's chat template."""
    return str(
        tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    )


def generate(
    sampler: Any,
    prompt: str,
    steps: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    chat: bool = False,
) -> Iterator[str]:
    """The text generated from ``prompt``, piece by piece (a chat's rendered template is not echoed, nor
    given a BOS), with the BLAS threads set for sampling while it runs; ``sampler.stats`` then holds the
    counts and ``why_stopped`` says what ended it."""
    from anekit.threads import blas_threads, for_sampling

    pieces = sampler.generate(prompt, steps, temperature, top_p, seed, echo_prompt=not chat, bos=not chat)
    params = getattr(sampler.decoder, "params", None)
    with blas_threads(for_sampling(params)):
        yield from pieces


def why_stopped(stats: Any, steps: int, seq_len: int) -> str:
    """What ended the generation, in words (``GenerationStats.stop``)."""
    if stats.stop == "bos":
        return "stopped at a BOS token, the end of a story"
    if stats.stop == "eos":
        return "stopped at an end token of the tokenizer"
    if stats.stop == "context":
        return f"stopped at the model's context of {seq_len} positions"
    if stats.stop == "prompt":
        return (
            f"nothing sampled: the prompt's {stats.prompt_tokens} tokens (BOS included) fill --steps "
            f"{steps}; raise --steps to generate"
        )
    return f"stopped after --steps {steps} positions"
