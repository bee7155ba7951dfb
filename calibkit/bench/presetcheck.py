"""``calibkit preset check``: everything about a preset that can be checked without its data.

:func:`calibkit.bench.presetfile.parse_preset` has checked every name; here every run's
``TrainConfig`` is built and validated (values such as ``lr > 0``, milestones inside the epochs),
every loss spec is built, the data set name is looked up and the model is resolved (a
``module:factory`` model is imported). Loading the data and building the model on it is the
bench's preflight (:mod:`calibkit.bench.preflight`).
"""

from __future__ import annotations


def check_preset(preset, source: str | None = None) -> str:
    """Raise ``ValueError`` naming the first problem; return a one-paragraph summary."""
    from calibkit import losses
    from calibkit.bench.grid import grid_methods
    from calibkit.bench.runner import train_config
    from calibkit.bench.space import candidates
    from calibkit.data import DATASETS
    from calibkit.models import resolve

    where = f"{source or preset.name}: "
    if preset.dataset not in DATASETS:
        from calibkit.bench.presetfile import nearest

        raise ValueError(f"{where}unknown data set {preset.dataset!r}{nearest(preset.dataset, DATASETS)}; "
                         f"valid: {', '.join(DATASETS)}")
    try:
        resolve(preset.model)
    except (ValueError, ImportError) as exc:
        raise ValueError(f"{where}{exc}") from None
    methods, skipped = grid_methods(preset)
    for m in methods:
        try:
            train_config(preset, m, preset.seeds[0] if preset.seeds else 0, csm_data="-")
            losses.build(preset.loss_for(m), num_classes=10)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}method {m}: {exc}") from None
    n_cands = sum(len(candidates(m, preset)) for m in methods if m != "ce" and preset.space_for(m))
    tuned = [m for m in methods if preset.space_for(m)]
    custom = ", ".join(sorted(preset.spaces)) or "none"
    return (f"{where}preset {preset.name} is valid: data {preset.dataset}"
            f"{' (' + preset.data_dir + ')' if preset.data_dir else ''}, model {preset.model}, OOD {preset.ood}; "
            f"{len(methods)} methods x {len(preset.seeds)} seed(s) = {len(methods) * len(preset.seeds)} bench runs"
            f"{'; skipped: ' + ', '.join(skipped) if skipped else ''}; tune: {n_cands + 1} candidates over "
            f"{len(tuned)} methods (own search spaces: {custom}). Not checked here: the data files and the "
            f"model on them (the bench checks both before it starts).")
