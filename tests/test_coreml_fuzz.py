"""Fuzzing the package reader: mutated specs, Manifests and weight files load or raise FormatError, quickly,
in bounded memory, never anything else."""

from __future__ import annotations

import json
import shutil
import time
import tracemalloc
import warnings

import numpy as np
import pytest

from anekit.blob import BlobWarning
from anekit.coreml import load_mlpackage, save_mlpackage
from anekit.errors import FormatError
from anekit.mil import Builder, StateType, tensor
from tests.coreml_oracle import coremltools
from tests.fuzz_util import watchdog

coremltools()

MODEL = "Data/com.apple.CoreML/model.mlmodel"
WEIGHTS = "Data/com.apple.CoreML/weights/weight.bin"


def seed_package(path):
    rng = np.random.default_rng(0)
    b = Builder()
    f = b.function("main")
    cache = f.input("cache", StateType(tensor("fp16", [1, 16, 1, 4])))
    x = f.input("x", tensor("fp16", [1, 16, 1, 4]))
    w = f.const(rng.standard_normal((16, 16, 1, 1)).astype(np.float16), name="w")  # 512 B: weight file
    y = f.conv(x=x, weight=w, bias=rng.standard_normal(16).astype(np.float16), name="y")
    s = f.coreml_update_state(state=cache, value=f.add(x=f.read_state(input=cache), y=y))
    f.const(rng.integers(-8, 8, 33), name="q", dtype="int4")
    f.output(f.softmax(x=s, axis=1, name="out"))
    g = b.function("decode")
    xi = g.input("x", tensor("fp32", [1, 8]))
    g.output(g.reduce_sum(x=xi, axes=[1], keep_dims=True, name="s"))
    return save_mlpackage(b.build(), path, blob_threshold=256)


def mutate(raw: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(raw)
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 4))
        if kind == 0 and b:  # bit flips
            for _ in range(int(rng.integers(1, 9))):
                pos = int(rng.integers(0, len(b)))
                b[pos] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:  # truncation
            del b[int(rng.integers(0, len(b) + 1)) :]
        elif kind == 2 and b:  # a random byte run
            pos = int(rng.integers(0, len(b)))
            n = int(rng.integers(1, 9))
            b[pos : pos + n] = rng.bytes(n)
        elif b:  # a varint-sized boundary value over some byte
            pos = int(rng.integers(0, len(b)))
            b[pos] = int(rng.choice([0x00, 0x7F, 0x80, 0xFF, 0x08, 0x12]))
    return bytes(b)


def load_or_format_error(path) -> str:
    try:
        load_mlpackage(path)
        return "ok"
    except FormatError as e:
        assert str(e).startswith("[mlpackage] "), e
        return "error"


@pytest.mark.parametrize("target", [MODEL, WEIGHTS, "Manifest.json"])
def test_mutated_packages_load_or_raise_format_error(tmp_path, target):
    pkg = seed_package(tmp_path / "seed.mlpackage")
    assert load_or_format_error(pkg) == "ok"
    work = tmp_path / "m.mlpackage"
    shutil.copytree(pkg, work)
    raw = (pkg / target).read_bytes()
    rng = np.random.default_rng(hash(target) % 2**32)
    outcomes = {"ok": 0, "error": 0}
    slowest = peak = 0.0
    cases = 400
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BlobWarning)
        for case in range(cases):
            data = mutate(raw, rng)
            (work / target).write_bytes(data)
            traced = case < 40
            if traced:
                tracemalloc.start()
            start = time.perf_counter()
            try:
                with watchdog(5):
                    outcomes[load_or_format_error(work)] += 1
            except Exception as e:  # pragma: no cover - the failure being tested for
                pytest.fail(f"{target} case {case}: {type(e).__name__}: {e}")
            finally:
                if traced:
                    peak = max(peak, tracemalloc.get_traced_memory()[1])
                    tracemalloc.stop()
            slowest = max(slowest, time.perf_counter() - start)
    assert outcomes["error"] > cases // 10, outcomes
    assert slowest < 1.0
    assert peak < 32 * 2**20  # no allocation driven by a mutated size field


def test_every_truncation_of_the_model_spec_is_refused(tmp_path):
    pkg = seed_package(tmp_path / "seed.mlpackage")
    raw = (pkg / MODEL).read_bytes()
    for n in range(0, len(raw), max(1, len(raw) // 300)):
        (pkg / MODEL).write_bytes(raw[:n])
        assert load_or_format_error(pkg) == "error", n


def test_random_manifests(tmp_path):
    pkg = seed_package(tmp_path / "seed.mlpackage")
    rng = np.random.default_rng(7)
    docs = [[], 3, None, {"itemInfoEntries": []}, {"itemInfoEntries": {"a": 1}, "rootModelIdentifier": "a"},
            {"itemInfoEntries": {"a": {"path": 5}}, "rootModelIdentifier": "a"},
            {"itemInfoEntries": {"a": {"path": ""}}, "rootModelIdentifier": "a"},
            {"itemInfoEntries": {"a": {"path": "x" * 5000}}, "rootModelIdentifier": "a"}]  # fmt: skip
    for doc in docs:
        (pkg / "Manifest.json").write_text(json.dumps(doc))
        assert load_or_format_error(pkg) == "error"
    for _ in range(50):
        (pkg / "Manifest.json").write_bytes(rng.bytes(int(rng.integers(0, 200))))
        assert load_or_format_error(pkg) == "error"
