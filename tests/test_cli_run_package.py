"""An exported model runs prefill, then decode, from ``anekit run`` and from ``anekit.coreml.open_session``,
its KV caches carried between calls, and picks the same greedy tokens as ``anekit sample`` on the source
model with its weights rounded to fp16 (what the package stores).

The reference is the CPU sampler (llama2.c's run.c in numpy: ``anekit sample`` on a llama2.c file); the
package runs in the simulator. Each CLI call is one function: ``--state-out`` saves the caches prefill
wrote, ``--state-in`` gives them to the next decode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from anekit.llama.params import Params
from tests.conftest import corpus_path
from tests.coreml_oracle import coremltools

coremltools()  # the package writer needs coremltools' protobuf classes

ONE = (1, 1, 1, 1)
BOS = 1
PROMPT_TOKENS = 8  # the prompt: BOS and the first tokens of the model's own story
CLI_TOKENS = 6  # one prefill and five decode commands
API_TOKENS = 40


def _model() -> Path:
    return corpus_path("llama2c", "stories260K.bin")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = _model()
    out = tmp_path_factory.mktemp("export") / "stories260K.mlpackage"
    assert main(["export", str(model), "--to", "mlpackage", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def fp16_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Params, Path]:
    """The source model with its weights rounded to fp16 (numpy's own cast), and as a llama2.c file."""
    from anekit.llama.llama2c import read_llama2c, write_llama2c

    params = read_llama2c(_model())[1].copy()
    for _, a in params.tensors():
        a[...] = a.astype(np.float16).astype(np.float32)
    path = tmp_path_factory.mktemp("fp16") / "stories260K-fp16.bin"
    write_llama2c(path, params)
    return params, path


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    """A 512-piece llama2.c tokenizer (stories260K's vocabulary size): the first pieces of llama2's own
    (its bytes and first merges), as a tokenizer.bin; only the token ids matter here."""
    from anekit.llama.llama2c import Tokenizer, read_tokenizer_bin, write_tokenizer_bin

    full = read_tokenizer_bin(corpus_path("llama2c", "tokenizer.bin"))
    tok = Tokenizer(full.vocab[:512], full.scores[:512])
    path = tmp_path_factory.mktemp("tok") / "tok512.bin"
    write_tokenizer_bin(path, tok)
    return tok, path


def _sampler(params: Params, tokenizer: object) -> object:
    from anekit.llama.sample import Sampler

    return Sampler(params, tokenizer)


def reference(params: Params, tokenizer: object, n: int) -> tuple[list[int], list[int]]:
    """(a prompt, the n greedy tokens after it) from the CPU sampler `anekit sample` runs, at temperature
    0 from BOS: the prompt is BOS and the story's first PROMPT_TOKENS tokens, so it reads as the model's
    own text and the tokens after it continue that story."""
    sampler = _sampler(params, tokenizer)
    story = list(sampler.generate_ids([BOS], PROMPT_TOKENS + n, 0.0, 0.9, 0))  # type: ignore[attr-defined]
    assert len(story) == PROMPT_TOKENS + n and BOS not in story  # no story ends inside the window
    return [BOS, *story[:PROMPT_TOKENS]], story[PROMPT_TOKENS:]


def greedy(logits: np.ndarray) -> int:
    """Temperature 0: the argmax (the sampler's rule against BOS holds for its first token only, which
    is inside the prompt here)."""
    return int(np.argmax(np.asarray(logits, np.float64).ravel()))


def prefill_inputs(ids: list[int], seq_len: int) -> dict[str, np.ndarray]:
    tokens = np.zeros((1, 1, seq_len, 1), np.int32)  # (1, 1, S, 1): the prompt, padded
    tokens[0, 0, : len(ids), 0] = ids
    return {"tokens": tokens, "last": np.full(ONE, len(ids) - 1, np.int32)}


def decode_inputs(token: int, pos: int) -> dict[str, np.ndarray]:
    return {"token": np.full(ONE, token, np.int32), "pos": np.full(ONE, pos, np.int32)}


def _files(folder: Path, arrays: dict[str, np.ndarray]) -> list[str]:
    args = []
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
        args += ["--input", f"{name}={folder / f'{name}.npy'}"]
    return args


def test_cli_runs_prefill_then_decode_like_anekit_sample(
    tmp_path: Path, package: Path, fp16_source: tuple[Params, Path], tokenizer: tuple[object, Path]
) -> None:
    params, _ = fp16_source
    ids, want = reference(params, tokenizer[0], CLI_TOKENS)
    state, out = tmp_path / "state.npz", tmp_path / "out.npz"
    run = ["run", str(package), "--output", str(out)]
    first = prefill_inputs(ids, params.cfg.seq_len)
    assert main([*run, "--function", "prefill", *_files(tmp_path, first), "--state-out", str(state)]) == 0
    got = [greedy(np.load(out)["logits"])]
    for pos in range(len(ids), len(ids) + CLI_TOKENS - 1):
        step = _files(tmp_path, decode_inputs(got[-1], pos))
        args = ["--function", "decode", *step, "--state-in", str(state), "--state-out", str(state)]
        assert main([*run, *args]) == 0
        got.append(greedy(np.load(out)["logits"]))
    assert got == want


def test_api_runs_prefill_then_decode_like_anekit_sample(
    tmp_path: Path,
    package: Path,
    fp16_source: tuple[Params, Path],
    tokenizer: tuple[object, Path],
    capsys: pytest.CaptureFixture,
) -> None:
    """The session API as ``anekit sample`` drives it: a prefill, decodes, the states saved and a new
    session carrying on, token for token the float reference's greedy choice. On the ideal machine
    (``numerics="ieee"``): under the chip's engine numerics, whose MAC first stage truncates each 4-lane
    tile (``mac.first-stage``), a greedy choice between two near-equal logits may differ after a few dozen
    tokens, as it may on the engine; what this test holds is the API's bookkeeping."""
    from anekit import runtime
    from anekit.coreml import open_session

    params, fp16_file = fp16_source
    tok, tok_file = tokenizer
    ids, want = reference(params, tok, API_TOKENS)
    got: list[int] = []
    with open_session(package, runtime.open("sim", numerics="ieee")) as s:
        got.append(greedy(s.run("prefill", **prefill_inputs(ids, params.cfg.seq_len))["logits"]))
        for pos in range(len(ids), len(ids) + API_TOKENS // 2):
            got.append(greedy(s.run("decode", **decode_inputs(got[-1], pos))["logits"]))
        s.save_states(tmp_path / "half.npz")
    # a new session carries on from the saved caches
    with open_session(package, runtime.open("sim", numerics="ieee"), states=tmp_path / "half.npz") as s:
        for pos in range(len(ids) + API_TOKENS // 2, len(ids) + API_TOKENS - 1):
            got.append(greedy(s.run("decode", **decode_inputs(got[-1], pos))["logits"]))
    assert got == want
    # and `anekit sample` itself, from BOS, prints the text of the prompt and these tokens, decoded after
    # BOS as run.c decodes them (the leading space of the piece after BOS dropped)
    steps = str(PROMPT_TOKENS + API_TOKENS)
    capsys.readouterr()
    sample = ["sample", str(fp16_file), "--tokenizer", str(tok_file), "--steps", steps, "--temperature", "0"]
    assert main(sample) == 0
    text = tok.decode(ids + got)  # type: ignore[attr-defined]
    assert capsys.readouterr().out == text + "\n"


def test_run_fills_inputs_but_not_states_at_random(package: Path, capsys: pytest.CaptureFixture) -> None:
    """`anekit run MODEL.mlpackage --random 0` (the states are no inputs: they start at zero)."""
    assert main(["run", str(package), "--random", "0"]) == 0
    assert "logits: [1, 512, 1, 1]" in capsys.readouterr().out


def test_states_start_at_zero_and_state_in_replaces_them(tmp_path: Path, package: Path) -> None:
    from anekit.coreml import open_session

    inputs = decode_inputs(7, 3)
    with open_session(package) as s:
        fresh = s.run("decode", **inputs)["logits"]
        assert all(b[:, :, 3].any() and not b[:, :, 4:].any() for b in s.states.values())
        s.save_states(tmp_path / "one.npz")
        s.run("prefill", **prefill_inputs([1, 9, 4, 2], 512))
        primed = s.run("decode", **inputs)["logits"]
        s.reset()
        np.testing.assert_array_equal(s.run("decode", **inputs)["logits"], fresh)
    saved = np.load(tmp_path / "one.npz")
    assert sorted(saved.files) == sorted(f"{kv}_cache_{i}" for i in range(5) for kv in "kv")
    assert all(saved[name].dtype == np.float16 for name in saved.files)  # the states' own dtype
    assert not np.array_equal(primed, fresh)


@pytest.mark.parametrize(
    "content, says",
    [
        ("missing", "no value for state 'k_cache_0'"),
        ("extra", "no state is named 'z'"),
        ("shape", "state 'k_cache_0' is a [2] float32 array"),
        ("text", "cannot read states from"),
    ],
)
def test_bad_state_files_are_one_line_errors(
    tmp_path: Path, package: Path, capsys: pytest.CaptureFixture, content: str, says: str
) -> None:
    state, good = tmp_path / "state.npz", tmp_path / "good.npz"
    assert main(["run", str(package), "--random", "0", "--state-out", str(good)]) == 0
    arrays = dict(np.load(good))
    if content == "missing":
        del arrays["k_cache_0"]
    elif content == "extra":
        arrays["z"] = np.zeros(1)
    elif content == "shape":
        arrays["k_cache_0"] = np.zeros(2, np.float32)
    if content == "text":
        state.write_text("not an npz")
    else:
        np.savez(state, **arrays)
    capsys.readouterr()
    assert main(["run", str(package), "--random", "0", "--state-in", str(state)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("anekit: [session]") and says in err and "Traceback" not in err
    assert err.count("\n") == 1
