"""CSM on your own image tensors, in your own PyTorch training loop.

Train a small class-conditional generator on your images, generate semantic mixes between classes,
give them soft labels with YOUR encoder (any function images -> features), then train your
classifier on real batches plus the generated companions:

    loss = cross_entropy(real) + soft_l2(generated)      (CSM, ICML 2025)

    python examples/csm_own_data.py --quick     # tiny settings, well under a minute on a CPU
    python examples/csm_own_data.py             # longer: the generated set starts to matter

The data here are scikit-learn's 8x8 digits standing in for your tensors; nothing is downloaded.
"""

import argparse
import tempfile

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from calibkit.functional import soft_l2
from calibkit.methods import csm
from calibkit.metrics import evaluate


class Net(nn.Module):  # your classifier: any model whose penultimate features you can reach
    def __init__(self, k=10):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.head = nn.Linear(256, k)

    def forward(self, x):
        return self.head(self.body(x))


def to_input(images):  # uint8 (N, 1, 8, 8) -> your network's input
    return images.float() / 255.0


def train(net, x, y, epochs, companion=None, seed=0):
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(64):
            loss = F.cross_entropy(net(to_input(x[idx])), y[idx])
            if companion is not None:  # two generated images per real one, with soft labels
                gen_images, gen_soft = companion.draw(y[idx], g)
                loss = loss + soft_l2(net(to_input(gen_images)), gen_soft)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return net.eval()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="tiny settings (a smoke run)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    gen_steps, groups, epochs = (40, 45, 15) if args.quick else (3000, 450, 60)

    # 1. Your data: float images in [0, 1] and integer labels (here 8x8 digits, 1,797 images).
    d = load_digits()
    x_all = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y_all = torch.tensor(d.target)
    perm = torch.randperm(len(y_all))
    tr, te = perm[:1300], perm[1300:]
    images, labels = csm.as_image_tensors(x_all[tr], y_all[tr])  # uint8 (N, 1, 8, 8), int64 (N,)
    test_x, test_y = csm.as_image_tensors(x_all[te], y_all[te])

    # 2. A small generator trained on your images (8x8 runs natively: 8 -> 4 with two levels).
    gen_cfg = csm.GeneratorConfig(num_classes=10, data_size=8, image_size=8, block_out_channels=(16, 32),
                                  attention_levels=(False, True), norm_num_groups=8)
    with tempfile.TemporaryDirectory() as out:
        model = csm.train_generator(images, labels, out, csm.GeneratorTrainConfig(steps=gen_steps, batch_size=64),
                                    gen_cfg, checkpoint_every=gen_steps, progress=False, device="cpu")

    # 3. Semantic mixes: groups of 8 images from one noise, class input moving from c2 to c1.
    mixes = csm.generate(model, num_groups=groups, steps=6 if args.quick else 18, guidance=2.0)

    # 4. Soft labels from YOUR encoder: penultimate features of a network trained on the real images.
    reference = train(Net(), images, labels, epochs)

    def encoder(u8):  # any callable: uint8 images (M, C, H, W) -> features (M, D)
        with torch.no_grad():
            return reference.body(to_input(u8))

    mixes["soft_labels"] = csm.annotate(mixes["images"], mixes["c1"], mixes["c2"], encoder, images, labels,
                                        num_classes=10, sharpness=4.0)["soft_labels"]
    companion = csm.CSMCompanion(mixes, num_classes=10)

    # 5. Your training loop with the companion; compare with plain cross-entropy.
    results = {"mixes": mixes}
    for name, comp in (("cross-entropy", None), ("CSM", companion)):
        torch.manual_seed(1)
        net = train(Net(), images, labels, epochs, comp, seed=1)
        with torch.no_grad():
            probs = net(to_input(test_x)).softmax(1)
        m = evaluate(probs, test_y)
        print(f"{name:<14} test accuracy {m['acc']:.3f}  ECE {100 * m['ece']:.2f}%")
        results[name] = m
    print(f"generated {len(mixes['images'])} images; mean soft label of c1 by position: "
          + " ".join(f"{v:.2f}" for v in mixes['soft_labels'].gather(1, mixes['c1'][:, None]).view(-1, 8).mean(0)))
    return results


if __name__ == "__main__":
    main()
