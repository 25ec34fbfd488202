"""Training runs from Python: ``Run`` (and ``anekit.train``) do what ``anekit train`` does.

A run lives in an output directory. Its checkpoint (``OUT/ckpt.bin``) is the run: a BLZT file whose run
record (``anekit.llama.checkpoint``) holds the model and training configs, the loss history, the
restarts and the identities (sha256) of the data and the tokenizer, written in one atomic rename.
``resume=True`` continues from it alone and refuses options that contradict it.

The order of work is the command's promise: ``Run(options)`` reads and checks everything and writes
nothing (a refused input leaves no directory behind); ``Run.train`` creates and locks the directory
(one writer: ``fileio.DirLock``), saves step 0, copies the tokenizer, trains, and saves at the end
(loss.csv and loss.png only once that checkpoint is in place: the curve is never ahead of it), and if
it fails before its first step removes what it wrote; a failed write is one line naming its file and
why. A finished run resumed trains nothing and writes nothing (its curves only when a kill left them
behind its checkpoint). Messages name the options as the Python parameters (``resume=True``); the
command names them as its flags (``flag_names``). Stopping is the caller's: ``should_stop`` is asked
between two steps (the command answers from its signal handler and its stdout), and a run whose
backend's compile budget ran out returns ``"budget"`` (the command then re-executes itself with
``resume=True``).

    import anekit

    result = anekit.train("out", steps=50, accum=2)   # the default model on the built-in corpus
    print(result.losses[-1], result.checkpoint)
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import math
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from anekit import addrspace, runtime
from anekit.errors import AnekitError
from anekit.fileio import LOCK_FILE, DirLock, remove_stale_temporaries, temporary_name, write_bytes_atomic
from anekit.inputs import LIMITS, check_input, stat_input
from anekit.kernels import PRESETS, ModelConfig, preset
from anekit.llama import checkpoint
from anekit.llama.checkpoint import RUN_FORMAT
from anekit.llama.checkpoint import RUN_RECORD_VERSION as RUN_VERSION
from anekit.outputs import check_apart, writing
from anekit.threads import Background, cores
from anekit.words import plural

if TYPE_CHECKING:
    # the training loop's modules load when a run is made, not when the CLI starts
    from anekit.llama.plot_helper import PlotHelper
    from anekit.llama.trainer import StepReport, TrainConfig, TrainState

CHECKPOINT = "ckpt.bin"
LEGACY_STATE = "train_state.json"  # the run state's separate file before the run record; removed on a new run
INT32_MAX = 2**31 - 1

# The default run: a model small enough to train in about a minute on two CPU cores in the simulator.
# 400 steps at a peak learning rate of 6e-3 bring its loss to about 1.3 (dynamic weights, 4 x 64 tokens
# a step); at the generic 3e-3 the same steps end near 1.9.
DEFAULT_STEPS = {"default": 400}
DEFAULT_LR = {"default": 6e-3}
GENERIC_STEPS = 200
GENERIC_LR = 3e-3
DEFAULT_ACCUM = 4
DEFAULT_WEIGHTS = "dynamic"
# Checkpoints when no checkpoint_every is given: every 50 steps, and at least once a minute, so a kill
# never loses more than about a minute of work whatever the model's step time.
AUTO_CHECKPOINT_STEPS = 50
AUTO_CHECKPOINT_SECONDS = 60.0
# The built-in tokenizer is a BPE trained on the embedded corpus, whose text holds only about 2000 pieces
# (sentencepiece refuses more: "Vocabulary size too high (32000) ... <= 2007"): enough for the 512-token
# presets; llama2.c's 32000-token presets need llama2.c's tokenizer.
BUILT_IN_VOCAB_MAX = 2000
# The fields a llama2.c --init model must share with the model trained (its seq_len is only the length it
# was trained at); a BLZT checkpoint's header fields must all agree (its reader checks them).
INIT_SHAPE = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size")
HASH_MAX_BYTES = 1 << 40  # 1 TiB: above any --init model; a bound on what is hashed
TOKENIZER_MAX_BYTES = 1 << 30  # 1 GiB: llama2.c's tokenizer.bin is 0.4 MB, sentencepiece models a few MB


@dataclass
class TrainOptions:
    """What a run is asked to do: ``anekit train``'s flags (None: the default, or the stored run's)."""

    out: Path = Path("out")
    config: str | None = None  # a preset name (default: "default")
    data: Path | None = None  # a directory of uint16 shards or a text file (default: the built-in corpus)
    tokenizer: Path | None = None  # sentencepiece .model or llama2.c tokenizer.bin (default: built in)
    steps: int | None = None
    accum: int | None = None
    lr: float | None = None
    seed: int | None = None
    weights: str | None = None  # "dynamic" (default) or "baked"
    backend: str | None = None  # default: the best available
    init: Path | None = None  # start from a llama2.c model or an anekit checkpoint
    resume: bool = False
    force: bool = False
    checkpoint_every: int | None = None
    compile_budget: int | None = None
    numerics: dict[str, Any] = field(default_factory=dict)  # the simulator's chip / numerics / sanitize
    restarted: bool = False  # a re-executed process continuing after a compile-budget restart
    threads: int | None = None  # sequences run at once (default: every core, simulator and dynamic weights)


# How messages name the options: as the Python parameters (``resume=True``, ``steps=5``) by default, as
# ``anekit train``'s flags (``--resume``, ``--steps 5``) while the command runs (``flag_names``).
_FLAG_NAMES: contextvars.ContextVar[bool] = contextvars.ContextVar("anekit_train_flag_names", default=False)
SWITCHES = ("resume", "force")  # options that are on or off: a flag without a value
_UNSET: Any = object()


@contextlib.contextmanager
def flag_names() -> Iterator[None]:
    """While it is held, messages name the options as ``anekit train``'s flags (the command holds it)."""
    token = _FLAG_NAMES.set(True)
    try:
        yield
    finally:
        _FLAG_NAMES.reset(token)


def opt(name: str, value: Any = _UNSET) -> str:
    """An option as its caller wrote it: ``opt("steps", 5)`` is "steps=5" from Python and "--steps 5" from
    the command line; ``opt("resume")`` "resume=True" / "--resume"; ``opt("lora_alpha")`` "lora_alpha" /
    "--lora-alpha"."""
    if _FLAG_NAMES.get():
        flag = "--" + name.replace("_", "-")
        return flag if value is _UNSET else f"{flag} {value}"
    if value is _UNSET:
        return f"{name}=True" if name in SWITCHES else name
    return f"{name}={value}"


@dataclass(frozen=True)
class RunResult:
    """How a run ended: ``reason`` "done", "budget" (continue with resume) or "stopped" (should_stop)."""

    reason: str
    step: int
    steps: int
    losses: list[float]
    checkpoint: Path
    seconds: dict[str, float]
    no_png: str | None = None  # why loss.png was not drawn (matplotlib missing), when it was not
    trained: bool = True  # False: the resumed run was already finished; no step was trained


# --------------------------------------------------------------------------------------------------------
# identities and the run record
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Identity of an input: where it was read from (absolute, or None for the built-in one) and a
    sha256 of what was read, which is what a resumed run checks."""

    path: str | None
    sha256: str

    def short(self) -> str:
        return f"{self.path or 'the built-in corpus'} (sha256 {self.sha256[:12]})"


def sha256_file(path: Path, max_bytes: int = HASH_MAX_BYTES) -> str:
    """sha256 of a regular file of at most ``max_bytes``: anything else (a FIFO, a device such as
    /dev/zero, a directory) is refused after a stat, never opened, so hashing always ends."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise AnekitError(f"[train] cannot read {path}: {e.strerror}") from e
    if not stat.S_ISREG(st.st_mode):
        raise AnekitError(f"[train] {path} is not a regular file")
    if st.st_size > max_bytes:
        raise AnekitError(f"[train] {path} holds {st.st_size} bytes, more than the {max_bytes} anekit reads")
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced between the stat and the open
                raise AnekitError(f"[train] {path} is not a regular file")
            left = st.st_size + 1  # read at most one byte past the size the stat gave
            while block := f.read(min(1 << 20, left)):
                h.update(block)
                left -= len(block)
                if left <= 0:
                    raise AnekitError(f"[train] {path} grew while it was read")
    except OSError as e:
        raise AnekitError(f"[train] cannot read {path}: {e.strerror}") from e
    return h.hexdigest()


def sha256_tokens(dataset: Any) -> str:
    """sha256 of the dataset's token streams (their lengths and uint16 values, not their file names), so
    the same tokens moved elsewhere are the same data, and the same text with another tokenizer is not."""
    h = hashlib.sha256()
    for _, part in dataset.parts:
        a = np.ascontiguousarray(part, dtype="<u2")  # (n,) a view for shards already little-endian
        h.update(len(a).to_bytes(8, "little"))
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def _abs(path: Path | None) -> str | None:
    return None if path is None else str(path.resolve())


@dataclass
class RunRecord:
    """A run's settings and identities, as stored in the checkpoint's run record."""

    cfg: ModelConfig
    tc: TrainConfig
    data: Source
    tokenizer: Source
    tokenizer_file: str  # name of the tokenizer's copy in the output directory
    init: Source | None
    marks: list[tuple[int, str]]  # (step, "budget" | "resume"): where the run restarted

    def record(self, state: Any) -> dict[str, Any]:
        return {
            "format": RUN_FORMAT,
            "version": RUN_VERSION,
            "config": asdict(self.cfg),
            "train": asdict(self.tc),
            "data": asdict(self.data),
            "tokenizer": {**asdict(self.tokenizer), "file": self.tokenizer_file},
            "init": None if self.init is None else asdict(self.init),
            "marks": [list(m) for m in self.marks],
            "state": {
                "step": state.step,
                "adam_t": state.adam_t,
                "loss_scale": state.loss_scale,
                "losses": state.losses,
                "seconds": state.seconds,
            },
        }

    @staticmethod
    def from_record(rec: dict[str, Any], where: Path) -> RunRecord:
        from anekit.llama.trainer import TrainConfig

        if rec.get("format") != RUN_FORMAT or rec.get("version") != RUN_VERSION:
            raise AnekitError(
                f"[train] {opt('resume')}: {where} holds a run record of another kind "
                f"({rec.get('format')!r} version {rec.get('version')!r}); anekit reads '{RUN_FORMAT}' "
                f"version {RUN_VERSION}"
            )
        try:
            known = {f.name for f in fields(TrainConfig)}
            tc = TrainConfig(**{k: v for k, v in rec["train"].items() if k in known})
            cfg = ModelConfig(**rec["config"])
            tok = rec["tokenizer"]
            init = rec.get("init")
            return RunRecord(
                cfg=cfg,
                tc=tc,
                data=Source(**rec["data"]),
                tokenizer=Source(tok["path"], tok["sha256"]),
                tokenizer_file=tok["file"],
                init=None if init is None else Source(**init),
                marks=[(int(s), str(k)) for s, k in rec.get("marks", [])],
            )
        except (KeyError, TypeError, ValueError, AnekitError) as e:
            raise AnekitError(f"[train] {opt('resume')}: the run record of {where} is incomplete: {e}") from e


def _state_from(ck: Any, rec: dict[str, Any]) -> TrainState:
    from anekit.llama.trainer import TrainState

    st = rec["state"]
    if st["step"] != ck.meta.step or st["adam_t"] != ck.meta.adam_t:
        raise AnekitError(
            f"[train] {opt('resume')}: the run record says step {st['step']} / Adam step {st['adam_t']}, the "
            f"header {ck.meta.step} / {ck.meta.adam_t}"
        )
    return TrainState(
        ck.params,
        ck.adam_m,
        ck.adam_v,
        step=int(st["step"]),
        adam_t=int(st["adam_t"]),
        loss_scale=float(st["loss_scale"]),
        losses=[float(x) for x in st["losses"]],
        seconds={k: float(v) for k, v in st.get("seconds", {}).items()},
    )


def save_run(path: Path, state: TrainState, spec: RunRecord, wall: float) -> None:
    """The checkpoint and its run record, in one atomic write."""
    tc = spec.tc
    meta = checkpoint.CheckpointMeta(
        step=state.step,
        total_steps=tc.steps,
        lr=float(tc.lr_at(max(0, state.step - 1))),
        loss=float(state.losses[-1]) if state.losses else 0.0,
        cum_compile=1e3 * state.seconds.get("compile", 0.0),
        cum_train=1e3 * sum(v for k, v in state.seconds.items() if k != "compile"),
        cum_wall=1e3 * wall,
        cum_steps=state.step * tc.accum,
        cum_batches=state.step,
        adam_t=state.adam_t,
    )
    checkpoint.save_checkpoint(path, state.params, state.adam_m, state.adam_v, meta, run=spec.record(state))


def curves_csv(losses: list[float], val_losses: dict[int, float] | None = None) -> bytes:
    """loss.csv's bytes: ``step,loss``, with a ``val_loss`` column (empty where not evaluated) when
    ``val_losses`` is given."""
    if val_losses is None:
        rows = "".join(f"{i + 1},{loss:.6f}\n" for i, loss in enumerate(losses))
        return ("step,loss\n" + rows).encode()
    at = {int(k): v for k, v in val_losses.items()}
    rows = "".join(
        f"{i},{'' if i == 0 else f'{losses[i - 1]:.6f}'},{f'{at[i]:.6f}' if i in at else ''}\n"
        for i in range(len(losses) + 1)
        if i > 0 or 0 in at
    )
    return ("step,loss,val_loss\n" + rows).encode()


class StagedCurves:
    """loss.csv and loss.png of some losses, made aside (the picture drawn into a temporary beside
    loss.png, through ``painter`` when given) and put in place only by ``commit``: a run commits them once
    the checkpoint holding those losses is written, so the curve is never ahead of the checkpoint.
    ``no_png`` is the one line saying why there is no picture (matplotlib missing), else None."""

    def __init__(self, out: Path, losses: list[float], title: str, marks: list[tuple[int, str]],
                 draw: bool = True, val_losses: dict[int, float] | None = None,
                 painter: Any = None) -> None:  # fmt: skip
        from anekit.llama.plot import PlotUnavailable, write_loss_png

        self.out, self.csv = out, curves_csv(losses, val_losses)
        self.no_png: str | None = None
        self.picture: Path | None = None
        if not draw or not losses:
            return
        tmp = temporary_name(out / "loss.png")
        try:
            with writing(out / "loss.png", "[train]"):
                (write_loss_png if painter is None else painter.draw)(tmp, losses, title, marks)
        except PlotUnavailable as e:
            self.no_png = str(e).removeprefix("[plot] ")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        else:
            self.picture = tmp

    def commit(self) -> None:
        """loss.png, then loss.csv: a loss.csv that matches the checkpoint says both are in place."""
        if self.picture is not None:
            with writing(self.out / "loss.png", "[train]"):
                os.replace(self.picture, self.out / "loss.png")
            self.picture = None
        with writing(self.out / "loss.csv", "[train]"):
            write_bytes_atomic(self.out / "loss.csv", self.csv)

    def discard(self) -> None:
        if self.picture is not None:
            self.picture.unlink(missing_ok=True)
            self.picture = None


def write_curves(out: Path, losses: list[float], title: str, marks: list[tuple[int, str]], draw: bool = True,
                 val_losses: dict[int, float] | None = None, painter: Any = None) -> str | None:  # fmt: skip
    """loss.csv always, loss.png when ``draw`` (``StagedCurves``, committed at once). Returns the one line
    saying why there is no picture, or None when it was drawn (or not asked for)."""
    staged = StagedCurves(out, losses, title, marks, draw, val_losses, painter)
    try:
        staged.commit()
    finally:
        staged.discard()
    return staged.no_png


# --------------------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------------------


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    """What tells one version of a file from the next (an atomic write renames a new inode in); None when
    it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _check_finite(params: Any, init: Path | None) -> None:
    """Refuse initial weights holding NaN or infinity (a damaged --init model) before anything is written."""
    for name, a in params.tensors():
        if not np.isfinite(a).all():
            where = opt("init", init) if init is not None else "the initial weights"
            raise AnekitError(f"[train] {where}: {name} holds NaN or infinite values")


def _check_options(options: TrainOptions, stored: RunRecord, where: Path) -> None:
    """On resume: refuse every given option that contradicts the stored run."""
    given = {
        "config": (options.config, stored.cfg.name),
        "steps": (options.steps, stored.tc.steps),
        "accum": (options.accum, stored.tc.accum),
        "lr": (options.lr, stored.tc.lr),
        "seed": (options.seed, stored.tc.seed),
        "weights": (options.weights, stored.tc.weights),
    }
    for name, (value, kept) in given.items():
        if value is not None and value != kept:
            raise_contradiction(name, value, kept, where)


def raise_contradiction(name: str, value: Any, kept: Any, where: Path) -> None:
    """A resume given an option that contradicts the stored run: one line naming it both ways."""
    raise AnekitError(
        f"[train] {opt('resume')}: {opt(name, value)} contradicts the run in {where} ({opt(name, kept)}); "
        f"drop it to continue that run, or start a new one with {opt('force')}"
    )


def _open_tokenizer(path: Path) -> Any:
    from anekit.llama import tokenizer

    if path.is_dir():
        raise AnekitError(f"[train] {opt('tokenizer', path)} is a directory, not a tokenizer file")
    return tokenizer.load_tokenizer(path)


# Without --tokenizer, an --init model's tokenizer is looked for beside it, as ``anekit sample`` does.
INIT_TOKENIZER_FILES = ("tokenizer.model", "tokenizer.bin")


def _init_tokenizer(init: Path | None, vocab_size: int) -> Path | None:
    """Without --tokenizer: the tokenizer beside the --init model (tokenizer.model, then tokenizer.bin)
    whose vocabulary is the model's, else the one the model's run record names where training read it
    (the same sha256); None when there is neither (the built-in tokenizer is used, with a warning)."""
    if init is None:
        return None
    for path in _beside(init):
        if _vocab_size(path) == vocab_size:
            return path
    recorded = _recorded_tokenizer(init)
    if recorded is not None and recorded[0] is not None:
        path = Path(recorded[0])
        same = path.is_file() and sha256_file(path, TOKENIZER_MAX_BYTES) == recorded[1]
        if same and _vocab_size(path) == vocab_size:
            return path
    return None


def _beside(init: Path) -> list[Path]:
    return [init.parent / name for name in INIT_TOKENIZER_FILES if (init.parent / name).is_file()]


def _vocab_size(path: Path) -> int:
    check_input(path, "[train] cannot read the tokenizer", LIMITS["tokenizer"], "a tokenizer file")
    return int(_open_tokenizer(path).vocab_size)


def _recorded_tokenizer(init: Path) -> tuple[str | None, str] | None:
    """(path, sha256) of the tokenizer an anekit checkpoint's run record names; None for a llama2.c model
    or a checkpoint without a record."""
    with contextlib.suppress(OSError), init.open("rb") as f:
        if int.from_bytes(f.read(4), "little") != checkpoint.MAGIC:
            return None
    try:
        record = checkpoint.read_run_record(init)
    except AnekitError:
        return None  # reading the weights says what is wrong with the file
    tok = record.get("tokenizer") if isinstance(record, dict) else None
    if isinstance(tok, dict) and isinstance(tok.get("sha256"), str):
        path = tok.get("path")
        return (path if isinstance(path, str) else None), tok["sha256"]
    return None


def _warn_builtin_for_init(init: Path, builtin: Path, vocab_size: int) -> None:
    """One line on stderr when an --init model is trained on the built-in tokenizer it may not have been
    trained with; none when its run record names exactly the built-in one."""
    import sys

    recorded = _recorded_tokenizer(init)
    if recorded is not None and sha256_file(builtin, TOKENIZER_MAX_BYTES) == recorded[1]:
        return
    beside = [f"{p.name} beside it has {_vocab_size(p)} tokens" for p in _beside(init)]
    found = "; ".join(beside) if beside else f"none of {', '.join(INIT_TOKENIZER_FILES)} beside it"
    print(
        f"anekit: warning: [train] --init {init}: no --tokenizer, and {found} (the model has {vocab_size}): "
        f"training with the built-in corpus tokenizer ({vocab_size}-token BPE of anekit's embedded "
        "stories); a model trained with another reads these ids as other text: pass its own with --tokenizer",
        file=sys.stderr,
    )


def _dataset(data: Path | None, tok: Any, seed: int) -> Any:
    from anekit.llama import data as data_mod

    if data is None:
        return data_mod.default_dataset(tok, seed=seed)
    if data.is_dir():
        return data_mod.ShardDataset(data)
    return data_mod.TextDataset(data, tok)


def _read_init(path: Path, cfg: ModelConfig, named: bool) -> tuple[Any, Source]:
    """The weights of --init (a llama2.c model or an anekit checkpoint), checked against the model
    (``named``: --config was given; else ``cfg`` is the default preset)."""
    from anekit.llama.llama2c import read_llama2c

    try:
        with path.open("rb") as f:
            head = f.read(checkpoint.HEADER_SIZE)
    except OSError as e:
        raise AnekitError(f"[train] {opt('init', path)}: {e.strerror}") from e
    if int.from_bytes(head[:4], "little") == checkpoint.MAGIC:
        if len(head) == checkpoint.HEADER_SIZE:  # shorter: the checkpoint reader says what is wrong
            _check_init_shape(path, _blzt_shape(path, head), cfg, named)
        params = checkpoint.load_checkpoint_file(path, cfg).params
    else:
        init_cfg, params = read_llama2c(path)
        _check_init_shape(path, {k: getattr(init_cfg, k) for k in INIT_SHAPE}, cfg, named)
    params.cfg = cfg
    return params, Source(_abs(path), sha256_file(path))


def _check_init_header(path: Path, cfg: ModelConfig, named: bool) -> bool:
    """--init's shape against the model's from the file's header alone (nothing else is read); whether
    its classifier is the embedding. A BLZT checkpoint's is checked when it is read (``_read_init``)."""
    from anekit.llama.llama2c import read_llama2c_header

    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise AnekitError(f"[train] --init {path}: {e.strerror}") from e
    if int.from_bytes(magic, "little") == checkpoint.MAGIC:
        return True
    header = read_llama2c_header(path)
    _check_init_shape(path, {k: getattr(header.cfg, k) for k in INIT_SHAPE}, cfg, named)
    return header.shared


def _check_training_memory(cfg: ModelConfig, tied: bool, init: Path | None) -> None:
    """Refuse, in words and before anything is allocated, a run whose weights, gradients and two Adam
    moments (four float32 copies of every parameter) cannot fit the address space the process may use."""
    from anekit.llama.params import layer_shapes

    per_layer = sum(math.prod(shape) for shape in layer_shapes(cfg).values())
    n = cfg.n_layers * per_layer + cfg.vocab_size * cfg.dim * (1 if tied else 2) + cfg.dim
    what = f"--init {init}: training it" if init is not None else f"training {cfg.name}"
    need = addrspace.words(16 * n)
    parts = f"at least {need} for the weights, gradients and two Adam moments of {n} parameters"
    addrspace.check(16 * n, "train", what, parts)


def _blzt_shape(path: Path, head: bytes) -> dict[str, int]:
    """The model shape a BLZT header gives, with n_kv_heads when the run record holds it (the header
    does not)."""
    header = checkpoint.HEADER.parse(head)
    shape = {k: header[k] for k in checkpoint.SHAPE_FIELDS}
    run = checkpoint.read_run_record(path)
    stored = run.get("config") if run is not None else None
    if isinstance(stored, dict) and isinstance(stored.get("n_kv_heads"), int):
        shape["n_kv_heads"] = stored["n_kv_heads"]
    return shape


def _check_init_shape(path: Path, found: dict[str, int], cfg: ModelConfig, named: bool) -> None:
    """One line when the --init model's shape (``found``) is not the model's: the fields that differ, and
    the preset to pass with --config when one has the file's shape."""
    order = [k for k in (*INIT_SHAPE, "seq_len") if k in found]
    differ = [f"{k} {found[k]} (not {getattr(cfg, k)})" for k in order if found[k] != getattr(cfg, k)]
    if not differ:
        return
    fits = [name for name, p in PRESETS.items() if all(getattr(p, k) == v for k, v in found.items())]
    model = opt("config", cfg.name) if named else f"the {cfg.name} preset (no {opt('config')})"
    hint = (
        f"pass {opt('config', fits[0])}"
        if fits
        else f"no preset has its shape (presets: {', '.join(PRESETS)}), so anekit train cannot start from it"
    )
    raise AnekitError(f"[train] {opt('init', path)} does not fit {model}: its {', '.join(differ)}; {hint}")


def check_input_paths(options: TrainOptions) -> None:
    """--data (a regular file, or a directory of shards), --tokenizer and --init (regular files), checked
    without opening them: one line naming the path and what it is."""
    data = options.data
    if data is not None:
        st = stat_input(data, f"[train] {opt('data')} cannot read")
        if st is not None and not stat.S_ISDIR(st.st_mode):
            check_input(
                data, f"[train] {opt('data')} cannot read", expected="a text file or a directory of shards"
            )
    if options.tokenizer is not None:
        check_input(
            options.tokenizer,
            f"[train] {opt('tokenizer')} cannot read",
            LIMITS["tokenizer"],
            "a tokenizer file",
        )
    if options.init is not None:
        check_input(options.init, f"[train] {opt('init')} cannot read", expected="a model file")


def check_record_path(where: Path, field_name: str, path: str | None) -> Path | None:
    """A path a run record names (``data.path``, ``tokenizer.path``, ``base.path``), before a resume opens
    it: the checks its flag gets (``check_input_paths``), in one line naming the record's field. Returns
    the path (None for None)."""
    if path is None:
        return None
    what = f"[train] the run record of {where}: {field_name}"
    if field_name == "data.path":
        st = stat_input(path, what)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            check_input(path, what, expected="a text file or a directory of shards")
    elif field_name == "tokenizer.path":
        check_input(path, what, LIMITS["tokenizer"], "a tokenizer file")
    else:
        st = stat_input(path, what)
        if st is None or not stat.S_ISDIR(st.st_mode):
            check_input(path, what, expected="a model directory")  # names what it is
            raise AnekitError(f"{what} {path}: a file, not a model directory")
    return Path(path)


# --------------------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------------------


# A run drawing its loss.png in a helper process (``anekit.llama.plot_helper``) only when it has this
# much work ahead (stories15M: about 2.3e10 a sequence, 0.3 s of the simulator): a smaller run ends before
# the helper has imported matplotlib, and a test suite of small runs would only pay the helpers' start.
PLOT_HELPER_MIN_FLOPS = 5e10


class Run:
    """One training run in ``options.out``: everything is read and checked when it is made, nothing is
    written until ``train``."""

    def __init__(self, options: TrainOptions) -> None:
        self.options = options
        self.out = Path(options.out)
        self.checkpoint = self.out / CHECKPOINT
        self.lock: DirLock | None = None
        self._wall0 = 0.0
        self._in_flight: Background | None = None  # a checkpoint being written on a thread
        self._painter: PlotHelper | None = None  # the loss.png helper of a run in progress
        self._started: list[Path] = []  # the files a new run created beside its step-0 checkpoint
        init = None if options.resume else options.init  # --resume with --init: refused as a contradiction
        inputs = ((opt("init"), init), (opt("data"), options.data), (opt("tokenizer"), options.tokenizer))
        check_apart(
            self.out, f"[train] {opt('out')}", inputs
        )  # never into, over or around an input, --force or not
        self._prepare()

    # -- 1. what to run: the stored run (resume) or the options; nothing is written here --------------

    def _open_backend(self) -> None:
        """The backend the options name, with a compile budget that holds one step (a budget below it
        would restart forever)."""
        from anekit.llama.trainer import check_budget

        o = self.options
        backend_options: dict[str, Any] = dict(o.numerics)
        if o.compile_budget is not None:
            backend_options["compile_budget"] = o.compile_budget
        self.backend = runtime.open(o.backend, **backend_options)
        check_budget(self.backend.compile_budget, self.cfg, self.tc.weights)

    def _prepare(self) -> None:
        o, out, ckpt_path = self.options, self.out, self.checkpoint
        check_input_paths(o)  # a FIFO or a device never gets opened (it would block or never end)
        if out.exists() and not out.is_dir():
            raise AnekitError(f"[train] {opt('out', out)} is a file, not a directory")
        runtime.check_numerics_options(o.backend, o.numerics)  # before any write
        self.resumed_wall = 0.0
        if o.resume:
            self._prepare_resume()
        else:
            self._prepare_new()
        cfg, dataset = self.cfg, self.dataset
        if hasattr(dataset, "vocab_check"):
            dataset.vocab_check(cfg.vocab_size)
        if hasattr(dataset, "check_windows"):  # empty or tiny data: refused before anything is written
            dataset.check_windows(cfg.seq_len)
        if not o.resume:
            _check_finite(self.state.params, o.init)
        self._open_backend()
        if ckpt_path.exists() and not ckpt_path.is_file():
            raise AnekitError(f"[train] {ckpt_path} is not a regular file: the checkpoint cannot be written")
        if out.is_dir() and not os.access(out, os.W_OK | os.X_OK):
            raise AnekitError(f"[train] the output directory {out} is not writable")
        self.tok_bytes = b""
        if not o.resume:
            try:
                self.tok_bytes = self.tok_path.read_bytes()
            except OSError as e:
                raise AnekitError(f"[train] cannot read the tokenizer {self.tok_path}: {e.strerror}") from e

    def _prepare_resume(self) -> None:
        o, out, ckpt_path = self.options, self.out, self.checkpoint
        if o.force or o.init is not None:
            given = opt("force") if o.force else opt("init")
            raise AnekitError(f"[train] {opt('resume')} continues the run in {out}; {given} starts a new one")
        if not ckpt_path.is_file():
            raise AnekitError(
                f"[train] {opt('resume')}: no checkpoint {ckpt_path} (start the run without {opt('resume')})"
            )
        if checkpoint.read_run_record(ckpt_path) is None:
            raise AnekitError(
                f"[train] {opt('resume')}: {ckpt_path} has no run record (a checkpoint of another tool or of "
                f"an older anekit); start a new run from its weights with {opt('init')}"
            )
        self.seen = _identity(ckpt_path)
        ck = checkpoint.load_checkpoint_file(ckpt_path)
        assert ck.run is not None
        spec = RunRecord.from_record(ck.run, ckpt_path)
        _check_options(o, spec, out)
        self.state = _state_from(ck, ck.run)
        self.resumed_wall = ck.meta.cum_wall / 1e3
        self.cfg, self.tc, self.spec = spec.cfg, spec.tc, spec
        tok_path = o.tokenizer
        if tok_path is None:
            tok_path = out / spec.tokenizer_file
            if not tok_path.is_file() and spec.tokenizer.path is not None:
                tok_path = check_record_path(ckpt_path, "tokenizer.path", spec.tokenizer.path)
        tok_id = sha256_file(tok_path, TOKENIZER_MAX_BYTES)
        if tok_id != spec.tokenizer.sha256:
            raise AnekitError(
                f"[train] {opt('resume')}: the tokenizer {tok_path} (sha256 {tok_id[:12]}) is not the run's "
                f"{spec.tokenizer.short()}"
            )
        self.tok_path = tok_path
        self.tokenizer = _open_tokenizer(tok_path)
        data_path = o.data
        if data_path is None:
            data_path = check_record_path(ckpt_path, "data.path", spec.data.path)
        self.dataset = _dataset(data_path, self.tokenizer, self.tc.seed)
        data_id = sha256_tokens(self.dataset)
        if data_id != spec.data.sha256:
            where = data_path or "the built-in corpus"
            raise AnekitError(
                f"[train] {opt('resume')}: the data {where} (tokens sha256 {data_id[:12]}) is not the run's "
                f"{spec.data.short()}"
            )
        if self.state.step < self.tc.steps:
            spec.marks.append((self.state.step, "budget" if o.restarted else "resume"))

    def _prepare_new(self) -> None:
        from anekit.llama.params import Params
        from anekit.llama.trainer import TrainConfig, TrainState

        o, out, ckpt_path = self.options, self.out, self.checkpoint
        self.seen = _identity(ckpt_path)
        if self.seen is not None and not o.force:
            raise AnekitError(
                f"[train] {out} holds a run ({ckpt_path}): {opt('resume')} to continue it, {opt('force')} "
                "to start over"
            )
        name = o.config or "default"
        cfg = preset(name)
        if o.tokenizer is None and cfg.vocab_size > BUILT_IN_VOCAB_MAX:
            raise AnekitError(
                f"[train] {opt('config', name)} needs a {cfg.vocab_size}-token tokenizer: pass it with "
                f"{opt('tokenizer')} "
                "(llama2.c's tokenizer.bin or tokenizer.model for its stories models); the built-in one, "
                f"trained on anekit's small story corpus, has at most {BUILT_IN_VOCAB_MAX} tokens"
            )
        tc = TrainConfig(
            steps=o.steps or DEFAULT_STEPS.get(name, GENERIC_STEPS),
            accum=o.accum or DEFAULT_ACCUM,
            lr=o.lr or DEFAULT_LR.get(name, GENERIC_LR),
            seed=o.seed or 0,
            weights=o.weights or DEFAULT_WEIGHTS,
        )
        if tc.steps * tc.accum > INT32_MAX:
            raise AnekitError(
                f"[train] {opt('steps')} x {opt('accum')} = {tc.steps * tc.accum} sequences do not fit the "
                f"checkpoint's int32 counter (at most {INT32_MAX})"
            )
        tied = True
        if o.init is not None:  # the header alone, before the tokenizer, the data or the weights are read
            tied = _check_init_header(o.init, cfg, named=o.config is not None)
        _check_training_memory(cfg, tied, o.init)
        tok_path = o.tokenizer if o.tokenizer is not None else _init_tokenizer(o.init, cfg.vocab_size)
        builtin = tok_path is None
        if tok_path is not None:
            tok = _open_tokenizer(tok_path)
        else:
            from anekit.llama import tokenizer

            tok = tokenizer.default_tokenizer(vocab_size=cfg.vocab_size)
            tok_path = tokenizer.default_tokenizer_path(cfg.vocab_size)
        if getattr(tok, "vocab_size", cfg.vocab_size) > cfg.vocab_size:
            raise AnekitError(
                f"[train] the tokenizer has {tok.vocab_size} tokens, the model {cfg.vocab_size}"
            )
        dataset = _dataset(o.data, tok, tc.seed)
        if o.init is not None:
            params, init = _read_init(o.init, cfg, named=o.config is not None)
            if builtin:  # after the shape check: a model refused gets its one line alone
                _warn_builtin_for_init(o.init, tok_path, cfg.vocab_size)
        else:
            params, init = Params.init(cfg, seed=tc.seed), None
        self.state = TrainState.fresh(params, tc)
        self.cfg, self.tc, self.tokenizer, self.tok_path, self.dataset = cfg, tc, tok, tok_path, dataset
        self.spec = RunRecord(
            cfg=cfg,
            tc=tc,
            data=Source(_abs(o.data), sha256_tokens(dataset)),
            tokenizer=Source(_abs(tok_path), sha256_file(tok_path, TOKENIZER_MAX_BYTES)),
            tokenizer_file="tokenizer.model" if tok_path.suffix == ".model" else "tokenizer.bin",
            init=init,
            marks=[],
        )

    # -- 2. the output directory, locked for the run ----------------------------------------------------

    def open(self) -> None:
        """Create (if need be) and lock the output directory, removing what dead writers left in it
        (``train`` does it when it was not done)."""
        if self.lock is None:
            self.created = self._open()

    def _open(self) -> bool:
        """``open``'s work; True when this run created the directory."""
        out = self.out
        created = not out.exists()
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise AnekitError(f"[train] cannot create the output directory {out}: {e.strerror}") from e
        try:
            self.lock = DirLock(out, "anekit train").acquire()
        except AnekitError:
            if created:
                self._remove_new_out()
            raise
        if _identity(self.checkpoint) != self.seen:  # another writer finished in between: stale checks
            raise AnekitError(
                f"[train] {self.checkpoint} changed while this run started (another anekit train wrote it); "
                "run again"
            )
        remove_stale_temporaries(out)
        return created

    def _remove_new_out(self) -> None:
        """Remove the output directory this run created, when a refusal comes before any step: only the
        lock file, temporaries and the tokenizer's copy may be in it (the step-0 checkpoint's write can fail
        after the copy), so a failed start leaves nothing behind."""
        with contextlib.suppress(OSError):
            (self.out / LOCK_FILE).unlink(missing_ok=True)
            (self.out / self.spec.tokenizer_file).unlink(missing_ok=True)
            remove_stale_temporaries(self.out)
            self.out.rmdir()

    def close(self) -> None:
        """Release the output directory's lock (a no-op when it is not held)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # -- 3. training ----------------------------------------------------------------------------------

    @property
    def threads(self) -> int:
        """Sequences of a batch run at once (``anekit.llama.accumulate``); the result never depends on it."""
        from anekit.llama.accumulate import default_threads

        if self.options.threads is not None:
            return self.options.threads
        return default_threads(self.backend.name, self.tc.weights, self.tc.accum, self.cfg)

    def save(self) -> None:
        """Checkpoint the run as it stands (weights, Adam state, run record), atomically."""
        self._settle()
        self._write_checkpoint()

    def _save_in_background(self) -> None:
        """Start the checkpoint's write on a thread: it must be settled (``_settle``) before any weight
        changes, and before any other write of the checkpoint."""
        self._settle()
        self._in_flight = Background(self._write_checkpoint, "anekit-checkpoint")

    def _settle(self, quiet: bool = False) -> None:
        """Wait for a checkpoint write in flight; raise its error unless ``quiet`` (already failing)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            if quiet:
                with contextlib.suppress(BaseException):
                    in_flight.wait()
            else:
                in_flight.wait()

    def _write_checkpoint(self) -> None:
        with writing(self.checkpoint, "[train]"):
            save_run(self.checkpoint, self.state, self.spec, time.perf_counter() - self._wall0)

    def title(self) -> str:
        spec = self.spec
        return (
            f"anekit train run '{self.out.resolve().name}': {spec.cfg.name} model, {len(self.state.losses)}/"
            f"{spec.tc.steps} steps, {spec.tc.weights} weights, lr {spec.tc.lr:g}, seed {spec.tc.seed}"
        )

    def train(
        self,
        on_step: Callable[[StepReport], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        log: Callable[[str], None] | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> RunResult:
        """Create and lock the output directory, then train until the steps are done, the compile budget
        runs out ("budget") or ``should_stop()`` says so between two steps ("stopped"); the run is saved
        either way. ``log`` receives the lines a run has to say (the sanitizer's summaries). ``on_done()``
        is called once the last step is done, as the final checkpoint starts being written (the command
        starts its closing sample there, on a thread, so that the two overlap); the weights do not change
        after it."""
        o, state, tc = self.options, self.state, self.tc
        self.open()
        sanitizer = getattr(self.backend, "sanitizer", None)
        self._wall0 = time.perf_counter() - self.resumed_wall  # cumulative over restarts

        def save(st: TrainState, background: bool = False) -> None:
            (self._save_in_background if background else self.save)()
            if sanitizer is not None and sanitizer.events:  # what departed from the ideal since the last one
                if log is not None:
                    log(f"sanitizer, steps up to {st.step}: {sanitizer.summary()}")
                sanitizer.clear()

        self._painter = self._plot_helper()
        try:
            return self._train(o, state, tc, save, on_step, should_stop, log, on_done)
        finally:
            if self._painter is not None:
                self._painter.close()
                self._painter = None

    def _train(self, o: TrainOptions, state: TrainState, tc: TrainConfig, save: Callable[..., None],
               on_step: Any, should_stop: Any, log: Any, on_done: Any) -> RunResult:  # fmt: skip
        from anekit.llama.trainer import train

        created = self.created
        every = o.checkpoint_every or AUTO_CHECKPOINT_STEPS
        seconds = None if o.checkpoint_every else AUTO_CHECKPOINT_SECONDS
        reason, first_saved = "done", False
        if o.resume and state.step >= tc.steps:  # finished before: nothing to train, nothing is written
            no_png = self._catch_up_curves()
            return RunResult("done", state.step, tc.steps, list(state.losses), self.checkpoint,
                             dict(state.seconds), no_png, trained=False)  # fmt: skip
        try:
            if not o.resume:
                # step 0: from now on a kill at any instant leaves a run that resume continues. Written while
                # the kernels compile and the first step computes (the trainer settles it before the first
                # update): 0.4 s of stories15M's start-up otherwise.
                save(state, background=True)
                first_saved = True
                self._start_files()
            if state.step < tc.steps:
                reason = train(
                    self.backend,
                    state,
                    self.dataset,
                    tc,
                    on_step=on_step,
                    on_checkpoint=lambda st: save(st, background=True),  # settled before the next update
                    checkpoint_every=every,
                    checkpoint_seconds=seconds,
                    should_stop=should_stop,
                    threads=self.threads,
                    before_update=self._settle,
                    **self._loop_options(log),
                )
        except AnekitError:
            self._settle(quiet=True)  # the step-0 write, if it is still going, ends before anything else
            if not o.resume and state.step == 0:  # e.g. kernels the backend refuses, a full disk:
                self._remove_started(first_saved, created)  # leave no run behind
            raise
        except BaseException:
            self._settle(quiet=True)  # Ctrl-C from Python: the step-0 checkpoint is whole before we unwind
            raise
        save(state, background=True)  # written while the run's product and its curves are made
        staged: StagedCurves | None = None
        try:
            if on_done is not None and reason == "done":
                on_done()
            self._finish(reason)
            staged = self._curves(draw=reason != "budget")
            self._settle()
            staged.commit()  # the curves only once the checkpoint holding their losses is in place
        except BaseException:
            self._settle(quiet=True)
            raise
        finally:
            if staged is not None:
                staged.discard()
        return RunResult(reason, state.step, tc.steps, list(state.losses), self.checkpoint,
                         dict(state.seconds), staged.no_png)  # fmt: skip

    def _catch_up_curves(self) -> str | None:
        """A finished run's curves, rewritten only when loss.csv is not the checkpoint's (a kill between
        the last checkpoint's rename and the curves' commit); else nothing is written."""
        try:
            current = (self.out / "loss.csv").read_bytes()
        except OSError:
            current = None
        if current == self._curves(draw=False).csv:
            return None
        staged = self._curves(draw=True)
        try:
            staged.commit()
        finally:
            staged.discard()
        return staged.no_png

    def _remove_started(self, first_saved: bool, created: bool) -> None:
        """A new run failing before its first step: remove what it wrote (its checkpoint and the files
        ``_start_files`` wrote), and the directory when it made it."""
        import shutil

        with contextlib.suppress(OSError):
            if first_saved and _identity(self.checkpoint) != self.seen:  # this run's, not the one it found
                self.checkpoint.unlink(missing_ok=True)
            for path in self._started:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        if created:
            self._remove_new_out()

    # -- what a kind of run adds (``anekit.hf.training.HFRun`` overrides these) ------------------------

    def _start_files(self) -> None:
        """Beside the step-0 checkpoint: the tokenizer's copy (a previous run's state file goes)."""
        self._write_started(self.out / self.spec.tokenizer_file, self.tok_bytes)
        (self.out / LEGACY_STATE).unlink(missing_ok=True)  # a previous run's state would mislead

    def _write_started(self, path: Path, data: bytes) -> None:
        """Write one of the files a new run starts with (removed again if it fails before its first step,
        when it was not there before); a failed write is one line naming the file and why."""
        new = not os.path.lexists(path)
        with writing(path, "[train]"):
            write_bytes_atomic(path, data)
        if new:
            self._started.append(path)

    def _loop_options(self, log: Callable[[str], None] | None) -> dict[str, Any]:
        """More arguments of ``trainer.train`` (what is trained, validation)."""
        return {}

    def _finish(self, reason: str) -> None:
        """After the last save (a product to write)."""

    def _curves(self, draw: bool) -> StagedCurves:
        return StagedCurves(self.out, self.state.losses, self.title(), self.spec.marks, draw=draw,
                            painter=self._painter)  # fmt: skip

    def _plot_helper(self) -> PlotHelper | None:
        """A helper process to draw loss.png (``anekit.llama.plot_helper``) when the run is long enough
        for its start to pay, there is a core to spare and matplotlib is installed; else None."""
        import importlib.util
        import sys

        from anekit.llama.accumulate import sequence_flops
        from anekit.llama.plot_helper import PlotHelper

        work = sequence_flops(self.cfg) * self.tc.accum * max(0, self.tc.steps - self.state.step)
        if work < PLOT_HELPER_MIN_FLOPS or cores() < 2 or getattr(sys, "frozen", False):
            return None
        if importlib.util.find_spec("matplotlib") is None:
            return None
        return PlotHelper.start()


class Progress:
    """What ``anekit.train`` prints as it runs (as mlx-lm's trainer does): a line at the first, every 10th
    and the last step (the command's lines, without its terminal redraw), the lines the run has to say
    (validation, the sanitizer's summaries) and one closing line; on stdout, flushed."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def say(self, line: str) -> None:
        print(line, flush=True)

    def step(self, r: StepReport) -> None:
        steps = self.run.tc.steps
        if r.step % 10 == 0 or r.step == steps or r.step == 1 or r.val_loss is not None:
            rate = r.tokens / r.seconds if r.seconds else 0.0
            skipped = "  (overflow: skipped)" if r.skipped else ""
            self.say(f"step {r.step:4d}/{steps}  loss {r.loss:6.3f}  lr {r.lr:.2e}  {rate:7.0f} tok/s  "
                     f"{1e3 * r.seconds:6.0f} ms/step{skipped}")  # fmt: skip

    def end(self, result: RunResult) -> None:
        losses = result.losses
        if not result.trained:
            self.say(f"the run in {self.run.out} is finished ({result.step}/{result.steps} steps)")
        elif result.reason == "budget":
            self.say(f"compile budget reached at step {result.step}: saved {result.checkpoint}; call again "
                     "with resume=True to continue")  # fmt: skip
        elif losses:
            done = "trained" if result.reason == "done" else "stopped after"
            self.say(f"{done} {plural(result.step, 'step')}: loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved "
                     f"{result.checkpoint}")  # fmt: skip


def train(out: str | os.PathLike[str] = "out", quiet: bool = False, **options: Any) -> RunResult:
    """Train as ``anekit train --out OUT`` does, the options named as its flags (``config``, ``data``,
    ``tokenizer``, ``steps``, ``accum``, ``lr``, ``seed``, ``weights``, ``backend``, ``init``, ``resume``,
    ``force``, ``checkpoint_every``, ``compile_budget``, ``numerics``); errors name them as these
    parameters (``resume=True``). Progress goes to stdout as the run goes (``Progress``: the first, every
    10th and the last step, one closing line) unless ``quiet=True``; ``Run`` itself prints nothing. Returns
    how the run ended; a run whose compile budget ran out ends with reason "budget": call again with
    ``resume=True``; a finished run resumed trains nothing and writes nothing (``trained`` False)."""
    known = {f.name for f in fields(TrainOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise AnekitError(
            f"[train] unknown option {unknown[0]!r} (known: {', '.join(sorted(known - {'out'}))}, quiet)"
        )
    for key in ("data", "tokenizer", "init"):
        if options.get(key) is not None:
            options[key] = Path(options[key])
    run = Run(TrainOptions(out=Path(out), **options))
    try:
        if quiet:
            return run.train()
        progress = Progress(run)
        result = run.train(on_step=progress.step, log=progress.say)
        progress.end(result)
        return result
    finally:
        run.close()
