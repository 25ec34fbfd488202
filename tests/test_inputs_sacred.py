"""Inputs are sacred: no command writes over or into one of its inputs, whatever ``--force`` says (the
same path, a symlink, a hard link, OUT inside an input directory, an input inside OUT); a device or FIFO is
never replaced by a regular file; a name too long for the output's temporary is one line before the work.

Every refusal is checked against the bytes of the inputs (sha256 before and after) and the kind of the
node (``os.stat``) after, not against the code's own message builder."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

PROGRAM = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 4, 1, 32]> x) {
        tensor<fp16, [1, 4, 1, 32]> y = mul(x = x, y = x);
    } -> (y);
}
"""


def _digest(root: Path) -> dict[str, str]:
    """sha256 of every regular file under ``root`` (or of ``root`` itself), by relative path."""
    if root.is_file():
        return {".": hashlib.sha256(root.read_bytes()).hexdigest()}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer Hugging Face model (single file and 2 shards), its LoRA adapters, a llama2.c model."""
    from anekit.hf.adapters import Adapters, LoraSpec, write_adapters
    from anekit.hf.model import load_model

    ws = tmp_path_factory.mktemp("sacred")
    for name, shards in (("hf", 1), ("hf2", 2)):
        make_tokenizer(ws / name, 512, "llama3")
        make_checkpoint(ws / name, small("tiny_llama2c", num_hidden_layers=1), seed=1, shards=shards)
    model = load_model(ws / "hf")
    rng = np.random.default_rng(0)
    adapters = Adapters.init(LoraSpec(2, 4.0, ("q",)), model.cfg, rng)
    for key in adapters.b:  # B nonzero: a fuse would change the weights
        adapters.b[key] = rng.standard_normal(adapters.b[key].shape).astype(np.float32) * 0.01
    write_adapters(ws / "ad", adapters, model.cfg, "tiny")
    assert main(["export", str(ws / "hf"), "--to", "llama2c", str(ws / "m.bin")]) == 0
    (ws / "p.mil").write_text(PROGRAM)
    np.save(ws / "x.npy", np.ones((1, 4, 1, 32), np.float32))
    return ws


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *inputs: Path, says: str = "") -> str:
    """Run ``argv``: exit 1, one line on stderr naming ``says``, every input's bytes unchanged."""
    before = [_digest(p) for p in inputs]
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("anekit: ") and "Traceback" not in err, err
    assert says in err, err
    assert [_digest(p) for p in inputs] == before
    return err


def _forms(ws: Path, tmp_path: Path, target: Path) -> dict[str, Path]:
    """The ways an OUT can be ``target`` (a file or directory of ``ws``): itself, a symlink, a hard link."""
    forms = {"same": target, "symlink": tmp_path / "link"}
    forms["symlink"].symlink_to(target)
    if target.is_file():
        forms["hardlink"] = tmp_path / "hard"
        os.link(target, forms["hardlink"])
    return forms


@pytest.mark.parametrize("model", ["hf", "hf2"])
@pytest.mark.parametrize("form", ["same", "symlink", "inside", "around"])
def test_fuse_never_writes_its_model_or_adapters(ws, tmp_path, capsys, model, form):
    base, adapters = ws / model, ws / "ad"
    out = {"same": base, "symlink": _forms(ws, tmp_path, base)["symlink"], "inside": base / "fused",
           "around": ws}[form]  # fmt: skip
    argv = ["fuse", str(base), str(adapters), str(out), "--force"]
    err = _refused(argv, capsys, base, adapters, says="[fuse] OUT")
    assert "MODEL" in err and "choose another output" in err
    assert not (base / "fused").exists()
    # the adapters are an input too
    _refused(["fuse", str(base), str(adapters), str(adapters), "--force"], capsys, base, adapters,
             says="is the input ADAPTERS")  # fmt: skip


def test_fuse_refuses_an_out_holding_a_hard_link_of_the_models_weights(ws, tmp_path, capsys):
    out = tmp_path / "fused"
    out.mkdir()
    os.link(ws / "hf" / "model.safetensors", out / "model.safetensors")
    _refused(["fuse", str(ws / "hf"), str(ws / "ad"), str(out), "--force"], capsys, ws / "hf",
             says="a hard link of a file of the input MODEL")  # fmt: skip


@pytest.mark.parametrize("form", ["same", "symlink", "inside", "around"])
def test_export_safetensors_never_rewrites_its_source(ws, tmp_path, capsys, form):
    src = ws / "hf2"
    out = {"same": src, "symlink": _forms(ws, tmp_path, src)["symlink"], "inside": src / "x", "around": ws}[
        form
    ]
    argv = ["export", str(src), "--to", "safetensors", str(out), "--force", "--dtype", "float16"]
    _refused(argv, capsys, src, says="the input MODEL")


@pytest.mark.parametrize("form", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("to", ["llama2c", "mlpackage"])
def test_export_of_a_model_file_never_writes_over_it(ws, tmp_path, capsys, form, to):
    out = _forms(ws, tmp_path, ws / "m.bin")[form]
    _refused(["export", str(ws / "m.bin"), "--to", to, str(out), "--force"], capsys, ws / "m.bin",
             says="is the input MODEL")  # fmt: skip


def test_export_never_writes_over_its_tokenizer(ws, tmp_path, capsys):
    tok = ws / "hf" / "tokenizer.json"
    argv = ["export", str(ws / "m.bin"), "--to", "llama2c", str(tmp_path / "t"), "--tokenizer", str(tok)]
    os.symlink(tok, tmp_path / "t")
    _refused([*argv, "--force"], capsys, tok, ws / "m.bin", says="is the input --tokenizer")


@pytest.mark.parametrize("form", ["same", "symlink", "around"])
def test_train_never_writes_into_its_init_model(ws, tmp_path, capsys, form):
    init = ws / "hf"
    out = {"same": init, "symlink": _forms(ws, tmp_path, init)["symlink"], "around": ws}[form]
    argv = ["train", "--init", str(init), "--out", str(out), "--steps", "1", "--force"]
    _refused(argv, capsys, init, says="[train] --out")
    assert not (init / "state.safetensors").exists() and not (init / ".anekit.lock").exists()


def test_train_never_writes_around_its_data_or_tokenizer(ws, tmp_path, capsys):
    data = tmp_path / "run" / "data.txt"
    data.parent.mkdir()
    data.write_text("Once upon a time there was a cat. " * 200)
    _refused(["train", "--data", str(data), "--out", str(data.parent), "--steps", "1"], capsys, data,
             says="holds the input --data")  # fmt: skip
    assert sorted(p.name for p in data.parent.iterdir()) == ["data.txt"]


def test_kernels_dump_never_writes_into_its_model(ws, capsys):
    for out in (ws / "hf", ws / "hf" / "k"):
        _refused(["kernels", "dump", "--config", str(ws / "hf"), str(out), "--force"], capsys, ws / "hf",
                 says="the input --config")  # fmt: skip


@pytest.mark.parametrize("flag", ["--output", "--state-out"])
def test_run_never_writes_over_its_program_or_inputs(ws, tmp_path, capsys, flag):
    prog, x = ws / "p.mil", ws / "x.npy"
    base = ["run", str(prog), "--input", f"x={x}", "--no-strict"]
    _refused([*base, flag, str(prog)], capsys, prog, x, says="is the input PROGRAM")
    link = tmp_path / "x.npz"
    os.link(x, link)
    _refused([*base, flag, str(link)], capsys, prog, x, says="is the input --input x=")


def test_run_output_never_writes_over_state_in(ws, tmp_path, capsys):
    """``--state-in S --state-out S`` advances a state file, as the README shows (read when the session
    opens, written atomically after the call: test_cli_run_package runs it); ``--output`` over it, or over
    a link of it, would lose the states."""
    state = tmp_path / "state.npz"
    np.savez(state, s=np.zeros((1, 4, 1, 32), np.float16))
    base = ["run", str(ws / "p.mil"), "--input", f"x={ws / 'x.npy'}", "--no-strict", "--state-in", str(state)]
    _refused([*base, "--output", str(state)], capsys, state, says="is the input --state-in")
    os.symlink(state, tmp_path / "link.npz")
    _refused([*base, "--output", str(tmp_path / "link.npz")], capsys, state, says="is the input --state-in")


# ---------------------------------------------------------------------------------------------------------
# devices and FIFOs: written into or refused, never replaced


def _char_device(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device node like /dev/null (minor 3) or /dev/full (7), made in tmp_path (root only), so
    that a regression replaces a copy, never the system's node."""
    node = tmp_path / name
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        with open(node, "wb"):
            pass
    except (PermissionError, OSError):
        pytest.skip("making (or opening) a device node needs root and a file system that allows devices")
    return node


def _is_char(path: Path) -> bool:
    return stat.S_ISCHR(os.lstat(path).st_mode)


def test_doctor_json_writes_into_a_null_device_and_leaves_it_a_device(tmp_path, capsys):
    null = _char_device(tmp_path, "null", 3)
    assert main(["doctor", "--json", str(null)]) in (0, 1)  # 1: no engine here; the report is written
    assert _is_char(null) and sorted(p.name for p in tmp_path.iterdir()) == ["null"]
    assert main(["doctor", "--json", "/dev/null"]) in (0, 1)
    assert _is_char(Path("/dev/null"))


def test_doctor_json_into_a_full_device_is_one_line_and_leaves_it_a_device(tmp_path, capsys):
    full = _char_device(tmp_path, "full", 7)
    capsys.readouterr()
    assert main(["doctor", "--json", str(full)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no space left on the device" in err, err
    assert _is_char(full) and sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_doctor_json_writes_into_a_fifo_with_a_reader_and_refuses_one_without(tmp_path, capsys):
    import json

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    capsys.readouterr()
    assert main(["doctor", "--json", str(fifo)]) == 1  # nobody reads: refused at once, not a hang
    assert "a FIFO that no process reads" in capsys.readouterr().err
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    time.sleep(0.3)  # the reader's open blocks until a writer comes
    assert main(["doctor", "--json", str(fifo)]) in (0, 1)
    reader.join(10)
    assert json.loads(got[0])["anekit"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("to", ["llama2c", "mlpackage", "safetensors"])
def test_export_force_onto_a_device_or_fifo_is_refused(ws, tmp_path, capsys, to):
    null = _char_device(tmp_path, "null", 3)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for node in (null, fifo):
        _refused(["export", str(ws / "m.bin"), "--to", to, str(node), "--force"], capsys, ws / "m.bin",
                 says="[export] OUT")  # fmt: skip
    assert _is_char(null) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "pipe"]


def test_the_writers_never_rename_over_a_device(tmp_path):
    """The shared depth: atomic_write and replace_path refuse a device or FIFO (NotReplaceable), whatever
    the command checked."""
    from anekit.fileio import NotReplaceable, atomic_write, replace_path

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(NotReplaceable, match="a FIFO"), atomic_write(fifo) as f:
        f.write(b"x")
    new = tmp_path / "new"
    new.mkdir()
    with pytest.raises(NotReplaceable, match="a FIFO"):
        replace_path(new, fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and new.is_dir()
    link = tmp_path / "link"
    target = tmp_path / "target"
    target.write_bytes(b"old")
    link.symlink_to(target)
    with atomic_write(link) as f:  # written through: the link stays, its target is replaced
        f.write(b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"


# ---------------------------------------------------------------------------------------------------------
# names too long


@pytest.mark.parametrize("size", [300, 240])
@pytest.mark.parametrize(
    "argv",
    [
        ["doctor", "--json", "{n}"],
        ["export", "{ws}/m.bin", "--to", "llama2c", "{n}"],
        ["export", "{ws}/m.bin", "--to", "mlpackage", "{n}"],
        ["export", "{ws}/hf", "--to", "safetensors", "{n}"],
        ["kernels", "dump", "--config", "stories260K", "{n}"],
        ["fuse", "{ws}/hf", "{ws}/ad", "{n}"],
        ["run", "{ws}/p.mil", "--input", "x={ws}/x.npy", "--no-strict", "--output", "{n}"],
    ],
    ids=["doctor", "llama2c", "mlpackage", "safetensors", "kernels", "fuse", "run"],
)
def test_a_name_too_long_is_one_line_before_the_work(ws, tmp_path, capsys, argv, size):
    """300 bytes: over the 255-byte name limit; 240: the name fits, its temporary (32 bytes more) does not."""
    name = str(tmp_path / ("n" * size))
    _refused([a.format(ws=ws, n=name) for a in argv], capsys, ws / "hf", says="file name too long")
    assert list(tmp_path.iterdir()) == []


def test_train_out_too_long_is_one_line(ws, tmp_path, capsys):
    _refused(
        ["train", "--steps", "1", "--out", str(tmp_path / ("t" * 300))], capsys, says="file name too long"
    )
    assert list(tmp_path.iterdir()) == []
