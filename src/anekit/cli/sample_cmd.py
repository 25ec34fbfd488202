"""``anekit sample MODEL``: generate text on the CPU from an anekit checkpoint or a llama2.c model .bin.

MODEL is recognised by its first four bytes (little-endian int32): the BLZT magic is an anekit
checkpoint; anything else (llama2.c's "ak42" versioned formats, or the legacy 7-int header) goes to the
llama2.c reader. The text is printed as it is generated, then a line with the speed on stderr (as
run.c prints ``achieved tok/s``), so stdout holds only the text.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from anekit.cli import flags
from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig, preset
from anekit.llama.params import Params

BLZT_MAGIC = 0x424C5A54  # anekit (and the ANE training reference) checkpoint
AK42_MAGIC = 0x616B3432  # llama2.c's versioned export formats
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.bin")  # looked for beside MODEL when --tokenizer is absent
STEPS_MAX = 1 << 20  # far above any model's seq_len: the steps are capped at the model's anyway
TEMPERATURE_MAX = 100.0  # logits / 100 is already a uniform draw for any model anekit reads


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="generate text from a checkpoint or a llama2.c model (CPU)")
    p.add_argument(
        "model",
        type=Path,
        metavar="MODEL",
        help="anekit BLZT checkpoint, llama2.c model .bin, or an `anekit export` package / shard directory",
    )
    p.add_argument("--prompt", default="", help="text to start from (default: none, a story from BOS)")
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
        help="sentencepiece .model or llama2.c tokenizer.bin (default: one beside MODEL, else the "
        "built-in corpus's tokenizer)",
    )
    p.add_argument(
        "--seed",
        type=flags.seed,
        default=None,
        help=f"random seed, 0 .. {flags.SEED_MAX} (default: from the clock)",
    )
    p.add_argument(
        "--config",
        metavar="NAME",
        help=flags.preset_help(
            "model preset of a BLZT checkpoint without a run record (its header has no n_kv_heads); "
            "default: the config the checkpoint's run record holds, else n_kv_heads = n_heads"
        ),
    )
    p.set_defaults(run=run)


def _magic(path: Path) -> int:
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as e:
        raise AnekitError(f"[sample] cannot read {path}: {e}") from e
    if len(head) < 4:
        raise AnekitError(f"[sample] {path} is {len(head)} bytes long: not a model file")
    return int.from_bytes(head, "little", signed=True)


def _params_of(loaded: Any, path: Path) -> Params:
    """The Params in whatever a reader returned (Params, a tuple holding one, or an object with .params)."""
    if isinstance(loaded, Params):
        return loaded
    if isinstance(loaded, tuple):
        for item in loaded:
            if isinstance(item, Params):
                return item
    params = getattr(loaded, "params", None)
    if isinstance(params, Params):
        return params
    raise AnekitError(f"[sample] the reader of {path} returned no model parameters ({type(loaded).__name__})")


def _config_name(args: argparse.Namespace) -> str | None:
    """--config, or None: a checkpoint written by ``anekit train`` carries its config in its run record."""
    return args.config or None


def _named_config(name: str) -> ModelConfig:
    return preset(name)  # "default" (anekit train's model) is a preset like the others


def check_finite(params: Params, path: Path, command: str) -> Params:
    """Refuse a model whose weights hold NaN or inf: whatever it generated would be noise."""
    for name, value in params.tensors():
        bad = ~np.isfinite(value)
        if bad.any():
            raise AnekitError(
                f"[{command}] {path}: weight {name} holds {int(bad.sum())} NaN or inf values of "
                f"{value.size}: the model is broken (a diverged training run?)"
            )
    return params


def load_model(args: argparse.Namespace) -> Params:
    """MODEL's parameters, dispatched on its magic."""
    path: Path = args.model
    if _magic(path) == BLZT_MAGIC:
        from anekit.llama.checkpoint import load_checkpoint

        name = _config_name(args)
        return _params_of(load_checkpoint(path, _named_config(name) if name else None), path)
    # AK42_MAGIC and the legacy header both go to the llama2.c reader, which explains what it refuses.
    from anekit.llama.llama2c import read_llama2c

    return _params_of(read_llama2c(path), path)


def load_tokenizer(args: argparse.Namespace, cfg: Any) -> Any:
    from anekit.llama import tokenizer

    if args.tokenizer is not None:
        return tokenizer.load_tokenizer(args.tokenizer)
    for fname in TOKENIZER_FILES:
        beside = args.model.parent / fname
        if beside.is_file():
            return tokenizer.load_tokenizer(beside)
    return tokenizer.default_tokenizer(vocab_size=cfg.vocab_size)


def is_export(path: Path) -> bool:
    """An ``anekit export`` output: an .mlpackage, a shard directory or its shards.json."""
    return path.suffix == ".mlpackage" or path.name == "shards.json" or (path / "shards.json").is_file()


def run(args: argparse.Namespace) -> int:
    from anekit.llama.sample import Sampler

    if args.config is not None:
        preset(args.config)  # an unknown name is refused even when MODEL's own header makes it unneeded
    if is_export(args.model):  # run the exported package(s) in the simulator, KV caches held as states
        from anekit.coreml.decoder import PackageDecoder

        decoder = PackageDecoder.open(args.model)
        sampler = Sampler(decoder, load_tokenizer(args, decoder.cfg))
    else:
        params = check_finite(load_model(args), args.model, "sample")
        sampler = Sampler(params, load_tokenizer(args, params.cfg))
    out = sys.stdout
    for piece in sampler.generate(args.prompt, args.steps, args.temperature, args.top_p, args.seed):
        out.write(piece)
        out.flush()
    out.write("\n")
    out.flush()
    s = sampler.stats
    print(
        f"{s.generated_tokens} tokens generated, {s.positions} positions in {s.seconds:.2f} s: "
        f"{s.tokens_per_second:.1f} tokens/s",
        file=sys.stderr,
    )
    return 0
