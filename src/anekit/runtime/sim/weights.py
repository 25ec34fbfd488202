"""The weight files a simulated program refers to: each opened once, its BLOBFILE consts read and checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from anekit.errors import AnekitError, BlobFormatError, CompilationFailed
from anekit.fp16 import bf16_bits_to_f32
from anekit.mil import types as T
from anekit.mil.values import BlobRef, Literal
from anekit.runtime.base import WeightSource

MODEL_PATH_PREFIX = "@model_path/"


class WeightFiles:
    """Opens each weight file a program refers to once, and reads consts out of it."""

    def __init__(self, weights: dict[str, WeightSource]) -> None:
        self.weights = weights
        self.open: dict[str, Any] = {}

    def source(self, path: str, const_name: str) -> Any:
        for key in (path, path.removeprefix(MODEL_PATH_PREFIX)):
            if key in self.weights:
                return self.weights[key]
        known = ", ".join(sorted(self.weights)) or "none"
        raise CompilationFailed(
            f"[compile] const '{const_name}' refers to weight file '{path}', which was not given "
            f"(weights given: {known})"
        )

    def read(self, lit: Literal, const_name: str) -> np.ndarray:
        ref = lit.value
        assert isinstance(ref, BlobRef) and isinstance(lit.type, T.TensorType)
        blob = self.open.get(ref.path)
        if blob is None:
            src = self.source(ref.path, const_name)
            if isinstance(src, (str, Path)) and not Path(src).is_file():
                raise CompilationFailed(
                    f"[compile] const '{const_name}': weight file '{ref.path}' -> {src} does not exist"
                )
            from anekit.blob import BlobFile

            try:
                blob = BlobFile(src)
            except (AnekitError, OSError) as e:
                msg = f"[compile] const '{const_name}': cannot open '{ref.path}': {e}"
                raise CompilationFailed(msg) from e
            self.open[ref.path] = blob
        shape = tuple(int(d) for d in lit.type.shape)
        try:
            data = blob.read(ref.offset, shape=shape, dtype=lit.type.dtype.name)
        except BlobFormatError as e:
            raise CompilationFailed(
                f"[compile] const '{const_name}' ({lit.type}) at offset {ref.offset} of '{ref.path}': {e}"
            ) from e
        if lit.type.dtype.name == "bf16":  # the blob holds bfloat16 bit patterns
            return bf16_bits_to_f32(data).reshape(shape)
        return data  # a read-only view into the file; the plan keeps only converted copies

    def close(self) -> None:
        for blob in self.open.values():
            blob.close()
        self.open.clear()
