"""Training wiring pinned to independent re-computations: MaC-Cal stage 2's optimiser (SGD with
momentum and weight decay, cosine schedule, gradient clipping) and CSM's training step (the
generated images normalised like the real ones, the soft-L2 term added with weight 1)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from calibkit.losses import build as build_loss
from calibkit.methods.maccal.masking import masked_linear
from calibkit.methods.maccal.stage2 import fit_masked_head

K, D = 4, 6


def _problem(seed=0, n=50, m=30):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(K, D, generator=g) * 2
    y, yv = torch.randint(0, K, (n,), generator=g), torch.randint(0, K, (m,), generator=g)
    x = centers[y] + torch.randn(n, D, generator=g)
    xv = centers[yv] + torch.randn(m, D, generator=g)
    head = nn.Linear(D, K)
    with torch.no_grad():
        head.weight.copy_(torch.randn(K, D, generator=g) * 0.3)
        head.bias.copy_(torch.randn(K, generator=g) * 0.1)
    return head, x, y, xv, yv


def reference_stage2(head, x, y, *, r, epochs, lr, momentum, wd, batch_size, clip, seed):
    """Stage 2 with a constant keep rate written out by hand: per epoch one shuffle, a fresh mask
    per mini-batch (same generator stream), cross-entropy, global-norm clip, SGD update
    ``buf = momentum * buf + (grad + wd * w)``, ``w -= lr_e * buf`` with
    ``lr_e = lr (1 + cos(pi (e - 1) / E)) / 2``. Returns the weights after every epoch."""
    w, b = head.weight.detach().clone(), head.bias.detach().clone()
    buf_w, buf_b = torch.zeros_like(w), torch.zeros_like(b)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for e in range(1, epochs + 1):
        lr_e = lr * (1 + math.cos(math.pi * (e - 1) / epochs)) / 2
        perm = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), batch_size):
            idx = perm[start:start + batch_size]
            wq, bq = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
            F.cross_entropy(masked_linear(x[idx], wq, bq, r, gen), y[idx]).backward()
            gw, gb = wq.grad, bq.grad
            if clip:
                norm = math.sqrt(float(gw.pow(2).sum() + gb.pow(2).sum()))
                scale = min(1.0, clip / (norm + 1e-6))
                gw, gb = gw * scale, gb * scale
            buf_w = momentum * buf_w + gw + wd * w
            buf_b = momentum * buf_b + gb + wd * b
            w, b = w - lr_e * buf_w, b - lr_e * buf_b
        out.append((w.clone(), b.clone()))
    return out


@pytest.mark.parametrize("clip", [0.05, None])
def test_stage2_optimiser_schedule_and_clipping_equal_a_hand_written_loop(clip):
    head, x, y, xv, yv = _problem()
    hp = dict(epochs=4, lr=0.3, momentum=0.8, weight_decay=0.01, batch_size=16, seed=5)
    best, hist = fit_masked_head(head, x, y, xv, yv, r_init=0.7, eta=0.0, r_min=0.1, grad_clip=clip,
                                 mc_samples=0, **hp)
    assert hist["keep_rates"] == [0.7] * 4  # eta = 0: the keep rate never moves
    lrs = [rec["lr"] for rec in hist["records"][1:]]
    assert lrs == pytest.approx([0.3 * (1 + math.cos(math.pi * e / 4)) / 2 for e in range(4)], abs=1e-12)
    ref = reference_stage2(head, x, y, r=0.7, epochs=4, lr=0.3, momentum=0.8, wd=0.01, batch_size=16,
                           clip=clip, seed=5)
    w, b = ref[hist["best_epoch"] - 1]
    torch.testing.assert_close(best.weight, w, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(best.bias, b, rtol=1e-4, atol=1e-5)
    # The selected epoch is the one whose deployed (here: unmasked) head has the lowest val ECE.
    eces = [rec["val_ece"] for rec in hist["records"][1:]]
    assert hist["best_epoch"] == 1 + eces.index(min(eces))


def test_stage2_clipping_is_active_and_zero_disables_it():
    head, x, y, xv, yv = _problem(seed=1)
    common = dict(r_init=0.9, eta=0.0, epochs=1, lr=0.5, momentum=0.0, batch_size=25, mc_samples=0, seed=2)

    def last_weights(clip):  # one epoch: the returned head is that epoch's (2 SGD steps)
        h, _ = fit_masked_head(head, x, y, xv, yv, grad_clip=clip, **common)
        return h.weight

    off, zero, tight = last_weights(None), last_weights(0), last_weights(0.01)
    assert torch.equal(off, zero)
    assert (off - tight).abs().max() > 1e-3
    # With a tight clip each of the 2 steps moves the weights by at most lr * (clip + weight-decay term).
    step = (tight - head.weight).norm()
    assert step < 2 * 0.5 * (0.01 + 5e-4 * head.weight.norm()) + 1e-6


class _Companion:
    """Returns fixed generated images (uint8) and soft labels for any draw."""

    def __init__(self, images, soft):
        self.images, self.soft, self.calls = images, soft, []

    def draw(self, y_cpu, generator, per_real=2):
        self.calls.append((y_cpu.clone(), per_real))
        return self.images, self.soft


class _Recorder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2 * 3 * 3, K)
        self.seen = None

    def forward(self, x):
        self.seen = x.detach().clone()
        z = x.flatten(1)
        return self.lin(z), z


def test_csm_step_normalises_generated_images_and_adds_soft_l2_with_weight_one():
    from calibkit.data.inputs import ImageInputs
    from calibkit.train.steps import CSM, EpochGenerators

    g = torch.Generator().manual_seed(0)
    b = 3
    mean, std = [0.2, 0.6], [0.5, 0.25]
    inputs = ImageInputs(mean, std)  # no crop, no flip: train_batch is the normalisation alone
    real = torch.randn(b, 2, 3, 3, generator=g)
    y = torch.tensor([0, 3, 1])
    gen_img = torch.randint(0, 256, (2 * b, 2, 3, 3), generator=g, dtype=torch.int64).to(torch.uint8)
    soft = torch.softmax(torch.randn(2 * b, K, generator=g), 1)
    companion = _Companion(gen_img, soft)
    step = CSM(build_loss("ce", num_classes=K), companion=companion, inputs=inputs)
    net = _Recorder()
    loss, logits, target = step(net, real, y, y, EpochGenerators(aug=torch.Generator(), draw=torch.Generator()))
    assert (len(companion.calls) == 1 and torch.equal(companion.calls[0][0], y)
            and companion.calls[0][1] == 2)  # default per_real
    # The generated half of the forward batch: (x / 255 - mean) / std per channel.
    m, s = torch.tensor(mean).view(1, 2, 1, 1), torch.tensor(std).view(1, 2, 1, 1)
    want_gen = (gen_img.float() / 255 - m) / s
    assert torch.equal(net.seen[:b], real)
    torch.testing.assert_close(net.seen[b:], want_gen, rtol=0, atol=1e-6)
    # loss = CE(real) + mean_i sum_k (softmax(gen logits)_ik - soft_ik)^2
    with torch.no_grad():
        all_logits = net.lin(torch.cat([real, want_gen]).flatten(1))
        p = torch.softmax(all_logits[b:], 1)
        want = F.cross_entropy(all_logits[:b], y) + ((p - soft) ** 2).sum(1).mean()
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert torch.equal(target, y) and logits.shape == (b, K)
    torch.testing.assert_close(logits.detach(), all_logits[:b], rtol=0, atol=1e-5)


def test_csm_step_augments_generated_images_like_real_ones():
    from calibkit.data.inputs import ImageInputs
    from calibkit.train.steps import CSM, EpochGenerators

    g = torch.Generator().manual_seed(3)
    inputs = ImageInputs([0.0, 0.0], [1.0, 1.0], crop_pad=0, hflip=True)
    gen_img = torch.randint(0, 256, (40, 2, 3, 3), generator=g, dtype=torch.int64).to(torch.uint8)
    soft = torch.full((40, K), 1.0 / K)
    step = CSM(build_loss("ce", num_classes=K), companion=_Companion(gen_img, soft), inputs=inputs)
    net = _Recorder()
    y = torch.zeros(20, dtype=torch.long)
    step(net, torch.zeros(20, 2, 3, 3), y, y, EpochGenerators(aug=torch.Generator().manual_seed(0),
                                                              draw=torch.Generator()))
    seen = net.seen[20:]
    plain, flipped = gen_img.float() / 255, gen_img.flip(-1).float() / 255
    same = (seen - plain).abs().flatten(1).amax(1) < 1e-6
    mirrored = (seen - flipped).abs().flatten(1).amax(1) < 1e-6
    assert (same | mirrored).all() and same.any() and mirrored.any()


def test_maccal_loss_stage1_reuses_the_stage1_runs_loss(tmp_path, one_thread):
    from calibkit import rundir
    from calibkit.methods.maccal import run_maccal
    from calibkit.train import load_config, train

    s1 = tmp_path / "s1"
    train(load_config(data="digits", model="mlp", epochs=1, num_threads=1, device="cpu", loss="ls:alpha=0.3"),
          s1, progress=False, verbose=False)
    heads = {}
    for loss in ("stage1", "ls:alpha=0.3", "ce"):
        out = tmp_path / loss.replace(":", "_")
        run_maccal(s1, out, loss=loss, epochs=2, mc_samples=4, seed=0, device="cpu", log=lambda _: None)
        rec = json.loads((out / "maccal.json").read_text())
        assert rec["hparams"]["loss"] == ("ls:alpha=0.3" if loss == "stage1" else loss)
        heads[loss] = rundir.read_tensors(out / "model.safetensors")["head.weight"]
    assert torch.equal(heads["stage1"], heads["ls:alpha=0.3"])
    assert not torch.equal(heads["stage1"], heads["ce"])
