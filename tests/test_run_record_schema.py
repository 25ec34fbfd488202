"""The run record's schema (``checkpoint.RUN_SCHEMA``) and the depth limit of every JSON read of llama/ and
coreml/: a damaged record, even one with a valid CRC, is one FormatError naming the field, never a KeyError,
a TypeError, a ZeroDivisionError or a RecursionError; ``anekit train --resume`` says it in one line."""

from __future__ import annotations

import copy
import json
import zlib

import pytest

from anekit.cli.main import main
from anekit.errors import AnekitError, FormatError
from anekit.kernels import ModelConfig
from anekit.llama.checkpoint import (
    RUN_FOOTER,
    RUN_FORMAT,
    CheckpointMeta,
    build_checkpoint,
    check_run_record,
    read_checkpoint,
)
from anekit.llama.params import Params

CFG = ModelConfig(16, 24, 1, 2, 1, 32, 8, name="tiny")


def record() -> dict:
    """A complete record as ``anekit train`` writes it."""
    return {
        "format": RUN_FORMAT,
        "version": 1,
        "config": {"dim": 16, "hidden_dim": 24, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "vocab_size": 32,
                   "seq_len": 8, "rope": True, "norm_eps": 1e-5, "rope_theta": 10000.0, "name": "tiny"},
        "train": {"steps": 5, "accum": 1, "lr": 0.003, "min_lr": 0.0003, "warmup": 10, "weight_decay": 0.1,
                  "beta1": 0.9, "beta2": 0.95, "grad_clip": 1.0, "loss_scale": 1024.0, "seed": 0,
                  "weights": "dynamic"},
        "data": {"path": "/data/stories.txt", "sha256": "ab" * 32},
        "tokenizer": {"path": None, "sha256": "cd" * 32, "file": "tokenizer.model"},
        "init": None,
        "marks": [[2, "budget"]],
        "state": {"step": 0, "adam_t": 0, "loss_scale": 1024.0, "losses": [], "seconds": {"compile": 0.5}},
    }  # fmt: skip


def with_raw_record(raw: bytes) -> bytes:
    """A checkpoint whose run record is ``raw`` with a valid footer (CRC included)."""
    p = Params.init(CFG, seed=0)
    body = build_checkpoint(p, p.zeros_like(), p.zeros_like(), CheckpointMeta())
    footer = RUN_FOOTER.build(magic=b"ANEKRUN\0", version=1, crc32=zlib.crc32(raw), size=len(raw))
    return body + raw + footer


def broken(path: str, value: object) -> dict:
    """record() with the field at ``path`` (dotted) set to ``value``, or removed when value is ...."""
    rec = copy.deepcopy(record())
    *parents, last = path.split(".")
    node = rec
    for k in parents:
        node = node[k]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return rec


def test_a_complete_record_passes_and_round_trips():
    rec = record()
    assert check_run_record(rec) is rec
    ck = read_checkpoint(with_raw_record(json.dumps(rec).encode()))
    assert ck.run == rec


CASES = [
    ("state", ..., "run record state: must be present"),
    ("state.losses", "1.0,2.0", "run record state.losses: must be a list"),
    ("state.loss_scale", None, "run record state.loss_scale: must be a finite number"),
    ("state.loss_scale", 0, "run record state.loss_scale: must be a finite number in (0, inf]"),
    ("state.step", -1, "run record state.step: must be an integer in 0 .."),
    ("state.step", True, "run record state.step: must be an integer"),
    ("state.seconds", {"compile": "x"}, "run record state.seconds.compile: must be a finite number"),
    ("train.accum", 0, "run record train.accum: must be an integer in 1 .. 65536"),
    ("train.steps", "5", "run record train.steps: must be an integer"),
    ("train.beta1", 1.0, "run record train.beta1: must be a finite number in [0, 1)"),
    ("train.weights", "frozen", "run record train.weights: must be one of 'baked', 'dynamic'"),
    ("train.seed", -1, "run record train.seed: must be an integer in 0 .. 4294967295"),
    ("config.n_heads", 0, "run record config.n_heads: must be an integer in 1 .."),
    ("data.sha256", "xyz", "run record data.sha256: must be 64 lowercase hex digits"),
    ("tokenizer.file", "../../etc/passwd", "run record tokenizer.file: must be one of"),
    ("tokenizer", ..., "run record tokenizer: must be present"),
    ("marks", [[1]], "run record marks[0]: must be a list of two items"),
    ("init", {"path": None}, "run record init.sha256: must be present"),
]


@pytest.mark.parametrize("path, value, message", CASES, ids=[f"{p}={v!r}" for p, v, _ in CASES])
def test_a_wrong_field_is_one_error_naming_its_path_even_with_a_valid_crc(path, value, message):
    data = with_raw_record(json.dumps(broken(path, value)).encode())
    with pytest.raises(FormatError) as e:
        read_checkpoint(data)
    assert message in str(e.value) and str(e.value).startswith("[blzt] "), str(e.value)


def test_a_record_nested_100000_deep_is_refused_before_json_recurses():
    raw = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(FormatError, match=r"run record.*nested 100000 deep"):
        read_checkpoint(with_raw_record(raw))
    deep_field = json.dumps(record())[:-1] + ',"x":' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(FormatError, match="nested"):
        read_checkpoint(with_raw_record(deep_field.encode()))


@pytest.mark.parametrize("path, value", [("state", ...), ("state.losses", "oops"), ("state.loss_scale", None),
                                         ("train.accum", 0)])  # fmt: skip
def test_resume_of_a_damaged_record_is_one_line(tmp_path, capsys, path, value):
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt.bin").write_bytes(with_raw_record(json.dumps(broken(path, value)).encode()))
    assert main(["train", "--out", str(out), "--resume", "--sample-steps", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("anekit: [blzt] run record ") and path in err, err


def test_manifest_and_shards_json_nested_deep_are_one_error(tmp_path):
    from anekit.coreml import shards
    from anekit.coreml.manifest import read_manifest

    deep = "[" * 100_000 + "]" * 100_000
    pkg = tmp_path / "m.mlpackage"
    pkg.mkdir()
    (pkg / "Manifest.json").write_text(deep)
    with pytest.raises(AnekitError, match="nested 100000 deep"):
        read_manifest(pkg)
    (tmp_path / "shards.json").write_text(deep)
    with pytest.raises(AnekitError, match="nested 100000 deep"):
        shards.read_manifest(tmp_path / "shards.json")
    (tmp_path / "shards.json").write_text("[1, 2]")
    with pytest.raises(AnekitError, match="must be a JSON object"):
        shards.read_manifest(tmp_path / "shards.json")
