"""The global-pooling text CNN: architecture facts, token-input contract, every loss trains on it."""

import pytest
import torch

from calibkit.losses import LOSSES, build
from calibkit.models import MODELS, input_kind, num_parameters
from calibkit.models.text import GlobalPoolingCNN

V, K = 60, 5


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    pass


def _tokens(gen, n=8, length=30):
    x = torch.randint(2, V, (n, length), generator=gen)
    x[0, 10:] = 0  # a short text padded at the end
    return x


def test_parameter_count_matches_the_layer_formula():
    # embedding V*E; three convs (in*C*5 + C); fc C*D + D; head D*K + K
    V_, K_, E, C, D = 20000, 20, 100, 128, 128
    expect = V_ * E + (E * C * 5 + C) + 2 * (C * C * 5 + C) + (C * D + D) + (D * K_ + K_)
    assert num_parameters(MODELS["gpool_cnn"](num_classes=K_, in_channels=V_)) == expect == 2_247_316
    small = MODELS["gpool_cnn_small"](num_classes=K_, in_channels=V_)
    assert small.head.in_features == 64 and small.embedding.embedding_dim == 64
    assert input_kind(small) == "tokens" and input_kind(MODELS["cnn"](num_classes=2, in_channels=1)) == "image"


def test_features_are_global_max_pooled_conv3(gen):
    torch.manual_seed(0)
    m = GlobalPoolingCNN(K, V, embed_dim=8, channels=6, hidden=4).eval()
    x = _tokens(gen)
    with torch.no_grad():
        h = m.embedding(x).transpose(1, 2)
        h = torch.nn.functional.max_pool1d(m.conv1(h).relu(), 5, 1)
        h = torch.nn.functional.max_pool1d(m.conv2(h).relu(), 5, 1)
        # global max over time, written as an explicit loop over positions
        pooled = torch.stack([m.conv3(h).relu()[:, :, t] for t in range(h.shape[2] - 4)], 2).max(2).values
        torch.testing.assert_close(m.forward_features(x), m.fc(pooled).relu())
        torch.testing.assert_close(m(x), m.head(m.forward_features(x)))


def test_short_inputs_are_padded_to_the_receptive_field(gen):
    m = GlobalPoolingCNN(K, V, embed_dim=8, channels=6, hidden=4).eval()
    x = torch.randint(2, V, (3, 7), generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(m(x), m(torch.nn.functional.pad(x, (0, 21 - 7))))
    assert m.min_length == 21


def test_padding_embedding_stays_zero_and_bad_inputs_are_refused(gen):
    m = GlobalPoolingCNN(K, V)
    assert m.embedding.weight[0].abs().sum() == 0
    with pytest.raises(ValueError, match="int64 token ids"):
        m(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match="vocabulary size"):
        GlobalPoolingCNN(K, 1)


@pytest.mark.parametrize("name", list(LOSSES))
def test_every_loss_trains_the_text_model_one_step(name, gen):
    """One SGD step with a small learning rate lowers each loss on the batch it was taken on."""
    torch.manual_seed(0)
    model = MODELS["gpool_cnn_small"](num_classes=K, in_channels=V)
    loss_fn = build(name, num_classes=K).eval()  # eval: FeDLaS's running statistics stay put
    x, y = _tokens(gen), torch.randint(0, K, (8,), generator=gen)
    params = list(model.parameters()) + list(loss_fn.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)

    def value():
        feats = model.forward_features(x)
        return loss_fn(model.head(feats), y, feats)

    before = value()
    opt.zero_grad()
    before.backward()
    emb_before = model.embedding.weight.detach().clone()
    assert model.embedding.weight.grad[x.unique()[1:]].abs().sum(1).gt(0).all()  # every word in the batch learns
    opt.step()
    assert not torch.equal(model.embedding.weight, emb_before)
    with torch.no_grad():
        after = value()
    assert after < before
