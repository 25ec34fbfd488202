"""Export of a stories110M-shaped model (random fp16 weights): time against anekit.blob alone, peak memory.

Targets (issue 11): the export within 1.5x of writing the same weights with ``anekit.blob`` alone, and
peak memory above the loaded model under 100 MB (the weights are streamed). Memory is the peak of
Python and numpy allocations (``tracemalloc``, which numpy reports to) during the phase, after the
model is loaded: what the export holds besides the model. Each phase runs in its own process.

    PYTHONPATH=src python benchmarks/bench_export.py            # both phases, each in a subprocess
"""

from __future__ import annotations

import argparse
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


def phase(name: str) -> None:
    params = model()
    tracemalloc.start()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        if name == "blob":
            from anekit.blob import BlobWriter

            with BlobWriter(Path(tmp) / "weight.bin") as w:
                for _, a in params.tensors():
                    w.append(a, "fp16")
        else:
            from anekit.coreml.model_export import export_mlpackage

            export_mlpackage(params, Path(tmp) / "m.mlpackage")
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        size = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
    print(f"{name}: {seconds:.2f} s, {size / 1e6:.0f} MB written, peak allocations {peak / 1e6:.1f} MB")


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
