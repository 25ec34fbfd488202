"""predict / residency through CoreML (device tests: macOS only), and what they say elsewhere."""

from __future__ import annotations

import platform

import pytest

import anekit.coreml
from anekit.coreml import NotOnMac, check_residency, predict
from anekit.errors import AnekitError

ON_MAC = platform.system() == "Darwin"


@pytest.mark.skipif(ON_MAC, reason="off-macOS behaviour")
def test_off_macos_they_say_why() -> None:
    with pytest.raises(NotOnMac, match="only macOS"):
        predict("m.mlpackage", {})
    with pytest.raises(NotOnMac, match="only macOS"):
        check_residency("m.mlpackage")


@pytest.mark.skipif(ON_MAC, reason="off-macOS behaviour")
def test_the_readme_call_is_a_function_that_says_why() -> None:
    """The README's ``anekit.coreml.predict(package, inputs, compute_units="cpu_and_ne")``: the package's
    attribute is the function (it was the submodule: TypeError 'module' object is not callable)."""
    assert callable(anekit.coreml.predict)
    with pytest.raises(NotOnMac, match=r"^\[coreml\] running a package needs CoreML") as e:
        anekit.coreml.predict("model.mlpackage", {}, compute_units="cpu_and_ne")
    assert isinstance(e.value, AnekitError)
    with pytest.raises(AnekitError, match="compute_units 'gpu'"):
        anekit.coreml.predict("model.mlpackage", {}, compute_units="gpu")


@pytest.mark.skipif(not ON_MAC, reason=f"needs CoreML (macOS); this is {platform.system()}")
def test_exported_package_is_resident_and_predicts(tmp_path: object) -> None:  # pragma: no cover - device
    import numpy as np

    from anekit.coreml.model_export import export_mlpackage
    from anekit.kernels.config import ModelConfig
    from anekit.llama.params import Params

    params = Params.init(ModelConfig(64, 96, 2, 4, 2, 64, 32, name="tiny"), seed=0)
    out = export_mlpackage(params, tmp_path / "m.mlpackage").path  # type: ignore[operator]
    assert check_residency(out)
    logits = predict(
        out,
        {"token": np.ones((1, 1, 1, 1), np.int32), "pos": np.zeros((1, 1, 1, 1), np.int32)},
        function="decode",
    )["logits"]
    assert logits.shape == (1, 64, 1, 1)
