"""CoreML packages: any verified Program as an ML Program .mlpackage, and packages back into Programs.

    save_mlpackage(program, "model.mlpackage")          # consts >= 1024 bytes go to weights/weight.bin
    pkg = load_mlpackage("model.mlpackage")              # .program, .weights, .default_function, ...
    runtime.open("sim").compile(pkg.program, pkg.weights, function=pkg.default_function)  # CoreML's route
    open_session("model.mlpackage").run("prefill", ...)  # anekit.runtime.session: states kept across calls
    predict("model.mlpackage", inputs, compute_units="cpu_and_ne")  # CoreML itself: macOS (else NotOnMac)
    predict("model.mlpackage", inputs, function="decode", state=make_state("model.mlpackage"))  # caches kept

The protobuf classes come from coremltools (``pip install -e '.[coreml]'`` in the checkout); without it
every entry point raises ``CoreMLUnavailable``. One small module per job: ``_proto`` (the optional import),
``values`` (types and literals), ``spec`` (Program <-> Model), ``manifest`` (layout and safe paths),
``save`` and ``load`` (``open_session``: a package's functions with their states kept between calls);
``mac`` runs a package through CoreML itself (``predict``, ``make_state``, ``open_function``,
``check_residency``), on macOS only.
"""

from anekit.coreml.load import MLPackage, load_mlpackage, open_session
from anekit.coreml.mac import NotOnMac, check_residency, make_state, open_function, predict, residency
from anekit.coreml.manifest import WEIGHT_PATH
from anekit.coreml.save import DEFAULT_BLOB_THRESHOLD, save_mlpackage
from anekit.errors import CoreMLFormatError, CoreMLUnavailable

__all__ = [
    "DEFAULT_BLOB_THRESHOLD",
    "WEIGHT_PATH",
    "CoreMLFormatError",
    "CoreMLUnavailable",
    "MLPackage",
    "NotOnMac",
    "check_residency",
    "load_mlpackage",
    "make_state",
    "open_function",
    "open_session",
    "predict",
    "residency",
    "save_mlpackage",
]
