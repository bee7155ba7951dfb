"""Calibrated reannotation of CSM groups with a frozen encoder (CSM, ICML 2025, Sec. 3.2).

For a generated image mixing classes c1 and c2 with features ``f`` and class prototypes ``p_k``
(mean feature of the real training images of class k)::

    lam_hat  = <f - p_c2, p_c1 - p_c2> / ||p_c1 - p_c2||^2     (projection on the prototype segment)
    lam'     = clamp(sigmoid(s (lam_hat - 0.5)), 0, 1)          (sharpening, s = 4 by default)
    y[c1] = lam',  y[c2] = 1 - lam',  0 elsewhere

Encoders (the one used is recorded with every annotation):

* ``classifier``: penultimate features (``model.forward_features``) of a reference classifier
  trained by calibkit on the real training split, read from its run directory. Offline default.
* ``clip``: ``transformers.CLIPModel.get_image_features`` (raw, not normalised, as the official
  code) loaded from a local directory; images are made RGB, resized to the vision model's input
  size (bicubic) and normalised with the directory's processor mean/std (CLIP's by default).
* ``efficientnet_lite0``: the pooled features (1280) of the ImageNet EfficientNet-Lite0 backbone
  (``calibkit[pretrained]``), frozen, in evaluation mode: an offline stand-in for the seed's CLIP, an
  encoder that knows images but never saw the data set. Grey images are repeated to RGB, resized
  (bilinear) to 64 pixels by default -- the size of calibkit's ``efficientnet_lite0`` model; the
  network's own 224 would cost 12 times more on a CPU -- and scaled as the weights expect,
  ``(255 p - 127) / 128``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

import calibkit.data
import calibkit.distributed
import calibkit.rundir
from calibkit.data import normalize
from calibkit.errors import UserError
from calibkit.methods.csm.inputs import as_image_tensors
from calibkit.methods.csm.store import load_store, write_annotations
from calibkit.models.efficientnet_lite import EfficientNetLite, imagenet_inputs, weights_file

# OpenAI CLIP's image normalisation (used when the directory has no preprocessor_config.json).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def reannotate(features: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, prototypes: torch.Tensor,
               sharpness: float = 4.0) -> dict:
    """Projection + sigmoid sharpening of the spec (pure function).

    Args:
        features: (N, D) encoder features of the generated images.
        c1, c2: (N,) int64 class pair of each image (c1 != c2).
        prototypes: (K, D) class prototypes.
        sharpness: s.

    Returns:
        dict with ``lam_hat`` (N,), ``lam_annot`` (N,) = lam' and ``soft_labels`` (N, K).
    """
    if features.dim() != 2 or prototypes.dim() != 2 or features.shape[1] != prototypes.shape[1]:
        raise UserError(f"features (N, D) and prototypes (K, D) disagree: {tuple(features.shape)} vs "
                         f"{tuple(prototypes.shape)}")
    if (c1 == c2).any():
        raise UserError("c1 and c2 must differ for every image")
    f, p = features.double(), prototypes.double()
    d = p[c1] - p[c2]
    norm2 = (d * d).sum(1)
    if (norm2 == 0).any():
        raise UserError("two class prototypes coincide; the projection is undefined")
    lam_hat = ((f - p[c2]) * d).sum(1) / norm2
    lam = torch.sigmoid(sharpness * (lam_hat - 0.5)).clamp(0, 1)
    soft = torch.zeros(len(f), p.shape[0], dtype=torch.float64)
    rows = torch.arange(len(f))
    soft[rows, c1] = lam
    soft[rows, c2] = 1 - lam
    return {"lam_hat": lam_hat.float(), "lam_annot": lam.float(), "soft_labels": soft.float()}


def class_prototypes(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Mean feature per class, (K, D); every class must have at least one image."""
    counts = torch.bincount(labels, minlength=num_classes)
    if (counts == 0).any():
        raise UserError(f"no training image for classes {torch.nonzero(counts == 0).flatten().tolist()}")
    sums = torch.zeros(num_classes, features.shape[1], dtype=torch.float64).index_add_(0, labels, features.double())
    return (sums / counts[:, None]).float()


class ClassifierEncoder:
    """Penultimate features of a classifier trained by ``calibkit train`` (a run directory).

    Args:
        run_dir: the run directory.
        batch_size: images per forward pass.
        device: where the network runs (``"cpu"``, ``"cuda[:N]"``, ``"auto"`` or a ``torch.device``);
            features are returned on the CPU.
    """

    def __init__(self, run_dir, batch_size: int = 512, device="cpu"):
        self.device = device if isinstance(device, torch.device) else calibkit.distributed.resolve_device(device)
        self.model, self.cfg, self.info = calibkit.rundir.load_run(run_dir)
        self.model = self.model.to(self.device).eval()
        self.run_dir, self.batch_size = str(run_dir), batch_size
        weights = Path(run_dir) / "model.safetensors"
        self.identity = {"encoder": "classifier", "run": self.run_dir, "model": self.cfg.model,
                         "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()[:16]}

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        mean, std = self.info["mean"], self.info["std"]
        return torch.cat([
            self.model.forward_features(
                normalize(images[i:i + self.batch_size].to(self.device), mean, std)).float().cpu()
            for i in range(0, len(images), self.batch_size)])

    def training_split(self):
        """The exact training split the reference classifier saw (images, labels)."""
        c = self.cfg
        bundle = calibkit.data.load(c.data, data_dir=c.data_dir, seed=c.seed, val_size=c.val_size,
                                    train_subset=c.train_subset)
        return bundle.train.images, bundle.train.labels


class ClipEncoder:
    """CLIP image features (``CLIPModel.get_image_features``) from a local directory.

    Args:
        clip_dir: a directory written by ``CLIPModel.save_pretrained`` (config.json + weights).
        batch_size: images per forward pass.
        device: where the model runs (as :class:`ClassifierEncoder`); features come back on the CPU.
    """

    def __init__(self, clip_dir, batch_size: int = 64, device="cpu"):
        from transformers import CLIPModel  # noqa: PLC0415 (optional extra csm; the command requires it)

        clip_dir = Path(clip_dir)
        if not (clip_dir / "config.json").is_file():
            raise FileNotFoundError(f"{clip_dir} has no config.json: not a saved CLIPModel directory")
        self.device = device if isinstance(device, torch.device) else calibkit.distributed.resolve_device(device)
        self.model = CLIPModel.from_pretrained(clip_dir).eval().to(self.device)
        self.size = int(self.model.config.vision_config.image_size)
        mean, std = CLIP_MEAN, CLIP_STD
        pre = clip_dir / "preprocessor_config.json"
        if pre.is_file():
            p = json.loads(pre.read_text())
            mean, std = tuple(p.get("image_mean", mean)), tuple(p.get("image_std", std))
        self.mean = torch.tensor(mean).view(1, 3, 1, 1)
        self.std = torch.tensor(std).view(1, 3, 1, 1)
        self.batch_size = batch_size
        h = hashlib.sha256()
        for f in sorted(clip_dir.glob("*.safetensors")) + sorted(clip_dir.glob("*.bin")):
            h.update(f.read_bytes())
        self.identity = {"encoder": "clip", "clip_dir": str(clip_dir), "weights_sha256": h.hexdigest()[:16],
                         "image_size": self.size, "mean": list(mean), "std": list(std)}

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (N, C, H, W), C in {1, 3} -> normalised float (N, 3, size, size)."""
        x = images.float() / 255.0
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)  # grey -> RGB, as the CLIP processor converts images
        x = torch.nn.functional.interpolate(x, size=(self.size, self.size), mode="bicubic",
                                            align_corners=False, antialias=True).clamp(0, 1)
        return (x - self.mean) / self.std

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        out = []
        for i in range(0, len(images), self.batch_size):
            x = self.preprocess(images[i:i + self.batch_size]).to(self.device)
            r = self.model.get_image_features(pixel_values=x)
            out.append((r if isinstance(r, torch.Tensor) else r.pooler_output).float().cpu())
        return torch.cat(out)


class EfficientNetEncoder:
    """Pooled ImageNet EfficientNet-Lite0 features (N, 1280) of uint8 images (``calibkit[pretrained]``).

    Args:
        size: the side images are resized to (64 by default; see the module docstring).
        batch_size: images per forward pass.
        device: where the network runs (as :class:`ClassifierEncoder`); features come back on the CPU.
    """

    def __init__(self, size: int = 64, batch_size: int = 256, device="cpu"):
        if int(size) < 32:
            raise UserError(f"EfficientNetEncoder: size must be >= 32 pixels (5 stride-2 stages), got {size}")
        self.device = device if isinstance(device, torch.device) else calibkit.distributed.resolve_device(device)
        self.model = EfficientNetLite(num_classes=1, in_channels=3, size=int(size), pretrained=True)
        self.model = self.model.eval().to(self.device)
        self.size, self.batch_size = int(size), batch_size
        digest = hashlib.sha256(Path(weights_file()).read_bytes()).hexdigest()[:16]
        self.identity = {"encoder": "efficientnet_lite0", "image_size": self.size, "weights_sha256": digest}

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[1] not in (1, 3):
            raise UserError(f"expected uint8 images (N, 1 or 3, H, W), got {tuple(images.shape)}")
        out = []
        for i in range(0, len(images), self.batch_size):
            x = images[i:i + self.batch_size].to(self.device).float() / 255.0
            out.append(self.model.forward_features(imagenet_inputs(x)).float().cpu())
        return torch.cat(out) if out else torch.zeros(0, 1280)


ENCODERS = ("classifier", "clip", "efficientnet_lite0")


def encoder_identity(encoder) -> dict:
    """What produced the features: ``encoder.identity`` when it has one, else the callable's name."""
    ident = getattr(encoder, "identity", None)
    if isinstance(ident, dict):
        return dict(ident)
    name = getattr(encoder, "__qualname__", None) or type(encoder).__qualname__
    return {"encoder": "callable", "name": f"{getattr(encoder, '__module__', '?')}.{name}"}


def _features(encoder, images: torch.Tensor, what: str) -> torch.Tensor:
    f = encoder(images)
    if not isinstance(f, torch.Tensor) or f.dim() != 2 or f.shape[0] != len(images):
        got = tuple(f.shape) if isinstance(f, torch.Tensor) else type(f).__name__
        raise UserError(f"the encoder must map the {len(images)} {what} images to features (N, D); got {got}")
    if not torch.isfinite(f).all():
        raise UserError(f"the encoder returned NaN or infinite features for the {what} images")
    return f.detach().float().cpu()


def annotate(images: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, encoder, train_images: torch.Tensor,
             train_labels: torch.Tensor, num_classes: int | None = None, sharpness: float = 4.0) -> dict:
    """Calibrated reannotation of generated images, tensors in and out.

    Args:
        images: uint8 generated images (N, C, H, W).
        c1, c2: (N,) int64 class pair of each image (as returned by generation).
        encoder: any callable ``uint8 images (M, C, H, W) -> features (M, D)`` (e.g. a lambda
            around the user's own network, :class:`ClassifierEncoder`, :class:`ClipEncoder`).
        train_images, train_labels: real training images (M, C, H, W) (uint8, or float in [0, 1],
            quantised to uint8 like the generated ones) and labels (M,); the prototypes are their
            mean features per class. The encoder receives uint8 images and does its own scaling.
        num_classes: K (default: the largest label or class index + 1).
        sharpness: s of the sigmoid.

    Returns:
        dict with ``soft_labels`` (N, K), ``lam_hat`` (N,), ``lam_annot`` (N,) and ``prototypes`` (K, D).
    """
    train_images, train_labels = as_image_tensors(train_images, train_labels)
    c1, c2 = torch.as_tensor(c1).long().cpu(), torch.as_tensor(c2).long().cpu()
    if images.dtype != torch.uint8:
        raise UserError(f"generated images must be uint8, got {images.dtype}")
    if c1.shape != (len(images),) or c2.shape != (len(images),):
        raise UserError(f"c1 and c2 must have shape ({len(images)},), got {tuple(c1.shape)} and {tuple(c2.shape)}")
    if train_labels.shape != (len(train_images),):
        raise UserError(f"train_labels must have shape ({len(train_images)},), got {tuple(train_labels.shape)}")
    k = num_classes or int(max(train_labels.max(), c1.max(), c2.max())) + 1
    if int(train_labels.max()) >= k or int(max(c1.max(), c2.max())) >= k or int(train_labels.min()) < 0:
        raise UserError(f"labels and class pairs must lie in [0, {k})")
    protos = class_prototypes(_features(encoder, train_images, "training"), train_labels, k)
    out = reannotate(_features(encoder, images, "generated"), c1, c2, protos, sharpness)
    return {**out, "prototypes": protos}


def annotate_store(store_dir, encoder, train_images: torch.Tensor, train_labels: torch.Tensor,
                   sharpness: float = 4.0, extra_meta: dict | None = None) -> dict:
    """Annotate every image of a store and write ``annotations.safetensors`` / ``.json``.

    Args:
        store_dir: a complete store (``calibkit csm generate``).
        encoder: callable uint8 (N, C, H, W) -> features (N, D); its ``identity`` dict, if any,
            is recorded (:func:`encoder_identity`).
        train_images, train_labels: the real training split (uint8 (M, C, H, W), int64 (M,));
            the prototypes are the mean features per class over it.
        sharpness: s of the sigmoid.
        extra_meta: recorded in ``annotations.json``.

    Returns:
        dict of the written tensors (``soft_labels`` (N, K), ``lam_hat``, ``lam_annot``, ``group``,
        ``member``, ``prototypes``) plus ``meta``.
    """
    store = load_store(store_dir)
    k = store["manifest"]["num_classes"]
    if int(torch.as_tensor(train_labels).max()) >= k:
        raise UserError(f"train_labels go up to {int(train_labels.max())} but the store has {k} classes")
    out = annotate(store["images"], store["c1"], store["c2"], encoder, train_images, train_labels, k, sharpness)
    tensors = {**out, "group": store["group"], "member": store["member"]}
    meta = {**encoder_identity(encoder), "sharpness": float(sharpness), "prototype_images": int(len(train_labels)),
            "generator_hash": store["manifest"]["generator_hash"], **(extra_meta or {})}
    write_annotations(store_dir, tensors, meta)
    return {**tensors, "meta": meta}
