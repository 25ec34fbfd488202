"""Export of a stories110M-shaped model (random fp16 weights): time against anekit.blob alone, peak memory.

Targets (issue 11): the export within 1.5x of writing the same weights with ``anekit.blob`` alone, and
peak memory above the loaded model under 100 MB (the weights are streamed). Memory is the peak of
Python and numpy allocations (``tracemalloc``, which numpy reports to) during the phase, after the
model is loaded: what the export holds besides the model. Time is measured in runs without tracemalloc
(which slows allocation-heavy code), as the median of three, after the one-time import of coremltools'
protobuf classes (reported on its own). Each phase runs in its own process.

    PYTHONPATH=src python benchmarks/bench_export.py            # both phases, each in a subprocess
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from anekit.kernels.config import PRESETS
from anekit.llama.params import Params


def model() -> Params:
    return Params.init(PRESETS["stories110M"], seed=0)


def _run(name: str, params: Params, out: Path) -> None:
    if name == "blob":
        from anekit.blob import BlobWriter

        with BlobWriter(out / "weight.bin") as w:
            for _, a in params.tensors():
                w.append(a, "fp16")
    else:
        from anekit.coreml.model_export import export_mlpackage

        export_mlpackage(params, out / "m.mlpackage")


def phase(name: str) -> None:
    params = model()
    if name == "export":
        from anekit.coreml._proto import proto

        t0 = time.perf_counter()
        proto()
        print(f"import of coremltools' protobuf classes (once per process): {time.perf_counter() - t0:.2f} s")
    times = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            _run(name, params, Path(tmp))
            times.append(time.perf_counter() - t0)
            size = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
    tracemalloc.start()
    with tempfile.TemporaryDirectory() as tmp:
        _run(name, params, Path(tmp))
        _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"{name}: {statistics.median(times):.2f} s (median of {', '.join(f'{t:.2f}' for t in times)}), "
        f"{size / 1e6:.0f} MB written, peak allocations {peak / 1e6:.1f} MB"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["blob", "export"])
    args = ap.parse_args()
    if args.phase:
        phase(args.phase)
        return
    for name in ("blob", "export"):
        subprocess.run([sys.executable, __file__, "--phase", name], check=True)


if __name__ == "__main__":
    main()
