"""``calibkit bench``: the grid of methods x seeds, its runner and its evaluation.

Submodules: :mod:`grid` (methods and presets, pure data), :mod:`runner` (train or reuse each run,
evaluate it, record it in the results database), :mod:`evaluation` (metrics before/after
temperature scaling, OOD, robustness). Nothing is imported eagerly so that reading the grid
does not load the training stack.
"""
