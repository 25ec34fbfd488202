"""The library side of anekit's commands: open the program(s) at a path (``loader``) or the model at a
path (``model``), resolve a program's weight files (``weights``), lint paths (``lint``), the doctor's
checks (``doctor``), the smoke ladder (``smoke``, ``smoke_numerics``), and the model jobs: sample
(``sample``), export (``export``), fuse adapters in (``fuse``). The command line only parses arguments
and prints what these return.

This package sits just below ``anekit.cli``: it may import every other layer.
"""
