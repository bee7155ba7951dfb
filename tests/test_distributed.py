"""``calibkit.distributed`` in one process: device resolution, evaluation batch sizes, what
``setup`` reads from torchrun's environment, and the shards each rank gets (the collective
operations themselves run under torchrun in ``tests/train/test_loop.py`` and ``tests/test_metrics.py``)."""

import pytest
import torch

from calibkit import distributed as D


@pytest.fixture
def cuda_present(monkeypatch):
    """A machine that reports a CUDA device (torch.device objects need no real GPU)."""
    monkeypatch.setattr(D.torch.cuda, "is_available", lambda: True)
    set_to = []
    monkeypatch.setattr(D.torch.cuda, "set_device", set_to.append)
    return set_to


def test_resolve_device_without_cuda():
    assert D.resolve_device("auto") == torch.device("cpu") and D.resolve_device("auto", 3) == torch.device("cpu")
    assert D.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError) as err:
        D.resolve_device("gpu0")
    assert str(err.value) == "device: unknown device 'gpu0' (use auto, cpu, cuda or cuda:N)"
    with pytest.raises(ValueError) as err:
        D.resolve_device("cuda:1")
    assert str(err.value) == "device: 'cuda:1' requested but CUDA is not available"


def test_resolve_device_with_cuda(cuda_present):
    assert D.resolve_device("auto") == torch.device("cuda:0")
    assert D.resolve_device("auto", 2) == torch.device("cuda:2")
    assert D.resolve_device("cuda:1") == torch.device("cuda:1") and D.resolve_device("cpu") == torch.device("cpu")


def test_eval_batch_size_by_device_type():
    assert D.eval_batch_size(None) == 128 == D.eval_batch_size("cpu") == D.eval_batch_size(torch.device("cpu"))
    assert D.eval_batch_size("cuda:1") == 1024 == D.eval_batch_size("mps")
    assert D.eval_batch_size("cuda", "7") == 7 and D.eval_batch_size(None, 3) == 3


def test_setup_of_a_single_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert D.setup() == D.Dist(0, 1, torch.device("cpu"), False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("world_size", "4")
    assert D.setup("cpu") == D.Dist(0, 1, torch.device("cpu"))
    with pytest.raises(ValueError, match="requested but CUDA is not available"):  # checked in one process too
        D.setup("cuda")


def test_setup_under_torchrun_joins_the_group_on_its_local_device(monkeypatch, cuda_present):
    joined = []
    monkeypatch.setattr(D.dist, "is_initialized", lambda: bool(joined))
    monkeypatch.setattr(D.dist, "init_process_group", lambda backend: joined.append(backend))
    monkeypatch.setattr(D.dist, "get_rank", lambda: 3)
    monkeypatch.setattr(D.dist, "get_world_size", lambda: 4)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("local_rank", "2")
    assert D.setup() == D.Dist(3, 4, torch.device("cuda:1"), True)
    assert joined == ["nccl"] and cuda_present == [torch.device("cuda:1")]
    assert D.setup("cpu") == D.Dist(3, 4, torch.device("cpu"), False)  # a group exists already: not its owner
    assert joined == ["nccl"] and len(cuda_present) == 1
    joined.clear()
    monkeypatch.delenv("LOCAL_RANK")
    assert D.setup("cpu") == D.Dist(3, 4, torch.device("cpu"), True) and joined == ["gloo"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    joined.clear()
    assert D.setup("auto").device == torch.device("cuda:0") and joined == ["nccl"]


def test_shards_pad_with_the_head_and_evaluation_chunks_are_contiguous():
    g = lambda: torch.Generator().manual_seed(2)  # noqa: E731
    perm = torch.randperm(10, generator=g())
    assert torch.equal(D.train_shard(10, g(), D.Dist(0, 1)), perm)
    padded = torch.cat([perm, perm[:2]])  # 10 samples over 4 ranks: 3 each, the first 2 again
    for r in range(4):
        assert torch.equal(D.train_shard(10, g(), D.Dist(r, 4)), padded[r::4])
    halves = [D.train_shard(10, g(), D.Dist(r, 2)) for r in range(2)]
    assert torch.equal(halves[0], perm[0::2]) and torch.equal(halves[1], perm[1::2])
    assert [D.eval_shard(10, D.Dist(r, 4))[0].tolist() for r in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8],
                                                                             [9, 9, 9]]
    assert D.eval_shard(10, D.Dist(1, 4))[1] == 3 and D.eval_shard(0, D.Dist(0, 2))[1] == 0
    assert D.eval_shard(0, D.Dist(0, 2))[0].tolist() == []
    assert [D.eval_shard(1, D.Dist(r, 2))[0].tolist() for r in range(2)] == [[0], [0]]  # padding repeats row 0


def test_one_process_operations_pass_their_values_through():
    one = D.Dist()
    t = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(D.gather_rows(t, 2, one), t[:2])
    assert D.all_reduce_sum((1.5, 2), one) == [1.5, 2]
    p = torch.nn.Parameter(torch.ones(2))
    D.average_grads([p], one)
    assert p.grad is None
    D.barrier(one)
    D.teardown(one)
