"""The ``anekit`` command line: thin wrappers over the library."""
