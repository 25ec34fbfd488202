"""A Llama-2-7B-shaped llama2.c file (26.95 GB, sparse) inspected and sampled for one token with private
memory limited to 4 GiB: wall time, peak RSS and peak private memory of each command.

The file is what llama2.c's export.py writes for Llama 2 7B (dim 4096, hidden 11008, 32 layers of 32
heads, 32000 tokens, an unshared classifier, 2048 positions of RoPE tables), with zeros for weights: a
hole, so it takes no disk space and reads at page-cache speed, not disk speed. A 32000-piece tokenizer.bin
is written beside it. Each command runs as ``prlimit --data=4294967296 python -m anekit.cli.main ...``
(4 GiB: prlimit takes a number of bytes). The limit is on private (anonymous) memory, which is what
reading a model whole would need; the weights are read through a read-only map of the file, whose pages
belong to the page cache.

Each command starts with none of the file in the page cache. Figures per command: wall time; peak RSS
(``wait4``'s ru_maxrss of that process), which counts the file's pages while they are mapped in and so
grows toward the file's size (or RAM) as the weights are read; and peak private memory (RssAnon of
/proc/PID/status, polled every 10 ms), which is what the limit bounds.

    PYTHONPATH=src python benchmarks/bench_big_model.py [--limit 4G] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from anekit.llama.llama2c import Tokenizer, write_tokenizer_bin

LLAMA2_7B = (4096, 11008, 32, 32, 32, -32000, 2048)  # the header llama2.c's legacy export writes
SRC = Path(__file__).resolve().parents[1] / "src"


def sparse_model(path: Path, dims: tuple[int, ...]) -> int:
    """A legacy llama2.c file with this header and zeros for weights, as one hole; its size in bytes."""
    dim, hidden, layers, heads, kv_heads, vocab, seq = dims
    head_dim = dim // heads
    kv = kv_heads * head_dim
    per_layer = 2 * dim + 2 * dim * dim + 2 * kv * dim + 3 * hidden * dim
    floats = abs(vocab) * dim * (2 if vocab < 0 else 1) + layers * per_layer + dim + seq * head_dim
    size = 28 + 4 * floats
    with path.open("wb") as f:
        f.write(struct.pack("<7i", *dims))
        f.truncate(size)
    return size


def drop_cached(path: Path) -> None:
    """Drop the file's pages from the page cache, so each command starts cold (clean pages: nothing lost)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _rss_anon_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def byte_count(text: str) -> int:
    """ "4G" -> 4 GiB in bytes: prlimit takes plain numbers (it reads "4G" as something else entirely)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    scale = units.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def run(argv: list[str], limit: int, cwd: Path) -> tuple[int, float, int, int, str]:
    """(exit status, seconds, peak RSS KiB, peak RssAnon KiB, last stderr line) of one limited command."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cmd = ["prlimit", f"--data={limit}", sys.executable, "-m", "anekit.cli.main", *argv]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    peak_anon = 0
    done = threading.Event()

    def poll() -> None:  # prlimit execs the command: the pid is python's
        nonlocal peak_anon
        while not done.is_set():
            peak_anon = max(peak_anon, _rss_anon_kb(proc.pid))
            done.wait(0.01)

    watcher = threading.Thread(target=poll)
    watcher.start()
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    done.set()
    watcher.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return proc.returncode, seconds, usage.ru_maxrss, peak_anon, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", default="4G", help="prlimit --data value (default: %(default)s)")
    ap.add_argument("--dir", type=Path, help="where to put the sparse file (default: a temporary directory)")
    args = ap.parse_args()
    if not sys.platform.startswith("linux") or shutil.which("prlimit") is None:
        sys.exit("needs Linux and prlimit (util-linux)")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        model = folder / "llama2-7b.bin"
        size = sparse_model(model, LLAMA2_7B)
        pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b" t%d" % i for i in range(3, 32000)]
        write_tokenizer_bin(folder / "tokenizer.bin", Tokenizer(pieces, [0.0] * len(pieces)))
        on_disk = os.stat(model).st_blocks * 512
        print(
            f"model: {size / 1e9:.2f} GB ({size / 2**30:.1f} GiB), Llama-2-7B header {LLAMA2_7B}, "
            f"{on_disk / 1e6:.1f} MB on disk; private memory limit --data={byte_count(args.limit)} "
            f"({args.limit})"
        )
        print(f"{'command':<28} {'status':>6} {'wall s':>8} {'peak RSS':>10} {'peak private':>13}")
        for name, argv in (
            ("inspect", ["inspect", str(model)]),
            ("sample --steps 1", ["sample", str(model), "--steps", "1", "--seed", "1"]),
        ):
            drop_cached(model)
            rc, seconds, rss, anon, last = run(argv, byte_count(args.limit), folder)
            print(f"{name:<28} {rc:>6} {seconds:>8.1f} {rss / 2**20:>8.2f} GiB {anon / 1024:>9.0f} MiB")
            if rc or name.startswith("sample"):
                print(f"    stderr: {last}")


if __name__ == "__main__":
    main()
