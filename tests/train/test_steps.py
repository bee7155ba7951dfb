"""The training steps (calibkit.train.steps) against independent computations.

Each method's step is recomputed here from the public pieces it is made of (the mixing functions,
the CSM companion, the input pipeline, the soft losses) with identically seeded generators; the
config wiring of ``build_step`` and the epoch records of ``EpochSums`` are checked against hand
counts.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from calibkit import functional as F_
from calibkit.config import TrainConfig
from calibkit.data import mixup, regmixup
from calibkit.data.inputs import ImageInputs
from calibkit.methods.csm.dataset import CSMCompanion
from calibkit.train.steps import CSM, EpochGenerators, EpochSums, Mixup, RegMixup, Standard, build_step

K, B = 4, 6


class Net(nn.Module):
    """Returns ``(logits, features)`` as the loop's wrapped model does."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head = nn.Linear(16, 3), nn.Linear(3, K)

    def forward(self, x):
        f = torch.tanh(self.body(x.flatten(1)))
        return self.head(f), f


class Recorder:
    """Cross-entropy that records the feature argument it is given (``needs``: its declaration)."""

    def __init__(self, needs=None):
        if needs is not None:
            self.needs_features = needs
        self.got = []

    def __call__(self, logits, y, feats=None):
        self.got.append(feats)
        return F.cross_entropy(logits, y)


def gens(aug_seed=11, draw_seed=22):
    return EpochGenerators(aug=torch.Generator().manual_seed(aug_seed), draw=torch.Generator().manual_seed(draw_seed))


def batch():
    g = torch.Generator().manual_seed(5)
    return torch.randn(B, 1, 4, 4, generator=g), torch.tensor([0, 1, 2, 3, 1, 2])


def test_standard_passes_features_only_to_losses_that_declare_them():
    net, (x, y) = Net(), batch()
    plain = Recorder()  # no needs_features attribute at all
    loss, logits, target = Standard(plain)(net, x, y, y, gens())
    assert plain.got == [None] and target is y
    torch.testing.assert_close(loss, F.cross_entropy(net(x)[0], y))
    torch.testing.assert_close(logits, net(x)[0])
    for needs in (False, True):
        rec = Recorder(needs)
        Standard(rec)(net, x, y, y, gens())
        assert (rec.got[0] is None) is (not needs)
        if needs:
            torch.testing.assert_close(rec.got[0], net(x)[1])


def test_mixup_step_draws_from_the_epoch_generator():
    net, (x, y) = Net(), batch()
    loss, logits, target = Mixup(Recorder(), num_classes=K, mix_alpha=0.4)(net, x, y, y, gens(aug_seed=3))
    x_mix, soft = mixup(x, y, K, 0.4, torch.Generator().manual_seed(3))
    torch.testing.assert_close(logits, net(x_mix)[0])
    torch.testing.assert_close(loss, F_.soft_cross_entropy(net(x_mix)[0], soft))
    assert torch.equal(target, soft.argmax(1))


def test_regmixup_step_is_clean_loss_plus_mixed_soft_ce():
    net, (x, y) = Net(), batch()
    rec = Recorder(needs=True)
    loss, logits, target = RegMixup(rec, num_classes=K, mix_alpha=20.0)(net, x, y, y, gens(aug_seed=4))
    x_cat, soft = regmixup(x, y, K, 20.0, torch.Generator().manual_seed(4))
    all_logits, feats = net(x_cat)
    expected = F.cross_entropy(all_logits[:B], y) + F_.soft_cross_entropy(all_logits[B:], soft[B:])
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(logits, net(x)[0])
    assert target is y
    torch.testing.assert_close(rec.got[0], feats[:B])  # the clean rows' features only
    assert rec.got[0].shape == (B, 3)


def companion_tensors(groups: int = 6):
    """An annotated store as tensors: every ordered class pair once, 8 members per group."""
    g = torch.Generator().manual_seed(9)
    pairs = [(a, b) for a in range(K) for b in range(K) if a < b][:groups]
    c1 = torch.tensor([a for a, _ in pairs]).repeat_interleave(8)
    c2 = torch.tensor([b for _, b in pairs]).repeat_interleave(8)
    lam = torch.arange(8).float().div(7).repeat(len(pairs))
    soft = torch.softmax(torch.randn(len(pairs) * 8, K, generator=g), 1)
    images = torch.randint(0, 256, (len(pairs) * 8, 1, 4, 4), dtype=torch.uint8, generator=g)
    return {"images": images, "c1": c1, "c2": c2, "lam": lam, "soft_labels": soft}


@pytest.mark.parametrize("weight,per_real,kind", [(2.0, 4, "l2"), (1.0, 2, "ce"), (0.5, 2, "l2")])
def test_csm_step_adds_the_weighted_loss_on_augmented_generated_images(weight, per_real, kind):
    net, (x, y) = Net(), batch()
    inputs = ImageInputs((0.5,), (0.25,), crop_pad=1, hflip=True)  # random: the generator matters
    companion = CSMCompanion(companion_tensors(), K, seed=0)
    rec = Recorder(needs=True)
    step = CSM(rec, companion, inputs, csm_weight=weight, csm_per_real=per_real, csm_loss=kind)
    loss, logits, target = step(net, x, y, y, gens(aug_seed=7, draw_seed=8))
    # the same draws by hand: the companion with the epoch's draw generator, then the pipeline's
    # augmentation with the epoch's augmentation generator
    gen_x, gen_soft = companion.draw(y, torch.Generator().manual_seed(8), per_real=per_real)
    assert len(gen_x) == per_real * B
    gen_x, _ = inputs.train_batch(gen_x, None, torch.Generator().manual_seed(7))
    all_logits, feats = net(torch.cat([x, gen_x]))
    gen_loss = (F_.soft_l2 if kind == "l2" else F_.soft_cross_entropy)(all_logits[B:], gen_soft)
    torch.testing.assert_close(loss, F.cross_entropy(all_logits[:B], y) + weight * gen_loss)
    torch.testing.assert_close(logits, all_logits[:B])
    torch.testing.assert_close(rec.got[0], feats[:B])
    assert target is y


def test_build_step_wires_the_config(monkeypatch):
    inputs = ImageInputs((0.5,), (0.25,))

    def step(num_classes=10, seed=0, **kw):
        return build_step(TrainConfig(**kw), Recorder(), num_classes, inputs, seed)

    # Mixup / RegMixup alpha: 0.2 for Mixup, RegMixup 20 (10 from 100 classes on); a given value wins
    assert step(method="mixup").alpha == 0.2
    assert ((step(method="regmixup", num_classes=99).alpha, step(method="regmixup", num_classes=100).alpha)
            == (20.0, 10.0))
    assert step(method="mixup", mix_alpha=0.7).alpha == 0.7 and step(method="regmixup", mix_alpha=3.0).alpha == 3.0
    assert type(step(method="standard")) is Standard and type(step(method="regmixup")) is RegMixup
    for spec in ("ce", " CE ", "ce:"):  # any spelling of cross-entropy
        assert type(step(method="mixup", loss=spec)) is Mixup
    with pytest.raises(ValueError, match="method mixup trains with soft-label cross-entropy; "
                                         "loss must be 'ce', got 'ls:smoothing=0.1'"):
        step(method="mixup", loss="ls:smoothing=0.1")

    class Dense(ImageInputs):
        dense = True

    dense = Dense((0.5,), (0.25,))
    assert type(build_step(TrainConfig(), Recorder(), 3, dense, 0)) is Standard
    with pytest.raises(ValueError,
                       match="method 'mixup' mixes whole images.*segmentation trains with method 'standard'"):
        build_step(TrainConfig(method="mixup"), Recorder(), 3, dense, 0)

    import calibkit.methods.csm.dataset as csm_dataset

    made = []

    class Companion:
        def __init__(self, *args, **kwargs):
            made.append((args, kwargs))

    monkeypatch.setattr(csm_dataset, "CSMCompanion", Companion)
    for kind, fn in (("l2", F_.soft_l2), ("ce", F_.soft_cross_entropy)):
        s = step(num_classes=7, seed=13, method="csm", csm_data="store", csm_weight=0.5, csm_per_real=4, csm_loss=kind)
        assert type(s) is CSM and isinstance(s.companion, Companion) and s.inputs is inputs
        assert (s.weight, s.per_real, s.gen_loss) == (0.5, 4, fn)
    assert made == [(("store", 7, 13), {})] * 2  # the run's seed seeds the companion's own generator


def test_epoch_sums_read_the_steps_so_far():
    sums = EpochSums(3, "cpu")
    assert sums.read() == (0.0, 0.0, 0.0, -1, 0.0)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0], [0.0, 5.0]])
    sums.add(0, torch.tensor(0.5), logits, torch.tensor([0, 0, 0, 1]))  # 3 of 4 right
    sums.add(1, torch.tensor(1.5), logits[:2], torch.tensor([1, 1]))  # 1 of 2 right
    # after 2 of 3 steps: the loss sum weights each step's mean loss by its batch size
    assert sums.read() == (0.5 * 4 + 1.5 * 2, 4.0, 6.0, -1, 0.0)


def test_epoch_sums_name_the_first_non_finite_step():
    sums = EpochSums(4, "cpu")
    logits, target = torch.zeros(2, 3), torch.tensor([0, 1])
    for step, value in enumerate([1.0, math.inf, math.nan, 2.0]):
        sums.add(step, torch.tensor(value), logits, target)
    total, _, _, first, bad = sums.read()
    assert math.isnan(total) and (first, bad) == (1, math.inf)
    sums = EpochSums(2, "cpu")
    sums.add(0, torch.tensor(math.nan), logits, target)
    sums.add(1, torch.tensor(0.25), logits, target)
    _, _, _, first, bad = sums.read()
    assert first == 0 and math.isnan(bad)


def test_epoch_sums_count_labelled_positions_of_one_dimensional_dense_targets():
    sums = EpochSums(1, "cpu")
    logits = torch.zeros(2, 3, 4)  # (N, K, L): a dense target over one spatial axis
    logits[:, 2] = 1.0  # predicts class 2 everywhere
    target = torch.tensor([[2, 3, 0, -1], [2, 2, 255, 1]])  # 3, -1 and 255 lie outside [0, 3): void
    sums.add(0, torch.tensor(0.5), logits, target)
    assert sums.read() == (0.5 * 5, 3.0, 5.0, -1, 0.0)
