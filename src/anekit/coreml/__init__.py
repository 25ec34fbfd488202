"""CoreML packages: .mlpackage write / read, model export (KV-cache states), int8, shards, predict."""
