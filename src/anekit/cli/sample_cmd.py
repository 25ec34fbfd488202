"""``anekit sample MODEL``: generate text on the CPU from an anekit checkpoint, a llama2.c model .bin, an
``anekit export`` package, or a Hugging Face model directory.

A Hugging Face directory (config.json + safetensors) is read by ``anekit.hf`` with its own tokenizer
(tokenizer.json or tokenizer.model in the directory); ``--chat`` renders the prompt as one user message
through the tokenizer's chat template. Generation stops at the tokenizer's end tokens. The sampling
settings are the command line's: generation_config.json's sampling defaults never override them (a
``--temperature 0`` is greedy whatever the model's file suggests).

MODEL is recognised by its first four bytes (little-endian int32): the BLZT magic is an anekit
checkpoint; anything else (llama2.c's "ak42" versioned formats, or the legacy 7-int header) goes to the
llama2.c reader. Either is read through a read-only map of the file, so a model larger than RAM samples
with little private memory. The tokenizer must be the model's (``load_tokenizer``): a vocabulary of
another size, or a file other than the one a checkpoint's run record names, is an error. The text is
printed as it is generated, then a line on stderr with the speed (as run.c prints ``achieved tok/s``)
and why generation stopped, so stdout holds only the text.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

from anekit.cli import flags
from anekit.errors import AnekitError
from anekit.inputs import LIMITS, check_input, stat_input
from anekit.kernels.config import preset
from anekit.llama.params import Params
from anekit.words import plural

BLZT_MAGIC = 0x424C5A54  # anekit (and the ANE training reference) checkpoint
AK42_MAGIC = 0x616B3432  # llama2.c's versioned export formats
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.bin")  # looked for in / beside MODEL without --tokenizer
STEPS_MAX = 1 << 20  # far above any model's seq_len: the steps are capped at the model's anyway
TEMPERATURE_MAX = 100.0  # logits / 100 is already a uniform draw for any model anekit reads


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="generate text from a checkpoint or a llama2.c model (CPU)")
    p.add_argument(
        "model",
        type=Path,
        metavar="MODEL",
        help="anekit BLZT checkpoint, llama2.c model .bin, Hugging Face model directory (config.json, "
        "safetensors, tokenizer), or an `anekit export` package / shard directory",
    )
    p.add_argument("--prompt", default="", help="text to start from (default: none, a story from BOS)")
    p.add_argument(
        "--chat",
        action="store_true",
        help="a Hugging Face model: send --prompt as a user message through the tokenizer's chat template",
    )
    p.add_argument(
        "--adapters",
        type=Path,
        metavar="DIR",
        help="a Hugging Face model: LoRA adapters (PEFT's format, as anekit train --lora writes) merged in "
        "before sampling",
    )
    p.add_argument(
        "--steps",
        type=flags.int_range(1, STEPS_MAX),
        default=256,
        metavar="N",
        help=f"positions to run, prompt included, at most the model's seq_len (1 .. {STEPS_MAX}; "
        "default: %(default)s)",
    )
    p.add_argument(
        "--temperature",
        type=flags.float_range(0, TEMPERATURE_MAX),
        default=1.0,
        metavar="T",
        help=f"0 is greedy (argmax); 0 .. {TEMPERATURE_MAX:g} (default: %(default)s)",
    )
    p.add_argument(
        "--top-p",
        type=flags.float_range(0, 1, lo_open=True),
        default=0.9,
        metavar="P",
        help="nucleus sampling mass in (0, 1]; 1 turns it off (default: %(default)s)",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        metavar="TOK",
        help="sentencepiece .model, llama2.c tokenizer.bin, or a Hugging Face tokenizer.json or model "
        "directory, with the model's vocabulary (default: the tokenizer an export carried, else "
        "tokenizer.model / tokenizer.bin in MODEL's shard directory or beside MODEL, else the one a "
        "checkpoint's run record names, else the built-in corpus's tokenizer, with a warning)",
    )
    p.add_argument(
        "--seed",
        type=flags.seed,
        default=None,
        help=f"random seed, 0 .. {flags.SEED_MAX} (default: from the clock)",
    )
    p.add_argument(
        "--config",
        type=flags.preset,
        metavar="NAME",
        help=flags.preset_help(
            "model preset of a BLZT checkpoint without a run record (its header has no n_kv_heads); "
            "default: the config the checkpoint's run record holds, else n_kv_heads = n_heads"
        ),
    )
    p.set_defaults(run=run)


def _magic(path: Path) -> int:
    check_input(path, "[sample] cannot read", expected="a model file")  # a FIFO would block the open
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as e:
        raise AnekitError(f"[sample] cannot read {path}: {e}") from e
    if len(head) < 4:
        raise AnekitError(f"[sample] {path} is {len(head)} bytes long: not a model file")
    return int.from_bytes(head, "little", signed=True)


def open_model(path: Path, config: str | None = None) -> tuple[Params, dict[str, Any] | None]:
    """MODEL's parameters, dispatched on its magic, as read-only views of a map of the file (a model
    larger than RAM works), and the run record of an anekit checkpoint (None otherwise). A Hugging Face
    model directory is read by ``anekit.hf`` (its weights widened to float32).

    ``config`` names the preset of a BLZT checkpoint without a run record (its header has no n_kv_heads).
    """
    from anekit.hf.config import check_model_dir, is_model_dir

    if is_model_dir(path):
        from anekit.hf.model import load_model as load_hf

        return load_hf(path).params, None
    check_model_dir(path, "[sample] cannot read")  # a directory whose config.json is missing or no file
    if _magic(path) == BLZT_MAGIC:
        from anekit.llama.checkpoint import open_checkpoint

        ck = open_checkpoint(path, preset(config) if config else None)
        return ck.params, ck.run
    # AK42_MAGIC and the legacy header both go to the llama2.c reader, which explains what it refuses.
    from anekit.llama.llama2c import open_llama2c

    return open_llama2c(path).params, None


def load_model(args: argparse.Namespace) -> Params:
    """MODEL's parameters (``open_model`` with ``--config``)."""
    return open_model(args.model, args.config)[0]


FINITE_BLOCK = 1 << 22  # floats counted at a time when a tensor is not finite (a 16 MB piece of a map)


def check_finite(params: Params, path: Path, command: str) -> Params:
    """Refuse a model whose weights hold NaN or inf: whatever it generated would be noise.

    Each tensor is summed in float64, which no float32 values can overflow, so the sum is finite exactly
    when every value is; only a tensor that fails is counted, block by block. Nothing the size of a
    tensor is allocated, so a mapped model is read once, a page at a time."""
    for name, value in params.tensors():
        with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf: the NaN is the answer
            if np.isfinite(np.sum(value, dtype=np.float64)):
                continue
        flat = value.reshape(-1)
        bad = sum(
            int(np.count_nonzero(~np.isfinite(flat[i : i + FINITE_BLOCK])))
            for i in range(0, flat.size, FINITE_BLOCK)
        )
        raise AnekitError(
            f"[{command}] {path}: weight {name} holds {bad} NaN or inf values of {value.size}: the model "
            "is broken (a diverged training run?)"
        )
    return params


def check_memory(params: Params, args: argparse.Namespace) -> None:
    """Refuse, before anything is read, a generation of --steps positions that cannot fit the address space
    the process may use (a one-token prompt: the sampler checks again once the prompt is tokenized)."""
    from anekit.llama.sample import check_sampling_memory

    positions = min(args.steps, params.cfg.seq_len)
    check_sampling_memory(params, positions, 1, f"{args.model}: sampling {positions} positions")


def tokenizer_places(model: Path) -> list[Path]:
    """Where a tokenizer is looked for when --tokenizer is absent: inside an export's directory (a shard
    directory holds the tokenizer `anekit export` wrote), then beside MODEL."""
    folders = [model] if model.is_dir() and model.suffix != ".mlpackage" else []
    folders.append(model.parent)
    return [folder / name for folder in folders for name in TOKENIZER_FILES]


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise AnekitError(f"[sample] cannot read tokenizer {path}: {e.strerror or e}") from e


def _recorded(run: dict[str, Any] | None) -> tuple[str | None, str] | None:
    """(path, sha256) of the tokenizer a checkpoint's run record names, or None."""
    tok = run.get("tokenizer") if isinstance(run, dict) else None
    if isinstance(tok, dict) and isinstance(tok.get("sha256"), str):
        path = tok.get("path")
        return (path if isinstance(path, str) else None), tok["sha256"]
    return None


def _pass_hint(cfg: Any, recorded: tuple[str | None, str] | None) -> str:
    if recorded is not None and recorded[0]:
        return (
            f"pass --tokenizer {recorded[0]}, the tokenizer the run record names (sha256 {recorded[1][:12]})"
        )
    return f"pass --tokenizer TOK, the {cfg.vocab_size}-token tokenizer the model was trained with"


def _checked_tokenizer(path: Path, how: str, cfg: Any, recorded: tuple[str | None, str] | None) -> Any:
    """The tokenizer at ``path`` when it is the model's: the run record's (by sha256) when there is one,
    and a vocabulary of exactly the model's vocab_size; a one-line AnekitError naming what to pass else."""
    from anekit.hf.tokenizer_kinds import load_tokenizer_at
    from anekit.llama import tokenizer
    from anekit.tokenizer_files import kind_of

    if kind_of(path) == "hf":  # a Hugging Face tokenizer: a model's vocabulary may be padded past it
        hf = load_tokenizer_at(path, "hf")
        if hf.vocab_size > cfg.vocab_size:
            raise AnekitError(
                f"[sample] the tokenizer {path} ({how}) has {hf.vocab_size} tokens but the model's "
                f"vocab_size is {cfg.vocab_size}: its ids would mean other text; " + _pass_hint(cfg, recorded)
            )
        return hf
    check_input(path, "[sample] cannot read", LIMITS["tokenizer"], "a tokenizer file")
    if recorded is not None and path.is_file() and _sha256(path) != recorded[1]:
        raise AnekitError(
            f"[sample] the tokenizer {path} ({how}) is not the one the model was trained with: "
            + _pass_hint(cfg, recorded)
        )
    tok = tokenizer.load_tokenizer(path)
    if tok.vocab_size != cfg.vocab_size:
        raise AnekitError(
            f"[sample] the tokenizer {path} ({how}) has {tok.vocab_size} tokens but the model's vocab_size "
            f"is {cfg.vocab_size}: its ids would mean other text; " + _pass_hint(cfg, recorded)
        )
    return tok


def load_tokenizer(args: argparse.Namespace, cfg: Any, run: dict[str, Any] | None = None) -> Any:
    """The model's tokenizer: --tokenizer, else the one an export records it carried
    (``anekit.tokenizer_files``), else one in or beside MODEL (``tokenizer_places``), else the
    one a checkpoint's run record names where training read it, else the built-in corpus tokenizer (said
    on stderr). A tokenizer that is not the model's is an error naming what to pass, never a fallback."""
    recorded = _recorded(run)
    if args.tokenizer is not None:
        return _checked_tokenizer(args.tokenizer, "--tokenizer", cfg, recorded)
    if is_export(args.model):
        from anekit.coreml.tokenizer_record import export_record
        from anekit.tokenizer_files import carried_path

        record = export_record(args.model)
        if record is not None:  # exactly the files the export carried, checked by their sha256
            folder = (
                args.model if args.model.is_dir() and args.model.suffix != ".mlpackage" else args.model.parent
            )
            return _checked_tokenizer(carried_path(folder, record), "carried by the export", cfg, None)
    for path in tokenizer_places(args.model):
        if path.is_file():
            where = "in" if path.parent == args.model else "beside"
            return _checked_tokenizer(path, f"found {where} {args.model.name}", cfg, recorded)
    if recorded is not None and recorded[0] is not None:
        path = Path(recorded[0])
        if path.is_file() and _sha256(path) == recorded[1]:
            return _checked_tokenizer(path, "named by the run record", cfg, recorded)
    return _builtin_tokenizer(args.model, cfg, recorded)


def _builtin_tokenizer(model: Path, cfg: Any, recorded: tuple[str | None, str] | None) -> Any:
    """The built-in corpus tokenizer of the model's vocab_size, when no tokenizer file is at hand: used
    with a warning for a model that names none, used quietly when the run record names exactly it."""
    from anekit.llama import tokenizer
    from anekit.outputs import OutputError

    folders = ", ".join(dict.fromkeys(str(p.parent) for p in tokenizer_places(model)))
    looked = f"no --tokenizer and none of {', '.join(TOKENIZER_FILES)} in {folders}"
    try:
        tok = tokenizer.default_tokenizer(vocab_size=cfg.vocab_size)
    except OutputError:
        raise  # the tokenizer cache: its own message says what to fix
    except AnekitError as e:  # e.g. sentencepiece cannot make 32000 pieces of the small corpus
        raise AnekitError(
            f"[sample] no tokenizer for {model}: {looked}, and the built-in corpus tokenizer cannot have "
            f"{cfg.vocab_size} tokens; " + _pass_hint(cfg, recorded)
        ) from e
    if recorded is not None:
        if _sha256(tokenizer.default_tokenizer_path(cfg.vocab_size)) != recorded[1]:
            raise AnekitError(
                f"[sample] no tokenizer for {model}: {looked}, nor at the path its run record names; "
                + _pass_hint(cfg, recorded)
            )
        return tok  # the run trained with the built-in tokenizer
    print(
        f"anekit: warning: [sample] {looked}: using the built-in corpus tokenizer ({tok.vocab_size}-token "
        "BPE of anekit's embedded stories); a model trained with another prints gibberish: pass its own "
        "with --tokenizer",
        file=sys.stderr,
    )
    return tok


def is_export(path: Path) -> bool:
    """An ``anekit export`` output: an .mlpackage, a shard directory or its shards.json."""
    return path.suffix == ".mlpackage" or path.name == "shards.json" or (path / "shards.json").is_file()


def run(args: argparse.Namespace) -> int:
    from anekit.llama.sample import Sampler

    if args.config is not None:
        preset(args.config)  # an unknown name is refused even when MODEL's own header makes it unneeded
    try:
        args.prompt.encode("utf-8")  # bytes that are not UTF-8 reach argv as lone surrogates
    except UnicodeEncodeError as e:
        raise AnekitError(f"[sample] --prompt is not UTF-8 text (at character {e.start})") from None
    stat_input(args.model, "[sample] cannot read")  # a path the OS cannot look up (too long): one line
    from anekit.hf.config import is_model_dir

    if is_model_dir(args.model):
        return _run_hf(args)
    if args.chat or args.adapters is not None:
        flag = "--chat" if args.chat else "--adapters"
        raise AnekitError(f"[sample] {flag} needs a Hugging Face model directory")
    if is_export(args.model):  # run the exported package(s) in the simulator, KV caches held as states
        from anekit.coreml.decoder import PackageDecoder

        decoder = PackageDecoder.open(args.model)
        sampler = Sampler(decoder, load_tokenizer(args, decoder.cfg))
    else:
        params, record = open_model(args.model, args.config)
        check_memory(params, args)  # before the weights are read to check them
        check_finite(params, args.model, "sample")
        sampler = Sampler(params, load_tokenizer(args, params.cfg, record))
    return _generate(args, sampler, args.prompt)


def _run_hf(args: argparse.Namespace) -> int:
    """``sample`` of a Hugging Face model directory, with its own tokenizer (and chat template)."""
    from anekit.hf.model import load_model as load_hf
    from anekit.hf.tokenizer import load_hf_tokenizer
    from anekit.llama.sample import Sampler

    if args.tokenizer is not None or args.config is not None:
        flag = "--tokenizer" if args.tokenizer is not None else "--config"
        raise AnekitError(f"[sample] {flag} does not apply to a Hugging Face directory: it names its own")
    model = load_hf(args.model)
    for note in model.config.notes:
        print(f"anekit: note: {note}", file=sys.stderr)
    params = model.params
    if args.adapters is not None:
        from anekit.hf.adapters import fuse, read_adapters

        params = fuse(params, read_adapters(args.adapters, params.cfg))
    check_finite(params, args.adapters or args.model, "sample")
    tok = load_hf_tokenizer(args.model, model_vocab=params.cfg.vocab_size)
    sampler = Sampler(params, tok)
    if not args.chat:
        return _generate(args, sampler, args.prompt)
    text = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
    return _generate(args, sampler, text, chat=True)


def _generate(args: argparse.Namespace, sampler: Any, prompt: str, chat: bool = False) -> int:
    """Print the text generated from ``prompt`` (a chat's rendered template is not echoed), then the
    speed line on stderr."""
    from anekit.threads import blas_threads, for_sampling

    out = sys.stdout
    pieces = sampler.generate(
        prompt, args.steps, args.temperature, args.top_p, args.seed, echo_prompt=not chat, bos=not chat
    )
    params = getattr(sampler.decoder, "params", None)
    with blas_threads(for_sampling(params)):
        for piece in pieces:
            out.write(piece)
            out.flush()
    out.write("\n")
    out.flush()
    s = sampler.stats
    print(
        f"{plural(s.generated_tokens, 'token')} generated, {plural(s.positions, 'position')} in "
        f"{s.seconds:.2f} s: "
        f"{s.tokens_per_second:.1f} tokens/s; {_why_stopped(s, args.steps, sampler.cfg.seq_len)}",
        file=sys.stderr,
    )
    return 0


def _why_stopped(stats: Any, steps: int, seq_len: int) -> str:
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
