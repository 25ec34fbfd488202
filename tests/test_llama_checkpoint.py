"""BLZT checkpoints: the header's byte layout, the reference's tensor order, round trips, atomic saves."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from anekit.errors import AnekitError, FormatError
from anekit.kernels.config import ModelConfig
from anekit.llama import checkpoint
from anekit.llama.checkpoint import (
    HEADER_SIZE,
    RUN_FOOTER,
    CheckpointMeta,
    build_checkpoint,
    checkpoint_size,
    load_checkpoint,
    load_checkpoint_file,
    parse_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from anekit.llama.params import Params

PROJECT_ROOT = Path(__file__).resolve().parents[1]

MHA = ModelConfig(dim=16, hidden_dim=40, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=24, seq_len=8)
GQA = MHA.with_(n_kv_heads=2)
META = CheckpointMeta(
    step=7,
    total_steps=100,
    lr=0.25,  # float32-exact values, so they compare equal after the round trip
    loss=3.5,
    cum_compile=1234.5,
    cum_train=6789.25,
    cum_wall=10000.125,
    cum_steps=28,
    cum_batches=7,
    adam_t=7,
)


def _state(cfg: ModelConfig, tied: bool = True, seed: int = 0) -> tuple[Params, Params, Params]:
    params = Params.init(cfg, seed=seed, tied=tied)
    rng = np.random.default_rng(seed + 1)
    m, v = params.zeros_like(), params.zeros_like()
    for c in (m, v):
        for _, a in c.tensors():
            a[...] = rng.standard_normal(a.shape).astype(np.float32)
    return params, m, v


def _header_by_hand(
    cfg: ModelConfig, meta: CheckpointMeta, magic: int = 0x424C5A54, version: int = 2
) -> bytes:
    # CkptHdr { int magic, version, step, total_steps, n_layers, vocab_size, dim, hidden_dim, n_heads,
    # seq_len; float lr, loss; double cum_compile, cum_train, cum_wall; int cum_steps, cum_batches,
    # adam_t, pad[3]; }: ten ints end at 40, two floats at 48, which is 8-aligned: no padding.
    return struct.pack(
        "<10i2f3d6i",
        magic, version, meta.step, meta.total_steps,
        cfg.n_layers, cfg.vocab_size, cfg.dim, cfg.hidden_dim, cfg.n_heads, cfg.seq_len,
        meta.lr, meta.loss,
        meta.cum_compile, meta.cum_train, meta.cum_wall,
        meta.cum_steps, meta.cum_batches, meta.adam_t, 0, 0, 0,
    )  # fmt: skip


def _file_by_hand(p: Params, m: Params, v: Params, meta: CheckpointMeta) -> bytes:
    """The reference's save_checkpoint, written out: per layer Wq Wk Wv Wo W1 W2 W3 rms_att rms_ffn, then
    each one's Adam m and v; rms_final + m + v; embed + m + v; (anekit: wcls + m + v when untied)."""

    def f32(a: np.ndarray) -> bytes:
        return np.asarray(a, "<f4").tobytes()

    out = [_header_by_hand(p.cfg, meta)]
    for lp, lm, lv in zip(p.layers, m.layers, v.layers):
        out += [f32(lp.wq), f32(lp.wk), f32(lp.wv), f32(lp.wo), f32(lp.w1), f32(lp.w2), f32(lp.w3)]
        out += [f32(lp.rms_att), f32(lp.rms_ffn)]
        for key in ("wq", "wk", "wv", "wo", "w1", "w2", "w3", "rms_att", "rms_ffn"):
            out += [f32(getattr(lm, key)), f32(getattr(lv, key))]
    out += [f32(p.rms_final), f32(m.rms_final), f32(v.rms_final)]
    out += [f32(p.embed), f32(m.embed), f32(v.embed)]
    if p.wcls is not None:
        out += [f32(p.wcls), f32(m.wcls), f32(v.wcls)]
    return b"".join(out)


def _assert_same(a: Params, b: Params) -> None:
    names_a = [n for n, _ in a.tensors()]
    assert names_a == [n for n, _ in b.tensors()]
    for (name, x), (_, y) in zip(a.tensors(), b.tensors()):
        assert x.dtype == np.float32 and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)


# ---------------------------------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------------------------------


def test_header_is_the_96_byte_c_struct():
    assert HEADER_SIZE == 96 == struct.calcsize("<10i2f3d6i")
    offsets = {f.name: f.offset for f in checkpoint.HEADER.fields}
    assert offsets["lr"] == 40 and offsets["cum_compile"] == 48 and offsets["cum_wall"] == 64
    assert offsets["cum_steps"] == 72 and offsets["adam_t"] == 80 and offsets["pad2"] == 92


def test_file_bytes_follow_the_reference_order():
    p, m, v = _state(MHA)
    data = build_checkpoint(p, m, v, META)
    assert data[:HEADER_SIZE] == _header_by_hand(MHA, META)
    assert data == _file_by_hand(p, m, v, META)
    assert len(data) == checkpoint_size(MHA)


def test_header_magic_spells_blzt_backwards_on_disk():
    p, m, v = _state(MHA)
    assert build_checkpoint(p, m, v, META)[:4] == b"TZLB"


# ---------------------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    p, m, v = _state(MHA)
    path = tmp_path / "ckpt.bin"
    save_checkpoint(path, p, m, v, META)
    assert path.read_bytes() == _file_by_hand(p, m, v, META)
    p2, m2, v2, meta2 = load_checkpoint(path)
    assert meta2 == META
    assert p2.cfg == MHA and p2.cfg.name == "ckpt"
    for a, b in ((p, p2), (m, m2), (v, v2)):
        _assert_same(a, b)
    assert p2.wcls is None


def test_parse_of_hand_written_bytes_and_build_of_parse():
    p, m, v = _state(MHA, seed=3)
    data = _file_by_hand(p, m, v, META)
    p2, m2, v2, meta2 = parse_checkpoint(data)
    _assert_same(p, p2)
    _assert_same(m, m2)
    _assert_same(v, v2)
    assert meta2 == META
    assert build_checkpoint(p2, m2, v2, meta2) == data


def test_loaded_arrays_are_writable_for_training_in_place(tmp_path):
    p, m, v = _state(MHA)
    save_checkpoint(tmp_path / "c.bin", p, m, v, META)
    for source in (tmp_path / "c.bin", (tmp_path / "c.bin").read_bytes()):
        p2, m2, _, _ = load_checkpoint(source)
        p2.layers[1].wq += 1.0
        m2.embed[0, 0] = 5.0
        assert m2.embed[0, 0] == 5.0


def test_lr_and_loss_come_back_as_float32():
    p, m, v = _state(MHA)
    meta = CheckpointMeta(step=1, lr=3e-4, loss=2.1)
    _, _, _, back = parse_checkpoint(build_checkpoint(p, m, v, meta))
    assert back.lr == float(np.float32(3e-4)) and back.loss == float(np.float32(2.1))


def test_grouped_query_model_needs_its_config_or_its_run_record(tmp_path):
    """The header has no n_kv_heads: a plain file is read as n_kv_heads == n_heads (never guessed from
    the size, which a damaged hidden_dim can fake); the run record anekit train appends carries it."""
    p, m, v = _state(GQA)
    path = tmp_path / "gqa.bin"
    save_checkpoint(path, p, m, v, META)
    with pytest.raises(FormatError) as e:
        load_checkpoint(path)
    assert e.value.field == "file size" and "n_kv_heads=2" in str(e.value)
    assert e.value.actual == checkpoint_size(GQA)
    p2, _, v2, meta = load_checkpoint(path, GQA)
    _assert_same(p, p2)
    _assert_same(v, v2)
    assert p2.layers[0].wk.shape == (GQA.kv_dim, GQA.dim) and meta == META
    save_checkpoint(path, p, m, v, META, run=RUN)
    ck = load_checkpoint_file(path)
    assert ck.kv_source == "run record" and ck.params.cfg.n_kv_heads == 2
    _assert_same(p, ck.params)


RUN = {"config": {**{k: getattr(GQA, k) for k in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
                                                   "vocab_size", "seq_len")}, "name": "gqa"},
       "state": {"losses": [3.5, 0.1 + 0.2]}}  # fmt: skip


def test_the_run_record_round_trips_after_the_body():
    """parse(build(x)) == x and build(parse(b)) == b with a run record; the body is unchanged by it."""
    p, m, v = _state(GQA)
    plain = build_checkpoint(p, m, v, META)
    data = build_checkpoint(p, m, v, META, run=RUN)
    assert data.startswith(plain) and data[-RUN_FOOTER.size :][:8] == b"ANEKRUN\0"
    ck = read_checkpoint(data)
    assert ck.run == RUN and ck.kv_source == "run record" and ck.params.cfg.name == "gqa"
    assert ck.run["state"]["losses"][1] == 0.1 + 0.2  # floats come back exactly
    assert build_checkpoint(ck.params, ck.adam_m, ck.adam_v, ck.meta, run=ck.run) == data
    _assert_same(p, ck.params)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda b: b[:-30] + b[-29:], "run record crc32"),  # one JSON byte gone: size still says n
        (lambda b: b[:-12] + b"\0\0\0\0" + b[-8:], "run record crc32"),
        (lambda b: b[:-16] + b"\2\0\0\0" + b[-12:], "run record version"),
        (lambda b: b[:-8] + (10**9).to_bytes(8, "little"), "run record size"),
    ],
)
def test_a_damaged_run_record_is_named(mutate, field):
    p, m, v = _state(GQA)
    with pytest.raises(FormatError) as e:
        read_checkpoint(mutate(build_checkpoint(p, m, v, META, run=RUN)))
    assert e.value.field == field


def test_a_run_record_that_contradicts_the_header_is_refused():
    p, m, v = _state(GQA)
    bad = {"config": {**RUN["config"], "dim": 32}}
    with pytest.raises(FormatError, match=r"run record config\.dim"):
        read_checkpoint(build_checkpoint(p, m, v, META, run=bad))


def test_untied_classifier_round_trips_after_the_embedding(tmp_path):
    p, m, v = _state(MHA, tied=False)
    data = build_checkpoint(p, m, v, META)
    assert data == _file_by_hand(p, m, v, META)
    assert len(data) == checkpoint_size(MHA) + 3 * 4 * MHA.vocab_size * MHA.dim
    p2, m2, _, _ = parse_checkpoint(data)
    assert p2.wcls is not None and m2.wcls is not None
    _assert_same(p, p2)
    _assert_same(m, m2)


# ---------------------------------------------------------------------------------------------------
# bad files
# ---------------------------------------------------------------------------------------------------


def _good() -> bytes:
    p, m, v = _state(MHA)
    return build_checkpoint(p, m, v, META)


def _patch(data: bytes, offset: int, fmt: str, value: object) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


@pytest.mark.parametrize(
    "offset, fmt, value, field",
    [
        (0, "<I", 0x12345678, "magic"),
        (4, "<i", 3, "version"),
        (4, "<i", 4, "version"),
        (16, "<i", 0, "n_layers"),
        (24, "<i", -16, "dim"),
        (36, "<i", 0, "seq_len"),
    ],
)
def test_bad_header_fields_are_named(offset, fmt, value, field):
    with pytest.raises(FormatError) as e:
        parse_checkpoint(_patch(_good(), offset, fmt, value))
    assert e.value.field == field and e.value.offset == offset
    assert e.value.actual in (value, hex(value))  # type: ignore[arg-type]
    assert str(e.value).startswith("[blzt] " + field)


def test_llama2c_file_is_recognised_as_not_a_checkpoint():
    data = struct.pack("<Ii", 0x616B3432, 1) + bytes(200)
    with pytest.raises(FormatError, match=r"llama2\.c model file"):
        parse_checkpoint(data)


def test_shape_fields_that_do_not_fit_the_size():
    data = _good()
    with pytest.raises(FormatError) as e:
        parse_checkpoint(_patch(data, 28, "<i", 48))  # hidden_dim 40 -> 48: the body is too short
    assert e.value.field == "file size" and e.value.actual == len(data)
    with pytest.raises(FormatError, match="file size"):
        parse_checkpoint(data[:-4])
    with pytest.raises(FormatError, match="file size"):
        parse_checkpoint(data + b"\0" * 4)
    with pytest.raises(FormatError) as e:
        parse_checkpoint(data[:50])
    assert e.value.field == "header" and e.value.expected == 96


def test_config_that_disagrees_with_the_header():
    with pytest.raises(FormatError) as e:
        parse_checkpoint(_good(), MHA.with_(vocab_size=32))
    assert (e.value.field, e.value.offset, e.value.expected, e.value.actual) == ("vocab_size", 20, 32, 24)


def test_unreadable_path_is_an_anekit_error(tmp_path):
    with pytest.raises(AnekitError, match="cannot read"):
        load_checkpoint(tmp_path / "missing.bin")


def test_save_rejects_mismatched_state_and_out_of_range_meta(tmp_path):
    p, m, v = _state(MHA)
    with pytest.raises(AnekitError, match=r"layers\.0\.wq\.m"):
        m2 = m.copy()
        m2.layers[0].wq = np.zeros((3, 3), np.float32)
        save_checkpoint(tmp_path / "x.bin", p, m2, v, META)
    _, _, v_untied = _state(MHA, tied=False)
    with pytest.raises(AnekitError, match="wcls"):
        save_checkpoint(tmp_path / "x.bin", p, m, v_untied, META)
    with pytest.raises(FormatError) as e:
        save_checkpoint(tmp_path / "x.bin", p, m, v, CheckpointMeta(step=2**31))
    assert e.value.field == "step" and e.value.offset == 8
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------------
# atomic saves
# ---------------------------------------------------------------------------------------------------


def test_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.bin"
    p, m, v = _state(MHA)
    save_checkpoint(path, p, m, v, META)
    before = path.read_bytes()

    calls = {"n": 0}
    real = checkpoint._write_array

    def failing(f, a):  # the disk fills up after a few tensors
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        real(f, a)

    monkeypatch.setattr(checkpoint, "_write_array", failing)
    p2, m2, v2 = _state(MHA, seed=9)
    with pytest.raises(AnekitError, match="cannot write checkpoint"):
        save_checkpoint(path, p2, m2, v2, CheckpointMeta(step=8))
    assert path.read_bytes() == before
    assert [x.name for x in tmp_path.iterdir()] == ["ckpt.bin"]  # the temporary file is gone


def test_interrupted_save_leaves_no_new_file(tmp_path, monkeypatch):
    def interrupted(f, a):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "_write_array", interrupted)
    p, m, v = _state(MHA)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "new.bin", p, m, v, META)
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_process_killed_during_save_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "ckpt.bin"
    p, m, v = _state(MHA)
    save_checkpoint(path, p, m, v, META)
    before = path.read_bytes()
    child = textwrap.dedent(
        """
        import json, os, signal, sys
        from anekit.kernels.config import ModelConfig
        from anekit.llama import checkpoint
        from anekit.llama.params import Params

        path, dims = sys.argv[1], json.loads(sys.argv[2])
        p = Params.init(ModelConfig(**dims), seed=5)
        real, n = checkpoint._write_array, [0]
        def killed_midway(f, a):
            n[0] += 1
            if n[0] == 20:
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            real(f, a)
        checkpoint._write_array = killed_midway
        checkpoint.save_checkpoint(path, p, p.zeros_like(), p.zeros_like(), checkpoint.CheckpointMeta())
        """
    )
    keys = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
    dims = json.dumps({k: getattr(MHA, k) for k in keys})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PROJECT_ROOT / "src"), str(PROJECT_ROOT)]))
    proc = subprocess.run(
        [sys.executable, "-c", child, str(path), dims], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert path.read_bytes() == before
    leftovers = [x.name for x in tmp_path.iterdir() if x.name != "ckpt.bin"]
    assert all(n.startswith(".ckpt.bin.") and n.endswith(".tmp") for n in leftovers)
    assert len(leftovers) == 1  # the killed writer's partial temporary file; the checkpoint is untouched


def test_a_checkpoint_file_far_larger_than_its_header_is_refused_before_it_is_read(tmp_path):
    """A 3 GB sparse file behind a small model's header: the size is checked on a map of the file, so the
    refusal allocates nothing near the file's size (the audit saw it read whole)."""
    import tracemalloc

    p, m, v = _state(MHA)
    path = tmp_path / "big.bin"
    save_checkpoint(path, p, m, v, META)
    with open(path, "r+b") as f:
        f.truncate(3 << 30)  # a hole: no disk blocks
    for load in (load_checkpoint, load_checkpoint_file):
        tracemalloc.start()
        try:
            with pytest.raises(FormatError, match="size"):
                load(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20, peak


@pytest.mark.parametrize("record", [True, False])
def test_zero_tensors_are_holes_that_read_back_as_the_same_bytes(tmp_path: Path, record: bool) -> None:
    """A fresh run's moments are skipped with a seek (a hole in the file): the file's bytes are still those
    ``build_checkpoint`` makes, a -0.0 is written (bits, not values, decide), and a zero tensor at the very
    end (no run record after it) still gives the file its full size."""
    cfg = ModelConfig(64, 128, 2, 2, 2, 600, 32, name="holes")
    params = Params.init(cfg, seed=1, tied=False)
    m, v = params.zeros_like(), params.zeros_like()
    m.layers[1].w1[3, 5] = -0.0  # a sign bit in an otherwise zero tensor
    run = {"step": 0} if record else None
    path = tmp_path / "ckpt.bin"
    save_checkpoint(path, params, m, v, CheckpointMeta(), run=run)
    want = build_checkpoint(params, m, v, CheckpointMeta(), run=run)
    assert path.read_bytes() == want
    assert np.signbit(load_checkpoint_file(path).adam_m.layers[1].w1[3, 5])


def test_a_tensor_of_negative_zeros_above_the_hole_threshold_is_written_not_skipped(tmp_path: Path) -> None:
    """-0.0 == 0.0 as values, but its bits are 0x80000000: a writer that decided holes by value would seek
    over this tensor and it would read back as +0.0. IEEE 754's sign bit, counted in the raw file."""
    cfg = ModelConfig(64, 128, 2, 2, 2, 600, 32, name="negzero")
    params = Params.init(cfg, seed=1, tied=False)
    m, v = params.zeros_like(), params.zeros_like()
    m.embed[...] = -0.0
    assert m.embed.nbytes > checkpoint.HOLE_MIN_BYTES  # a hole candidate by its size
    path = tmp_path / "ckpt.bin"
    save_checkpoint(path, params, m, v, CheckpointMeta())
    body = np.frombuffer(path.read_bytes()[HEADER_SIZE:], dtype="<u4")  # no run record: all float32 words
    assert int((body == 0x80000000).sum()) >= m.embed.size
    assert np.signbit(load_checkpoint_file(path).adam_m.embed).all()
