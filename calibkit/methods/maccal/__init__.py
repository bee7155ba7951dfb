"""MaC-Cal: masked classifier retraining (Ni, Zhao, Yang, Guo; Pattern Recognition 2026,
arXiv 2508.09116), calibkit's version.

Two stages. Stage 1 is any trained classifier whose last layer is linear (a calibkit run, or the
user's own model). Stage 2 freezes the features, computes them once, and retrains the linear
head under random DropConnect masks whose keep (retention) rate ``r`` adapts to the gap
between confidence and accuracy, correcting over- and under-confidence.

What the paper establishes, and what calibkit decided
------------------------------------------------------
The paper states the two stages, random masking of the classifier's parameters during
retraining with fixed features, and a keep rate adjusted from the deviation between confidence
and accuracy. **Its exact keep-rate update rule was not available to calibkit** (the public
abstract and summaries do not give it); the rule below is calibkit's own documented choice
(``docs/maccal.md``), not a reproduction of the authors' code:

* every optimisation step draws an i.i.d. mask ``M ~ Bernoulli(r)`` of the head's weight
  shape ``(K, D)``, shared by the mini-batch, and uses ``W_eff = (M * W) / r``; bias unmasked;
* the **deployed predictor** is the average of the probabilities of ``S`` masked heads
  (``mc_samples``, default 64) with masks drawn from a fixed seed, at the keep rate the head
  was trained under: reproducible, a deterministic function of the features;
* after every stage-2 epoch, that deployed predictor is scored on the validation split:
  ``c`` = mean max-probability, ``a`` = accuracy, then ``r <- clip(r - eta * (c - a), r_min, 1)``
  (over-confident: mask more, which softens the mask average; under-confident: mask less);
* the epoch whose deployed predictor has the lowest validation ECE is kept.

``mc_samples = 0`` deploys the deterministic unmasked head instead (and lets it drive the rule):
an explicitly different option, measured to barely calibrate, because the ``1/r`` scaling keeps
the unmasked head's expected logits unchanged.

Modules: :mod:`.masking` (mask, rule, deployed predictor), :mod:`.stage2` (the training loop),
:mod:`.estimator` (:class:`MaCCal`, :func:`extract_features`), :mod:`.run` (run directories).
"""

import importlib

# Each public name and the module that defines it. The package loads a module (and torch) only when
# one of its names is first read, so that ``calibkit maccal --help`` can show the defaults quickly.
_WHERE = {
    "DEFAULTS": "defaults",
    "MACCAL_JSON": "run", "RULE": "run", "load_maccal": "run", "run_maccal": "run",
    "MC_SEED_OFFSET": "masking", "bernoulli_mask": "masking", "deployed_proba": "masking",
    "masked_linear": "masking", "mc_logits": "masking", "mc_predict_proba": "masking",
    "update_keep_rate": "masking",
    "MaCCal": "estimator", "NotFittedError": "estimator", "extract_features": "estimator",
    "fit_masked_head": "stage2",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    "DEFAULTS",
    "MACCAL_JSON",
    "MC_SEED_OFFSET",
    "RULE",
    "MaCCal",
    "NotFittedError",
    "bernoulli_mask",
    "deployed_proba",
    "extract_features",
    "fit_masked_head",
    "load_maccal",
    "masked_linear",
    "mc_logits",
    "mc_predict_proba",
    "run_maccal",
    "update_keep_rate",
]
