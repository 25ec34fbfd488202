"""Which decoder generates for a backend name: ``cpu``, ``sim``, ``ane`` or ``coreml``.

    cpu     the model's float32 forward on the host (``anekit.llama.sample.CpuDecoder``)
    sim     the engine's generation kernels in the simulator, with a chip's numerics
            (``anekit.generate.engine.make_engine_decoder(params, "sim", chip=..., macos=..., numerics=...)``)
    ane     the same kernels on the Neural Engine through the direct route (a Mac with the engine)
    coreml  an exported package through CoreML on cpu_and_ne with its states (macOS + coremltools)

The default is ``ane`` where the engine backend can run (``anekit.runtime.ane.availability``, what
``anekit doctor`` probes), ``cpu`` elsewhere; an exported package (which holds no parameters to lower)
runs in the simulator (``sim``, ``anekit.coreml.decoder.PackageDecoder``) or through CoreML (``coreml``).
``check_backend`` refuses, in one line and before any weight is read or kernel compiled, a backend this
machine or this model cannot run. Every backend gives the sampler the same ``Decoder``.
"""

from __future__ import annotations

import platform
from pathlib import Path

from anekit.coreml.decoder import PackageDecoder
from anekit.errors import AnekitError
from anekit.generate.coreml_decoder import CoreMLDecoder
from anekit.generate.engine import EngineDecoder, make_engine_decoder
from anekit.llama.params import Params
from anekit.runtime.ane.availability import platform_supported, unavailable_reason

BACKENDS = ("cpu", "sim", "ane", "coreml")
ENGINE_BACKENDS = ("sim", "ane")  # the generation kernels: --chip / --macos / --numerics apply
PACKAGE_BACKENDS = ("sim", "coreml")  # what runs an exported package


def engine_available() -> bool:
    """Whether the Neural Engine backend can run here (macOS on Apple silicon, its framework and classes)."""
    return unavailable_reason() is None


def default_backend(package: bool = False) -> str:
    """``ane`` on a Mac with the engine, else ``cpu``; an exported package: ``sim``."""
    if package:
        return "sim"
    return "ane" if engine_available() else "cpu"


def check_backend(
    backend: str, *, package: bool, engine_options: bool = False, machine_options: bool = False
) -> None:
    """Refuse a backend this machine or model cannot run (``package``: MODEL is an exported package;
    ``engine_options``: --chip / --macos / --numerics were given; ``machine_options``: --chip / --numerics,
    which on the engine itself are the Mac's own)."""
    if backend not in BACKENDS:
        raise AnekitError(f"[sample] backend {backend!r} (known: {', '.join(BACKENDS)})")
    if backend == "ane":
        if not platform_supported():
            raise AnekitError(
                "[sample] --backend ane needs a Mac with the Neural Engine (macOS on Apple silicon); this is "
                f"{platform.system()} {platform.machine()}: --backend sim runs the same kernels in the "
                "simulator"
            )
        reason = unavailable_reason()
        if reason is not None:
            raise AnekitError(
                f"[sample] --backend ane: the Neural Engine is not available on this Mac ({reason}); "
                "--backend sim runs the same kernels in the simulator"
            )
    if backend == "coreml":
        if not package:
            raise AnekitError(
                "[sample] --backend coreml runs an `anekit export` package (.mlpackage); MODEL is not one: "
                "export it with `anekit export MODEL --to mlpackage OUT`, or use --backend sim / cpu"
            )
        if platform.system() != "Darwin":
            raise AnekitError(
                "[sample] --backend coreml needs CoreML, which only macOS has (this is "
                f"{platform.system()}): --backend sim runs the package in the simulator"
            )
    if package and backend not in PACKAGE_BACKENDS:
        raise AnekitError(
            f"[sample] --backend {backend}: MODEL is an exported package, which runs with --backend sim "
            "(the simulator) or coreml (CoreML on macOS)"
        )
    if backend == "ane" and machine_options:
        raise AnekitError(
            "[sample] --chip and --numerics choose the simulator's chip and numerics (--backend sim); on the "
            "Neural Engine (--backend ane) they are this Mac's own"
        )
    if engine_options and (backend not in ENGINE_BACKENDS or package):
        raise AnekitError(
            "[sample] --chip, --macos and --numerics choose how the engine's generation kernels run: they "
            "apply to --backend sim / ane on a model, not to "
            + ("an exported package" if package else f"--backend {backend}")
        )


def engine_decoder(
    params: Params, backend: str, chip: str = "any", macos: str = "", numerics: str | None = None
) -> EngineDecoder:
    """The generation kernels' decoder on ``backend`` (``sim`` or ``ane``)."""
    return make_engine_decoder(params, backend, chip=chip, macos=macos, numerics=numerics)


def package_decoder(path: Path, backend: str) -> PackageDecoder | CoreMLDecoder:
    """An exported package's decoder: in the simulator (``sim``) or through CoreML (``coreml``)."""
    if backend == "coreml":
        if Path(path).suffix != ".mlpackage":
            raise AnekitError(
                f"[sample] --backend coreml runs one .mlpackage; {path} is a sharded export (shards.json), "
                "which runs with --backend sim"
            )
        return CoreMLDecoder(path)
    return PackageDecoder.open(path)
