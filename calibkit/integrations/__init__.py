"""Adapters for other libraries' evaluation loops; each imports its library only when used.

* :mod:`calibkit.integrations.torchmetrics`: ``CalibrationMetric``, the metric panel as a
  ``torchmetrics.Metric`` (Lightning, or any loop that uses torchmetrics); needs ``torchmetrics``.
* :mod:`calibkit.integrations.huggingface`: ``compute_metrics`` for ``transformers.Trainer``
  (needs nothing beyond calibkit: it takes the ``EvalPrediction`` the Trainer passes).
* :mod:`calibkit.integrations.model`: ``CalibratedModel``, a model and its fitted calibrator as one
  ``nn.Module`` that returns calibrated probabilities and saves both (needs nothing beyond calibkit).
* :mod:`calibkit.integrations.lightning`: ``CalibrationCallback``, fits a calibrator on Lightning's
  validation outputs and logs ECE/NLL before and after; needs ``lightning``.
"""
