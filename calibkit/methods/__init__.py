"""The methods that are more than a loss: their own stages, data and models.

* :mod:`calibkit.methods.maccal`: MaC-Cal, a second stage retraining the last layer of a trained
  classifier;
* :mod:`calibkit.methods.csm`: CSM's generator and its generated, annotated sets.

Three names say "method" in calibkit, each with its own meaning: this package (the code of these
methods); a *training method* (``calibkit.config.TRAINING_METHODS``, the ``method`` field of a
training run: how a batch reaches the loss); a *bench method* (``calibkit.bench.grid.BENCH_METHODS``,
one row of the bench's tables, produced by a loss, a training method or one of these packages).
"""
