"""The llama2.c-style model: parameters, CPU ops, the step, the sampler, file formats (its training is
``anekit.training``)."""

from anekit.llama.params import LAYER_FIELDS, LayerParams, Params, layer_shapes

__all__ = ["LAYER_FIELDS", "LayerParams", "Params", "layer_shapes"]
