"""Decoders for compiled Neural Engine artifacts: bytes in, frozen dataclasses out."""
