"""MaC-Cal stage-2 defaults, in a module that imports nothing, so that the command line can show
them in ``--help`` without loading torch."""

# Stage-2 defaults: the keep-rate rule (r_init, eta, r_min), the deployed predictor (mc_samples)
# and calibkit's optimiser decision; docs/maccal.md says how each was chosen.
DEFAULTS = {
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
