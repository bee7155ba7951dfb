"""A user's own pretrained network through ``file.py:factory``: a ``backbone_blocks`` method is all
that ``finetune`` and ``backbone_lr_scale`` need (docs/finetuned.md)."""

import textwrap

import pytest
import torch

from calibkit.rundir import read_tensors

pytestmark = pytest.mark.usefixtures("one_thread")

MODULE = textwrap.dedent('''
    import os

    import torch
    from torch import nn

    from calibkit.models.pretrained import PretrainedMixin


    class Net(PretrainedMixin, nn.Module):
        def __init__(self, num_classes, in_channels):
            super().__init__()
            self.stem = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 28 * 28, 32), nn.BatchNorm1d(32), nn.ReLU())
            self.block = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
            self.head = nn.Linear(32, num_classes)

        def backbone_blocks(self):
            return [self.stem, self.block]

        def forward_features(self, x):
            return self.block(self.stem(x))

        def forward(self, x):
            return self.head(self.forward_features(x))


    def make_model(num_classes, in_channels):
        net = Net(num_classes, in_channels)
        weights = torch.load(os.environ["OWN_WEIGHTS"], weights_only=True)
        net.load_state_dict({**weights, **{f"head.{k}": v for k, v in net.head.state_dict().items()}}, strict=True)
        return net
''')


def test_a_factory_with_backbone_blocks_fine_tunes_its_last_block_only(tmp_path, monkeypatch):
    from calibkit.train import load_config, train

    (tmp_path / "own.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import own  # the "pretrained" weights: a fixed draw, saved as the user would ship them

    torch.manual_seed(123)
    pretrained = {k: v for k, v in own.Net(10, 1).state_dict().items() if not k.startswith("head.")}
    torch.save(pretrained, tmp_path / "weights.pt")
    monkeypatch.setenv("OWN_WEIGHTS", str(tmp_path / "weights.pt"))
    cfg = load_config(data="digits", model=f"{tmp_path / 'own.py'}:make_model", epochs=1, lr=0.05, batch_size=64,
                      finetune="last:1", backbone_lr_scale=0.5, num_threads=1, device="cpu")
    train(cfg, tmp_path / "run", progress=False, verbose=False)
    after = read_tensors(tmp_path / "run" / "model.safetensors")
    for key, value in pretrained.items():
        if key.startswith("stem."):  # frozen and in evaluation mode: weights and BatchNorm statistics as loaded
            assert torch.equal(after[key], value), key
        else:  # the last block trains
            assert not torch.equal(after[key], value), key
    assert set(after) - set(pretrained) == {"head.weight", "head.bias"}
