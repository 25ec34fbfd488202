"""Training: the loop, the accumulation, the optimizer, the trainable (full or LoRA) and the run.

The package is ``anekit.training``, not ``anekit.train``: ``anekit.train`` is the one-call function the
README documents and ``anekit/__init__.py`` exports (``anekit.train("out", steps=50)``); a subpackage of
that name would shadow it. Its modules, low to high:

* ``options``: what a run is asked to do (``TrainOptions``) and how messages name those options;
* ``state``: the training config and state the loop carries (``TrainConfig``, ``TrainState``);
* ``budget``: the compile budget one optimizer step needs;
* ``optimizer``: AdamW over every tensor, clipped;
* ``trainable``: what a step trains (``FullTrainable``) and what the loop asks of it (``Trainable``);
* ``lora``: the LoRA wrapper of a model's linears, which knows no file format (PEFT's files are
  ``anekit.hf.adapters``');
* ``accumulate``: one accumulation batch on one thread or several;
* ``loop``: the loop itself, which knows no run directory;
* ``identity``, ``curves``: the identities of a run's inputs, its loss curves;
* ``source``, ``blzt``: what a run is given (``RunSource``) and the BLZT / llama2.c source
  (``anekit.hf.training`` holds the Hugging Face one);
* ``run``: one ``Run`` in an output directory, given a source, and ``train`` (``anekit.train``).

The run records both sources write are declared once, as data, in ``anekit.llama.run_record``.
"""
