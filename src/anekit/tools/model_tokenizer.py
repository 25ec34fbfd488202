"""The tokenizer of a model at a path, found and checked to be the model's.

The tokenizer must be the model's (``find_tokenizer``): the one named, else the one an export records it
carried (``anekit.tokenizer_files``), else one in or beside the model (``anekit.tools.model``), else the
one a checkpoint's run record names where training read it, else the built-in corpus tokenizer (with a
warning the caller says). A vocabulary of another size, or a file other than the one a checkpoint's run
record names, is an error naming what to pass, never a fallback.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anekit.errors import AnekitError
from anekit.inputs import LIMITS, check_input
from anekit.tools.model import TOKENIZER_FILES, is_export, tokenizer_places

if TYPE_CHECKING:
    from anekit.llama.sample import DecoderShape

Recorded = tuple[str | None, str]  # (path, sha256) of the tokenizer a run record names


@dataclass(frozen=True)
class FoundTokenizer:
    """The model's tokenizer and, when it is the built-in one used for want of any other, the warning."""

    tokenizer: Any
    warning: str | None = None


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise AnekitError(f"[sample] cannot read tokenizer {path}: {e.strerror or e}") from e


def recorded_tokenizer(run: dict[str, Any] | None) -> Recorded | None:
    """(path, sha256) of the tokenizer a checkpoint's run record names, or None."""
    tok = run.get("tokenizer") if isinstance(run, dict) else None
    if isinstance(tok, dict) and isinstance(tok.get("sha256"), str):
        path = tok.get("path")
        return (path if isinstance(path, str) else None), tok["sha256"]
    return None


def _pass_hint(cfg: DecoderShape, recorded: Recorded | None) -> str:
    if recorded is not None and recorded[0]:
        return (
            f"pass --tokenizer {recorded[0]}, the tokenizer the run record names (sha256 {recorded[1][:12]})"
        )
    return f"pass --tokenizer TOK, the {cfg.vocab_size}-token tokenizer the model was trained with"


def checked_tokenizer(path: Path, how: str, cfg: DecoderShape, recorded: Recorded | None) -> Any:
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


def find_tokenizer(
    model: Path, cfg: DecoderShape, run: dict[str, Any] | None = None, tokenizer: Path | None = None
) -> FoundTokenizer:
    """The tokenizer of the model at ``model`` (see the module docstring); ``tokenizer`` is the one named
    (``--tokenizer``), ``run`` a checkpoint's run record."""
    recorded = recorded_tokenizer(run)
    if tokenizer is not None:
        return FoundTokenizer(checked_tokenizer(tokenizer, "--tokenizer", cfg, recorded))
    if is_export(model):
        from anekit.coreml.tokenizer_record import export_record
        from anekit.tokenizer_files import carried_path

        record = export_record(model)
        if record is not None:  # exactly the files the export carried, checked by their sha256
            folder = model if model.is_dir() and model.suffix != ".mlpackage" else model.parent
            return FoundTokenizer(
                checked_tokenizer(carried_path(folder, record), "carried by the export", cfg, None)
            )
    for path in tokenizer_places(model):
        if path.is_file():
            where = "in" if path.parent == model else "beside"
            return FoundTokenizer(checked_tokenizer(path, f"found {where} {model.name}", cfg, recorded))
    if recorded is not None and recorded[0] is not None:
        path = Path(recorded[0])
        if path.is_file() and _sha256(path) == recorded[1]:
            return FoundTokenizer(checked_tokenizer(path, "named by the run record", cfg, recorded))
    return builtin_tokenizer(model, cfg, recorded)


def builtin_tokenizer(model: Path, cfg: DecoderShape, recorded: Recorded | None) -> FoundTokenizer:
    """The built-in corpus tokenizer of the model's vocab_size, when no tokenizer file is at hand: with a
    warning for a model that names none, quietly when the run record names exactly it."""
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
        return FoundTokenizer(tok)  # the run trained with the built-in tokenizer
    return FoundTokenizer(
        tok,
        f"[sample] {looked}: using the built-in corpus tokenizer ({tok.vocab_size}-token BPE of anekit's "
        "embedded stories); a model trained with another prints gibberish: pass its own with --tokenizer",
    )
