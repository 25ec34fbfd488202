"""The llama2.c-style model and its training: parameters, CPU ops, the step, trainer, file formats."""

from anekit.llama.params import LAYER_FIELDS, LayerParams, Params, layer_shapes

__all__ = ["LAYER_FIELDS", "LayerParams", "Params", "layer_shapes"]
