"""The library side of anekit's commands: open what is at a path (``loader``), resolve a program's
weight files (``weights``), lint paths (``lint``), the doctor's checks (``doctor``) and the smoke ladder
(``smoke``, ``smoke_numerics``). The command line only parses arguments and prints what these return.

This package sits just below ``anekit.cli``: it may import every other layer.
"""
