"""The frozen ImageNet EfficientNet-Lite0 encoder of CSM's reannotation (``calibkit[pretrained]``)."""

import hashlib

import pytest
import torch
import torch.nn.functional as F

from calibkit.methods.csm.annotate import EfficientNetEncoder, annotate
from tests.models.pretrained_skip import needs_efficientnet

pytestmark = [needs_efficientnet, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def encoder():
    return EfficientNetEncoder(batch_size=7)


@pytest.fixture(scope="module")
def digits():
    from calibkit.data import load

    bundle = load("digits")
    keep = bundle.train.labels < 3
    return bundle.train.images[keep][:150], bundle.train.labels[keep][:150]


def test_features_are_the_backbone_on_rgb_imagenet_scaled_inputs(encoder):
    g = torch.Generator().manual_seed(0)
    grey = torch.randint(0, 256, (5, 1, 28, 28), generator=g, dtype=torch.uint8)
    # the preprocessing written out: RGB by repeating, bilinear to 64, (255 p - 127) / 128 = (u - 127) / 128
    x = F.interpolate((grey.double().repeat(1, 3, 1, 1) - 127.0) / 128.0, size=(64, 64), mode="bilinear",
                      align_corners=False).float()
    model = encoder.model
    with torch.no_grad():
        h = model.top(model.blocks(model.stem(x))).mean(dim=(2, 3))
    got = encoder(grey)
    assert got.shape == (5, 1280) and not model.training
    torch.testing.assert_close(got, h, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(EfficientNetEncoder(batch_size=256)(grey), got, rtol=1e-5, atol=1e-5)  # batch-free
    rgb = grey.repeat(1, 3, 1, 1)
    torch.testing.assert_close(encoder(rgb), got, rtol=1e-5, atol=1e-5)


def test_identity_names_the_weights_and_the_size(encoder):
    from calibkit.models.efficientnet_lite import weights_file

    with open(weights_file(), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    assert encoder.identity == {"encoder": "efficientnet_lite0", "image_size": 64, "weights_sha256": digest}


def test_prototypes_of_real_images_separate_the_classes(encoder, digits):
    images, labels = digits
    # "generated" images that are real images of class 0 or 1, each annotated on the pair (0, 1):
    # the projection must put class-0 images nearer the class-0 prototype than class-1 images
    pair = labels < 2
    gen = images[pair]
    c1, c2 = torch.zeros(len(gen), dtype=torch.long), torch.ones(len(gen), dtype=torch.long)
    out = annotate(gen, c1, c2, encoder, images, labels, num_classes=3)
    lam = out["lam_hat"]
    zero = labels[pair] == 0
    assert lam[zero].mean() > 0.8 and lam[~zero].mean() < 0.2
    # the prototypes are the mean features per class
    feats = encoder(images)
    torch.testing.assert_close(out["prototypes"][2], feats[labels == 2].mean(0), rtol=1e-4, atol=1e-4)


def test_rejects_bad_images_and_sizes(encoder):
    with pytest.raises(ValueError, match=r"expected uint8 images \(N, 1 or 3, H, W\), got \(2, 28, 28\)"):
        encoder(torch.zeros(2, 28, 28, dtype=torch.uint8))
    with pytest.raises(ValueError, match="size must be >= 32"):
        EfficientNetEncoder(size=16)
