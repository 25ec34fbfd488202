"""Training runs from Python: ``Run`` (and ``anekit.train``) do what ``anekit train`` does.

A run lives in an output directory and is given a source (``anekit.training.source.RunSource``): the
BLZT / llama2.c one (``BlztSource``, the default: a preset or an --init model on corpus data, the run in
``OUT/ckpt.bin``) or the Hugging Face one (``anekit.hf.training.HFSource``). The source says what is
trained and how the run's state is kept; ``Run`` keeps the promises every run makes, whatever its source.

The order of work is the command's promise: ``Run(options)`` reads and checks everything and writes
nothing (a refused input leaves no directory behind); ``Run.train`` creates and locks the directory
(one writer: ``fileio.DirLock``), saves step 0, writes the source's start files (the tokenizer's copy),
trains, and saves at the end (loss.csv and loss.png only once that checkpoint is in place: the curve is
never ahead of it), and if it fails before its first step removes what it wrote; a failed write is one
line naming its file and why. A finished run resumed trains nothing and writes nothing (its curves only
when a kill left them behind its checkpoint). Messages name the options as the Python parameters
(``resume=True``); the command names them as its flags (``flag_names``). Stopping is the caller's:
``should_stop`` is asked between two steps (the command answers from its signal handler and its stdout),
and a run whose backend's compile budget ran out returns ``"budget"`` (the command then re-executes
itself with ``resume=True``).

    import anekit

    result = anekit.train("out", steps=50, accum=2)   # the default model on the built-in corpus
    print(result.losses[-1], result.checkpoint)
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anekit import runtime
from anekit.errors import AnekitError
from anekit.fileio import DirLock, remove_stale_temporaries, write_bytes_atomic
from anekit.kernels import ModelConfig
from anekit.llama.params import Params
from anekit.outputs import check_apart, writing
from anekit.runtime.base import Backend
from anekit.threads import Background, cores
from anekit.training.blzt import BlztSource
from anekit.training.curves import StagedCurves
from anekit.training.distributed.transport import (
    DEFAULT_TIMEOUT,
    DistributedError,
    LocalTransport,
    PeerLost,
    Transport,
)
from anekit.training.identity import check_record_path, file_identity
from anekit.training.options import TrainOptions, check_distributed, flag_names, opt
from anekit.training.route_choice import chosen_route, with_weights
from anekit.training.source import RunSource
from anekit.training.state import TrainConfig, TrainState
from anekit.training.trainable import Trainable
from anekit.words import plural

if TYPE_CHECKING:
    # the training loop's modules load when a run trains, not when the CLI starts
    from anekit.llama.plot_helper import PlotHelper
    from anekit.runtime.sim.sanitizer import Sanitizer
    from anekit.training.state import StepReport

__all__ = [
    "AUTO_CHECKPOINT_SECONDS",
    "AUTO_CHECKPOINT_STEPS",
    "Progress",
    "Run",
    "RunResult",
    "TrainOptions",
    "check_record_path",
    "flag_names",
    "train",
]

# Checkpoints when no checkpoint_every is given: every 50 steps, and at least once a minute, so a kill
# never loses more than about a minute of work whatever the model's step time.
AUTO_CHECKPOINT_STEPS = 50
AUTO_CHECKPOINT_SECONDS = 60.0


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


# A run drawing its loss.png in a helper process (``anekit.llama.plot_helper``) only when it has this
# much work ahead (stories15M: about 2.3e10 a sequence, 0.3 s of the simulator): a smaller run ends before
# the helper has imported matplotlib, and a test suite of small runs would only pay the helpers' start.
PLOT_HELPER_MIN_FLOPS = 5e10


def open_transport(options: TrainOptions) -> Transport:
    """The transport ``options.distributed`` names (``anekit.training.distributed.open``), or the
    one-process one."""
    if options.distributed is None:
        return LocalTransport()
    from anekit.training.distributed.open import open_transport as open_kind

    timeout = DEFAULT_TIMEOUT if options.peer_timeout is None else options.peer_timeout
    return open_kind(options.distributed, timeout)


def check_world(accum: int, per_rank: int | None, size: int, out: Path, resume: bool) -> None:
    """A run over ``size`` ranks of ``accum`` sequences a step (the global batch): ``size`` divides it, and a
    per-rank ``accum`` given on resume (``per_rank``) gives it; one line otherwise."""
    if not resume:
        return
    if accum % size:
        sizes = ", ".join(str(n) for n in range(1, accum + 1) if accum % n == 0)
        raise AnekitError(
            f"[train] {opt('resume')}: the run in {out} takes {plural(accum, 'sequence')} a step, which "
            f"{size} ranks cannot share evenly; resume it on a number of ranks that divides {accum} ({sizes})"
        )
    if per_rank is not None and per_rank * size != accum:
        raise AnekitError(
            f"[train] {opt('resume')}: {opt('accum', per_rank)} per rank on {size} ranks "
            f"({per_rank * size} sequences a step) contradicts the run in {out} ({accum} a step: "
            f"{opt('accum', accum // size)} on {size} ranks); drop it to continue that run"
        )


@dataclass(frozen=True)
class BackendNumerics:
    """What the simulator computes with: its chip's name and its numerics ("engine", "ieee")."""

    chip: str
    numerics: str


class Run:
    """One training run in ``options.out``, given its ``source`` (default: ``BlztSource``): everything is
    read and checked when it is made, nothing is written until ``train``."""

    def __init__(
        self, options: TrainOptions, source: RunSource | None = None, transport: Transport | None = None
    ) -> None:
        check_distributed(options)
        self.options = options
        self.source: RunSource = BlztSource() if source is None else source
        self.out = Path(options.out)
        self.checkpoint = self.out / self.source.checkpoint_name
        self.lock: DirLock | None = None
        self.created = False
        self._opened = False
        self._wall0 = 0.0
        self._in_flight: Background | None = None  # a checkpoint being written on a thread
        self._painter: PlotHelper | None = None  # the loss.png helper of a run in progress
        self._started: list[Path] = []  # the files a new run created beside its step-0 checkpoint
        self.saved_step: int | None = None  # the step of the last checkpoint this process wrote
        self._own_transport = transport is None
        self.transport: Transport = open_transport(options) if transport is None else transport
        self.rank, self.size = self.transport.rank, self.transport.size
        self.resuming = options.resume  # a follower's own options are a fresh run's: rank 0 says
        try:
            if self.size == 1:
                self._check_apart()
                self._prepare()
            elif self.rank == 0:
                self._lead()
            else:
                self._follow()
        except BaseException:
            self.close()
            raise

    def _check_apart(self) -> None:
        o = self.options
        init = None if o.resume else o.init  # --resume with --init: refused as a contradiction
        inputs = ((opt("init"), init), (opt("data"), o.data), (opt("tokenizer"), o.tokenizer))
        check_apart(self.out, f"[train] {opt('out')}", inputs)  # never into, over or around an input

    # -- 0. a run over several ranks: rank 0 prepares, the others follow (``distributed.follow``) ------

    def _lead(self) -> None:
        from anekit.training.distributed import follow

        try:
            self._check_apart()
            self._prepare()
        except AnekitError as e:
            follow.announce(self.transport, None, str(e))
            raise
        description = {
            **self.source.describe(),
            "resume": self.options.resume,
            "state": follow.state_counters(self.state),
            "marks": [list(m) for m in self.source.marks],
            "worlds": [list(w) for w in self.source.worlds],
            "blas_threads": self.source.blas_threads,
        }
        follow.announce(self.transport, description, None)
        follow.all_ready(self.transport, None, "reading the run's inputs")
        self._agree_and_share()

    def _follow(self) -> None:
        from anekit.training.distributed import follow
        from anekit.training.source import source_of

        description = follow.receive(self.transport)
        error: AnekitError | None = None
        try:
            if description.get("kind") != self.source.kind:  # e.g. an HF run resumed where OUT is not
                self.source = source_of(description)
                self.checkpoint = self.out / self.source.checkpoint_name
            self.options = self.source.follower_options(description, self.options)
            self.resuming = bool(description["resume"])
            self._prepare(follower=True)
            self.source.blas_threads = description["blas_threads"]
        except AnekitError as e:
            error = e
        follow.all_ready(self.transport, error, "reading the run's inputs")
        self._agree_and_share()
        follow.adopt_counters(self.state, description["state"])
        self.source.marks[:] = [(int(s), str(k)) for s, k in description["marks"]]
        self.source.worlds[:] = [(int(s), int(n)) for s, n in description["worlds"]]
        self.source.state_received()

    def _agree_and_share(self) -> None:
        """Every rank's fingerprint of the run compared (one line naming the first field that differs),
        then rank 0's state into every rank's, exactly (the plain transport, never the wire's dtype)."""
        from anekit.training.distributed import follow
        from anekit.training.distributed.agree import agree

        numerics = self.numerics
        backend = self.backend.name + ("" if numerics is None else f" ({numerics.chip}, {numerics.numerics})")
        fields = follow.fingerprint(self.cfg, self.tc, self.source.identity(), backend, self.size,
                                    self.options.wire, self.source.blas_threads)  # fmt: skip
        try:
            agree(self.transport, fields, "the run's fingerprint")
        except PeerLost:
            raise
        except DistributedError as e:  # every rank found it: rank 0 says it
            if self.rank == 0:
                raise
            raise follow.StartRefused(str(e)) from e
        follow.share_state(self.transport, self.source.state_arrays())

    @property
    def wired(self) -> Transport:
        """The transport the gradients travel on: the plain one, or fp16 / bf16 buckets (``wire``)."""
        if self.options.wire == "fp32":
            return self.transport
        from anekit.training.distributed.wire import with_wire

        return with_wire(self.transport, self.options.wire)

    # -- what the source read ---------------------------------------------------------------------------

    @property
    def cfg(self) -> ModelConfig:
        return self.source.cfg

    @property
    def tc(self) -> TrainConfig:
        return self.source.tc

    @property
    def state(self) -> TrainState:
        return self.source.state

    @property
    def tokenizer(self) -> Any:
        return self.source.tokenizer

    @property
    def trainable(self) -> Trainable:
        return self.source.trainable

    @property
    def mode(self) -> str:
        """What the run trains: "full" (every weight) or "lora" (adapters)."""
        return self.source.mode

    def products(self) -> list[Path]:
        """What the run makes besides its checkpoint and curves (adapters, a model directory)."""
        return self.source.products(self.out)

    def sample_weights(self) -> Params:
        """The weights to sample from after training (LoRA: the base with the trained adapters fused)."""
        return self.source.sample_weights()

    @property
    def numerics(self) -> BackendNumerics | None:
        """The simulator's chip and numerics; None on the engine itself."""
        from anekit.runtime.sim import SimBackend

        backend = self.backend
        return BackendNumerics(backend.chip, backend.numerics) if isinstance(backend, SimBackend) else None

    @property
    def sanitizer(self) -> Sanitizer | None:
        """The simulator's sanitizer when it was asked for (``numerics={"sanitize": True}``), else None."""
        from anekit.runtime.sim import SimBackend

        return self.backend.sanitizer if isinstance(self.backend, SimBackend) else None

    # -- 1. what to run: the stored run (resume) or the options; nothing is written here --------------

    def _prepare(self, follower: bool = False) -> None:
        """Read and check the run (a follower: the fresh run rank 0 described, from its own inputs; it
        does not look at OUT, which may be on rank 0's machine only)."""
        o, out, ckpt_path = self.options, self.out, self.checkpoint
        self.source.check_inputs(o)
        if not follower and out.exists() and not out.is_dir():
            raise AnekitError(f"[train] {opt('out', out)} is a file, not a directory")
        runtime.check_numerics_options(o.backend, o.numerics)  # before any write
        self._open_backend()
        o = self.options = self._with_route(o)
        per_rank = o.accum
        spread = (o.distributed is not None or self.size > 1) and not follower
        if spread:  # accum counts a rank's sequences: the run's are N x
            o = replace(o, accum=None if o.resume else (per_rank or self.source.default_accum) * self.size)
        self.source.prepare(o, out, ckpt_path)
        self.seen = self.source.seen
        self.resumed_wall = self.source.resumed_wall
        if spread:
            check_world(self.tc.accum, per_rank, self.size, out, o.resume)
        if not follower and self.state.step < self.tc.steps:
            self.source.worlds.append((self.state.step, self.size))
        if not follower and self.source.blas_threads is None:  # fixed now, for every rank and resume
            self.source.blas_threads = self._blas_threads()
        self._check_budget()
        if follower:
            return
        if ckpt_path.exists() and not ckpt_path.is_file():
            raise AnekitError(f"[train] {ckpt_path} is not a regular file: the checkpoint cannot be written")
        if out.is_dir() and not os.access(out, os.W_OK | os.X_OK):
            raise AnekitError(f"[train] the output directory {out} is not writable")

    def _open_backend(self) -> None:
        """The backend the options name (opened before the run is read: its chip decides the route)."""
        o = self.options
        backend_options: dict[str, Any] = dict(o.numerics)
        if o.compile_budget is not None:
            backend_options["compile_budget"] = o.compile_budget
        self.backend: Backend = runtime.open(o.backend, **backend_options)

    def _with_route(self, o: TrainOptions) -> TrainOptions:
        """``o`` with the training route a new run takes (``anekit.training.route_choice``): the one it
        names, else its chip's, its weight mode applied; a resumed run keeps its own (``route`` given
        and different: refused as a contradiction by the source)."""
        self.route = chosen_route(self.backend, o.numerics)
        if o.route is not None or o.resume:
            return o
        if self.route is None:
            return replace(o, route="")
        return replace(o, route=with_weights(self.route, o.weights))

    def _check_budget(self) -> None:
        """A compile budget that holds one step (a budget below it would restart forever)."""
        from anekit.training.budget import check_budget

        check_budget(self.backend.compile_budget, self.cfg, self.tc.weights, self.tc.route)

    # -- 2. the output directory, locked for the run ----------------------------------------------------

    def open(self) -> None:
        """Create (if need be) and lock the output directory, removing what dead writers left in it
        (``train`` does it when it was not done). Over several ranks rank 0 alone does it, and every rank
        learns whether it could."""
        if self._opened:
            return
        error: AnekitError | None = None
        if self.rank == 0:
            try:
                self.created = self._open()
            except AnekitError as e:
                error = e
                if self.size == 1:
                    raise
        if self.size > 1:
            from anekit.training.distributed.follow import all_ready

            all_ready(self.transport, error, "opening the output directory")
        self._opened = True

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
                self.source.remove_new_out(out)
            raise
        if file_identity(self.checkpoint) != self.seen:  # another writer finished in between: stale checks
            raise AnekitError(
                f"[train] {self.checkpoint} changed while this run started (another anekit train wrote it); "
                "run again"
            )
        remove_stale_temporaries(out)
        return created

    def close(self) -> None:
        """Release the output directory's lock (a no-op when it is not held), and the transport this run
        opened."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self._own_transport:
            self._own_transport = False
            self.transport.close()

    # -- 3. training ----------------------------------------------------------------------------------

    @property
    def threads(self) -> int:
        """Sequences of a batch run at once (``anekit.training.accumulate``); the result never depends on
        it."""
        from anekit.training.accumulate import default_threads

        if self.options.threads is not None:
            return self.options.threads
        local = self.tc.accum // self.size  # this rank's sequences; the ranks on a host share its cores
        share = max(1, cores() // max(1, self.transport.local_size)) if self.size > 1 else cores()
        return min(share, default_threads(self.backend.name, self.tc.weights, local, self.cfg))

    def _blas_threads(self) -> int:
        """The BLAS threads one sequence runs on in this process (``accumulate.sequence_blas``): fixed for
        the run when it starts, since a float32 product's bits depend on them."""
        from anekit.training.accumulate import sequence_blas

        local = self.tc.accum // self.size
        workers = min(self.threads, local) if self.tc.weights == "dynamic" else 1
        return sequence_blas(self.cfg, max(1, workers))

    def save(self) -> None:
        """Checkpoint the run as it stands (weights, Adam state, run record), atomically (rank 0 alone
        writes: every rank holds the same state)."""
        if self.rank != 0:
            return
        self._settle()
        self._write_checkpoint()

    def _save_in_background(self) -> None:
        """Start the checkpoint's write on a thread: it must be settled (``_settle``) before any weight
        changes, and before any other write of the checkpoint."""
        if self.rank != 0:
            return
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
        step = self.state.step
        with writing(self.checkpoint, "[train]"):
            made = self.source.write_checkpoint(self.checkpoint, time.perf_counter() - self._wall0)
        self.saved_step = step
        for path in made:  # removed if the run fails before its first step
            if path not in self._started:
                self._started.append(path)

    def title(self) -> str:
        return self.source.title(self.out)

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
        sanitizer = self.sanitizer
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
        from anekit.training import loop

        created = self.created
        every = o.checkpoint_every or AUTO_CHECKPOINT_STEPS
        seconds = None if o.checkpoint_every else AUTO_CHECKPOINT_SECONDS
        reason, first_saved, lead = "done", False, self.rank == 0
        if self.resuming and state.step >= tc.steps:  # finished before: nothing to train, nothing is written
            no_png = self._catch_up_curves() if lead else None
            return RunResult("done", state.step, tc.steps, list(state.losses), self.checkpoint,
                             dict(state.seconds), no_png, trained=False)  # fmt: skip
        try:
            if not self.resuming and lead:
                # step 0: from now on a kill at any instant leaves a run that resume continues. Written while
                # the kernels compile and the first step computes (the trainer settles it before the first
                # update): 0.4 s of stories15M's start-up otherwise.
                save(state, background=True)
                first_saved = True
                self._start_files()
            if state.step < tc.steps:
                validation = self.source.validation(log)
                reason = loop.train(
                    self.backend,
                    state,
                    self.source.dataset,
                    tc,
                    on_step=on_step,
                    on_checkpoint=lambda st: save(st, background=True),  # settled before the next update
                    checkpoint_every=every,
                    checkpoint_seconds=seconds,
                    should_stop=should_stop,
                    threads=self.threads,
                    before_update=self._settle,
                    trainable=self.source.trainable,
                    validate=None if validation is None else validation[0],
                    val_every=0 if validation is None else validation[1],
                    transport=self.wired if self.size > 1 else None,
                    blas_threads=self.source.blas_threads,
                )
        except AnekitError:
            self._settle(quiet=True)  # the step-0 write, if it is still going, ends before anything else
            if not self.resuming and state.step == 0 and lead:  # e.g. kernels the backend refuses, a full
                self._remove_started(first_saved, created)  # disk: leave no run behind
            raise
        except BaseException:
            self._settle(quiet=True)  # Ctrl-C from Python: the step-0 checkpoint is whole before we unwind
            raise
        if not lead:  # rank 0 writes the run's files; this rank holds the same state
            if on_done is not None and reason == "done":
                on_done()
            return RunResult(reason, state.step, tc.steps, list(state.losses), self.checkpoint,
                             dict(state.seconds))  # fmt: skip
        save(state, background=True)  # written while the run's product and its curves are made
        staged: StagedCurves | None = None
        try:
            if on_done is not None and reason == "done":
                on_done()
            if reason != "budget":  # the product, when the source writes one at the end
                self.source.finish(self.out, reason)
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
            if first_saved and file_identity(self.checkpoint) != self.seen:  # this run's, not the one found
                self.checkpoint.unlink(missing_ok=True)
            for path in self._started:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        if created:
            self.source.remove_new_out(self.out)

    def _start_files(self) -> None:
        """The source's files beside the step-0 checkpoint, each written atomically (removed again if the
        run fails before its first step, when it was not there before); a failed write is one line naming
        the file and why."""
        for path, data in self.source.start_files(self.out):
            new = not os.path.lexists(path)
            with writing(path, "[train]"):
                write_bytes_atomic(path, data)
            if new:
                self._started.append(path)

    def _curves(self, draw: bool) -> StagedCurves:
        return StagedCurves(self.out, self.state.losses, self.title(), self.source.marks, draw=draw,
                            val_losses=self.source.val_losses(), painter=self._painter)  # fmt: skip

    def _plot_helper(self) -> PlotHelper | None:
        """A helper process to draw loss.png (``anekit.llama.plot_helper``) when the run is long enough
        for its start to pay, there is a core to spare and matplotlib is installed; else None."""
        import importlib.util
        import sys

        from anekit.llama.plot_helper import PlotHelper
        from anekit.training.accumulate import sequence_flops

        work = sequence_flops(self.cfg) * self.tc.accum * max(0, self.tc.steps - self.state.step)
        if self.rank != 0 or work < PLOT_HELPER_MIN_FLOPS or cores() < 2 or getattr(sys, "frozen", False):
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
    ``force``, ``checkpoint_every``, ``compile_budget``, ``numerics``, and for a rank of a run over several
    processes ``distributed`` ("mpi" / "mlx"; ``accum`` then counts this rank's sequences),
    ``peer_timeout``, ``wire``); errors name them as these parameters (``resume=True``). Over several
    ranks rank 0 alone prints and writes. Progress goes to stdout as the run goes (``Progress``: the first,
    every 10th and the last step, one closing line) unless ``quiet=True``; ``Run`` itself prints nothing.
    Returns how the run ended; a run whose compile budget ran out ends with reason "budget": call again
    with ``resume=True``; a finished run resumed trains nothing and writes nothing (``trained`` False)."""
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
        if quiet or run.rank != 0:  # rank 0 alone prints
            return run.train()
        progress = Progress(run)
        result = run.train(on_step=progress.step, log=progress.say)
        progress.end(result)
        return result
    finally:
        run.close()
