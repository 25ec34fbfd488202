"""An exported package run through CoreML itself as the sampler's decoder: ``prefill`` and ``decode`` on one
state.

The package ``anekit export`` writes (``anekit.coreml.export``: ``prefill(tokens [1, 1, S, 1], last)`` and
``decode(token, pos)``, both ``-> logits [1, vocab, 1, 1]``, the KV caches in states) is loaded once per
function through ``anekit.coreml.mac`` on ``cpu_and_ne`` (law 2), and both functions run on ONE
``MLState``: the caches prefill writes are the ones decode reads and extends, as the simulator's
``anekit.coreml.decoder.PackageDecoder`` shares its state buffers between the two kernels. A prompt at
position 0 goes through ``prefill`` (padded to the package's context S), every later token through
``decode``. macOS only: elsewhere opening one is ``NotOnMac``'s one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from anekit.coreml.decoder import PackageShape
from anekit.coreml.export import FUNCTIONS
from anekit.coreml.mac import CoreMLFunction, open_function
from anekit.errors import AnekitError

ONE = (1, 1, 1, 1)  # a scalar input of the exported functions: [1, 1, 1, 1] int32


class CoreMLDecoder:
    """The sampler's ``Decoder`` over one exported package run by CoreML (``forward``, ``reset``)."""

    def __init__(self, package: str | Path, compute_units: str = "cpu_and_ne") -> None:
        self.package = Path(package)
        prefill, decode = (open_function(package, name, compute_units) for name in FUNCTIONS)
        self.functions: dict[str, CoreMLFunction] = {"prefill": prefill, "decode": decode}
        tokens, logits = prefill.inputs.get("tokens"), decode.outputs.get("logits")
        if tokens is None or logits is None or len(tokens.shape) != 4 or len(logits.shape) != 4:
            raise AnekitError(
                f"[sample] {package}: not an `anekit export` package (prefill takes 'tokens' [1, 1, S, 1], "
                "decode returns 'logits' [1, vocab, 1, 1])"
            )
        self.cfg = PackageShape(vocab_size=logits.shape[1], seq_len=tokens.shape[2])
        self.state: Any = prefill.make_state()  # the KV caches, zero: shared by both functions

    def reset(self) -> None:
        """A new sequence: fresh (zeroed) caches."""
        self.state = self.functions["prefill"].make_state()

    def forward(self, tokens: Sequence[int] | np.ndarray, pos: int) -> np.ndarray:
        """Logits (vocab,) after tokens at positions pos, pos+1, ...: a prompt at position 0 through
        ``prefill``, later tokens one at a time through ``decode``, all on the one state."""
        ids = [int(t) for t in np.asarray(tokens).ravel()]
        s = self.cfg.seq_len
        if not ids or pos < 0 or pos + len(ids) > s:
            raise AnekitError(f"[sample] cannot run {len(ids)} token(s) at position {pos} (context {s})")
        if pos == 0:
            padded = np.zeros((1, 1, s, 1), np.int32)  # (1, 1, S, 1): the prompt, zero after it
            padded[0, 0, : len(ids), 0] = ids
            feed = {"tokens": padded, "last": np.full(ONE, len(ids) - 1, np.int32)}
            return self._logits("prefill", feed)
        logits = None
        for i, tok in enumerate(ids):
            feed = {"token": np.full(ONE, tok, np.int32), "pos": np.full(ONE, pos + i, np.int32)}
            logits = self._logits("decode", feed)
        assert logits is not None
        return logits

    def _logits(self, function: str, feed: dict[str, np.ndarray]) -> np.ndarray:
        out = self.functions[function].predict(feed, self.state)
        return np.asarray(out["logits"], np.float32).reshape(-1)  # (vocab,)
