"""Training configuration: the :class:`TrainConfig` dataclass and TOML presets.

A preset is a flat TOML file whose keys are :class:`TrainConfig` field names::

    data = "cifar10"
    model = "resnet50"
    loss = "mbls:margin=6"
    epochs = 350
    milestones = [150, 250]   # or fractions of the epochs: [0.4286, 0.7143]

Top-level tables (e.g. ``[bench]``) belong to other commands and are ignored here. Values given
on the command line override the file, which overrides the defaults (:func:`load_config`).

Milestones are epochs (integers) or fractions of the epochs (numbers in (0, 1)); fractions are
resolved once, when the config is built (:func:`resolve_milestones`), so that a preset's drops
follow an ``--epochs`` override and the recorded config holds epochs either way. The shipped
presets give fractions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import tomllib

from calibkit.errors import UserError

# The training methods: how a batch reaches the loss (``TrainConfig.method``; calibkit.train.steps).
# Not the bench's methods (calibkit.bench.grid.BENCH_METHODS, each naming one of these) nor the
# package calibkit.methods (the two-stage methods).
TRAINING_METHODS = ("standard", "mixup", "regmixup", "csm")
SCHEDULES = ("multistep", "cosine", "onecycle")
# Fields that change how a run executes but not what it computes: a run may resume with new values.
# (compile, channels_last: the same function, computed by other kernels; they may round differently.)
RUNTIME_FIELDS = ("device", "num_threads", "eval_batch_size", "compile", "channels_last", "checkpoint_every")
OPTIMIZERS = ("sgd", "adam")
# Checkpoint policies (calibkit.train.keep): which epoch's weights a run keeps.
KEEP_POLICIES = ("best-acc", "best-nll", "best-ece", "best-miou", "last")
# Preset names resolve to TOML files shipped inside the package (calibkit/configs/).
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


@dataclass
class TrainConfig:
    """Everything that defines a training run (recorded in the run's ``config.json``).

    Attributes:
        data: data set name (``calibkit.data.DATASETS`` key).
        data_dir: where its files are (None: the data set's default location).
        model: ``calibkit.models.MODELS`` key.
        loss: loss spec for ``calibkit.losses.build``, e.g. ``"mbls:margin=6"``.
        method: the training method, one of ``TRAINING_METHODS`` (``standard``, ``mixup``,
            ``regmixup``, ``csm``).
        mix_alpha: Beta parameter of Mixup/RegMixup (None: 0.2 for Mixup; RegMixup 20, or 10 with
            100 or more classes).
        csm_data: directory of a CSM generated set (method ``csm`` only).
        csm_weight: weight of CSM's generated term ``soft_l2`` (1 in the paper).
        csm_per_real: generated images per real image in a batch (an even number: each pair is a
            pure endpoint on the real label's side and an interior member of one group; 2 in the paper).
        csm_loss: the generated term: ``l2`` (``soft_l2``, the paper) or ``ce`` (soft-label
            cross-entropy, a calibkit diagnostic option: its gradient does not vanish when the
            softmax saturates, see ``docs/csm.md``).
        epochs: training epochs.
        batch_size: global batch size (split evenly over DDP processes).
        optimizer: ``sgd`` (momentum, weight decay) or ``adam`` (torch's Adam, betas (0.9, 0.999),
            L2 weight decay ``weight_decay``; ``momentum`` is unused). The text protocol of the
            calibration literature trains its 20 Newsgroups CNN with Adam.
        lr, momentum, weight_decay: optimiser hyperparameters.
        schedule: ``multistep`` (x ``gamma`` at each milestone), ``cosine`` or ``onecycle``.
        milestones: epochs of the multistep drops, or fractions of ``epochs`` (numbers in (0, 1),
            resolved to epochs when the config is built: :func:`resolve_milestones`); None: the
            fractions 0.5 and 0.75.
        gamma: multistep factor.
        grad_clip: max global gradient norm of the model's parameters (0 disables).
        amp: bfloat16 autocast for the forward pass.
        seed: seeds the split, the initialisation and every random draw of training.
        val_size: validation images: a count (int >= 1) or a fraction of the official training
            split (float in (0, 1), rounded to the nearest count); None: the data set's protocol.
        train_subset: keep only this many training images (None: all).
        augment: random crop and flip as the data set allows (False: the images as they are).
        keep: checkpoint policy, which epoch's weights the run keeps: ``best-acc`` (highest
            validation accuracy, the literature's protocol), ``best-nll``, ``best-ece`` (lowest
            validation NLL / ECE) or ``last`` (see :mod:`calibkit.train.keep`).
        eval_batch_size: batch size for computing logits (None: 128 on a CPU, 1024 on an
            accelerator; see :func:`calibkit.distributed.eval_batch_size`).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        num_threads: torch CPU threads (None: torch's default).
        compile: wrap the model in ``torch.compile`` for training.
        channels_last: hold the model's 4-D weights in ``torch.channels_last`` memory format, so
            its convolutions take the channels-last kernels (on a 2-core CPU the small CNN's
            training steps ran 1.3-1.8x faster, ResNet-20's 1.3x: ``docs/performance.md``).
            No effect on models without convolutions; the results differ by rounding only.
        checkpoint_every: write the resume checkpoint (and the kept weights) every this many
            epochs and after the last one. A run killed in between resumes from the last one
            written and repeats at most ``checkpoint_every - 1`` epochs, ending with the same
            weights (training is a function of the epoch). Short epochs are where it pays: the
            default preset's MLP epochs take 0.4 s and a checkpoint ~10 ms.
        finetune: what of a pretrained model (``calibkit.models.PRETRAINED_MODELS``) is trained:
            ``all`` (every parameter), ``head`` (the new head only, the backbone frozen) or
            ``last:N`` (the head and the last N backbone blocks); other models take ``all`` only
            (:mod:`calibkit.models.pretrained`).
        backbone_lr_scale: the pretrained backbone learns at this times ``lr`` (the head at ``lr``);
            0.1 by default: the pretrained features move less than the new head.
    """

    data: str = "fmnist"
    data_dir: str | None = None
    model: str = "resnet20"
    loss: str = "ce"
    method: str = "standard"
    mix_alpha: float | None = None
    csm_data: str | None = None
    csm_weight: float = 1.0
    csm_per_real: int = 2
    csm_loss: str = "l2"
    epochs: int = 30
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    optimizer: str = "sgd"
    weight_decay: float = 5e-4
    schedule: str = "multistep"
    milestones: list[int] | None = None
    gamma: float = 0.1
    grad_clip: float = 2.0
    amp: bool = False
    seed: int = 0
    val_size: int | float | None = None
    train_subset: int | None = None
    augment: bool = True
    keep: str = "best-acc"
    eval_batch_size: int | None = None
    device: str = "auto"
    num_threads: int | None = None
    compile: bool = False
    channels_last: bool = False
    checkpoint_every: int = 1
    finetune: str = "all"
    backbone_lr_scale: float = 0.1

    def __post_init__(self):
        # Fractions of the epochs become epochs here, so that every TrainConfig (and its record)
        # holds epochs; integers pass unchanged.
        if self.milestones is not None and isinstance(self.epochs, int):
            self.milestones = resolve_milestones(self.milestones, self.epochs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        """Build from plain values (JSON/TOML), checking names and types; unknown keys are errors."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise UserError(f"unknown config key(s) {', '.join(unknown)}; valid: {', '.join(names)}")
        kinds = {f.name: str(f.type) for f in dataclasses.fields(cls)}  # strings: postponed annotations
        return cls(**{k: _coerce(k, kinds[k], v) for k, v in values.items()})

    def resolved_milestones(self) -> list[int]:
        if self.milestones is not None:
            return list(self.milestones)
        return resolve_milestones(DEFAULT_MILESTONES, self.epochs)

    def validate(self) -> TrainConfig:
        """Raise ``ValueError`` naming the first bad field; return ``self``."""
        for f in dataclasses.fields(self):  # inf passes "> 0" and fails at the second step of training
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise UserError(f"{f.name}: must be a finite number, got {value!r}")
            if f.name in FLOAT_VALUED and value is not None and abs(value) > FLOAT32_MAX:  # training is float32
                raise UserError(f"{f.name}: must be at most {FLOAT32_MAX:.4g} in size (float32, what training "
                                 f"computes in), got {value!r}")
        checks = [
            (self.method in TRAINING_METHODS, "method", f"must be one of {', '.join(TRAINING_METHODS)}"),
            (self.schedule in SCHEDULES, "schedule", f"must be one of {', '.join(SCHEDULES)}"),
            (self.keep in KEEP_POLICIES, "keep", f"must be one of {', '.join(KEEP_POLICIES)}"),
            (self.epochs >= 1, "epochs", "must be >= 1"),
            (self.batch_size >= 1, "batch_size", "must be >= 1"),
            (self.eval_batch_size is None or self.eval_batch_size >= 1, "eval_batch_size", "must be >= 1"),
            (self.lr > 0, "lr", "must be > 0"),
            (0 <= self.momentum < 1, "momentum", "must be in [0, 1)"),
            (self.optimizer in OPTIMIZERS, "optimizer", f"must be one of {', '.join(OPTIMIZERS)}"),
            (self.weight_decay >= 0, "weight_decay", "must be >= 0"),
            (0 < self.gamma <= 1, "gamma", "must be in (0, 1]"),
            (self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 disables clipping)"),
            (self.mix_alpha is None or self.mix_alpha > 0, "mix_alpha", "must be > 0"),
            (self.method != "csm" or bool(self.csm_data), "csm_data", "is required with method csm"),
            (self.csm_weight > 0, "csm_weight", "must be > 0"),
            (self.csm_per_real >= 2 and self.csm_per_real % 2 == 0, "csm_per_real", "must be an even number >= 2"),
            (self.csm_loss in ("l2", "ce"), "csm_loss", "must be 'l2' (the paper) or 'ce'"),
            (self.val_size is None or _count_or_fraction(self.val_size), "val_size",
             "must be an image count >= 1 or a fraction in (0, 1)"),
            (self.train_subset is None or self.train_subset >= 1, "train_subset", "must be >= 1"),
            (self.num_threads is None or self.num_threads >= 1, "num_threads", "must be >= 1"),
            (self.checkpoint_every >= 1, "checkpoint_every", "must be >= 1"),
            (_finetune_ok(self.finetune), "finetune", "must be 'all', 'head' or 'last:N' with N >= 1"),
            (self.backbone_lr_scale > 0, "backbone_lr_scale", "must be > 0"),
            (all(0 < m < self.epochs for m in self.resolved_milestones()) or self.schedule != "multistep",
             "milestones", f"must lie strictly between 0 and epochs ({self.epochs}) (give them as fractions "
             "of the epochs, e.g. [0.5, 0.75], to follow the number of epochs)"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise UserError(f"{name}: {why}, got {getattr(self, name)!r}")
        return self

    def differences(self, other: TrainConfig) -> list[str]:
        """Names of the fields (runtime-only fields excepted) whose values differ from ``other``."""
        a, b = self.to_dict(), other.to_dict()
        return [k for k in a if k not in RUNTIME_FIELDS and a[k] != b[k]]


# The largest float32: a hyperparameter beyond it overflows in the optimiser ("cannot be converted to
# type float without overflow") after the run directory was made.
FLOAT32_MAX = 3.4028234663852886e38
# The fields read as real numbers (an int given for one, lr = 100, is one too).
FLOAT_VALUED = ("lr", "momentum", "weight_decay", "gamma", "grad_clip", "mix_alpha", "csm_weight",
                "backbone_lr_scale")

# The default multistep drops: fractions of the epochs (resolved by resolve_milestones).
DEFAULT_MILESTONES = (0.5, 0.75)


def resolve_milestones(milestones, epochs: int) -> list[int]:
    """Multistep milestones in epochs: integers are epochs already; fractions of ``epochs``.

    A fraction ``f`` (a number strictly between 0 and 1) becomes ``floor(f * epochs)``, computed on
    the decimal ``f`` is written as (``Fraction(repr(f))``), so ``0.29`` of 100 epochs is 29, not
    the 28 that binary floating point gives. Drops that fall on epoch 0 are left out and equal ones
    merged, so a short run keeps only the drops inside it (2 epochs at ``[0.5, 0.75]``: ``[1]``).
    The rounding (down) is that of the default, 50% and 75% of the epochs; the shipped presets'
    fractions resolve to the epochs their protocols give (fmnist ``[0.5, 0.7667]`` of 30: 15, 23).

    Raises:
        ValueError: a mix of epochs and fractions, a fraction outside (0, 1), or a non-number.
    """
    values = list(milestones)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise UserError(f"milestones: expected epochs (integers) or fractions of the epochs, got {values!r}")
    fractions = [v for v in values if isinstance(v, float)]
    if not fractions:
        return values
    if len(fractions) != len(values):
        raise UserError(f"milestones: give epochs (integers) or fractions of the epochs (numbers in (0, 1)), "
                         f"not both, got {values!r}")
    if not all(0 < f < 1 for f in fractions):
        raise UserError(f"milestones: fractions of the epochs must lie strictly between 0 and 1, got {values!r}")
    return sorted({m for m in (math.floor(Fraction(repr(f)) * epochs) for f in fractions) if m > 0})


def _coerce(name: str, kind: str, value):
    """Check one value against its field's annotation (a string under postponed evaluation)."""
    if value is None:
        if "None" in kind:
            return None
        raise UserError(f"{name}: a value is required")
    base = kind.replace(" | None", "")
    if base == "int | float":  # a count or a fraction: integral floats (5000.0 from JSON) become counts
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{name}: expected a number, got {value!r}")
        return int(value) if float(value).is_integer() else float(value)
    ok = {
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        # milestones may also be fractions of the epochs (TrainConfig.__post_init__ resolves them)
        "list[int]": isinstance(value, (list, tuple))
        and all(isinstance(v, (int, float) if name == "milestones" else int) and not isinstance(v, bool)
                for v in value),
    }[base]
    if not ok:
        raise UserError(f"{name}: expected {base}, got {value!r}")
    return float(value) if base == "float" else list(value) if base == "list[int]" else value


def _finetune_ok(value: str) -> bool:
    """``all``, ``head`` or ``last:N`` with N >= 1 (parsed again by calibkit.models.pretrained)."""
    name, colon, count = str(value).partition(":")
    return value in ("all", "head") or (name == "last" and bool(colon) and count.isdigit() and int(count) >= 1)


def _count_or_fraction(value) -> bool:
    """Whether ``value`` is an image count (an int >= 1) or a fraction strictly between 0 and 1."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 1
    return isinstance(value, float) and 0 < value < 1


def parse_count_or_fraction(text: str) -> int | float:
    """Command-line value of ``--val-size``: ``"5000"`` -> 5000, ``"0.1"`` -> 0.1.

    Raises:
        ValueError: neither an integer >= 1 nor a fraction in (0, 1).
    """
    value: int | float | None
    try:
        value = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            value = None
    if value is None or not _count_or_fraction(value):
        raise UserError(f"expected an image count (e.g. 5000) or a fraction in (0, 1) (e.g. 0.1), got {text!r}")
    return value


def read_preset(path_or_name: str) -> dict:
    """The TrainConfig values of a TOML preset: a file path, or a name in ``calibkit/configs/`` (e.g. ``cifar10``)."""
    path = Path(path_or_name)
    if not path.is_file() and not path.suffix and (CONFIG_DIR / f"{path_or_name}.toml").is_file():
        path = CONFIG_DIR / f"{path_or_name}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.toml")) if CONFIG_DIR.is_dir() else []
        raise FileNotFoundError(f"config {path_or_name!r} not found (a TOML file, or one of: {', '.join(known)})")
    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: invalid TOML ({exc})") from exc
    return {k: v for k, v in values.items() if not isinstance(v, dict)}


def load_config(preset: str | None = None, **overrides) -> TrainConfig:
    """Defaults <- preset file <- overrides (``None`` overrides are ignored), validated."""
    values = read_preset(preset) if preset else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig.from_dict(values).validate()
