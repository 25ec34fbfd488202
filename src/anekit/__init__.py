"""anekit: program the Apple Neural Engine directly, with a faithful simulator everywhere else."""

from anekit.errors import AnekitError

__version__ = "0.1.0"

__all__ = ["AnekitError", "__version__"]
