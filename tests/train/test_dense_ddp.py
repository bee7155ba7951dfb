"""Streamed pixel evaluation under DDP (2 gloo processes) equals the single-process result."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from calibkit.data.bundle import Split
from calibkit.data.inputs import SegmentationInputs
from tests.helpers.ports import free_port as _free_port

K = 4


def _setup():
    torch.manual_seed(0)
    from calibkit.models.segnet import UNet

    model = UNet(K, 1, width=4).eval()
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (5, 1, 12, 12), dtype=torch.uint8, generator=g)  # 5 images: uneven shards
    masks = torch.randint(0, K, (5, 12, 12), dtype=torch.uint8, generator=g)
    masks[torch.rand(5, 12, 12, generator=g) < 0.2] = 255
    return model, Split(images, masks), SegmentationInputs([0.5], [0.3])


def _run(dd):
    from calibkit.train.dense import sample_positions, stream

    model, split, inputs = _setup()
    pos = sample_positions(split.labels, 9, 255)
    accs, sample = stream(model, split, inputs, 2, torch.device("cpu"), dd, temperatures=(1.0, 2.0), positions=pos,
                          num_classes=K)
    return [a.compute() for a in accs], sample


def _worker(rank, port, out_dir):
    from calibkit import distributed as D

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        panels, sample = _run(D.Dist(rank, 2, torch.device("cpu")))
        torch.save({"panels": panels, "sample": sample}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_stream_under_ddp_equals_single_process(tmp_path):
    from calibkit import distributed as D

    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    panels, sample = _run(D.Dist())
    assert panels[0]["acc"] != panels[1]["acc"] or panels[0]["ece"] != panels[1]["ece"]  # T = 2 changes the panel
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        for mine, theirs in zip(panels, got["panels"]):
            for key, value in mine.items():
                # float32 forward passes of different batch compositions differ in the last bits
                assert theirs[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
        torch.testing.assert_close(got["sample"][0], sample[0], rtol=1e-5, atol=1e-6)  # logits of the drawn pixels
        assert torch.equal(got["sample"][1], sample[1]) and torch.equal(got["sample"][2], sample[2])
