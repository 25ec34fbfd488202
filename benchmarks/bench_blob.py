"""Benchmark: write N GB of fp32 weights as fp16 MILBlob, its peak memory, and opening an N GB blob file.

Run: PYTHONPATH=src python benchmarks/bench_blob.py [--gb 1.0] [--repeat 5] [--dir /tmp]

Targets (1 GB): >= 1 GB/s of fp32 input written as fp16, < 100 MB peak memory above the input array while
doing so, < 1 ms to open a 1 GB blob file. The write runs in a child process so its peak RSS
(``ru_maxrss``) covers the write alone; tracemalloc's peak of numpy allocations is reported too. Files go
to a temporary directory (``--dir``) that is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from anekit import blob

_CHUNK = 1 << 18  # input generated 1 MB at a time, so the RSS high-water mark before the write is the input


def peak_rss_bytes() -> int:
    """This process's peak resident set size (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def make_input(n: int, seed: int = 0) -> np.ndarray:
    """n float32 weights ~ N(0, 0.02), generated in place chunk by chunk (no full-size temporaries)."""
    rng = np.random.default_rng(seed)
    a = np.empty(n, dtype=np.float32)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        a[start:stop] = rng.standard_normal(stop - start, dtype=np.float32)
        a[start:stop] *= np.float32(0.02)
    return a


class NullSink:
    """A seekable binary stream that keeps nothing: times the encoding without the disk."""

    def __init__(self) -> None:
        self.pos = 0
        self.end = 0

    def write(self, b: Any) -> int:
        n = memoryview(b).nbytes
        self.pos += n
        self.end = max(self.end, self.pos)
        return n

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos
        return pos

    def truncate(self, size: int) -> int:
        self.end = size
        return size


def child_write(gb: float, repeat: int, workdir: Path) -> dict[str, Any]:
    """Run in a fresh process: time the fp16 writes and measure the memory they need above the input."""
    a = make_input(int(gb * 2**30) // 4)
    baseline = peak_rss_bytes()
    path = workdir / "fp16.bin"
    write_times = []
    for _ in range(repeat):
        start = time.perf_counter()
        with blob.BlobWriter(path) as w:
            w.append(a, "fp16")
        write_times.append(time.perf_counter() - start)
        path.unlink()
    rss_delta = peak_rss_bytes() - baseline
    encode_times = []
    for _ in range(repeat):
        start = time.perf_counter()
        s = blob._BlobStream(NullSink())
        s.append(a, "fp16")
        s._finish()
        encode_times.append(time.perf_counter() - start)
    tracemalloc.start()
    with blob.BlobWriter(path) as w:
        w.append(a, "fp16")
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    path.unlink()
    return {
        "input_bytes": a.nbytes,
        "write_s": write_times,
        "encode_s": encode_times,
        "rss_delta": rss_delta,
        "traced_peak": traced_peak,
    }


def bench_open(gb: float, repeat: int, workdir: Path) -> dict[str, float]:
    """Write an N GB file (fp32 blob) and time opening it, and opening + a zero-copy read of the blob."""
    path = workdir / "fp32.bin"
    a = make_input(int(gb * 2**30) // 4, seed=1)
    start = time.perf_counter()
    with blob.BlobWriter(path) as w:
        off = w.append(a, "fp32")
    passthrough = a.nbytes / (time.perf_counter() - start)
    del a
    opens, reads = [], []
    for _ in range(max(repeat, 20)):
        start = time.perf_counter()
        f = blob.BlobFile(path)
        opens.append(time.perf_counter() - start)
        view = f.read(off)
        reads.append(time.perf_counter() - start)
        del view
        f.close()
    return {
        "file_bytes": path.stat().st_size,
        "open_s": statistics.median(opens),
        "open_read_s": statistics.median(reads),
        "fp32_write_bps": passthrough,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gb", type=float, default=1.0, help="GB (2**30 bytes) of fp32 input (default 1.0)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (median reported)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where to write")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child is not None:
        print(json.dumps(child_write(args.gb, args.repeat, args.child)))
        return

    need = int(args.gb * 2**30 * 1.6) + (64 << 20)  # the fp16 file, then the fp32 file (+ slack)
    free = shutil.disk_usage(args.dir).free
    if free < need:
        sys.exit(f"bench_blob: {args.dir} has {free / 2**30:.1f} GB free, needs {need / 2**30:.1f} GB")

    workdir = Path(tempfile.mkdtemp(prefix="anekit-bench-blob-", dir=args.dir))
    try:
        cmd = [
            sys.executable,
            __file__,
            "--gb",
            str(args.gb),
            "--repeat",
            str(args.repeat),
            "--child",
            str(workdir),
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        w = json.loads(out.strip().splitlines()[-1])
        o = bench_open(args.gb, args.repeat, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    gbytes = w["input_bytes"] / 1e9
    write = statistics.median(w["write_s"])
    encode = statistics.median(w["encode_s"])
    mb = 2**20
    size = w["input_bytes"] / 2**30
    print(f"input: {size:.2f} GiB fp32 -> fp16 MILBlob in {args.dir} (median of {args.repeat})")
    runs = ", ".join(f"{gbytes / t:.2f}" for t in w["write_s"])
    print(f"  write fp16 blob file   {gbytes / write:6.2f} GB/s of input  (target >= 1)   runs: {runs}")
    print(f"  encode only (no disk)  {gbytes / encode:6.2f} GB/s of input")
    print(f"  peak RSS above input   {w['rss_delta'] / mb:6.1f} MB  (target < 100)")
    print(f"  tracemalloc peak       {w['traced_peak'] / mb:6.1f} MB")
    print(f"  write fp32 blob file   {o['fp32_write_bps'] / 1e9:6.2f} GB/s (passthrough, one run)")
    print(f"open: {o['file_bytes'] / 2**30:.2f} GiB blob file")
    print(f"  BlobFile(path)         {o['open_s'] * 1e3:8.3f} ms  (target < 1)")
    print(f"  open + zero-copy read  {o['open_read_s'] * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
