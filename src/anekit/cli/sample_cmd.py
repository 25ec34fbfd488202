"""``anekit sample MODEL``: generate text on the CPU from an anekit checkpoint, a llama2.c model .bin, an
``anekit export`` package, or a Hugging Face model directory.

A Hugging Face directory (config.json + safetensors) is read by ``anekit.hf`` with its own tokenizer
(tokenizer.json or tokenizer.model in the directory); ``--chat`` renders the prompt as one user message
through the tokenizer's chat template. Generation stops at the tokenizer's end tokens. The sampling
settings are the command line's: generation_config.json's sampling defaults never override them (a
``--temperature 0`` is greedy whatever the model's file suggests).

``--backend`` says what generates: ``cpu`` the float32 forward (the default off a Mac), ``sim`` the
engine's generation kernels in the simulator with a chip's numerics (``--chip``, ``--macos``,
``--numerics``), ``ane`` the same kernels on the Neural Engine (the default on a Mac with the engine),
``coreml`` an exported package through CoreML on cpu_and_ne (macOS). An exported package runs with ``sim``
(its own kernels in the simulator, the default) or ``coreml``. The same sampler drives every backend.

MODEL is opened by ``anekit.tools.model`` (what it is, by its magic or its files) and sampled by
``anekit.tools.sample`` (the model's checks, its tokenizer, the backend's decoder, the generation); this
module parses the arguments and prints. The text is printed as it is generated, then a line on stderr with
the speed and the backend (as run.c prints ``achieved tok/s``) and why generation stopped, so stdout holds
only the text. Ctrl-C prints what was generated so far, then ``anekit: interrupted`` (exit status 130).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anekit.cli import flags
from anekit.engine.evidence import check_macos
from anekit.errors import AnekitError
from anekit.generate.backends import BACKENDS
from anekit.tools import model_tokenizer, sample
from anekit.words import plural

if TYPE_CHECKING:
    from anekit.llama.sample import DecoderShape

STEPS_MAX = 1 << 20  # far above any model's seq_len: the steps are capped at the model's anyway
TEMPERATURE_MAX = 100.0  # logits / 100 is already a uniform draw for any model anekit reads


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sample", help="generate text from a model: on the CPU, the Neural Engine, the simulator or CoreML"
    )
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
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        help="what generates: cpu = the float32 forward; sim = the engine's generation kernels in the "
        "simulator; ane = the same kernels on the Neural Engine (a Mac); coreml = an exported package "
        "through CoreML on cpu_and_ne (macOS) (default: ane on a Mac with the engine, else cpu; sim for an "
        "exported package)",
    )
    p.add_argument(
        "--chip",
        type=flags.chip,
        metavar="CHIP",
        help="sim: the chip whose generation route and numerics the kernels use, any or m1 .. m5 "
        "(default: any; on the engine, --backend ane, it is the Mac's own)",
    )
    p.add_argument(
        "--macos",
        type=_macos,
        metavar="VERSION",
        help="sim / ane: the macOS version the route is chosen for (15, 26, 15.3 ...; default: the route "
        "that runs under every version anekit has evidence for)",
    )
    p.add_argument(
        "--numerics",
        choices=["engine", "exact", "ieee"],
        help="sim: engine = the chip's measured numerics (default); exact = the same with the MAC's "
        "first-stage rounding at every size; ieee = the ideal machine (fp16 storage, fp32 accumulation)",
    )
    p.set_defaults(run=run)


def _macos(value: str) -> str:
    """``--macos``: a version number (argparse reports the problem as a usage error)."""
    try:
        check_macos(value, "sample")
    except AnekitError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("[sample] ")) from None
    return value.strip()


def load_tokenizer(args: argparse.Namespace, cfg: DecoderShape, run: dict[str, Any] | None = None) -> Any:
    """The model's tokenizer (``anekit.tools.model_tokenizer.find_tokenizer``); a warning it brings goes
    to stderr."""
    found = model_tokenizer.find_tokenizer(args.model, cfg, run, args.tokenizer)
    if found.warning is not None:
        print(f"anekit: warning: {found.warning}", file=sys.stderr)
    return found.tokenizer


def run(args: argparse.Namespace) -> int:
    options = sample.SampleOptions(
        prompt=args.prompt,
        steps=args.steps,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        chat=args.chat,
        adapters=args.adapters,
        tokenizer=args.tokenizer,
        config=args.config,
        backend=args.backend,
        chip=args.chip,
        macos=args.macos,
        numerics=args.numerics,
    )
    job = sample.prepare(args.model, options, _say, lambda cfg, run: load_tokenizer(args, cfg, run))
    out = sys.stdout
    try:
        for piece in job.pieces():
            out.write(piece)
            out.flush()
    except KeyboardInterrupt:  # what was generated stays printed; main says "interrupted", exit 130
        out.write(job.pending() + "\n")
        out.flush()
        raise
    finally:
        job.close()
    out.write("\n")
    out.flush()
    s = job.stats
    print(
        f"{plural(s.generated_tokens, 'token')} generated, {plural(s.positions, 'position')} in "
        f"{s.seconds:.2f} s on {job.backend}: {s.tokens_per_second:.1f} tokens/s; {job.why_stopped()}",
        file=sys.stderr,
    )
    return 0


def _say(kind: str, text: str) -> None:
    print(f"anekit: {kind}: {text}", file=sys.stderr)
