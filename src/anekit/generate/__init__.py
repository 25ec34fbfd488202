"""Text generation on the engine: prefill and decode kernels with the KV cache in surfaces.

The package lowers a model family's layer (``anekit.models``) to generation kernels (``anekit.kernels``
``generation``), plans how a model is cut into them for a chip (``plan``), and drives them on any backend
(the engine on a Mac, the simulator elsewhere) as a decoder the sampler of ``anekit.llama.sample`` drives.
"""
