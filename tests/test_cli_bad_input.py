"""Bad input to every command, as a table: no traceback, no hang, no leftover file, no silent acceptance.

Each case is one command line (``{ws}``: a shared workspace of inputs, ``{out}``: a fresh output
location, prepared by the case's ``setup``) and what must come of it:

- the exit status;
- the form of stderr, by class of error (``anekit.cli.main`` documents the two):
  ``usage`` — argparse's usage error, exit 2: an unknown flag, a missing argument, a value that does
  not parse or is outside its range (the message names the range), not one of the flag's choices or
  not a name its table knows (a preset, a chip, a route: the message lists the known ones);
  ``anekit`` — exactly one line ``anekit: [where] what``, exit 1: everything found after parsing;
  ``fail`` — ``mil check``'s own report, one ``FILE: FAIL ...`` line per file, exit 1;
  ``findings`` — ``lint``'s report on stdout, nothing on stderr, exit 1;
  ``ok`` — exit 0 and the fragment on stdout (bad numbers reported, not hidden);
- a fragment of the message, so a different error that happens to exit 1 does not pass;
- no ``Traceback``, and no Python warning (numpy's RuntimeWarning text included) — in-process the
  warnings are recorded and must be none;
- the output location afterwards: exactly what it held before (nothing new, nothing half-written,
  no temporary file, the previous content unchanged), plus only the files a succeeding case names;
- within ``SECONDS`` (a watchdog in-process, a timeout for subprocesses).

How the cases run (subprocess start costs ~0.5 s with numpy): most run in-process through
``anekit.cli.main.main`` with capsys; the cases marked ``sub`` run only as real subprocesses
(``python -m anekit.cli.main``) — a representative of each command and error class, plus the file
size limit (``RLIMIT_FSIZE``, a real kernel-level write failure) that only a separate process can
take. Faults in-process: ``enospc`` makes every file opened for writing fail with ENOSPC on its first
write (the atomic writers, ``Path.write_*``, numpy's savez); ``readonly`` makes ``os.access`` deny
writing under ``{out}`` (the tests run as root, who can write anywhere; one chmod case skips as root).

``train``'s own behaviour (resume, its flags against a stored run, signals) is tested beside the trainer
(tests/test_train_resume.py, tests/test_train_signals.py); its cases here are those every command shares.
"""

from __future__ import annotations

import argparse
import builtins
import errno
import io
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from anekit.kernels import ModelConfig
from anekit.llama.llama2c import write_llama2c
from anekit.llama.params import Params
from tests.fuzz_util import watchdog

SECONDS = 60
SRC = Path(__file__).resolve().parents[1] / "src"
SEED_RANGE = "0 .. 4294967295"
USAGE_LAST = re.compile(r"^anekit( [\w-]+)*: error: ")


@dataclass(frozen=True)
class Case:
    """One bad command line and what must come of it (see the module docstring)."""

    id: str
    argv: tuple[str, ...]
    status: int
    says: str = ""
    setup: str = ""  # a key of SETUPS: what {out} holds before the run
    fault: str = ""  # "enospc", "readonly" (in-process) or "fsize" (subprocess)
    env: tuple[tuple[str, str], ...] = ()
    new: tuple[str, ...] = ()  # top-level names a succeeding case adds to {out}
    sub: bool = False  # run as a subprocess (only)

    @property
    def form(self) -> str:
        if self.status == 2:
            return "usage"
        if self.status == 0:
            return "ok"
        if self.argv[:2] == ("mil", "check"):
            return "fail"
        if self.argv[0] == "lint" and any(a in LINT_FINDINGS for a in self.argv):
            return "findings"
        return "anekit"


LINT_FINDINGS = ("{ws}/garbage", "{ws}/fifodir")  # lint reports what these hold as findings


def c(id: str, *argv: str, status: int, says: str = "", **kw: object) -> Case:
    return Case(id, tuple(argv), status, says, **kw)  # type: ignore[arg-type]


# --- the output location's previous content --------------------------------------------------------


def _previous_file(out: Path) -> None:
    (out / "o.npz").write_bytes(b"previous output")
    (out / "m.bin").write_bytes(b"previous model")


def _foreign_dir(out: Path) -> None:
    (out / "d").mkdir()
    (out / "d" / "notes.txt").write_text("not anekit's")


def _previous_dump(out: Path) -> None:
    (out / "k").mkdir()
    (out / "k" / "kernels.json").write_text('{"config": "x", "kernels": {}}\n')
    (out / "k" / "ffn_fwd").mkdir()
    (out / "k" / "ffn_fwd" / "model.mil").write_text("previous")


def _package_dir(out: Path) -> None:
    (out / "d.mlpackage").mkdir()
    (out / "d.mlpackage" / "Manifest.json").write_text("{}")


SETUPS: dict[str, Callable[[Path], None]] = {
    "file": _previous_file,
    "dir": _foreign_dir,
    "dump": _previous_dump,
    "package": _package_dir,
}

# --- the table -------------------------------------------------------------------------------------

P = "{ws}/prog.mil"
RUN = [
    c("run-missing-program", "run", "{ws}/nope.mil", "--random", "1", status=1, says="cannot read", sub=True),
    c("run-program-is-dir", "run", "{ws}", "--random", "1", status=1, says="cannot read"),
    c("run-program-garbage", "run", "{ws}/garbage", "--random", "1", status=1, says="cannot read"),
    c("run-program-empty", "run", "{ws}/empty", "--random", "1", status=1, says="[mil.parse]"),
    c("run-syntax-error", "run", "{ws}/syn.mil", "--random", "1", status=1, says="syn.mil:5:3", sub=True),
    c("run-type-error", "run", "{ws}/type.mil", "--random", "1", status=1, says="does not verify"),
    c("run-strict-refusal", "run", "{ws}/small.mil", "--random", "1", status=1, says="rows of 16 bytes"),
    c("run-no-function", "run", P, "--random", "1", "--function", "f", status=1, says="no function 'f'"),
    c("run-input-no-eq", "run", P, "--input", "x", status=1, says="NAME=FILE.npy"),
    c("run-input-missing", "run", P, "--input", "x={ws}/nope.npy", status=1, says="cannot load input"),
    c("run-input-garbage", "run", P, "--input", "x={ws}/garbage", status=1, says="cannot load input"),
    c("run-input-pickle", "run", P, "--input", "x={ws}/obj.npy", status=1, says="allow_pickle"),
    c("run-input-shape", "run", P, "--input", "x={ws}/shape.npy", status=1, says="has shape [2, 3]"),
    c("run-input-unknown", "run", P, "--input", "y={ws}/x.npy", "--random", "1", status=1, says="'y'"),
    c("run-input-twice", "run", P, "--input", "x={ws}/x.npy", "--input", "x={ws}/x.npy", status=1,
      says="given twice"),
    c("run-no-input", "run", P, status=1, says="no value for input 'x'"),
    c("run-random-negative", "run", P, "--random", "-1", status=2, says=SEED_RANGE, sub=True),
    c("run-random-text", "run", P, "--random", "x", status=2, says="--random"),
    c("run-random-2^32", "run", P, "--random", str(2**32), status=2, says=SEED_RANGE),
    c("run-repeat-0", "run", P, "--random", "1", "--repeat", "0", status=2, says="1 .. 1000000"),
    c("run-repeat-negative", "run", P, "--random", "1", "--repeat", "-5", status=2, says="1 .. 1000000"),
    c("run-repeat-float", "run", P, "--random", "1", "--repeat", "1.5", status=2, says="an integer"),
    c("run-repeat-huge", "run", P, "--random", "1", "--repeat", "10000001", status=2, says="1 .. 1000000"),
    c("run-backend", "run", P, "--backend", "gpu", status=2, says="invalid choice"),
    c("run-precision", "run", P, "--precision", "fp8", status=2, says="invalid choice"),
    c("run-chip", "run", P, "--random", "1", "--chip", "m9", status=2, says="argument --chip: unknown chip"),
    c("run-weights-missing", "run", P, "--weights", "{ws}/nope", "--random", "1", status=1,
      says="do not exist"),
    c("run-unknown-flag", "run", P, "--bogus", status=2, says="unrecognized arguments"),
    c("run-no-program", "run", status=2, says="required"),
    c("run-package-missing", "run", "{ws}/nope.mlpackage", "--random", "1", status=1, says="nope.mlpackage"),
    c("run-package-weights", "run", "{ws}/nope.mlpackage", "--weights", "{ws}", status=1,
      says="carries its own weights"),
    # --output
    c("run-output-dir", "run", P, "--random", "1", "--output", "{out}", status=1, says="is a directory",
      sub=True),
    c("run-output-no-parent", "run", P, "--random", "1", "--output", "{out}/no/o.npz", status=1,
      says="does not exist"),
    c("run-output-under-file", "run", P, "--random", "1", "--output", "{out}/o.npz/x.npz", status=1,
      says="is a file, not a directory", setup="file"),
    c("run-output-empty", "run", P, "--random", "1", "--output", "", status=1, says="names a directory"),
    c("run-output-dot", "run", P, "--random", "1", "--output", "{out}/.", status=1, says="directory"),
    c("run-output-kept-on-error", "run", P, "--output", "{out}/o.npz", status=1, says="no value",
      setup="file"),
    c("run-output-readonly", "run", P, "--random", "1", "--output", "{out}/o.npz", status=1,
      says="not writable", fault="readonly"),
    c("run-output-enospc", "run", P, "--random", "1", "--output", "{out}/o.npz", status=1,
      says="no space left", fault="enospc"),
    c("run-output-enospc-keeps", "run", P, "--random", "1", "--output", "{out}/o.npz", status=1,
      says="no space left", fault="enospc", setup="file"),
    c("run-output-fsize", "run", P, "--random", "1", "--output", "{out}/o.npz", status=1,
      says="file too large", fault="fsize", sub=True),
    # numbers that are not numbers: reported, not hidden, and no numpy warning on stderr
    c("run-nan-input", "run", P, "--input", "x={ws}/nan.npy", status=0, says="input x: NOT FINITE: 1 NaN"),
    c("run-overflow", "run", P, "--input", "x={ws}/big.npy", status=0, says="128 +inf of 128", sub=True),
    c("run-neginf-input", "run", P, "--input", "x={ws}/neginf.npy", status=0, says="1 -inf"),
    c("run-nan-output-written", "run", P, "--input", "x={ws}/nan.npy", "--output", "{out}/z.npz",
      status=0, says="outputs hold NaN or inf: z", new=("z.npz",)),
]  # fmt: skip

S = ("sample", "{ws}/tiny.bin", "--steps", "4", "--seed", "1")
SAMPLE = [
    c("sample-missing", "sample", "{ws}/nope.bin", status=1, says="cannot read", sub=True),
    c("sample-dir", "sample", "{ws}", status=1, says="cannot read"),
    c("sample-empty", "sample", "{ws}/empty", status=1, says="0 bytes long"),
    c("sample-3-bytes", "sample", "{ws}/three", status=1, says="3 bytes long"),
    c("sample-garbage", "sample", "{ws}/garbage", status=1, says="[llama2c] dim"),
    c("sample-truncated", "sample", "{ws}/trunc.bin", status=1, says="truncated"),
    c("sample-nan-weights", "sample", "{ws}/nan.bin", status=1, says="NaN or inf values", sub=True),
    c("sample-inf-weights", "sample", "{ws}/inf.bin", status=1, says="NaN or inf values"),
    c("sample-steps-0", *S[:2], "--steps", "0", status=2, says="1 .. 1048576", sub=True),
    c("sample-steps-negative", *S[:2], "--steps", "-1", status=2, says="1 .. 1048576"),
    c("sample-steps-text", *S[:2], "--steps", "many", status=2, says="an integer"),
    c("sample-steps-huge", *S[:2], "--steps", str(2**21), status=2, says="1 .. 1048576"),
    c("sample-steps-float", *S[:2], "--steps", "1.5", status=2, says="an integer"),
    c("sample-temperature-negative", *S, "--temperature", "-1", status=2, says="[0, 100]"),
    c("sample-temperature-nan", *S, "--temperature", "nan", status=2, says="finite"),
    c("sample-temperature-inf", *S, "--temperature", "inf", status=2, says="finite"),
    c("sample-temperature-text", *S, "--temperature", "hot", status=2, says="a number"),
    c("sample-temperature-101", *S, "--temperature", "101", status=2, says="[0, 100]"),
    c("sample-top-p-0", *S, "--top-p", "0", status=2, says="(0, 1]"),
    c("sample-top-p-1.5", *S, "--top-p", "1.5", status=2, says="(0, 1]"),
    c("sample-top-p-negative", *S, "--top-p", "-0.1", status=2, says="(0, 1]"),
    c("sample-top-p-nan", *S, "--top-p", "nan", status=2, says="finite"),
    c("sample-seed-negative", *S[:4], "--seed", "-1", status=2, says=SEED_RANGE),
    c("sample-seed-text", *S[:4], "--seed", "abc", status=2, says="an integer"),
    c("sample-seed-2^32", *S[:4], "--seed", str(2**32), status=2, says=SEED_RANGE),
    c("sample-config-unknown", *S, "--config", "nope", status=2, says="unknown preset 'nope'"),
    c("sample-tokenizer-missing", *S, "--tokenizer", "{ws}/nope.bin", status=1, says="nope.bin"),
    c("sample-tokenizer-garbage", *S, "--tokenizer", "{ws}/garbage", status=1, says="not a llama2.c tokenizer.bin"),
    c("sample-tokenizer-dir", *S, "--tokenizer", "{ws}", status=1,
      says="no tokenizer: looked for tokenizer.json and tokenizer.model"),  # a directory: a model directory
    c("sample-tokenizer-bad-model", *S, "--tokenizer", "{ws}/bad.model", status=1,
      says="not a sentencepiece model"),
    c("sample-unknown-flag", *S, "--top-k", "3", status=2, says="unrecognized arguments"),
    c("sample-no-model", "sample", status=2, says="required"),
    c("sample-shards-garbage", "sample", "{ws}/shards", status=1, says="shards.json"),
    c("sample-package-missing", "sample", "{ws}/nope.mlpackage", status=1, says="nope.mlpackage"),
    # the tokenizer cache (ANEKIT_CACHE)
    c("sample-cache-is-file", *S, status=1, says="is a file, not a directory", setup="file",
      env=(("ANEKIT_CACHE", "{out}/o.npz"),), sub=True),
    c("sample-cache-under-file", *S, status=1, says="set ANEKIT_CACHE", setup="file",
      env=(("ANEKIT_CACHE", "{out}/o.npz/c"),)),
    c("sample-cache-readonly", *S, status=1, says="not writable", fault="readonly",
      env=(("ANEKIT_CACHE", "{out}/c"),)),
    c("sample-cache-enospc", *S, status=1, says="no space left", fault="enospc",
      env=(("ANEKIT_CACHE", "{out}"),)),
    c("sample-config-default", *S, "--config", "default", status=0),
]  # fmt: skip

K = ("kernels", "dump", "--config", "default")
KERNELS = [
    c("kernels-no-config", "kernels", "dump", "{out}/k", status=2, says="--config", sub=True),
    c("kernels-config-unknown", *K[:3], "nope", "{out}/k", status=2, says="unknown preset 'nope'"),
    c("kernels-no-out", *K, status=2, says="OUT_DIR"),
    c("kernels-no-action", "kernels", status=2, says="required"),
    c("kernels-unknown-action", "kernels", "load", status=2, says="invalid choice"),
    c("kernels-exists", *K, "{out}/d", status=1, says="exists (use --force", setup="dir"),
    c("kernels-force-foreign-dir", *K, "{out}/d", "--force", status=1, says="not a previous dump",
      setup="dir", sub=True),
    c("kernels-force-output-root", *K, "{out}", "--force", status=1, says="not a previous dump", setup="dir"),
    c("kernels-dump-exists", *K, "{out}/k", status=1, says="exists (use --force", setup="dump"),
    c("kernels-out-is-file", *K, "{out}/m.bin", status=1, says="is a file", setup="file"),
    c("kernels-out-is-file-force", *K, "{out}/m.bin", "--force", status=1, says="is a file", setup="file"),
    c("kernels-no-parent", *K, "{out}/no/k", status=1, says="does not exist"),
    c("kernels-under-file", *K, "{out}/m.bin/k", status=1, says="is a file, not a directory", setup="file"),
    c("kernels-out-dot", *K, "{out}/.", status=1, says="exists"),
    c("kernels-out-empty", *K, "", status=1, says="name of a new directory"),
    c("kernels-seed-negative", *K, "{out}/k", "--seed", "-1", status=2, says=SEED_RANGE),
    c("kernels-seed-text", *K, "{out}/k", "--seed", "x", status=2, says="an integer"),
    c("kernels-seed-2^32", *K, "{out}/k", "--seed", str(2**32), status=2, says=SEED_RANGE),
    c("kernels-readonly", *K, "{out}/k", status=1, says="not writable", fault="readonly"),
    c("kernels-enospc", *K, "{out}/k", status=1, says="no space left", fault="enospc"),
    c("kernels-enospc-keeps-dump", *K, "{out}/k", "--force", status=1, says="no space left",
      fault="enospc", setup="dump"),
    c("kernels-fsize", *K, "{out}/k", status=1, says="file too large", fault="fsize", sub=True),
    c("kernels-config-default", *K, "{out}/k", status=0, says="wrote 12 kernels of default", new=("k",)),
]  # fmt: skip

E = ("export", "{ws}/tiny.bin", "--to")
EL = (*E, "llama2c", "{out}/m.bin")
EM = (*E, "mlpackage", "{out}/m.mlpackage")
EXPORT = [
    c("export-missing", "export", "{ws}/nope.bin", "--to", "llama2c", "{out}/m.bin", status=1,
      says="cannot read", sub=True),
    c("export-garbage", "export", "{ws}/garbage", "--to", "llama2c", "{out}/m.bin", status=1, says="[llama2c] dim"),
    c("export-nan", "export", "{ws}/nan.bin", "--to", "llama2c", "{out}/m.bin", status=1,
      says="NaN or inf values"),
    c("export-truncated", "export", "{ws}/trunc.bin", "--to", "mlpackage", "{out}/m.mlpackage", status=1,
      says="truncated"),
    c("export-llama2c-out-dir", *E, "llama2c", "{out}/d", status=1, says="is a directory", setup="dir"),
    c("export-llama2c-out-dir-force", *E, "llama2c", "{out}/d", "--force", status=1,
      says="is a directory", setup="dir"),
    c("export-llama2c-no-parent", *E, "llama2c", "{out}/no/m.bin", status=1, says="does not exist"),
    c("export-llama2c-under-file", *E, "llama2c", "{out}/m.bin/x.bin", status=1,
      says="is a file, not a directory", setup="file"),
    c("export-llama2c-exists", *EL, status=1, says="already exists", setup="file"),
    c("export-mlpackage-foreign-dir-force", *E, "mlpackage", "{out}/d", "--force", status=1,
      says="not a previous export", setup="dir", sub=True),
    c("export-mlpackage-file-force", *E, "mlpackage", "{out}/m.bin", "--force", status=1,
      says="not a previous export", setup="file"),
    c("export-mlpackage-no-parent", *E, "mlpackage", "{out}/no/m.mlpackage", status=1,
      says="does not exist"),
    c("export-mlpackage-under-file", *E, "mlpackage", "{out}/m.bin/m.mlpackage", status=1,
      says="is a file, not a directory", setup="file"),
    c("export-mlpackage-suffix", *E, "mlpackage", "{out}/m.pkg", status=1, says=".mlpackage"),
    c("export-shard-mb-0", *EM, "--shard-mb", "0", status=2, says="(0, inf)"),
    c("export-shard-mb-negative", *EM, "--shard-mb", "-1", status=2, says="(0, inf)"),
    c("export-shard-mb-nan", *EM, "--shard-mb", "nan", status=2, says="finite"),
    c("export-shard-mb-inf", *EM, "--shard-mb", "inf", status=2, says="finite"),
    c("export-shard-mb-text", *EM, "--shard-mb", "x", status=2, says="a number"),
    c("export-shard-mb-tiny", *EM, "--shard-mb", "0.01", status=1, says="cannot be sharded"),
    c("export-no-to", "export", "{ws}/tiny.bin", "{out}/m.bin", status=2, says="--to"),
    c("export-to-unknown", *E, "onnx", "{out}/m.onnx", status=2, says="invalid choice"),
    c("export-quantize-unknown", *EM, "--quantize", "int3", status=2, says="invalid choice: 'int3'"),
    c("export-quantize-llama2c", *EL, "--quantize", "int8", status=1, says="--to mlpackage only"),
    c("export-config-unknown", *EL, "--config", "nope", status=2, says="unknown preset 'nope'"),
    c("export-tokenizer-missing", *EL, "--tokenizer", "{ws}/nope.model", status=1, says="nope.model"),
    c("export-readonly", *EL, status=1, says="not writable", fault="readonly"),
    c("export-llama2c-enospc", *EL, status=1, says="no space left", fault="enospc"),
    c("export-llama2c-enospc-keeps", *EL, "--force", status=1, says="no space left", fault="enospc",
      setup="file"),
    c("export-mlpackage-enospc", *EM, status=1, says="no space left", fault="enospc"),
    c("export-fsize", *EM, status=1, says="file too large", fault="fsize", sub=True),
]  # fmt: skip

DOCTOR = [
    c("doctor-json-dir", "doctor", "--json", "{out}", status=1, says="is a directory", sub=True),
    c("doctor-json-no-parent", "doctor", "--json", "{out}/no/r.json", status=1, says="does not exist"),
    c("doctor-json-under-file", "doctor", "--json", "{out}/m.bin/r.json", status=1,
      says="is a file, not a directory", setup="file"),
    c("doctor-json-empty", "doctor", "--json", "", status=1, says="needs a file name"),
    c("doctor-json-dot", "doctor", "--json", "{out}/.", status=1, says="directory"),
    c("doctor-seed-negative", "doctor", "--smoke", "--seed", "-1", status=2, says=SEED_RANGE),
    c("doctor-seed-text", "doctor", "--smoke", "--seed", "x", status=2, says="an integer"),
    c("doctor-config-unknown", "doctor", "--smoke", "--config", "nope", status=2, says="unknown preset"),
    c("doctor-dialect", "doctor", "--smoke", "--dialect", "ios99", status=2, says="invalid choice"),
    c("doctor-readonly", "doctor", "--json", "{out}/r.json", status=1, says="not writable", fault="readonly"),
    c("doctor-enospc", "doctor", "--json", "{out}/r.json", status=1, says="no space left", fault="enospc"),
    c("doctor-fsize", "doctor", "--json", "{out}/r.json", status=1, says="file too large", fault="fsize",
      sub=True),
]  # fmt: skip

DEMO = [
    c("demo-dim-0", "demo", "--dim", "0", status=2, says="2 .. 1024", sub=True),
    c("demo-dim-negative", "demo", "--dim", "-64", status=2, says="2 .. 1024"),
    c("demo-dim-text", "demo", "--dim", "wide", status=2, says="an integer"),
    c("demo-dim-huge", "demo", "--dim", "100000", status=2, says="2 .. 1024"),
    c("demo-hidden-0", "demo", "--hidden", "0", status=2, says="1 .. 2048"),
    c("demo-heads-0", "demo", "--heads", "0", status=2, says="1 .. 64"),
    c("demo-heads-not-dividing", "demo", "--heads", "3", status=1, says="[config demo]"),
    c("demo-kv-heads-not-dividing", "demo", "--kv-heads", "3", status=1, says="[config demo]"),
    c("demo-kv-heads-0", "demo", "--kv-heads", "0", status=2, says="1 .. 64"),
    c("demo-seq-0", "demo", "--seq", "0", status=2, says="32 .. 1024"),
    c("demo-seq-short-rows", "demo", "--seq", "31", status=2, says="32 .. 1024"),
    c("demo-seq-huge", "demo", "--seq", "5000", status=2, says="32 .. 1024"),
    c("demo-hidden-wide-conv", "demo", "--hidden", "2049", status=2, says="1 .. 2048"),
    c("demo-dim-1", "demo", "--dim", "1", status=2, says="2 .. 1024"),
    c("demo-head-dim-odd", "demo", "--dim", "24", "--heads", "8", status=1, says="head_dim 3 must be even"),
    c("demo-seed-negative", "demo", "--seed", "-1", status=2, says=SEED_RANGE),
    c("demo-seed-text", "demo", "--seed", "x", status=2, says="an integer"),
]  # fmt: skip

COST = [
    c("cost-nothing", "cost", status=1, says="name one of", sub=True),
    c("cost-both", "cost", P, "--config", "default", status=1, says="name one of"),
    c("cost-config-unknown", "cost", "--config", "nope", status=2, says="unknown preset"),
    c("cost-chip-unknown", "cost", "--config", "default", "--chip", "m9", status=2, says="unknown chip"),
    c("cost-target-missing", "cost", "{ws}/nope.mil", status=1, says="no such file"),
    c("cost-target-garbage", "cost", "{ws}/garbage", status=1, says="not utf-8 text"),
    c("cost-target-empty-dir", "cost", "{out}", status=1, says="no model.mil"),
    c("cost-target-syntax", "cost", "{ws}/syn.mil", status=1, says="not a MIL program"),
    c("cost-weights", "cost", "--config", "default", "--weights", "both", status=2, says="invalid choice"),
    c("cost-config-default", "cost", "--config", "default", status=0, says="default training step"),
]  # fmt: skip

LAUNCH = [
    c("launch-n-missing", "launch", "--", "train", status=2, says="-n"),
    c("launch-n-zero", "launch", "-n", "0", "--", "train", status=2, says="1 .. 4096"),
    c("launch-not-train", "launch", "-n", "2", "--", "sample", status=1, says="train ARGS... (got 'sample')"),
    c("launch-nothing", "launch", "-n", "2", status=1, says="(got nothing)", sub=True),
    c("launch-engine-unknown", "launch", "-n", "2", "--engine", "nccl", "--", "train", status=2,
      says="invalid choice"),
    c("launch-hostfile-missing", "launch", "-n", "2", "--hostfile", "{ws}/nope", "--", "train", status=1,
      says="no such file or directory"),
    c("launch-hostfile-fifo", "launch", "-n", "2", "--hostfile", "{ws}/fifo.mil", "--", "train", status=1,
      says="a fifo (named pipe), not a hostfile"),
    c("launch-hostfile-device", "launch", "-n", "2", "--hostfile", "/dev/zero", "--", "train", status=1,
      says="not a hostfile"),
    c("launch-hostfile-not-json", "launch", "-n", "2", "--engine", "mlx", "--hostfile", "{ws}/garbage", "--",
      "train", status=1, says="not UTF-8 text"),
    c("launch-hosts-and-hostfile", "launch", "-n", "2", "--hosts", "a", "--hostfile", "{ws}/garbage", "--",
      "train", status=2, says="not allowed with"),
    c("launch-distributed-contradicts", "launch", "-n", "2", "--", "train", "--distributed", "mlx", status=1,
      says="train --distributed mlx contradicts --engine mpi"),
    c("launch-peer-timeout-zero", "launch", "-n", "2", "--peer-timeout", "0", "--", "train", status=2,
      says="(0, 86400]"),
    c("launch-peer-timeout-twice", "launch", "-n", "2", "--peer-timeout", "3", "--", "train", "--peer-timeout",
      "4", status=1, says="give it once"),
    c("launch-mlx-hosts-uneven", "launch", "-n", "3", "--engine", "mlx", "--hosts", "a,b", "--", "train",
      status=1, says="give a multiple of 2"),
]  # fmt: skip

MIL = [
    c("mil-check-missing", "mil", "check", "{ws}/nope.mil", status=1, says="cannot read", sub=True),
    c("mil-check-garbage", "mil", "check", "{ws}/garbage", status=1, says="cannot read"),
    c("mil-check-syntax", "mil", "check", "{ws}/syn.mil", status=1, says="syn.mil:5:3"),
    c("mil-check-type", "mil", "check", "{ws}/type.mil", status=1, says="inner dimensions"),
    c("mil-check-empty", "mil", "check", "{ws}/empty", status=1, says="[mil.parse]"),
    c("mil-check-dir", "mil", "check", "{ws}", status=1, says="a directory, not a mil text file"),
    c("mil-check-package", "mil", "check", "{out}/d.mlpackage", status=1, says="a coreml package: `anekit lint`",
      setup="package"),
    c("mil-fmt-package", "mil", "fmt", "{out}/d.mlpackage", status=1, says="a coreml package", setup="package"),
    c("mil-fmt-missing", "mil", "fmt", "{ws}/nope.mil", status=1, says="cannot read"),
    c("mil-fmt-syntax", "mil", "fmt", "{ws}/syn.mil", status=1, says="syn.mil:5:3", sub=True),
    c("mil-fmt-type", "mil", "fmt", "{ws}/type.mil", status=1, says="inner dimensions"),
    c("mil-fmt-garbage", "mil", "fmt", "{ws}/garbage", status=1, says="cannot read"),
    c("mil-no-action", "mil", status=2, says="required"),
    c("mil-check-no-files", "mil", "check", status=2, says="required"),
]  # fmt: skip

LINT = [
    c("lint-nothing", "lint", status=1, says="name at least one", sub=True),
    c("lint-missing", "lint", "{ws}/nope.mil", status=1, says="no such file"),
    c("lint-chip", "lint", P, "--chip", "m9", status=2, says="argument --chip: unknown chip 'm9'"),
    c("lint-route", "lint", P, "--route", "npu", status=2, says="argument --route: unknown route 'npu'",
      sub=True),
    c("lint-garbage", "lint", "{ws}/garbage", status=1, says="mil.syntax error"),
]  # fmt: skip

INSPECT = [
    c("inspect-nothing", "inspect", status=1, says="give one FILE", sub=True),
    c("inspect-both", "inspect", P, "--diff", P, P, status=1, says="give one FILE"),
    c("inspect-missing", "inspect", "{ws}/nope", status=1, says="nope"),
    c("inspect-empty", "inspect", "{ws}/empty", status=1, says="0 bytes"),
    c("inspect-garbage", "inspect", "{ws}/garbage", status=1, says="not a file kind"),
    c("inspect-foreign-dir", "inspect", "{out}/d", status=1, says="d", setup="dir"),
    c("inspect-diff-kinds", "inspect", "--diff", "{ws}/tiny.bin", P, status=1, says="two files of one kind"),
    c("inspect-diff-missing", "inspect", "--diff", "{ws}/nope", P, status=1, says="nope"),
    c("inspect-truncated", "inspect", "{ws}/trunc.bin", status=1, says="truncated"),
    c("inspect-diff-one", "inspect", "--diff", P, status=2, says="--diff"),
]  # fmt: skip

TRAIN_TODAY = [
    c("train-config-unknown", "train", "--config", "nope", "--out", "{out}/t", status=2,
      says="argument --config: unknown preset 'nope'", sub=True),
    c("train-chip-unknown", "train", "--chip", "m9", "--out", "{out}/t", status=2,
      says="argument --chip: unknown chip 'm9' (choose one of: any, m1"),
    c("train-vocab-needs-tokenizer", "train", "--config", "stories15M", "--steps", "5", "--out", "{out}/t",
      status=1, says="needs a 32000-token tokenizer: pass it with --tokenizer"),
    c("train-tokenizer-dir", "train", "--tokenizer", "{ws}", "--out", "{out}/t", status=1,
      says="a directory, not a tokenizer file"),
    c("train-steps-text", "train", "--steps", "x", "--out", "{out}/t", status=2, says="--steps"),
    c("train-backend", "train", "--backend", "gpu", "--out", "{out}/t", status=2, says="invalid choice"),
    c("train-weights", "train", "--weights", "both", "--out", "{out}/t", status=2, says="invalid choice"),
]  # fmt: skip

# Inputs that are not regular files (a FIFO would block the open forever, /dev/zero never ends), paths
# the OS cannot look up, sizes and shapes over what anything can hold, and arrays that are not real numbers:
# one line each, refused before anything is opened or allocated (anekit.inputs, mil.verify.MAX_ELEMENTS).
LONG = "{ws}/" + "a" * 300  # ENAMETOOLONG: one line naming the path, shortened
NPY = ("run", P, "--input")
BAD_PATHS = [
    c("run-program-fifo", "run", "{ws}/fifo.mil", "--random", "1", status=1, says="a fifo (named pipe)",
      sub=True),
    c("run-program-dev-zero", "run", "/dev/zero", "--random", "1", status=1, says="a character device"),
    c("run-program-long-path", "run", LONG + ".mil", "--random", "1", status=1, says="file name too long"),
    c("run-output-long-path", "run", P, "--random", "1", "--output", "{out}/" + "b" * 300 + ".npz",
      status=1, says="characters): file name too long"),
    c("run-weights-long-path", "run", P, "--random", "1", "--weights", LONG, status=1,
      says="file name too long"),
    c("run-input-fifo", *NPY, "x={ws}/fifo.mil", status=1, says="a fifo (named pipe), not a .npy file"),
    c("run-input-dev-zero", *NPY, "x=/dev/zero", status=1, says="a character device"),
    c("run-input-dir", *NPY, "x={ws}", status=1, says="a directory, not a .npy file"),
    c("run-input-long-path", *NPY, "x=" + LONG + ".npy", status=1, says="file name too long"),
    c("run-input-huge-header", *NPY, "x={ws}/huge.npy", status=1, says="has shape [1000000000000]"),
    c("run-input-2^70-header", *NPY, "x={ws}/huge70.npy", status=1, says=f"has shape [{2**70}]"),
    c("run-input-short-data", *NPY, "x={ws}/short.npy", status=1, says="the file holds 100 bytes"),
    c("run-input-complex", *NPY, "x={ws}/complex.npy", status=1, says="complex numbers"),
    c("run-input-str", *NPY, "x={ws}/str.npy", status=1, says="strings"),
    c("run-input-empty", *NPY, "x={ws}/empty.npy", status=1, says="is empty (shape [0])"),
    c("run-input-int64", *NPY, "x={ws}/int64.npy", status=1, says="int64 values for a float input"),
    c("run-input-bool", *NPY, "x={ws}/bool.npy", status=1, says="bool values for a float input"),
    c("run-input-structured", *NPY, "x={ws}/struct.npy", status=1, says="structured array"),
    c("run-huge-dims", "run", "{ws}/huge.mil", "--random", "1", status=1,
      says="holds 10000000000 elements", sub=True),
    c("run-dims-2^40", "run", "{ws}/dims40.mil", "--random", "1", status=1, says="over the limit of 2147483648"),
    c("run-dims-2^70", "run", "{ws}/dims70.mil", "--random", "1", status=1, says="over the limit of 2147483648"),
    c("run-hex-overflow", "run", "{ws}/hex.mil", "--random", "1", status=1, says="literal 0x1p99999 is too large"),
    c("mil-check-fifo", "mil", "check", "{ws}/fifo.mil", status=1, says="a fifo (named pipe)", sub=True),
    c("mil-check-dev-zero", "mil", "check", "/dev/zero", status=1, says="a character device"),
    c("mil-check-long-path", "mil", "check", LONG, status=1, says="file name too long"),
    c("mil-check-huge-dims", "mil", "check", "{ws}/huge.mil", status=1, says="over the limit of 2147483648"),
    c("mil-check-dims-2^70", "mil", "check", "{ws}/dims70.mil", status=1, says="over the limit of 2147483648"),
    c("mil-check-hex-overflow", "mil", "check", "{ws}/hex.mil", status=1, says="hex.mil:4:"),
    c("mil-fmt-fifo", "mil", "fmt", "{ws}/fifo.mil", status=1, says="a fifo (named pipe)"),
    c("mil-fmt-dev-zero", "mil", "fmt", "/dev/zero", status=1, says="a character device"),
    c("mil-fmt-hex-overflow", "mil", "fmt", "{ws}/hex.mil", "--no-verify", status=1, says="0x1p99999"),
    c("lint-fifo", "lint", "{ws}/fifo.mil", status=1, says="a fifo (named pipe)", sub=True),
    c("lint-dir-holding-fifo", "lint", "{ws}/fifodir", status=1, says="a fifo (named pipe)"),
    c("lint-long-path", "lint", LONG + ".mil", status=1, says="file name too long"),
    c("lint-dev-zero", "lint", "/dev/zero", status=1, says="a character device"),
    c("lint-py-keyboard-interrupt", "lint", "{ws}/ki.py", status=130, says="anekit: interrupted"),
    c("inspect-fifo", "inspect", "{ws}/fifo.mil", status=1, says="a fifo (named pipe)", sub=True),
    c("inspect-dev-zero", "inspect", "/dev/zero", status=1, says="a character device"),
    c("inspect-long-path", "inspect", LONG, status=1, says="file name too long"),
    c("inspect-diff-fifo", "inspect", "--diff", "{ws}/fifo.mil", P, status=1, says="a fifo (named pipe)"),
    c("sample-fifo", "sample", "{ws}/fifo.mil", status=1, says="a fifo (named pipe), not a model file",
      sub=True),
    c("sample-dev-zero", "sample", "/dev/zero", status=1, says="a character device"),
    c("sample-prompt-not-utf8", *S, "--prompt", "caf\udce9", status=1,
      says="--prompt is not utf-8 text"),
    c("sample-long-path", "sample", LONG, status=1, says="file name too long"),
    c("sample-tokenizer-fifo", *S, "--tokenizer", "{ws}/fifo.mil", status=1,
      says="a fifo (named pipe), not a tokenizer file"),
    c("sample-tokenizer-dev-zero", *S, "--tokenizer", "/dev/zero", status=1, says="a character device"),
    c("export-fifo", "export", "{ws}/fifo.mil", "--to", "llama2c", "{out}/m.bin", status=1,
      says="a fifo (named pipe), not a model file"),
    c("export-dev-zero", "export", "/dev/zero", "--to", "llama2c", "{out}/m.bin", status=1,
      says="a character device"),
    c("kernels-out-long-path", *K, "{out}/" + "k" * 300, status=1, says="file name too long"),
    c("train-data-fifo", "train", "--data", "{ws}/fifo.mil", "--out", "{out}/t", status=1,
      says="a fifo (named pipe), not a text file or a directory of shards", sub=True),
    c("train-tokenizer-dev-zero", "train", "--tokenizer", "/dev/zero", "--out", "{out}/t", status=1,
      says="a character device, not a tokenizer file"),
    c("train-init-fifo", "train", "--init", "{ws}/fifo.mil", "--out", "{out}/t", status=1,
      says="a fifo (named pipe), not a model file", sub=True),
    c("train-data-long-path", "train", "--data", LONG, "--out", "{out}/t", status=1, says="file name too long"),
    c("cost-fifo", "cost", "{ws}/fifo.mil", status=1, says="a fifo (named pipe), not a MIL text file", sub=True),
    c("cost-dev-zero", "cost", "/dev/zero", status=1, says="a character device"),
    c("cost-long-path", "cost", LONG + ".mil", status=1, says="file name too long"),
    c("export-out-long-path", *E, "llama2c", "{out}/" + "m" * 300 + ".bin", status=1,
      says="file name too long"),
]  # fmt: skip

HF = [
    c("fuse-no-args", "fuse", status=2, says="the following arguments are required"),
    c("fuse-not-a-model", "fuse", "{ws}/tiny.bin", "{ws}/hf", "{out}/f", status=1,
      says="is not a Hugging Face model directory"),
    c("fuse-missing-adapters", "fuse", "{ws}/hf", "{ws}/nope", "{out}/f", status=1, says="nope"),
    c("fuse-adapters-without-config", "fuse", "{ws}/hf", "{ws}/fifodir", "{out}/f", status=1,
      says="adapter_config.json"),
    c("fuse-fifo-adapter-weights", "fuse", "{ws}/hf", "{ws}/fifoadapter", "{out}/f", status=1,
      says="a fifo (named pipe)", sub=True),
    c("fuse-out-foreign-dir", "fuse", "{ws}/hf", "{ws}/hf", "{out}/d", status=1, says="is not a model",
      setup="dir"),
    c("fuse-out-long-path", "fuse", "{ws}/hf", "{ws}/hf", "{out}/" + "f" * 300, status=1,
      says="file name too long"),
    c("sample-hf-bad-config", "sample", "{ws}/hfbad", status=1, says="hfbad/config.json: not json"),
    c("sample-hf-tokenizer-flag", "sample", "{ws}/hf", "--tokenizer", "{ws}/bad.model", status=1,
      says="--tokenizer does not apply to a Hugging Face directory"),
    c("sample-chat-not-hf", *S, "--chat", status=1, says="--chat needs a hugging face model directory"),
    c("sample-adapters-not-hf", *S, "--adapters", "{ws}/hf", status=1,
      says="--adapters needs a hugging face model directory"),
    c("sample-adapters-missing", "sample", "{ws}/hf", "--adapters", "{ws}/nope", status=1, says="nope"),
    c("export-dtype-not-safetensors", "export", "{ws}/hf", "--to", "llama2c", "--dtype", "float16",
      "{out}/m.bin", status=1, says="--dtype applies to --to safetensors only"),
    c("export-safetensors-exists", "export", "{ws}/hf", "--to", "safetensors", "{out}/d", status=1,
      says="exists (use --force", setup="dir"),
    c("export-safetensors-foreign-dir", "export", "{ws}/hf", "--to", "safetensors", "--force", "{out}/d",
      status=1, says="not a previous safetensors export", setup="dir"),
    c("train-lora-without-hf", "train", "--lora", "4", "--out", "{out}/t", status=1,
      says="--lora applies to a Hugging Face model (--init HF_DIR)"),
    c("train-lora-alpha-without-rank", "train", "--init", "{ws}/hf", "--lora-alpha", "8", "--out", "{out}/t",
      status=1, says="--lora-alpha and --lora-targets need --lora RANK"),
    c("train-lora-bad-target", "train", "--init", "{ws}/hf", "--lora", "4", "--lora-targets", "q,zz",
      "--out", "{out}/t", status=1, says="unknown target 'zz'"),
    c("train-hf-baked", "train", "--init", "{ws}/hf", "--weights", "baked", "--out", "{out}/t", status=1,
      says="trains with dynamic weights"),
    c("train-lora-rank-zero", "train", "--init", "{ws}/hf", "--lora", "0", "--out", "{out}/t", status=2,
      says="--lora: must be in 1 .. 4096"),
    c("train-hf-data-fifo", "train", "--init", "{ws}/hf", "--lora", "2", "--data", "{ws}/fifo.mil", "--out",
      "{out}/t", status=1, says="a fifo (named pipe)", sub=True),
]  # fmt: skip

TOP = [
    c("no-command", status=2, says="required", sub=True),
    c("unknown-command", "fly", status=2, says="invalid choice"),
    c("unknown-top-flag", "--fast", "demo", status=2, says="unrecognized arguments"),
]  # fmt: skip

CASES = (
    RUN + SAMPLE + KERNELS + EXPORT + DOCTOR + DEMO + COST + LAUNCH + MIL + LINT + INSPECT + TRAIN_TODAY + HF
)
CASES += TOP
CASES += BAD_PATHS
IN_PROCESS = [k for k in CASES if not k.sub]
SUBPROCESS = [k for k in CASES if k.sub]


def test_the_table_is_large_and_well_formed():
    assert len(CASES) >= 150
    assert len({k.id for k in CASES}) == len(CASES), "case ids are unique"
    assert all(k.fault != "fsize" or k.sub for k in CASES), "a file size limit needs its own process"
    assert all(k.fault not in ("enospc", "readonly") or not k.sub for k in CASES), "in-process faults"
    assert {k.argv[0] for k in SUBPROCESS if k.argv} >= {
        "run", "sample", "kernels", "export", "doctor", "demo", "cost", "mil", "lint", "inspect", "train",
    }  # fmt: skip


# --- the workspace of inputs -----------------------------------------------------------------------

PROGRAM = """program(1.3)
{{
    func main<ios18>(tensor<fp16, [1, 4, 1, {s}]> x) {{
        tensor<fp16, [1, 4, 1, {s}]> y = mul(x = x, y = x);
        tensor<fp16, [1, 4, 1, {s}]> z = exp(x = y);
    }} -> (z);
}}
"""


SYNTAX_ERROR = """program(1.3)
{
  func main<ios18>(tensor<fp16, [1, 4, 1, 32]> x) {
   tensor<fp16, [1, 4, 1, 32]> y = mul(x = x, y = x
  } -> (y);
}
"""  # line 5, column 3: the call is not closed


HEX_OVERFLOW = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 4, 1, 32]> x) {
        fp16 s = const()[name = string("s"), val = fp16(0x1p99999)];
        tensor<fp16, [1, 4, 1, 32]> y = mul(x = x, y = s);
    } -> (y);
}
"""  # 2^99999 overflows every float type: float.fromhex raises OverflowError


def _params_with(value: float) -> Params:
    params = Params.init(TINY, seed=1)
    params.layers[1].w2[3, 5] = value
    return params


TINY = ModelConfig(32, 48, 2, 4, 2, 512, 16, name="tiny")  # 512: the default tokenizer's vocabulary


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Inputs shared by every case (never written by them) and a warm tokenizer cache."""
    from anekit.llama.tokenizer import default_tokenizer

    ws = tmp_path_factory.mktemp("ws")
    write_llama2c(ws / "tiny.bin", Params.init(TINY, seed=1))
    write_llama2c(ws / "nan.bin", _params_with(np.nan))
    write_llama2c(ws / "inf.bin", _params_with(np.inf))
    (ws / "trunc.bin").write_bytes((ws / "tiny.bin").read_bytes()[:1000])
    (ws / "prog.mil").write_text(PROGRAM.format(s=32))
    (ws / "small.mil").write_text(PROGRAM.format(s=8))
    (ws / "syn.mil").write_text(SYNTAX_ERROR)
    (ws / "type.mil").write_text(PROGRAM.format(s=32).replace("mul(", "matmul("))
    (ws / "garbage").write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    (ws / "empty").write_bytes(b"")
    (ws / "three").write_bytes(b"abc")
    (ws / "bad.model").write_bytes(b"\x00\x01not a model")
    (ws / "shards").mkdir()
    (ws / "shards" / "shards.json").write_text("{not json")
    x = np.ones((1, 4, 1, 32), np.float32)
    np.save(ws / "x.npy", x)
    np.save(ws / "nan.npy", np.where(np.arange(x.size).reshape(x.shape) == 0, np.nan, x))
    np.save(ws / "neginf.npy", np.where(np.arange(x.size).reshape(x.shape) == 0, -np.inf, x))
    np.save(ws / "big.npy", np.full_like(x, 300.0))  # 300^2 overflows fp16: inf, and exp(inf) = inf
    np.save(ws / "shape.npy", np.ones((2, 3), np.float32))
    np.save(ws / "obj.npy", np.array([{}], dtype=object), allow_pickle=True)
    os.mkfifo(ws / "fifo.mil")  # nothing ever writes it: an open() would block forever
    (ws / "fifodir").mkdir()
    os.mkfifo(ws / "fifodir" / "p.mil")
    (ws / "ki.py").write_text("raise KeyboardInterrupt\n")
    (ws / "huge.mil").write_text(PROGRAM.format(s=32).replace("[1, 4, 1, 32]", "[1, 100000, 1, 100000]"))
    (ws / "dims40.mil").write_text(PROGRAM.format(s=2**40))
    (ws / "dims70.mil").write_text(PROGRAM.format(s=2**70))
    (ws / "hex.mil").write_text(HEX_OVERFLOW)
    _npy_header(ws / "huge.npy", (10**12,), b"\0" * 64)
    _npy_header(ws / "huge70.npy", (2**70,), b"\0" * 64)
    _npy_header(ws / "short.npy", (1, 4, 1, 32), b"\0" * 100)  # 512 bytes of float32 promised
    np.save(ws / "complex.npy", x.astype(np.complex64))
    np.save(ws / "str.npy", np.full(x.shape, "a"))
    np.save(ws / "empty.npy", np.zeros(0, np.float32))
    np.save(ws / "int64.npy", x.astype(np.int64))
    np.save(ws / "bool.npy", x.astype(bool))
    np.save(ws / "struct.npy", np.zeros(x.shape, [("a", "<f4"), ("b", "<f4")]))
    default_tokenizer(TINY.vocab_size, cache_dir=ws / "cache")
    _hf_inputs(ws)
    return ws


def _hf_inputs(ws: Path) -> None:
    """A small Hugging Face model directory with its tokenizer, a broken one, and a FIFO adapter."""
    from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

    make_tokenizer(ws / "hf", 512, "llama3")
    make_checkpoint(ws / "hf", small("tiny_llama2c", num_hidden_layers=1), dtype="float32", seed=1)
    (ws / "hfbad").mkdir()
    (ws / "hfbad" / "config.json").write_text("{not json")
    (ws / "fifoadapter").mkdir()
    (ws / "fifoadapter" / "adapter_config.json").write_text(
        '{"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}'
    )
    os.mkfifo(ws / "fifoadapter" / "adapter_model.safetensors")


def _npy_header(path: Path, shape: tuple[int, ...], data: bytes) -> None:
    """A .npy file of float32 whose header promises ``shape``, followed by ``data`` (of any length)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
        f.write(data)


# --- running a case --------------------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` (hidden ones included): a file's bytes, None for a directory."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))
    }


def _prepare(case: Case, ws: Path, tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    out = tmp_path / "out"
    out.mkdir()
    if case.setup:
        SETUPS[case.setup](out)

    def fill(text: str) -> str:
        return text.replace("{ws}", str(ws)).replace("{out}", str(out))

    env = {"ANEKIT_CACHE": str(ws / "cache"), "ANEKIT_BACKEND": "sim"}
    env.update({k: fill(v) for k, v in case.env})
    return [fill(a) for a in case.argv], env, out


def _check(case: Case, status: int, stdout: str, stderr: str, out: Path, before: dict) -> None:
    where = f"{case.id}: exit {status}\nstdout: {stdout[-2000:]}\nstderr: {stderr[-2000:]}"
    assert "Traceback" not in stderr, where
    assert "Warning" not in stderr, where  # numpy's RuntimeWarning text, or any other
    assert status == case.status, where
    lines = stderr.strip().splitlines()
    says = case.says.lower()  # the OS's own words differ in case ("No space left" / "no space left")
    if case.form == "usage":
        assert lines and lines[0].startswith("usage: anekit") and USAGE_LAST.match(lines[-1]), where
        assert says in lines[-1].lower(), where
    elif case.form == "anekit":
        assert len(lines) == 1 and lines[0].startswith("anekit: "), where
        assert says in lines[0].lower(), where
    elif case.form == "fail":
        assert len(lines) == 1 and ": FAIL " in lines[0] and says in lines[0].lower(), where
    elif case.form == "findings":
        assert stderr == "" and says in stdout.lower(), where
    else:
        assert says in stdout.lower(), where
    after = _snapshot(out)
    added = {k for k in after.keys() - before.keys() if Path(k).parts[0] not in case.new}
    assert not added, f"{where}\nleft behind: {sorted(added)}"
    changed = {k for k in before if after.get(k, b"<gone>") != before[k]}
    assert not changed, f"{where}\nchanged or removed: {sorted(changed)}"
    for name in case.new:
        assert name in after, where


class _FullDisk:
    """A file opened for writing whose every write fails as on a full disk."""

    def __init__(self, f: object) -> None:
        self._f = f

    def write(self, data: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    writelines = write

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()  # type: ignore[attr-defined]

    def __iter__(self) -> object:
        return iter(self._f)  # type: ignore[call-overload]

    def __getattr__(self, name: str) -> object:
        return getattr(self._f, name)


def _full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file opened for writing (builtins / io.open, os.fdopen) fails with ENOSPC on its first write."""
    real_open, real_fdopen = io.open, os.fdopen

    def writing(mode: str) -> bool:
        return any(ch in mode for ch in "wax+")

    def fake_open(file: object, mode: str = "r", *args: object, **kw: object) -> object:
        f = real_open(file, mode, *args, **kw)  # type: ignore[call-overload]
        return _FullDisk(f) if writing(mode) else f

    def fake_fdopen(fd: int, mode: str = "r", *args: object, **kw: object) -> object:
        f = real_fdopen(fd, mode, *args, **kw)  # type: ignore[call-overload]
        return _FullDisk(f) if writing(mode) else f

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(os, "fdopen", fake_fdopen)


def _read_only(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """``os.access`` denies writing anywhere under ``root`` (as a read-only directory would)."""
    real_access = os.access

    def fake_access(path: object, mode: int, *args: object, **kw: object) -> bool:
        if mode & os.W_OK and Path(os.fspath(path)).resolve().is_relative_to(root.resolve()):  # type: ignore[arg-type]
            return False
        return real_access(path, mode, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", fake_access)


@pytest.mark.parametrize("case", IN_PROCESS, ids=[k.id for k in IN_PROCESS])
def test_bad_input_in_process(case: Case, ws: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    argv, env, out = _prepare(case, ws, tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = _snapshot(out)
    if case.fault == "enospc":
        _full_disk(monkeypatch)
    elif case.fault == "readonly":
        _read_only(monkeypatch, out)
    with warnings.catch_warnings(record=True) as caught, watchdog(SECONDS):
        warnings.simplefilter("always")
        try:
            status = main(argv)
        except SystemExit as e:  # argparse's usage error (and --help / --version)
            status = e.code if isinstance(e.code, int) else 1
    monkeypatch.undo()  # the real open() again before the output location is read back
    captured = capsys.readouterr()
    assert not caught, f"{case.id}: warnings {[str(w.message) for w in caught]}"
    _check(case, status, captured.out, captured.err, out, before)


def _limit_file_size() -> None:  # runs in the child before exec
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))


@pytest.mark.parametrize("case", SUBPROCESS, ids=[k.id for k in SUBPROCESS])
def test_bad_input_subprocess(case: Case, ws: Path, tmp_path: Path) -> None:
    argv, env, out = _prepare(case, ws, tmp_path)
    before = _snapshot(out)
    env = {**os.environ, **env, "PYTHONPATH": str(SRC), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "anekit.cli.main", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=SECONDS,
        preexec_fn=_limit_file_size if case.fault == "fsize" else None,
    )
    _check(case, proc.returncode, proc.stdout, proc.stderr, out, before)


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes even where chmod forbids"
)
def test_a_really_read_only_directory_is_one_error_line(ws: Path, tmp_path: Path, capsys) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        status = main(["run", str(ws / "prog.mil"), "--random", "1", "--output", str(ro / "o.npz")])
        err = capsys.readouterr().err
        assert status == 1 and err.startswith("anekit: [run] --output") and "not writable" in err
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)
        shutil.rmtree(ro)


# --- every command is in the table -----------------------------------------------------------------

READERS = {"run", "mil", "lint", "inspect", "sample"}  # commands whose inputs anekit.inputs opens


def test_the_table_covers_every_registered_command() -> None:
    """A command added to anekit.cli.main cannot ship without its bad-input cases here."""
    from anekit.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    registered = set(sub.choices)
    assert registered <= {k.argv[0] for k in CASES if k.argv}, registered - {k.argv[0] for k in CASES}
    fifo = {k.argv[0] for k in CASES if k.argv and any("fifo" in a for a in k.argv)}
    assert READERS <= fifo <= registered, "each command that reads an input has a FIFO case"
    for command in READERS:
        assert any(k.argv[:1] == (command,) and "/dev/zero" in k.argv for k in CASES), command
        assert any(k.argv[:1] == (command,) and any(len(a) > 300 for a in k.argv) for k in CASES), command


# --- signals and stdout ----------------------------------------------------------------------------


def _anekit(*argv: str, **kw: object) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONDONTWRITEBYTECODE": "1", "ANEKIT_BACKEND": "sim"}
    return subprocess.Popen(
        [sys.executable, "-m", "anekit.cli.main", *argv], stderr=subprocess.PIPE, text=True, env=env, **kw
    )  # type: ignore[call-overload]


def test_a_full_stdout_is_one_line_and_exit_1() -> None:
    with open("/dev/full", "w") as full:
        proc = _anekit("lint", "--rules", stdout=full)
        err = proc.communicate(timeout=SECONDS)[1]
    assert proc.returncode == 1, err
    assert err == "anekit: cannot write to standard output: no space left on the device\n"


def test_a_closed_stdout_is_one_line_and_exit_141() -> None:
    proc = _anekit("lint", "--rules", stdout=subprocess.PIPE)
    proc.stdout.close()  # type: ignore[union-attr]
    err = proc.communicate(timeout=SECONDS)[1]
    assert proc.returncode == 141, err
    assert err == "anekit: standard output was closed\n"


def test_ctrl_c_during_run_repeat_is_one_line_and_exit_130(ws: Path) -> None:
    import signal
    import time

    slow = ws / "slow.mil"  # 64K elements a run: a million runs take far longer than the wait below
    slow.write_text(PROGRAM.format(s=16384))
    # A process started in the background of a non-interactive shell inherits SIGINT ignored (so does a
    # test run launched that way): the child gets the default back, as a terminal's foreground job has.
    proc = _anekit(
        "run",
        str(slow),
        "--random",
        "1",
        "--repeat",
        "1000000",
        stdout=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(4)  # past the imports and the compile: inside the repeated runs
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=SECONDS)[1]
    assert proc.returncode == 130 and err == "anekit: interrupted\n", err


def test_ctrl_c_while_the_commands_load_is_one_line_and_exit_130(capsys, monkeypatch) -> None:
    real_import = builtins.__import__

    def interrupted(name: str, *args: object, **kw: object) -> object:
        if name == "anekit.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", interrupted)
    status = main(["demo"])
    monkeypatch.undo()
    assert status == 130 and capsys.readouterr().err == "anekit: interrupted\n"


def test_counts_of_one_are_singular():
    """ "1 programs", "trained 1 steps": a count of one takes the singular noun (anekit.words.plural)."""
    from anekit.words import plural

    assert [plural(n, "step") for n in (0, 1, 2)] == ["0 steps", "1 step", "2 steps"]
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"


def test_export_float16_of_weights_past_its_range_is_refused(tmp_path, capsys):
    """--dtype float16 once wrote an all-inf model: a tensor with |values| >= 65520 (they round to inf in
    binary16) is refused by name before anything is written; 65504 itself fits."""
    from anekit.kernels.config import ModelConfig
    from anekit.llama.llama2c import write_llama2c
    from anekit.llama.params import Params

    cfg = ModelConfig(dim=16, hidden_dim=40, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=24, seq_len=8)
    params = Params.init(cfg, seed=0)
    params.layers[1].w2[0, 0] = 65504.0
    write_llama2c(tmp_path / "fits.bin", params)
    assert main(["export", str(tmp_path / "fits.bin"), "--to", "safetensors", "--dtype", "float16",
                 str(tmp_path / "ok")]) == 0  # fmt: skip
    params.layers[1].w2[0, 0] = -70000.0
    write_llama2c(tmp_path / "big.bin", params)
    capsys.readouterr()
    out = tmp_path / "out"
    args = ["export", str(tmp_path / "big.bin"), "--to", "safetensors", str(out)]
    assert main([*args, "--dtype", "float16"]) == 1
    _, err = capsys.readouterr()
    assert err == (
        "anekit: [export] --dtype float16: tensor model.layers.1.mlp.down_proj.weight holds values up to "
        "|x| = 70000, past float16's largest finite 65504: they would be written as inf (use --dtype float32)\n"
    )
    assert not out.exists() and not any(p.name.startswith(".") for p in tmp_path.iterdir())
    assert main([*args, "--dtype", "bfloat16"]) == 0  # bfloat16 has float32's range


def test_export_mlpackage_of_weights_past_fp16_is_refused(tmp_path, capsys):
    """The package stores every unquantized weight fp16: one past binary16's range is refused by name."""
    from anekit.kernels.config import ModelConfig
    from anekit.llama.llama2c import write_llama2c
    from anekit.llama.params import Params

    cfg = ModelConfig(dim=64, hidden_dim=128, n_layers=1, n_heads=4, n_kv_heads=4, vocab_size=64, seq_len=32)
    params = Params.init(cfg, seed=0)
    params.layers[0].wq[3, 1] = 65520.0  # the smallest magnitude binary16 rounds to inf (65504 + 16)
    write_llama2c(tmp_path / "big.bin", params)
    capsys.readouterr()
    out = tmp_path / "m.mlpackage"
    assert main(["export", str(tmp_path / "big.bin"), "--to", "mlpackage", str(out)]) == 1
    _, err = capsys.readouterr()
    assert (
        err.startswith(
            "anekit: [export] the package's fp16 weights: tensor model.layers.0.self_attn.q_proj.weight holds "
            "values up to |x| = 65520, past float16's largest finite 65504"
        )
        and err.count("\n") == 1
    )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["big.bin"]
