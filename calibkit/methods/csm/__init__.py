"""CSM: calibration-aware semantic mixing (ICML 2025), offline, with calibkit's own generator.

Stages (see ``docs/csm.md``):

* :mod:`~calibkit.methods.csm.generator` / :mod:`~calibkit.methods.csm.train_generator`: the
  class-conditional EDM denoiser with a soft one-hot class input, its loss and training loop;
* :mod:`~calibkit.methods.csm.sampler`: deterministic Heun sampler, classifier-free guidance;
* :mod:`~calibkit.methods.csm.generate` / :mod:`~calibkit.methods.csm.store`: groups of 8 mixes
  from one noise, written to a shardable, resumable store;
* :mod:`~calibkit.methods.csm.annotate`: calibrated reannotation with a frozen encoder;
* :mod:`~calibkit.methods.csm.dataset`: :class:`CSMCompanion`, the generated half of a batch.
"""

from calibkit.methods.csm.annotate import ClassifierEncoder, ClipEncoder, annotate_store, reannotate
from calibkit.methods.csm.dataset import CSMCompanion
from calibkit.methods.csm.generate import generate_store, sample_groups
from calibkit.methods.csm.generator import CondDenoiser, GeneratorConfig, class_vector, load_generator
from calibkit.methods.csm.sampler import heun_sample
from calibkit.methods.csm.store import load_annotations, load_store

__all__ = [
    "CSMCompanion", "ClassifierEncoder", "ClipEncoder", "CondDenoiser", "GeneratorConfig", "annotate_store",
    "class_vector", "generate_store", "heun_sample", "load_annotations", "load_generator", "load_store",
    "reannotate", "sample_groups",
]
