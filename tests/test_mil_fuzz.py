"""Parser fuzzing: mutated MIL text raises only anekit's own errors, and never hangs."""

from __future__ import annotations

import random
from contextlib import suppress

import pytest

from anekit import mil
from anekit.errors import AnekitError
from anekit.kernels import ModelConfig, forward
from tests.conftest import corpus_files
from tests.fuzz_util import watchdog
from tests.test_mil_parser import GENERATED

TOKENS = [
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    ",",
    "=",
    ";",
    '"',
    "->",
    "0x1p",
    "0x1.8p-3",
    "-",
    "1e9",
    "tensor<",
    "fp16",
    "int8(",
    "BLOBFILE(",
    "string(",
    "bool(",
    "[]",
    "?",
    "//",
    "/*",
    "nan",
    "\n",
    "99999999999999999999",
    "tensor<fp16, [",
    "tensor_buffer<",
    "list<",
    "dict<",
    "func",
    "program(1.3)",
    "x",
    "values = (",
    "uint64(",
    "  ",
    "\\",
]


def _mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(text) + 1)
        j = min(len(text), i + rng.randint(0, 40))
        kind = rng.randrange(6)
        if kind == 0:
            text = text[:i] + text[j:]
        elif kind == 1:
            text = text[:i] + rng.choice(TOKENS) + text[i:]
        elif kind == 2:
            text = text[:i] + text[i:j] * rng.randint(2, 4) + text[j:]
        elif kind == 3:
            text = text[:i]
        elif kind == 4:
            text = text[:i] + chr(rng.randrange(32, 127)) + text[i + 1 :]
        else:
            k = rng.randrange(len(text) + 1)
            text = text[:k] + text[i:j] + text[k:]
    return text


def _seeds() -> list[tuple[str, str]]:
    kernel = forward.sdpa_fwd(ModelConfig(32, 64, 1, 4, 2, 100, 8))
    seeds = [("generated", GENERATED), ("sdpa_fwd", kernel.text())]
    seeds += [(p.name, p.read_text(encoding="utf-8")) for p in corpus_files("mil", "*.mil")]
    return seeds


@pytest.mark.parametrize("name, seed", _seeds(), ids=[n for n, _ in _seeds()])
def test_mutated_text_raises_only_anekit_errors(name, seed):
    rng = random.Random(f"fuzz-{name}")
    outcomes = {"parsed": 0, "rejected": 0}
    for _ in range(400):
        text = _mutate(seed, rng)
        with watchdog(5):
            try:
                prog = mil.parse(text)
            except AnekitError:
                outcomes["rejected"] += 1
                continue
            outcomes["parsed"] += 1
            mil.check(prog)  # lists problems; must not raise
            with suppress(AnekitError):
                mil.verify(prog)
            mil.parse(mil.to_text(prog))  # what parsed prints back to parseable text
    assert outcomes["rejected"] > 0 and outcomes["parsed"] >= 0


def test_random_bytes_and_deep_nesting_are_rejected_cleanly():
    rng = random.Random(3)
    samples = ["(" * 5000, "[" * 5000, "program(1.3){func main(" + "list<" * 3000, "\x00\xff", ""]
    samples += ["".join(chr(rng.randrange(1, 0x2FF)) for _ in range(200)) for _ in range(50)]
    for text in samples:
        with watchdog(5), pytest.raises(AnekitError):
            mil.parse(text)


PREFIX_SEEDS = [("generated", GENERATED)] + [
    (p.name, p.read_text(encoding="utf-8")) for p in corpus_files("mil", "coremltools-*.mil")
]


@pytest.mark.parametrize("name, seed", PREFIX_SEEDS, ids=[n for n, _ in PREFIX_SEEDS])
def test_every_prefix_of_a_program_is_rejected_cleanly(name, seed):
    """Truncation at every character: each prefix parses or raises an anekit error, never anything else."""
    for end in range(len(seed)):
        try:
            mil.parse(seed[:end])
        except AnekitError:
            continue
