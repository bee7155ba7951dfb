"""Training: one readable loop from a :class:`TrainConfig` to a finished run directory.

- :func:`train` (:mod:`calibkit.train.loop`): the loop, resume, DDP, checkpoints;
- :mod:`calibkit.train.state` and :mod:`calibkit.train.run`: the run's state and how it is built;
  :mod:`calibkit.train.evaluate`
  and :mod:`calibkit.train.dense`: how a classification or a segmentation run is measured;
- :mod:`calibkit.train.steps`: what a step computes for each training method (standard, Mixup,
  RegMixup, CSM);
- :mod:`calibkit.train.keep`: the checkpoint policy (which epoch's weights a run keeps);
- :func:`learning_rate` (:mod:`calibkit.train.schedule`): the schedules.

Reading a finished run back (:func:`load_run`, :func:`load_logits`, :func:`predict_logits`) lives in
:mod:`calibkit.rundir` and is re-exported here.
"""

from calibkit.config import SCHEDULES, TRAINING_METHODS, TrainConfig, load_config
from calibkit.rundir import load_logits, load_run, predict_logits
from calibkit.train.keep import KEEP_POLICIES
from calibkit.train.loop import train
from calibkit.train.schedule import learning_rate

__all__ = ["TrainConfig", "load_config", "train", "learning_rate", "load_run", "load_logits",
           "predict_logits", "TRAINING_METHODS", "SCHEDULES", "KEEP_POLICIES"]
