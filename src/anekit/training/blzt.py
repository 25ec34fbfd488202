"""The BLZT / llama2.c source of a run: a preset (or an --init llama2.c model or anekit checkpoint),
corpus data, and the run kept in one BLZT checkpoint.

The checkpoint (``OUT/ckpt.bin``) is the run: a BLZT file whose run record (``anekit.llama.run_record``)
holds the model and training configs, the loss history, the restarts and the identities (sha256) of the
data and the tokenizer, written in one atomic rename. A resume continues from it alone and refuses
options that contradict it. Data is a directory of uint16 shards, a text file, or the built-in corpus;
the tokenizer is a sentencepiece .model or llama2.c's tokenizer.bin (default: a BPE trained on the
built-in corpus), copied beside the checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from anekit import addrspace
from anekit.errors import AnekitError
from anekit.fileio import LOCK_FILE, remove_stale_temporaries
from anekit.inputs import LIMITS, check_input
from anekit.kernels import PRESETS, ModelConfig, preset
from anekit.kernels.route import kernel_route
from anekit.llama import checkpoint
from anekit.llama.params import Params
from anekit.llama.run_record import RUN_FORMAT, world_fields
from anekit.llama.run_record import RUN_RECORD_VERSION as RUN_VERSION
from anekit.training.identity import (
    TOKENIZER_MAX_BYTES,
    FileIdentity,
    Source,
    absolute,
    check_input_paths,
    check_record_path,
    file_identity,
    sha256_file,
    sha256_tokens,
)
from anekit.training.options import INT32_MAX, TrainOptions, opt, raise_contradiction
from anekit.training.source import Validation, register_source
from anekit.training.state import TrainConfig, TrainState
from anekit.training.trainable import FullTrainable, Trainable

CHECKPOINT = "ckpt.bin"
LEGACY_STATE = "train_state.json"  # the run state's separate file before the run record; removed on a new run

# The default run: a model small enough to train in about a minute on two CPU cores in the simulator.
# 400 steps at a peak learning rate of 6e-3 bring its loss to about 1.3 (dynamic weights, 4 x 64 tokens
# a step); at the generic 3e-3 the same steps end near 1.9.
DEFAULT_STEPS = {"default": 400}
DEFAULT_LR = {"default": 6e-3}
GENERIC_STEPS = 200
GENERIC_LR = 3e-3
DEFAULT_ACCUM = 4
DEFAULT_WEIGHTS = "dynamic"
# The built-in tokenizer is a BPE trained on the embedded corpus, whose text holds only about 2000 pieces
# (sentencepiece refuses more: "Vocabulary size too high (32000) ... <= 2007"): enough for the 512-token
# presets; llama2.c's 32000-token presets need llama2.c's tokenizer.
BUILT_IN_VOCAB_MAX = 2000
# The fields a llama2.c --init model must share with the model trained (its seq_len is only the length it
# was trained at); a BLZT checkpoint's header fields must all agree (its reader checks them).
INIT_SHAPE = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size")


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
    worlds: list[tuple[int, int]] = field(default_factory=list)  # (step, world size) of every start
    blas_threads: int | None = None  # BLAS threads per sequence, fixed at the start (None: an older run)

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
            **world_fields(self.worlds, self.blas_threads),
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
                worlds=[(int(s), int(n)) for s, n in rec.get("worlds", [])],
                blas_threads=rec.get("blas_threads"),
            )
        except (KeyError, TypeError, ValueError, AnekitError) as e:
            raise AnekitError(f"[train] {opt('resume')}: the run record of {where} is incomplete: {e}") from e


def _state_from(ck: Any, rec: dict[str, Any]) -> TrainState:
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
    assert state.adam_m is not None and state.adam_v is not None  # a full run keeps its moments in the state
    checkpoint.save_checkpoint(path, state.params, state.adam_m, state.adam_v, meta, run=spec.record(state))


def _check_finite(params: Any, init: Path | None) -> None:
    """Refuse initial weights holding NaN or infinity (a damaged --init model) before anything is written."""
    for name, a in params.tensors():
        if not np.isfinite(a).all():
            where = opt("init", init) if init is not None else "the initial weights"
            raise AnekitError(f"[train] {where}: {name} holds NaN or infinite values")


def _route_weights(route: str | None, weights: str | None = None) -> str | None:
    """The weight mode of training route ``route`` (None: no route, the legacy kernels); an explicit
    ``weights`` that contradicts it is refused."""
    if not route:
        return None
    mode = kernel_route(route).weights
    if weights is not None and weights != mode:
        raise AnekitError(f"[train] {opt('weights', weights)} contradicts the route {route} ({mode} weights)")
    return mode


def _check_options(options: TrainOptions, stored: RunRecord, where: Path) -> None:
    """On resume: refuse every given option that contradicts the stored run."""
    given = {
        "config": (options.config, stored.cfg.name),
        "steps": (options.steps, stored.tc.steps),
        "accum": (options.accum, stored.tc.accum),
        "lr": (options.lr, stored.tc.lr),
        "seed": (options.seed, stored.tc.seed),
        "weights": (options.weights, stored.tc.weights),
        "route": (options.route, stored.tc.route),
    }
    for name, (value, kept) in given.items():
        if value is not None and value != kept:
            raise_contradiction(name, value, kept, where)


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
    return params, Source(absolute(path), sha256_file(path))


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


class BlztSource:
    """A run of a preset or of an --init llama2.c model / anekit checkpoint on corpus data, kept in a BLZT
    checkpoint (``anekit.training.source.RunSource``)."""

    checkpoint_name = CHECKPOINT
    mode = "full"  # every weight is trained
    kind = "blzt"
    default_accum = DEFAULT_ACCUM

    def __init__(self) -> None:
        self.resumed_wall = 0.0
        self.seen: FileIdentity | None = None
        self.tok_bytes = b""
        self._trainable: FullTrainable | None = None

    @property
    def marks(self) -> list[tuple[int, str]]:
        return self.spec.marks

    @property
    def worlds(self) -> list[tuple[int, int]]:
        return self.spec.worlds

    @property
    def blas_threads(self) -> int | None:
        return self.spec.blas_threads

    @blas_threads.setter
    def blas_threads(self, value: int | None) -> None:
        self.spec.blas_threads = value

    @property
    def trainable(self) -> Trainable:
        """Every weight, with the state's Adam moments (its gradients allocated on first use)."""
        if self._trainable is None:
            self._trainable = FullTrainable(self.state)
        return self._trainable

    def check_inputs(self, options: TrainOptions) -> None:
        check_input_paths(options)  # a FIFO or a device never gets opened (it would block or never end)

    def prepare(self, options: TrainOptions, out: Path, checkpoint_path: Path) -> None:
        """The stored run (resume) or the options read and checked; nothing is written."""
        o = options
        if o.resume:
            self._prepare_resume(o, out, checkpoint_path)
        else:
            self._prepare_new(o, out, checkpoint_path)
        cfg, dataset = self.cfg, self.dataset
        if hasattr(dataset, "vocab_check"):
            dataset.vocab_check(cfg.vocab_size)
        if hasattr(dataset, "check_windows"):  # empty or tiny data: refused before anything is written
            dataset.check_windows(cfg.seq_len)
        if not o.resume:
            _check_finite(self.state.params, o.init)
            try:  # copied beside the step-0 checkpoint
                self.tok_bytes = self.tok_path.read_bytes()
            except OSError as e:
                raise AnekitError(f"[train] cannot read the tokenizer {self.tok_path}: {e.strerror}") from e

    def _prepare_resume(self, o: TrainOptions, out: Path, ckpt_path: Path) -> None:
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
        self.seen = file_identity(ckpt_path)
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
        assert tok_path is not None
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

    def _prepare_new(self, o: TrainOptions, out: Path, ckpt_path: Path) -> None:
        self.seen = file_identity(ckpt_path)
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
            weights=_route_weights(o.route, o.weights) or o.weights or DEFAULT_WEIGHTS,
            route=o.route or "",
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
            data=Source(absolute(o.data), sha256_tokens(dataset)),
            tokenizer=Source(absolute(tok_path), sha256_file(tok_path, TOKENIZER_MAX_BYTES)),
            tokenizer_file="tokenizer.model" if tok_path.suffix == ".model" else "tokenizer.bin",
            init=init,
            marks=[],
        )

    # -- what the run writes --------------------------------------------------------------------------

    def title(self, out: Path) -> str:
        spec = self.spec
        return (
            f"anekit train run '{out.resolve().name}': {spec.cfg.name} model, {len(self.state.losses)}/"
            f"{spec.tc.steps} steps, {spec.tc.weights} weights, lr {spec.tc.lr:g}, seed {spec.tc.seed}"
        )

    def start_files(self, out: Path) -> list[tuple[Path, bytes]]:
        """Beside the step-0 checkpoint: the tokenizer's copy (a previous run's state file goes)."""
        (out / LEGACY_STATE).unlink(missing_ok=True)  # a previous run's state would mislead
        return [(out / self.spec.tokenizer_file, self.tok_bytes)]

    def write_checkpoint(self, path: Path, wall: float) -> list[Path]:
        """The checkpoint and its run record, in one atomic write; nothing else is made."""
        save_run(path, self.state, self.spec, wall)
        return []

    def validation(self, log: Callable[[str], None] | None) -> Validation | None:
        return None  # corpus runs are not validated

    def val_losses(self) -> dict[int, float] | None:
        return None

    def finish(self, out: Path, reason: str) -> None:
        """Nothing beyond the checkpoint: it is the run's product."""

    def products(self, out: Path) -> list[Path]:
        return []

    def sample_weights(self) -> Params:
        return self.state.params

    def remove_new_out(self, out: Path) -> None:
        """Remove the output directory a refused start created: only the lock file, temporaries and the
        tokenizer's copy may be in it (the step-0 checkpoint's write can fail after the copy)."""
        with contextlib.suppress(OSError):
            (out / LOCK_FILE).unlink(missing_ok=True)
            (out / self.spec.tokenizer_file).unlink(missing_ok=True)
            remove_stale_temporaries(out)
            out.rmdir()

    # -- a run over several ranks ---------------------------------------------------------------------

    def identity(self) -> dict[str, str]:
        return {"data sha256": self.spec.data.sha256, "tokenizer sha256": self.spec.tokenizer.sha256,
                "trainable": self.mode}  # fmt: skip

    def describe(self) -> dict[str, Any]:
        """The preset, the training config, and where rank 0 read its data and tokenizer (None: the
        built-in ones, which every rank makes alike)."""
        from anekit.llama import tokenizer

        spec = self.spec
        builtin = str(tokenizer.default_tokenizer_path(spec.cfg.vocab_size).resolve())
        tok = spec.tokenizer.path
        return {
            "kind": self.kind,
            "config": spec.cfg.name,
            "train": asdict(spec.tc),
            "data": spec.data.path,
            "tokenizer": None if tok == builtin else tok,
            "tokenizer_file": spec.tokenizer_file,
        }

    def follower_options(self, description: dict[str, Any], options: TrainOptions) -> TrainOptions:
        """A fresh run of the described preset and config; the data and tokenizer this rank was given, else
        the paths rank 0 read (the tokenizer: its recorded path, else the copy in OUT when this machine
        shares it)."""
        d, tc = description, description["train"]
        tok = options.tokenizer
        if tok is None and d["tokenizer"] is not None:
            recorded, copy = Path(d["tokenizer"]), options.out / d["tokenizer_file"]
            tok = copy if not recorded.is_file() and copy.is_file() else recorded
        data = options.data if options.data is not None else None if d["data"] is None else Path(d["data"])
        return replace(options, config=d["config"], data=data, tokenizer=tok, init=None, resume=False,
                       force=True, steps=tc["steps"], accum=tc["accum"], lr=tc["lr"], seed=tc["seed"],
                       weights=tc["weights"], route=tc["route"])  # fmt: skip

    def state_arrays(self) -> list[np.ndarray]:
        s = self.state
        assert s.adam_m is not None and s.adam_v is not None  # a full run keeps its moments in the state
        return [a for container in (s.params, s.adam_m, s.adam_v) for _, a in container.tensors()]

    def state_received(self) -> None:
        """Nothing to redo: the kernels read the weights as they are."""


register_source(BlztSource.kind, lambda description: BlztSource())
