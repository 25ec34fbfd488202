"""``anekit.coreml.predict`` as the README calls it, and the CoreML decoder over an exported package, with a
STAND-IN coremltools module injected into ``sys.modules`` (and ``platform.system`` saying Darwin) for the
signature and the flow only: which function is loaded on which compute unit, what inputs CoreML gets (the
declared dtypes and shapes), and that prefill and decode run on ONE state. The stand-in's ``predict`` runs
the package's function in anekit's simulator on the state's buffers, so the decoder's tokens are checked
against the simulator's own ``PackageDecoder``; nothing here says what real CoreML computes (the device
test in test_coreml_predict.py runs on a Mac)."""

from __future__ import annotations

import platform
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anekit.coreml import mac
from anekit.coreml._proto import proto
from anekit.coreml.decoder import PackageDecoder
from anekit.coreml.load import load_mlpackage
from anekit.coreml.manifest import MODEL_ENTRY
from anekit.coreml.model_export import export_mlpackage
from anekit.errors import AnekitError
from anekit.generate.coreml_decoder import CoreMLDecoder
from anekit.kernels.config import ModelConfig
from anekit.llama.params import Params
from anekit.llama.sample import Sampler
from anekit.runtime.sim import SimBackend

pytest.importorskip("coremltools.proto", reason="the package is written with coremltools' protobuf classes")

CFG = ModelConfig(64, 96, 2, 4, 2, 64, 32, name="tiny")


def _spec(path: str) -> Any:
    return proto().Model.Model.FromString((Path(path) / "Data" / MODEL_ENTRY).read_bytes())


class FakeState:
    def __init__(self, buffers: dict[str, np.ndarray]) -> None:
        self.buffers = buffers


class FakeMLModel:
    """coremltools' MLModel as far as anekit uses it; each instance one function of the package."""

    loads: list[tuple[str, Any, str | None]] = []
    calls: list[tuple[str | None, dict[str, tuple[str, tuple[int, ...]]], FakeState | None]] = []

    def __init__(self, path: str, compute_units: Any = None, function_name: str | None = None) -> None:
        self._spec = _spec(path)
        self.function_name = function_name or self._spec.description.defaultFunctionName
        FakeMLModel.loads.append((path, compute_units, function_name))
        pkg = load_mlpackage(path)
        backend = SimBackend(compile_budget=100, strict=True, route="coreml")
        self.kernel = backend.compile(pkg.program, dict(pkg.weights), function=self.function_name).load()
        self.stateful = bool(self.kernel.states)

    def get_spec(self) -> Any:
        return self._spec

    def make_state(self) -> FakeState:
        return FakeState({name: np.zeros_like(buf) for name, buf in self.kernel.states.items()})

    def predict(self, data: dict[str, np.ndarray], state: FakeState | None = None) -> dict[str, np.ndarray]:
        FakeMLModel.calls.append(
            (self.function_name, {k: (v.dtype.name, v.shape) for k, v in data.items()}, state)
        )
        if self.stateful and state is None:
            raise RuntimeError("This model is stateful: predict() needs a state")  # what CoreML says
        if state is not None:
            self.kernel.states = state.buffers
        return self.kernel(**data)


@pytest.fixture
def coremltools(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    fake = types.ModuleType("coremltools")
    units = ("CPU_AND_NE", "CPU_ONLY", "CPU_AND_GPU", "ALL")
    fake.ComputeUnit = types.SimpleNamespace(**{u: f"ComputeUnit.{u}" for u in units})  # type: ignore[attr-defined]
    fake.models = types.SimpleNamespace(MLModel=FakeMLModel)  # type: ignore[attr-defined]
    fake.utils = types.SimpleNamespace(load_spec=_spec)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "coremltools", fake)
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    FakeMLModel.loads, FakeMLModel.calls = [], []
    return fake


@pytest.fixture(scope="module")
def params() -> Params:
    return Params.init(CFG, seed=2)


@pytest.fixture(scope="module")
def package(params: Params, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_mlpackage(params, tmp_path_factory.mktemp("pkg") / "m.mlpackage").path


def test_the_readme_call_runs_the_default_function_on_a_fresh_state(coremltools, package: Path):
    """``predict(package, inputs, compute_units="cpu_and_ne")`` with plain integers: the package's default
    function (``decode``) on CPU_AND_NE, each input cast to its declared [1, 1, 1, 1] int32, and a state
    made for it (the export keeps its states in each function's description, none at the top level)."""
    out = mac.predict(package, {"token": 1, "pos": 0}, compute_units="cpu_and_ne")
    assert out["logits"].shape == (1, CFG.vocab_size, 1, 1)
    assert FakeMLModel.loads == [(str(package), "ComputeUnit.CPU_AND_NE", "decode")]
    ((function, feed, state),) = FakeMLModel.calls
    assert function == "decode" and state is not None
    assert feed == {"token": ("int32", (1, 1, 1, 1)), "pos": ("int32", (1, 1, 1, 1))}


def test_a_state_from_make_state_carries_the_caches(coremltools, package: Path, params: Params):
    state = mac.make_state(package, "prefill")
    tokens = np.zeros((1, 1, CFG.seq_len, 1), np.int64)
    tokens[0, 0, :3, 0] = [1, 7, 9]
    mac.predict(package, {"tokens": tokens, "last": 2}, function="prefill", state=state)
    logits = mac.predict(package, {"token": 4, "pos": 3}, function="decode", state=state)["logits"]
    assert [c[2] for c in FakeMLModel.calls] == [state, state]
    ref = PackageDecoder.open(package)
    ref.forward([1, 7, 9], 0)
    np.testing.assert_array_equal(logits.reshape(-1), ref.forward([4], 3))


def test_bad_inputs_and_functions_are_one_line(coremltools, package: Path):
    with pytest.raises(AnekitError, match=r"function 'decode' takes inputs token, pos: missing 'pos'"):
        mac.predict(package, {"token": 1})
    with pytest.raises(AnekitError, match=r"no input 'tokens'"):
        mac.predict(package, {"token": 1, "pos": 0, "tokens": 0})
    with pytest.raises(AnekitError, match=r"input 'tokens' is \[3\], expected \[1, 1, 32, 1\]"):
        mac.predict(package, {"tokens": [1, 2, 3], "last": 0}, function="prefill")
    with pytest.raises(AnekitError, match=r"has no function 'main' \(it has: prefill, decode\)"):
        mac.predict(package, {}, function="main")
    with pytest.raises(AnekitError, match=r"compute_units 'gpu'"):
        mac.predict(package, {}, compute_units="gpu")


def test_the_coreml_decoder_samples_the_simulators_tokens(coremltools, package: Path):
    class Ids:
        bos_id = 1
        vocab_size = CFG.vocab_size

        def encode(self, text: str, bos: bool, eos: bool) -> list[int]:
            return [1] * bos + [int(t) for t in text.split()]

        def decode(self, ids: list[int]) -> str:
            return " ".join(map(str, ids))

    decoder = CoreMLDecoder(package)
    assert decoder.cfg.vocab_size == CFG.vocab_size and decoder.cfg.seq_len == CFG.seq_len
    assert sorted(f for _, _, f in FakeMLModel.loads) == ["decode", "prefill"]
    assert {u for _, u, _ in FakeMLModel.loads} == {"ComputeUnit.CPU_AND_NE"}
    got = list(Sampler(decoder, Ids()).generate_ids([1, 5, 6], 16, 1.0, 0.9, seed=3))
    ref = list(Sampler(PackageDecoder.open(package), Ids()).generate_ids([1, 5, 6], 16, 1.0, 0.9, seed=3))
    assert got == ref
    states = {id(c[2]) for c in FakeMLModel.calls}
    assert len(states) == 1 and FakeMLModel.calls[0][0] == "prefill"  # one state for both functions
    assert {c[0] for c in FakeMLModel.calls[1:]} == {"decode"}
    decoder.reset()
    assert decoder.state is not FakeMLModel.calls[0][2]


def test_off_macos_the_decoder_is_notonmac(package: Path):
    if platform.system() == "Darwin":
        pytest.skip("off-macOS behaviour")
    with pytest.raises(mac.NotOnMac, match=r"^\[coreml\] running a package needs CoreML"):
        CoreMLDecoder(package)


def test_sample_backend_coreml_runs_the_package_through_coreml(
    coremltools, package: Path, tmp_path: Path, capsys
):
    from anekit.cli.main import main
    from anekit.llama.llama2c import Tokenizer, write_tokenizer_bin

    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n", *(f"<{i}>".encode() for i in range(3, CFG.vocab_size))]
    write_tokenizer_bin(tmp_path / "tok.bin", Tokenizer(pieces, [0.0] * len(pieces)))
    argv = [
        "sample",
        str(package),
        "--tokenizer",
        str(tmp_path / "tok.bin"),
        "--temperature",
        "0",
        "--steps",
        "8",
    ]
    assert main([*argv, "--backend", "coreml"]) == 0
    out, err = capsys.readouterr()
    assert " s on coreml: " in err and {f for _, _, f in FakeMLModel.loads} == {"prefill", "decode"}
    assert main([*argv, "--backend", "sim"]) == 0  # the package's kernels in the simulator
    sim, sim_err = capsys.readouterr()
    assert out == sim and " s on sim: " in sim_err


def test_sample_backend_coreml_refuses_a_sharded_export(coremltools, tmp_path: Path, capsys):
    from anekit.cli.main import main

    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "shards.json").write_text("{}")
    assert main(["sample", str(tmp_path / "shards"), "--backend", "coreml"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs one .mlpackage" in err and "--backend sim" in err, err
