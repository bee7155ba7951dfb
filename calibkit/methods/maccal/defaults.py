"""MaC-Cal stage-2 defaults, in a module that imports nothing, so that the command line can show
them in ``--help`` without loading torch."""

from typing import TypedDict


class Defaults(TypedDict):
    """The stage-2 settings, each with its type."""

    r_init: float
    eta: float
    r_min: float
    epochs: int
    lr: float
    momentum: float
    weight_decay: float
    batch_size: int
    grad_clip: float | None
    n_bins: int
    seed: int
    mc_samples: int


# Stage-2 defaults: the keep-rate rule (r_init, eta, r_min), the deployed predictor (mc_samples)
# and calibkit's optimiser decision; docs/maccal.md says how each was chosen.
DEFAULTS: Defaults = {
    "r_init": 0.9,
    "eta": 2.0,
    "r_min": 0.1,
    "epochs": 30,
    "lr": 0.01,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "batch_size": 128,
    "grad_clip": 2.0,
    "n_bins": 15,
    "seed": 0,
    "mc_samples": 64,
}
