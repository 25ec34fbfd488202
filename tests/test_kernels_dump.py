"""``anekit kernels dump``: every kernel of a preset as files that the other commands read back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.cli.main import main
from anekit.kernels import catalog
from anekit.tools.weights import weight_map


def test_dump_writes_every_kernel_readable_by_check_and_run(tmp_path, capsys):
    out = tmp_path / "k"
    assert main(["kernels", "dump", "--config", "stories260K", str(out)]) == 0
    index = json.loads((out / "kernels.json").read_text())
    names = [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS]
    assert index["config"] == "stories260K" and list(index["kernels"]) == names
    files = sorted(str(p) for p in out.glob("*/model.mil"))
    assert len(files) == len(names)
    capsys.readouterr()
    assert main(["mil", "check", *files]) == 0
    assert capsys.readouterr().out.count(": ok,") == len(names)
    # The FFN forward kernel runs from its folder through the same weight lookup as `anekit run`.
    prog = mil.parse((out / "ffn_fwd" / "model.mil").read_text())
    kernel = runtime.open("sim").compile(prog, weight_map(out / "ffn_fwd", prog))
    result = kernel(x=np.random.default_rng(0).standard_normal((1, 64, 1, 512)))["out"]
    assert result.shape == (1, index["kernels"]["ffn_fwd"]["output"]["channels"], 1, 512)
    assert np.isfinite(result).all()


def test_dump_refuses_to_overwrite_and_rejects_unknown_presets(tmp_path, capsys):
    (tmp_path / "k").mkdir()
    assert main(["kernels", "dump", "--config", "stories260K", str(tmp_path / "k")]) == 1
    assert "exists (use --force" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a usage error: the name is looked up while parsing
        main(["kernels", "dump", "--config", "nope", str(tmp_path / "j")])
    assert e.value.code == 2 and "argument --config: unknown preset 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "j").exists()


@pytest.mark.parametrize("name", ["stories15M", "stories110M"])
def test_every_catalog_kernel_verifies_for_the_presets(name):
    from anekit.kernels import preset

    cfg = preset(name)
    for kernel in [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS]:
        mil.verify(catalog.build(kernel, cfg, None).program)
