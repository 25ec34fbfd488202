"""Fine-tuning a Hugging Face model with the training kernels: LoRA (``lora`` rank given) or full.

``HFSource`` is the source (``anekit.training.source.RunSource``) of an ``anekit.training.run.Run`` of a
model read from a Hugging Face directory (``init``): ``hf_run(options, hf)`` makes one. The run keeps
the promises every run makes (everything checked before anything is written, one writer per output
directory, a run that a kill at any instant leaves resumable, stopping between steps); the source brings
what such a model needs:

* data in mlx-lm's formats (``anekit.hf.datasets``: a directory with train.jsonl and valid.jsonl, or one
  .jsonl file), the loss only where the format says (a completion, the last assistant message); without
  ``data``, the built-in story corpus as text examples (its last 5% for validation);
* windows of ``seq`` tokens (default ``DEFAULT_SEQ``, at most the model's context), one example each,
  drawn uniformly from the trainable examples by a generator seeded with (seed, step, micro-step), so a
  resumed run draws what the uninterrupted one would have (mlx-lm shuffles epochs instead);
* the validation loss (token-weighted over the first ``val_batches`` validation examples) before the
  first step, every ``val_every`` steps and after the last; loss.csv gets a ``val_loss`` column;
* the run's state in ``OUT/state.safetensors``: the trained tensors and their Adam moments (F32) with the
  run record (JSON, ``anekit.llama.run_record.HF_RUN_SCHEMA``) in the file's metadata under
  ``anekit.run``, written in one atomic rename;
* the result: LoRA adapters in PEFT's format in ``OUT/adapters`` (rewritten at every checkpoint), or,
  for full fine-tuning, the model as a Hugging Face directory ``OUT/model`` (written at the end and when
  the run stops), with the tokenizer files copied beside it.

Validated runs use dynamic weights (the kernels read the updated weights without recompiling).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from anekit.errors import AnekitError
from anekit.jsonio import loads
from anekit.kernels.route import kernel_route
from anekit.llama.params import Params
from anekit.llama.run_record import HF_RUN_FORMAT, HF_RUN_SCHEMA, HF_RUN_VERSION, world_fields
from anekit.outputs import writing
from anekit.training.distributed.transport import Transport
from anekit.training.identity import (
    FileIdentity,
    check_input_paths,
    check_record_path,
    file_identity,
    sha256_file,
)
from anekit.training.lora import (
    Adapters,
    LoraSpec,
    LoraTrainable,
    adapter_tensors,
    frozen_base,
    fuse,
    parse_targets,
)
from anekit.training.options import INT32_MAX, TrainOptions, opt, raise_contradiction
from anekit.training.run import Run
from anekit.training.source import Validation, register_source
from anekit.training.state import TrainConfig, TrainState
from anekit.training.trainable import FullTrainable, Trainable

STATE_FILE = "state.safetensors"
RUN_KEY = "anekit.run"  # the run record's key in the state file's metadata
DEFAULT_SEQ = 256
DEFAULT_STEPS = 100
DEFAULT_ACCUM = 4
DEFAULT_LR = {"lora": 1e-3, "full": 2e-5}  # LoRA: see README, "Fine-tuning a Hugging Face model"
DEFAULT_VAL_EVERY = 25
DEFAULT_VAL_BATCHES = 25  # validation examples evaluated (mlx-lm's --val-batches default); -1: all
DEFAULT_TARGETS = ("q", "v")  # PEFT's default LoRA targets for Llama-family models
VALID_SHARE = 0.05  # of the built-in corpus's stories, held out for validation
MODEL_FILES_HASHED = ("config.json", "model.safetensors.index.json")  # with every *.safetensors


@dataclass(frozen=True)
class HFOptions:
    """What ``anekit train --init HF_DIR`` adds to ``TrainOptions``."""

    lora: int | None = None  # LoRA rank; None: full fine-tuning
    lora_alpha: float | None = None  # default 2 x rank (scale 2)
    lora_targets: tuple[str, ...] | None = None  # default q, v
    seq: int | None = None  # window length (the kernels' spatial size), default DEFAULT_SEQ
    val_every: int | None = None
    val_batches: int | None = None


def hash_model(directory: Path) -> str:
    """sha256 over a model directory's config.json, index and safetensors files (names and bytes)."""
    h = hashlib.sha256()
    names = [n for n in MODEL_FILES_HASHED if (directory / n).is_file()]
    names += sorted(p.name for p in directory.glob("*.safetensors"))
    for name in names:
        h.update(name.encode() + b"\0")
        h.update(bytes.fromhex(sha256_file(directory / name)))
    return h.hexdigest()


def hash_tokenizer(directory: Path) -> str:
    from anekit.hf.model import SIDE_FILES

    h = hashlib.sha256()
    for name in SIDE_FILES:
        if (directory / name).is_file():
            h.update(name.encode() + b"\0")
            h.update(bytes.fromhex(sha256_file(directory / name)))
    return h.hexdigest()


class ExampleData:
    """Windows of ``seq`` tokens for the training loop: one trainable example each, drawn uniformly."""

    def __init__(self, examples: list[Any], seq: int, pad_id: int) -> None:
        from anekit.hf.datasets import trainable

        self.examples = [e for e in examples if trainable(e, seq)]
        self.skipped = len(examples) - len(self.examples)
        self.seq, self.pad_id = seq, pad_id
        if not self.examples:
            raise AnekitError(
                f"[train] no training example has a trained token within {seq} tokens ({opt('seq', seq)})"
            )

    def batch(self, rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from anekit.hf.datasets import window

        w = window(self.examples[int(rng.integers(len(self.examples)))], seq_len, self.pad_id)
        return w.inputs, w.targets, w.weights


def tokens_digest(examples: list[Any]) -> str:
    """sha256 of the examples' tokens and masks: the data's identity for a resumed run."""
    h = hashlib.sha256()
    for e in examples:
        a = np.ascontiguousarray(e.tokens, dtype="<i4")
        h.update(len(a).to_bytes(8, "little") + int(e.loss_from).to_bytes(8, "little"))
        h.update(a.data.cast("B"))
    return h.hexdigest()


def hf_run(options: TrainOptions, hf: HFOptions | None = None, transport: Transport | None = None) -> Run:
    """A run fine-tuning the Hugging Face model ``options.init`` (or resuming one: ``options.resume``), over
    ``transport``'s ranks when given (else the one ``options.distributed`` names)."""
    return Run(options, HFSource(hf or HFOptions()), transport)


class HFSource:
    """The source of a fine-tuning run of a Hugging Face model (see the module docstring)."""

    checkpoint_name = STATE_FILE
    kind = "hf"
    default_accum = DEFAULT_ACCUM

    def __init__(self, hf: HFOptions) -> None:
        self.hf = hf
        self.resumed_wall = 0.0
        self.seen: FileIdentity | None = None
        self.marks: list[tuple[int, str]] = []
        self.worlds: list[tuple[int, int]] = []  # (step, world size) of every start
        self.blas_threads: int | None = None  # BLAS threads per sequence, fixed at the start
        self._refs: dict[str, Any] = {}

    # -- preparing: nothing written -----------------------------------------------------------------

    def check_inputs(self, options: TrainOptions) -> None:
        o = options
        if o.tokenizer is not None or o.config is not None:
            flag = opt("tokenizer") if o.tokenizer is not None else opt("config")
            raise AnekitError(f"[train] {flag} does not apply to a Hugging Face model: it names its own")
        if o.weights not in (None, "dynamic"):
            raise AnekitError(
                "[train] a Hugging Face model trains with dynamic weights (it validates as it goes)"
            )
        check_input_paths(TrainOptions(data=o.data))  # a FIFO or a device never gets opened

    def prepare(self, options: TrainOptions, out: Path, checkpoint: Path) -> None:
        self.options, self.out, self.checkpoint = options, out, checkpoint
        self.seen = file_identity(checkpoint)
        stored = self._stored() if options.resume else None
        self._setup(stored)

    def _stored(self) -> dict[str, Any]:
        """The run record of ``OUT/state.safetensors`` (resume)."""
        o = self.options
        if o.force:
            raise AnekitError(
                f"[train] {opt('resume')} continues the run in {self.out}; {opt('force')} starts a new one"
            )
        if not self.checkpoint.is_file():
            raise AnekitError(
                f"[train] {opt('resume')}: no {self.checkpoint} (start the run without {opt('resume')})"
            )
        from anekit.hf.safetensors_io import read_header

        refs, metadata = read_header(self.checkpoint)
        self._refs = refs
        if RUN_KEY not in metadata:
            raise AnekitError(f"[train] {opt('resume')}: {self.checkpoint} holds no anekit run record")
        rec = loads(metadata[RUN_KEY], f"[train] the run record of {self.checkpoint}")
        if (
            not isinstance(rec, dict)
            or rec.get("format") != HF_RUN_FORMAT
            or rec.get("version") != HF_RUN_VERSION
        ):
            raise AnekitError(
                f"[train] {opt('resume')}: {self.checkpoint} holds a run record of another kind; anekit "
                f"reads '{HF_RUN_FORMAT}' version {HF_RUN_VERSION}"
            )
        try:
            HF_RUN_SCHEMA.check(rec, "")  # every field the resume reads, with its type and range
        except AnekitError as e:
            raise AnekitError(f"[train] {opt('resume')}: {self.checkpoint}: {e}") from e
        return rec

    def _setup(self, stored: dict[str, Any] | None) -> None:
        from anekit.hf.model import load_model
        from anekit.hf.tokenizer import load_hf_tokenizer

        o, hf = self.options, self.hf
        try:
            init = o.init
            if init is None and stored:
                init = check_record_path(self.checkpoint, "base.path", stored["base"]["path"])
            if init is None:
                raise AnekitError(f"[train] {opt('init', 'HF_DIR')} names the model to fine-tune")
            seq = hf.seq or (stored["seq"] if stored else DEFAULT_SEQ)
            lora = hf.lora if not stored else (stored["lora"] or {}).get("rank")
        except (KeyError, TypeError) as e:
            raise AnekitError(
                f"[train] {opt('resume')}: the run record of {self.checkpoint} is incomplete: {e}"
            ) from e
        if stored is None and self.seen is not None and not o.force:
            raise AnekitError(
                f"[train] {self.out} holds a run ({self.checkpoint}): {opt('resume')} to continue it, "
                f"{opt('force')} to start over"
            )
        if not hf.seq and not stored:  # the default window, at most the model's context
            from anekit.hf.config import read_config

            seq = min(DEFAULT_SEQ, read_config(init).max_position_embeddings)
        mode = "lora" if lora else "full"
        # LoRA: the frozen matrices as float16 from the start (the kernels read fp16; half the memory)
        model = load_model(init, seq_len=seq, matrix_dtype=np.float16 if mode == "lora" else np.float32)
        self.model = model
        self.base_id = hash_model(Path(init))
        self.tok_id = hash_tokenizer(Path(init))
        if stored is not None:
            if self.base_id != stored["base"]["sha256"]:
                raise AnekitError(
                    f"[train] {opt('resume')}: the model {init} is not the run's (its files changed)"
                )
            if self.tok_id != stored["tokenizer"]["sha256"]:
                raise AnekitError(f"[train] {opt('resume')}: the tokenizer files of {init} are not the run's")
        self.tokenizer = load_hf_tokenizer(init, model_vocab=model.cfg.vocab_size)
        if self.tokenizer.vocab_size > model.cfg.vocab_size:
            raise AnekitError(
                f"[train] the tokenizer has {self.tokenizer.vocab_size} tokens, the model "
                f"{model.cfg.vocab_size}"
            )
        known = {f.name for f in fields(TrainConfig)}
        if stored is not None:
            tc = TrainConfig(**{k: v for k, v in stored["train"].items() if k in known})
            self._check_same(stored, tc)
        else:
            tc = TrainConfig(
                steps=o.steps or DEFAULT_STEPS,
                accum=o.accum or DEFAULT_ACCUM,
                lr=o.lr or DEFAULT_LR[mode],
                min_lr=(o.lr or DEFAULT_LR[mode]) / 10,
                warmup=min(10, max(1, (o.steps or DEFAULT_STEPS) // 10)),
                weight_decay=0.0 if mode == "lora" else 0.1,
                seed=o.seed or 0,
                weights="dynamic",
                route=self._route(o.route),
            )
        if tc.steps * tc.accum > INT32_MAX:
            raise AnekitError(
                f"[train] {opt('steps')} x {opt('accum')} = {tc.steps * tc.accum} is too many sequences"
            )
        self.cfg, self.tc, self.mode = model.cfg, tc, mode

        def kept(given: Any, key: str, default: Any) -> Any:
            """A flag's value, else the stored run's, else the default."""
            return given if given is not None else stored[key] if stored else default

        self.val_every = kept(hf.val_every, "val_every", DEFAULT_VAL_EVERY)
        self.val_batches = kept(hf.val_batches, "val_batches", DEFAULT_VAL_BATCHES)
        stored_data = stored["data"]["path"] if stored else None
        data_path = o.data
        if data_path is None:
            data_path = check_record_path(self.checkpoint, "data.path", stored_data)
        self.data_path = data_path
        self._load_data(data_path, seq)
        if stored is not None and self.data_id != stored["data"]["sha256"]:
            raise AnekitError(
                f"[train] {opt('resume')}: the data {data_path or 'built-in corpus'} is not the run's"
            )
        self.cfg.check_kernels(vocab=False)  # the head (classifier) runs on the CPU
        self.trainable: Trainable
        if mode == "lora":
            base = frozen_base(model.params)  # already float16: the same arrays
            if stored is not None:
                rec = stored["lora"]
                spec = LoraSpec(int(rec["rank"]), float(rec["alpha"]), tuple(rec["targets"]))
                adapters, moments = self._read_lora(spec)
            else:
                assert lora is not None  # mode "lora"
                rank = int(lora)
                targets = hf.lora_targets or DEFAULT_TARGETS
                if isinstance(targets, str):
                    targets = parse_targets(targets)
                spec = LoraSpec(rank, float(hf.lora_alpha or 2 * rank), tuple(targets))
                adapters = Adapters.init(spec, self.cfg, np.random.default_rng([tc.seed, 7]))
                moments = None
            self.spec_lora: LoraSpec | None = spec
            self.lora_trainable = LoraTrainable(base, adapters, moments)
            self.trainable = self.lora_trainable
            self.state = TrainState(base, None, None, loss_scale=tc.loss_scale)
        else:
            params = model.params  # the float32 master weights: arrays of their own, trained in place
            m, v = params.zeros_like(), params.zeros_like()
            if stored is not None:
                self._read_full(params, m, v)
            self.spec_lora = None
            self.state = TrainState(params, m, v, loss_scale=tc.loss_scale)
            self.trainable = FullTrainable(self.state)
        if stored is not None:
            st = stored["state"]
            s = self.state
            s.step, s.adam_t, s.loss_scale = int(st["step"]), int(st["adam_t"]), float(st["loss_scale"])
            s.losses = [float(x) for x in st["losses"]]
            try:
                s.val_losses = {int(k): float(x) for k, x in st["val_losses"].items()}
            except ValueError:
                raise AnekitError(
                    f"[train] {opt('resume')}: {self.checkpoint}: run record state.val_losses: keys must be "
                    "steps"
                ) from None
            s.seconds = {k: float(x) for k, x in st["seconds"].items()}
            self.marks = [(int(a), str(b)) for a, b in stored.get("marks", [])]
            self.worlds = [(int(a), int(b)) for a, b in stored.get("worlds", [])]
            self.blas_threads = stored.get("blas_threads")
            self.resumed_wall = float(st.get("wall", 0.0))
            if s.step < tc.steps:
                self.marks.append((s.step, "budget" if o.restarted else "resume"))

    @staticmethod
    def _route(route: str | None) -> str:
        """The training route of a new run (``anekit.training.route_choice``): one with dynamic weights (the
        run validates as it goes, reading the kernels the last step left); "" for the legacy kernels."""
        if route and kernel_route(route).weights != "dynamic":
            raise AnekitError(
                f"[train] a Hugging Face model trains with dynamic weights (it validates as it goes); this "
                f"chip's training route {route} runs {kernel_route(route).weights} weights"
            )
        return route or ""

    def _check_same(self, stored: dict[str, Any], tc: Any) -> None:
        o, hf = self.options, self.hf
        lora = stored.get("lora") or {}
        given = {
            "steps": (o.steps, tc.steps),
            "accum": (o.accum, tc.accum),
            "lr": (o.lr, tc.lr),
            "seed": (o.seed, tc.seed),
            "seq": (hf.seq, stored.get("seq")),
            "lora": (hf.lora, lora.get("rank")),
            "lora_alpha": (hf.lora_alpha, lora.get("alpha")),
        }
        for name, (value, kept) in given.items():
            if value is not None and value != kept:
                raise_contradiction(name, value, kept, self.out)

    def _load_data(self, path: Path | None, seq: int) -> None:
        from anekit.hf.datasets import Example, load_dir

        tok = self.tokenizer
        if path is None:
            from anekit.llama.corpus import generate_corpus
            from anekit.llama.data import split_stories

            stories = split_stories(generate_corpus())
            examples = []
            for i, story in enumerate(stories):
                ids = tok.encode(story, bos=True)
                if tok.eos_id >= 0:
                    ids.append(tok.eos_id)
                examples.append(Example(np.asarray(ids, np.int32), 0, f"corpus:{i + 1}"))
            cut = max(1, int(len(examples) * (1 - VALID_SHARE)))
            train, valid = examples[:cut], examples[cut:]
        else:
            splits = load_dir(path, tok)
            train, valid = splits.train, splits.valid or []
        pad = max(tok.eos_id, 0)
        self.dataset = ExampleData(train, seq, pad)
        self.valid = valid if self.val_batches < 0 else valid[: self.val_batches]
        self.data_id = tokens_digest(train + valid)

    # -- the state file -------------------------------------------------------------------------------

    def _read_lora(self, spec: LoraSpec) -> tuple[Adapters, tuple[dict, dict]]:
        template = Adapters.init(spec, self.cfg, np.random.default_rng(0))
        names = [n for n, _ in adapter_tensors(template)]
        table = {n: a for n, a in adapter_tensors(template)}
        m: dict[str, np.ndarray] = {}
        v: dict[str, np.ndarray] = {}
        for name in names:
            for prefix, into in (("", table), ("m.", m), ("v.", v)):
                ref = self._refs.get(prefix + name)
                if ref is None or ref.shape != table[name].shape:
                    raise AnekitError(
                        f"[train] {opt('resume')}: {self.checkpoint} lacks {prefix + name} (or its shape "
                        "differs)"
                    )
                value = ref.to_float32()
                if prefix:
                    into[name] = value
                else:
                    table[name][...] = value
        return template, (m, v)

    def _read_full(self, params: Any, m: Any, v: Any) -> None:
        for prefix, container in (("p.", params), ("m.", m), ("v.", v)):
            for name, a in container.tensors():
                ref = self._refs.get(prefix + name)
                if ref is None or tuple(ref.shape) != a.shape:
                    raise AnekitError(
                        f"[train] {opt('resume')}: {self.checkpoint} lacks {prefix + name} (or its shape "
                        "differs)"
                    )
                a[...] = ref.to_float32()

    def record(self, wall: float) -> dict[str, Any]:
        s = self.state
        lora = None
        if self.spec_lora is not None:
            sp = self.spec_lora
            lora = {"rank": sp.rank, "alpha": sp.alpha, "targets": list(sp.targets)}
        return {
            "format": HF_RUN_FORMAT,
            "version": HF_RUN_VERSION,
            "base": {"path": str(Path(self.model.directory).resolve()), "sha256": self.base_id},
            "tokenizer": {"path": str(Path(self.model.directory).resolve()), "sha256": self.tok_id},
            "data": {
                "path": None if self.data_path is None else str(Path(self.data_path).resolve()),
                "sha256": self.data_id,
            },
            "config": {k: v for k, v in asdict(self.cfg).items() if k != "rope_scaling"},
            "train": asdict(self.tc),
            "lora": lora,
            "seq": self.cfg.seq_len,
            "val_every": self.val_every,
            "val_batches": self.val_batches,
            "marks": [list(x) for x in self.marks],
            **world_fields(self.worlds, self.blas_threads),
            "state": {
                "step": s.step,
                "adam_t": s.adam_t,
                "loss_scale": s.loss_scale,
                "losses": s.losses,
                "val_losses": {str(k): x for k, x in s.val_losses.items()},
                "seconds": s.seconds,
                "wall": wall,
            },
        }

    def write_checkpoint(self, path: Path, wall: float) -> list[Path]:
        """The state file (trained tensors, moments, run record) in one atomic write; LoRA adapters too
        (returned when this write created them)."""
        from anekit.hf.safetensors_io import write_safetensors

        tensors: dict[str, tuple[str, np.ndarray]] = {}
        if self.mode == "lora":
            t = self.lora_trainable
            for name, a in adapter_tensors(t.adapters):
                tensors[name] = ("F32", np.ascontiguousarray(a))
                tensors["m." + name] = ("F32", np.ascontiguousarray(t.adam_m[name]))
                tensors["v." + name] = ("F32", np.ascontiguousarray(t.adam_v[name]))
        else:
            s = self.state
            assert s.adam_m is not None and s.adam_v is not None  # full fine-tuning keeps them
            for prefix, container in (("p.", s.params), ("m.", s.adam_m), ("v.", s.adam_v)):
                for name, a in container.tensors():
                    tensors[prefix + name] = ("F32", np.ascontiguousarray(a, np.float32))
        with writing(path, "[train]"):
            write_safetensors(path, tensors, {RUN_KEY: json.dumps(self.record(wall))})
        if self.mode != "lora":
            return []
        adapters = self.out / "adapters"
        new = self.state.step == 0 and not os.path.lexists(adapters)
        with writing(adapters, "[train]"):
            self.write_result()
        return [adapters] if new else []  # removed if the run fails before its first step

    def write_result(self) -> list[Path]:
        """The run's product: OUT/adapters (LoRA, PEFT's format) or OUT/model (a Hugging Face directory)."""
        if self.mode == "lora":
            from anekit.hf.adapters import write_adapters

            return write_adapters(self.out / "adapters", self.lora_trainable.adapters, self.cfg,
                                  str(self.model.directory), force=True)  # fmt: skip
        from anekit.hf.model import write_model

        return write_model(self.state.params, self.out / "model", source=self.model)  # built aside, renamed

    def sample_weights(self) -> Params:
        """The weights to sample from after training: the fused model (LoRA) or the trained one."""
        if self.mode == "lora":
            return fuse(self.state.params, self.lora_trainable.adapters)  # float16 base + float32 deltas
        return self.state.params

    def products(self, out: Path) -> list[Path]:
        return [out / ("adapters" if self.mode == "lora" else "model")]

    # -- training ---------------------------------------------------------------------------------------

    def validation(self, log: Callable[[str], None] | None) -> Validation | None:
        """The validation loss over the held-out examples every ``val_every`` steps (None: none)."""
        if not self.valid or self.val_every <= 0:
            return None
        return self._validate(log), self.val_every

    def _validate(self, log: Callable[[str], None] | None) -> Callable[[Any, Any], float]:
        from anekit.hf.datasets import validation_windows
        from anekit.llama.step import eval_loss

        def validate(kernels: Any, timer: Any) -> float:
            total = weight = 0.0
            for w in validation_windows(self.valid, self.cfg.seq_len, self.dataset.pad_id):
                loss, n = eval_loss(kernels, self.trainable.params, w.inputs, w.targets, w.weights, timer)
                total, weight = total + loss, weight + n
            value = total / weight if weight else math.nan
            if log is not None:
                log(f"val loss {value:.3f} at step {self.state.step}")
            return value

        return validate

    def title(self, out: Path) -> str:
        what = f"LoRA rank {self.spec_lora.rank}" if self.spec_lora is not None else "full fine-tuning"
        return f"anekit train run '{out.resolve().name}': {self.cfg.name}, {what}, lr {self.tc.lr:g}"

    def start_files(self, out: Path) -> list[tuple[Path, bytes]]:
        """The tokenizer's files beside the run, where ``anekit sample`` looks for them."""
        from anekit.hf.model import SIDE_FILES

        files = []
        for name in SIDE_FILES:
            source = Path(self.model.directory) / name
            if source.is_file():
                files.append((out / name, source.read_bytes()))
        return files

    def finish(self, out: Path, reason: str) -> None:
        """Full fine-tuning: the model as a Hugging Face directory (LoRA's adapters are kept current at
        every checkpoint)."""
        if self.mode == "full":
            with writing(out / "model", "[train]"):
                self.write_result()

    def val_losses(self) -> dict[int, float] | None:
        return self.state.val_losses if self.valid else None

    def remove_new_out(self, out: Path) -> None:
        """A refused start removes the directory it made, with the tokenizer files it copied there."""
        shutil.rmtree(out, ignore_errors=True)

    # -- a run over several ranks ---------------------------------------------------------------------

    def _trained(self) -> str:
        sp = self.spec_lora
        if sp is None:
            return "full"
        return f"lora rank {sp.rank} alpha {sp.alpha:g} targets {','.join(sp.targets)}"

    def identity(self) -> dict[str, str]:
        return {"base model sha256": self.base_id, "tokenizer sha256": self.tok_id,
                "data sha256": self.data_id, "trainable": self._trained()}  # fmt: skip

    def describe(self) -> dict[str, Any]:
        """The base model's and data's paths as rank 0 read them, the training config, the LoRA spec, the
        window and the validation settings."""
        sp = self.spec_lora
        return {
            "kind": self.kind,
            "base": str(Path(self.model.directory).resolve()),
            "data": None if self.data_path is None else str(Path(self.data_path).resolve()),
            "train": asdict(self.tc),
            "hf": {
                "lora": None if sp is None else sp.rank,
                "lora_alpha": None if sp is None else sp.alpha,
                "lora_targets": None if sp is None else list(sp.targets),
                "seq": self.cfg.seq_len,
                "val_every": self.val_every,
                "val_batches": self.val_batches,
            },
        }

    def follower_options(self, description: dict[str, Any], options: TrainOptions) -> TrainOptions:
        """A fresh fine-tuning run of the described model (this rank's --init and --data first, else rank
        0's paths), with rank 0's LoRA spec, window and validation settings (they replace this source's)."""
        d, tc = description, description["train"]
        self.hf = _hf_options(d)
        init = options.init if options.init is not None else Path(d["base"])
        data = options.data if options.data is not None else None if d["data"] is None else Path(d["data"])
        return replace(options, init=init, data=data, resume=False, force=True, config=None, tokenizer=None,
                       steps=tc["steps"], accum=tc["accum"], lr=tc["lr"], seed=tc["seed"], weights="dynamic",
                       route=tc["route"])  # fmt: skip

    def state_arrays(self) -> list[np.ndarray]:
        if self.mode == "lora":
            t = self.lora_trainable
            names = [n for n, _ in adapter_tensors(t.adapters)]
            return (
                [a for _, a in adapter_tensors(t.adapters)]
                + [t.adam_m[n] for n in names]
                + [t.adam_v[n] for n in names]
            )
        s = self.state
        assert s.adam_m is not None and s.adam_v is not None  # full fine-tuning keeps them
        return [a for container in (s.params, s.adam_m, s.adam_v) for _, a in container.tensors()]

    def state_received(self) -> None:
        """LoRA: the merged weights are made anew from the received adapters."""
        if self.mode == "lora":
            self.lora_trainable.params.refresh()


def _hf_options(description: dict[str, Any]) -> HFOptions:
    hf = description["hf"]
    targets = None if hf["lora_targets"] is None else tuple(hf["lora_targets"])
    return HFOptions(hf["lora"], hf["lora_alpha"], targets, hf["seq"], hf["val_every"], hf["val_batches"])


register_source(HFSource.kind, lambda description: HFSource(_hf_options(description)))
