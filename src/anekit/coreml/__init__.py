"""CoreML packages: write / read .mlpackage (anekit.coreml package I/O), model export, int8, shards, predict."""
