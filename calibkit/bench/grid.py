"""The benchmark grid: which methods ``calibkit bench`` compares, and the presets it runs them under.

Pure data (no torch import), so that ``calibkit report`` and the tests can read method names
and order without loading the training stack.

Every method is one entry of :data:`BENCH_METHODS` (``METHODS`` is the same dict under its former
name). A *bench method* is one row of the bench's tables; it is not a *training method*
(``calibkit.config.TRAINING_METHODS``: how ``calibkit.train.train`` feeds a batch to the loss) nor
the package :mod:`calibkit.methods` (the two-stage methods' code, MaC-Cal). ``kind`` says how a
run is produced:

* ``train``: one ordinary ``calibkit.train.train`` run with the given loss spec and training
  method (``standard``, ``mixup``, ``regmixup``);
* ``maccal``: MaC-Cal stage 2 (``calibkit.methods.maccal.run_maccal``) on top of the CE run of the
  same seed (stage 1);
* ``csm``: a ``method="csm"`` training run on calibkit's shipped generated set of
  Fashion-MNIST semantic mixes, reannotated with the features of the CE run of the same seed as
  the reference-classifier encoder (the offline encoder; no CLIP weights are needed).

Every method also declares its **search space** next to its entry (``MethodSpec.space``): the
hyperparameters ``calibkit tune`` selects on the validation split (``calibkit.bench.tune``), each
an :class:`Axis` (the grid and the published value) under an address saying where the value goes:

* ``loss.<param>``: a parameter of the method's loss spec (``"mbls:margin=6"``);
* ``train.<field>``: a ``calibkit.config.TrainConfig`` field of the method's runs (``mix_alpha``);
* ``maccal.<kwarg>``: a stage-2 keyword of ``calibkit.methods.maccal.run_maccal`` (``eta``);
* ``csm.<setting>``: a CSM setting of the preset (``sharpness`` of the reannotation).

The grids are the starting grids of the literature's sweeps (``docs/bench.md``, "Hyperparameters").
MbLS and FeDLaS-MbLS search one shared margin grid (:data:`MARGINS`), with MbLS's lambda fixed at
0.1 as in its paper, so that the two are compared under the same selection.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from calibkit.bench.builtin_presets import BUILTIN_PRESETS, SEG_METHODS, TEXT_METHODS
from calibkit.bench.pretrained_presets import PRETRAINED_PRESETS
from calibkit.config import KEEP_POLICIES  # noqa: F401  (the policies of TrainConfig.keep; config is pure)
from calibkit.errors import UserError

__all__ = [
    "BENCH_METHODS", "BOUNDS", "IMAGE_ONLY", "KEEP_POLICIES", "MARGINS", "METHODS", "NAME_CHARS", "PRESETS",
    "REFERENCE", "SEG_METHODS", "TARGETS", "TEXT_METHODS", "USER_DATASETS", "Axis", "Bound", "MethodSpec", "Preset",
    "applicable", "bound_for", "default_ood", "get_preset", "grid_methods", "select_methods", "space_for",
    "with_keep", "with_overrides",
]

REFERENCE = "ce"  # every comparison (the ECE difference column) is against cross-entropy
# Data sets holding the user's own data: their default OOD set is none (Preset.ood).
USER_DATASETS = ("imagefolder", "tensors")
# Characters of a preset name (it names run directories and database keys).
NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+=,-"
# Where a search-space address may point (see the module docstring).
TARGETS = ("loss", "train", "maccal", "csm")


@dataclass(frozen=True)
class Axis:
    """One searched hyperparameter.

    Attributes:
        values: the grid, ascending.
        default: the published value; among candidates tied on the criterion, the one nearest
            it wins (distance in grid-range units, summed over the axes of a space).
    """

    values: tuple[float, ...]
    default: float


@dataclass(frozen=True)
class Bound:
    """The values a searched hyperparameter may take at all (what ``calibkit tune`` never extends
    a grid past): ``low`` and ``high`` (``None``: unbounded), each excluded when ``*_open``.

    Example: label smoothing's alpha is ``Bound(0.0, 1.0, high_open=True)`` (0 <= alpha < 1).
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: float) -> bool:
        v = float(value)
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return False
        return not (self.high is not None and (v > self.high or (self.high_open and v == self.high)))

    def text(self) -> str:
        lo = "(-inf" if self.low is None else ("(" if self.low_open else "[") + f"{self.low:g}"
        hi = "inf)" if self.high is None else f"{self.high:g}" + (")" if self.high_open else "]")
        return f"{lo}, {hi}"


@dataclass(frozen=True)
class MethodSpec:
    """One method of the grid.

    Attributes:
        label: the name printed in tables and figures.
        kind: ``train``, ``maccal`` or ``csm`` (see the module docstring).
        loss: a ``calibkit.losses.build`` spec; a preset may override it (``Preset.losses``).
        method: the trainer's method (``standard``, ``mixup``, ``regmixup``, ``csm``).
        needs: grid methods whose run of the same seed this one builds on.
        space: the search space, ``{address: Axis}`` (empty: nothing to tune).
    """

    label: str
    kind: str = "train"
    loss: str = "ce"
    method: str = "standard"
    needs: tuple[str, ...] = ()
    space: dict = field(default_factory=dict)


# The one margin grid of MbLS and FeDLaS-MbLS (MbLS's Fig. 2 sweeps the margin; 6 on CIFAR-10,
# 10 on Tiny-ImageNet).
MARGINS = (0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 15.0, 20.0)


# Literal registry: the grid order is the table order. Each search space's grid follows the
# paper's own sweep where it has one (docs/bench.md lists the sources); CE, FLSD-53 (a fixed
# schedule) and AdaFocal (it adapts itself on validation) have nothing to tune. Grids widened
# because the default preset's selection landed on their edge: ECP beta (1, 2, then 4, 8), ACLS
# margin (1, 2), RegMixup alpha (1, 2), FeDLaS-LS beta (0.1, 0.25), CSM sharpness (0.5, after a
# seed-0 validation ablation chose 1; the same ablation had 8 worst, so 8 was left out).
BENCH_METHODS: dict[str, MethodSpec] = {
    "ce": MethodSpec("CE", loss="ce"),
    "ls": MethodSpec("LS", loss="ls", space={"loss.alpha": Axis((0.01, 0.03, 0.05, 0.1, 0.2), 0.05)}),
    "focal": MethodSpec("Focal", loss="focal", space={"loss.gamma": Axis((1.0, 2.0, 3.0, 4.0), 3.0)}),
    "flsd": MethodSpec("FLSD-53", loss="flsd"),
    "ecp": MethodSpec("ECP", loss="ecp", space={"loss.beta": Axis((0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0), 0.1)}),
    "mbls": MethodSpec("MbLS", loss="mbls", space={"loss.margin": Axis(MARGINS, 10.0)}),
    "acls": MethodSpec("ACLS", loss="acls", space={"loss.margin": Axis((1.0, 2.0, 4.0, 6.0, 10.0), 10.0)}),
    "dfl": MethodSpec("Dual focal", loss="dfl", space={"loss.gamma": Axis((1.0, 2.0, 3.0, 5.0), 5.0)}),
    "adafocal": MethodSpec("AdaFocal", loss="adafocal"),
    "mixup": MethodSpec("Mixup", loss="ce", method="mixup",
                        space={"train.mix_alpha": Axis((0.1, 0.2, 0.4, 1.0), 0.2)}),
    "regmixup": MethodSpec("RegMixup", loss="ce", method="regmixup",
                           space={"train.mix_alpha": Axis((1.0, 2.0, 5.0, 10.0, 20.0), 20.0)}),
    "fedlas_ls": MethodSpec("FeDLaS-LS", loss="fedlas_ls",
                            space={"loss.alpha": Axis((0.025, 0.05, 0.1), 0.05),
                                   "loss.beta": Axis((0.1, 0.25, 0.5, 1.0, 4.0), 4.0)}),
    "fedlas_mbls": MethodSpec("FeDLaS-MbLS", loss="fedlas_mbls", space={"loss.margin": Axis(MARGINS, 6.0)}),
    "maccal": MethodSpec("MaC-Cal", kind="maccal", needs=("ce",),
                         space={"maccal.eta": Axis((1.0, 2.0, 4.0), 2.0),
                                "maccal.r_min": Axis((0.05, 0.1, 0.3), 0.1)}),
    "csm": MethodSpec("CSM", kind="csm", loss="ce", method="csm", needs=("ce",),
                      space={"csm.sharpness": Axis((0.5, 1.0, 2.3, 4.0), 4.0),
                             "train.csm_weight": Axis((1.0, 4.0, 8.0, 16.0), 1.0)}),
}

# The former name of BENCH_METHODS, the same dict (a monkeypatch of either is seen by both).
METHODS = BENCH_METHODS

# The hard bounds of every searched hyperparameter, by address (beside the grids above): a grid
# extension (``calibkit.bench.extend``) never leaves them. They are the losses' own domains: a
# smoothing weight in [0, 1), a margin, a focusing parameter or a loss weight >= 0, a mixing
# Beta(alpha, alpha) or a step size eta > 0, MaC-Cal's r_min in (0, 1), a sharpness > 0.
# :func:`bound_for` falls back to "positive" for an address not listed whose grid is all > 0.
_UNIT = Bound(0.0, 1.0, high_open=True)
_NONNEG = Bound(0.0)
_POS = Bound(0.0, low_open=True)
BOUNDS: dict[str, Bound] = {
    "loss.alpha": _UNIT, "loss.gamma": _NONNEG, "loss.beta": _POS, "loss.margin": _NONNEG,
    "loss.lam": _NONNEG, "train.mix_alpha": _POS, "train.csm_weight": _NONNEG, "maccal.eta": _POS,
    "maccal.r_min": Bound(0.0, 1.0, low_open=True, high_open=True), "csm.sharpness": _POS,
}


def bound_for(address: str, axis: Axis | None = None) -> Bound:
    """The hard bound of a search-space address (:data:`BOUNDS`); an address not listed is
    unbounded, except that a grid whose values are all positive stays positive."""
    if address in BOUNDS:
        return BOUNDS[address]
    if axis is not None and axis.values and min(axis.values) > 0:
        return _POS
    return Bound()


def default_ood(dataset: str) -> str:
    """The OOD set of a preset that names none: ``none`` for the user's own data (digits would be an
    arbitrary, possibly same-domain choice), else ``digits`` (as before)."""
    return "none" if dataset in USER_DATASETS else "digits"


@dataclass(frozen=True)
class Preset:
    """A named benchmark configuration.

    Attributes:
        name: the preset's name (first part of every run key and run directory; :data:`NAME_CHARS`).
        dataset: a ``calibkit.data.load`` name.
        model: a ``calibkit.models.MODELS`` name or the user's ``"module:factory"`` (``models.resolve``).
        seeds: the default seeds.
        train: ``calibkit.train.TrainConfig`` fields shared by every run of the preset.
        losses: per-method loss spec overrides (e.g. MbLS margin 6 on CIFAR).
        train_by_method: per-method ``TrainConfig`` overrides (e.g. mixup's alpha).
        maccal: keyword arguments of ``run_maccal`` (stage-2 hyperparameters).
        csm: CSM settings (generated set path, reannotation sharpness, ...).
        ood: the OOD set of ``calibkit.data.load_ood`` (a built-in set, a data set, the user's folder
            or tensors file) or ``none``; not given: :func:`default_ood` of the data set.
        robust_n: test images used for the corrupted test sets (a fixed, seeded subset; 0 = all).
        severities: corruption severities evaluated (each over every corruption).
        n_boot: bootstrap resamples for the ECE-difference intervals.
        tune_seed: the seed of ``calibkit tune``'s candidate runs (the selection seed). It is none
            of the evaluation seeds, so the test numbers of a tuned bench come from runs that took
            no part in the selection (no winner's curse on them).
        num_threads: torch CPU threads unless ``--num-threads`` says otherwise (None: torch's
            default). The Fashion-MNIST presets use 1: their MLP's matrices are small, and on a
            shared, busy 2-core machine two OpenMP threads per process were measured ~18x slower per
            epoch (36 s vs 2 s) than one, from oversubscription.
        checkpoint_every: ``TrainConfig.checkpoint_every`` of the preset's training runs, a
            runtime setting (not part of a run's record: it changes no result). The Fashion-MNIST
            presets use 5: their epochs take ~0.4 s and a checkpoint ~10 ms, and a killed run
            repeats at most 4 epochs.
        note: one line shown with the report (what the preset is for, how long it takes).
        methods: the grid methods the preset runs when none are named (None: all of them); the
            segmentation presets run the methods defined per pixel, the text presets
            :data:`TEXT_METHODS`.
        modality: ``"image"``, ``"text"`` or ``"features"``; the last two skip :data:`IMAGE_ONLY` methods.
            Segmentation presets are ``"image"`` (dense images); their per-pixel method list is
            ``methods``.
        data_dir: the data set's folder (or file, ``tensors``); ``--data-dir`` overrides it.
        spaces: ``{method: {address: Axis}}`` replacing methods' own spaces (read: :meth:`space_for`).
        report_calibrators: the post-hoc calibrators the report fits on every run (names of
            ``calibkit.calibrators.CALIBRATORS``, ``temperature`` among them; None: every one but
            the opt-in ones). A runtime setting of the report: the runs are the same either way.
        report_figures: which methods the report draws a reliability figure of (before and after
            TS, confidence histogram; one of :data:`REPORT_FIGURES`): ``"all"``, every method's;
            ``"ce-and-chosen"``, CE's and the recommended method's only (``calibkit report
            --all-figures`` draws every one). A runtime setting of the report, like ``report_calibrators``.
    """

    name: str
    dataset: str
    model: str
    seeds: tuple[int, ...]
    train: dict
    losses: dict = field(default_factory=dict)
    train_by_method: dict = field(default_factory=dict)
    maccal: dict = field(default_factory=dict)
    csm: dict = field(default_factory=dict)
    ood: str | None = None
    robust_n: int = 2000
    severities: tuple[int, ...] = (1, 2, 3, 4, 5)
    n_boot: int = 1000
    tune_seed: int = 100
    num_threads: int | None = None
    checkpoint_every: int = 1
    note: str = ""
    methods: tuple[str, ...] | None = None
    modality: str = "image"
    data_dir: str | None = None
    spaces: dict = field(default_factory=dict)
    report_calibrators: tuple[str, ...] | None = None
    report_figures: str = "all"

    def __post_init__(self):
        if self.ood is None:
            object.__setattr__(self, "ood", default_ood(self.dataset))

    def space_for(self, method: str) -> dict:
        """The search space of ``method`` under this preset: ``spaces[method]`` where the preset
        gives one, else the method's own (``BENCH_METHODS[method].space``)."""
        return space_for(self, method)

    def loss_for(self, method: str) -> str:
        return self.losses.get(method, BENCH_METHODS[method].loss)

    @property
    def keep(self) -> str:
        """The checkpoint policy of every training run of the preset (``TrainConfig.keep``)."""
        return self.train.get("keep", "best-acc")


# The built-in presets (calibkit.bench.builtin_presets), then those of the pretrained backbones
# (calibkit.bench.pretrained_presets), in that order.
PRESETS: dict[str, Preset] = {name: Preset(name=name, **values) for name, values in BUILTIN_PRESETS.items()}

# Preset.report_figures: every method's reliability figure, or CE's and the recommended method's only.
REPORT_FIGURES = ("all", "ce-and-chosen")

# Text presets skip these methods: they mix input images or generate them.
IMAGE_ONLY = ("mixup", "regmixup", "csm")


def space_for(preset: Preset | None, method: str) -> dict:
    """The search space of ``method`` under ``preset`` (its ``spaces`` entry, else the method's own;
    ``preset=None``: the method's own). Every reader of a search space goes through it."""
    if preset is not None and method in preset.spaces:
        return preset.spaces[method]
    return BENCH_METHODS[method].space


def applicable(methods: list[str], preset: Preset) -> tuple[list[str], list[str]]:
    """``(kept, skipped)``: text presets skip the methods that mix or generate images."""
    if preset.modality == "image":
        return list(methods), []
    return [m for m in methods if m not in IMAGE_ONLY], [m for m in methods if m in IMAGE_ONLY]


def grid_methods(preset: Preset, names=None) -> tuple[list[str], list[str]]:
    """``(kept, skipped)``: the methods a bench or a tuning of ``preset`` runs, from ``names``
    (default: the preset's own list, else all), with what they build on, minus what the preset's
    modality cannot run."""
    return applicable(select_methods(names if names is not None else preset.methods), preset)


def get_preset(name: str) -> Preset:
    """The preset called ``name``; an unknown name lists the valid ones."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]


def select_methods(names) -> list[str]:
    """Grid methods in grid order: ``names`` (all when ``None``) plus what they build on, and CE.

    CE is always included: it is the reference of the ECE-difference column and the stage 1 of
    MaC-Cal and the encoder of CSM.
    """
    if names is None:
        return list(BENCH_METHODS)
    unknown = [n for n in names if n not in BENCH_METHODS]
    if unknown:
        raise UserError(f"unknown method(s) {', '.join(unknown)}; valid methods: {', '.join(BENCH_METHODS)}")
    wanted = {REFERENCE, *names}
    for n in names:
        wanted.update(BENCH_METHODS[n].needs)
    return [m for m in BENCH_METHODS if m in wanted]


def with_keep(preset: Preset, keep: str | None) -> Preset:
    """``preset`` with another checkpoint policy for all its runs (``None``: unchanged)."""
    if keep is None:
        return preset
    if keep not in KEEP_POLICIES:
        raise UserError(f"unknown checkpoint policy {keep!r}; choose one of {', '.join(KEEP_POLICIES)}")
    overridden = sorted(m for m, t in preset.train_by_method.items() if "keep" in t)
    if overridden:
        raise UserError(f"preset {preset.name}: {', '.join(overridden)} override the checkpoint policy; "
                         "one policy must hold for every method")
    return replace(preset, train={**preset.train, "keep": keep})


def with_overrides(preset: Preset, **changes) -> Preset:
    """A copy of ``preset`` with some fields replaced (e.g. ``seeds`` from the command line)."""
    return replace(preset, **changes)


def _pretrained_presets() -> dict[str, Preset]:
    """The presets of the pretrained backbones (:mod:`calibkit.bench.pretrained_presets`)."""
    out = {}
    for name, values in PRETRAINED_PRESETS.items():
        named = values.get("methods")  # a group's name, or the methods themselves
        groups = {"text": TEXT_METHODS, "image-without-csm": tuple(m for m in BENCH_METHODS if m != "csm")}
        methods = groups.get(named, named) if isinstance(named, str) else named
        out[name] = Preset(name=name, **{**values, "methods": methods})
    return out


PRESETS.update(_pretrained_presets())
