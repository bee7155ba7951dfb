"""calibkit: make neural-network classifiers calibrated.

Subpackages follow one-way data flow:
``functional`` -> ``losses`` / ``metrics`` / ``calibrators`` -> ``train`` / ``methods`` -> ``bench`` -> ``cli``.
"""

__version__ = "0.1.0"
