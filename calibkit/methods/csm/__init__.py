"""CSM: calibration-aware semantic mixing (ICML 2025), offline, with calibkit's own generator.

Stages (see ``docs/csm.md``):

* :mod:`~calibkit.methods.csm.generator` / :mod:`~calibkit.methods.csm.train_generator`: the
  class-conditional EDM denoiser with a soft one-hot class input, its loss and training loop;
* :mod:`~calibkit.methods.csm.sampler`: deterministic Heun sampler, classifier-free guidance;
* :mod:`~calibkit.methods.csm.generate` / :mod:`~calibkit.methods.csm.store`: groups of 8 mixes
  from one noise, written to a shardable, resumable store;
* :mod:`~calibkit.methods.csm.annotate`: calibrated reannotation with a frozen encoder;
* :mod:`~calibkit.methods.csm.dataset`: :class:`CSMCompanion`, the generated half of a batch;
* :mod:`~calibkit.methods.csm.inputs`: the user's tensors or Dataset in the form every stage takes.

Every stage works on tensors and any encoder callable (see ``examples/csm_own_data.py``)::

    images, labels = as_image_tensors(my_images, my_labels)           # uint8 (N, C, H, W), (N,)
    model = train_generator(images, labels, "gen_dir", GeneratorTrainConfig(steps=2000))
    groups = generate(model, num_groups=1250, guidance=3.0)
    groups["soft_labels"] = annotate(groups["images"], groups["c1"], groups["c2"], my_encoder,
                                     images, labels)["soft_labels"]
    companion = CSMCompanion(groups, num_classes=10)                  # draw(labels) in the loop

The ``calibkit csm`` commands are a thin layer over the same functions.
"""

from calibkit.methods.csm.annotate import ClassifierEncoder, ClipEncoder, annotate, annotate_store, reannotate
from calibkit.methods.csm.dataset import CSMCompanion
from calibkit.methods.csm.generate import generate, generate_store, sample_groups
from calibkit.methods.csm.generator import CondDenoiser, GeneratorConfig, class_vector, load_generator
from calibkit.methods.csm.inputs import as_image_tensors
from calibkit.methods.csm.sampler import heun_sample
from calibkit.methods.csm.store import load_annotations, load_store
from calibkit.methods.csm.train_generator import GeneratorTrainConfig, train_generator

__all__ = [
    "CSMCompanion", "ClassifierEncoder", "ClipEncoder", "CondDenoiser", "GeneratorConfig", "GeneratorTrainConfig",
    "annotate", "annotate_store", "as_image_tensors", "class_vector", "generate", "generate_store", "heun_sample",
    "load_annotations", "load_generator", "load_store", "reannotate", "sample_groups", "train_generator",
]
