"""FeDLaS under DDP (2 gloo processes) equals one process on the same global batch: the model's
gradients averaged by DDP, the gate's by ``calibkit.distributed.average_grads`` (the trainer's
call), the running feature statistics all-reduced."""

import gc
import os

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from calibkit.distributed import Dist, average_grads
from calibkit.losses import FeDLaS
from tests.helpers.ports import free_port as _free_port

K, D, N, STEPS = 6, 5, 16, 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(D, 8)
        self.head = nn.Linear(8, K)

    def forward(self, x):
        z = torch.relu(self.body(x))
        return self.head(z), z


def _setup():
    torch.manual_seed(0)
    net, loss = Net().double(), FeDLaS(K, "mbls", beta=2.0, theta=0.6, margin=2.0).double()
    opt = torch.optim.SGD(list(net.parameters()) + list(loss.parameters()), lr=0.5)
    return net, loss, opt


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(N, D, generator=g, dtype=torch.float64) * 3, torch.randint(0, K, (N,), generator=g))
            for _ in range(STEPS)]


def _state(net, loss):
    return {**{f"net.{k}": v.detach().clone() for k, v in net.state_dict().items()},
            **{f"loss.{k}": v.detach().clone() for k, v in loss.state_dict().items()}}


def _worker(rank, port, out_dir):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        net, loss, opt = _setup()
        ddp = nn.parallel.DistributedDataParallel(net)
        half = slice(0, N // 2) if rank == 0 else slice(N // 2, N)
        for x, y in _batches():
            opt.zero_grad()
            logits, feats = ddp(x[half])
            loss(logits, y[half], feats).backward()
            average_grads(list(loss.parameters()), Dist(rank=rank, world=2))
            opt.step()
        torch.save(_state(net, loss), os.path.join(out_dir, f"rank{rank}.pt"))
        # the wrapper sits in a reference cycle: collected only now, its reducer goes before the
        # group (destroyed at exit, after it, it aborts the process: calibkit.distributed.teardown)
        del ddp, logits, feats
        gc.collect()
    finally:
        torch.distributed.destroy_process_group()


def test_fedlas_ddp_two_processes_equal_one_process_on_the_global_batch(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    net, loss, opt = _setup()
    start = _state(net, loss)
    for x, y in _batches():
        opt.zero_grad()
        logits, feats = net(x)
        loss(logits, y, feats).backward()
        average_grads(list(loss.parameters()), Dist())  # one process: a no-op
        opt.step()
    want = _state(net, loss)
    # The gate and the statistics really moved, so equality below is not that of untouched values.
    for key in ("loss.gate.0.weight", "loss.gate.2.bias", "loss.mu", "loss.sigma", "net.head.weight"):
        assert (want[key] - start[key]).abs().max() > 1e-4, key
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert got.keys() == want.keys()
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-9, atol=1e-12, msg=f"rank {rank}: {key}")


def test_average_grads_fills_missing_gradients_with_zero_and_ignores_one_process():
    p = nn.Parameter(torch.ones(3))
    average_grads([p], Dist())
    assert p.grad is None  # one process: nothing to do
    with pytest.raises(ValueError):  # enabled but no process group: it must try to all-reduce
        average_grads([p], Dist(rank=0, world=2))


def test_teardown_collects_cycles_before_leaving_its_own_group(monkeypatch):
    # the process group outlives every unreachable DDP wrapper: collected first, then destroyed;
    # a group the caller made is not touched
    import calibkit.distributed as D

    calls = []
    monkeypatch.setattr(D.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(D.dist, "destroy_process_group", lambda: calls.append("destroy"))
    monkeypatch.setattr(D.gc, "collect", lambda: calls.append("collect"))
    D.teardown(Dist(rank=0, world=2, owns_group=False))
    assert calls == []
    D.teardown(Dist(rank=0, world=2, owns_group=True))
    assert calls == ["collect", "destroy"]


def test_train_drops_its_run_before_the_teardown(tmp_path, monkeypatch):
    # what train() still references when it leaves the group: nothing of the run (a weak
    # reference to its model is dead by then, in a single process too)
    import weakref

    import calibkit.train.loop as loop
    from calibkit.config import TrainConfig

    refs, seen = [], []
    build = loop.build_run

    def spy_build(*a, **k):
        run = build(*a, **k)
        refs.append(weakref.ref(run.model))
        return run

    def spy_teardown(dd):
        gc.collect()
        seen.append(refs[0]() is None)

    monkeypatch.setattr(loop, "build_run", spy_build)
    monkeypatch.setattr(loop.D, "teardown", spy_teardown)
    cfg = TrainConfig(data="digits", model="mlp", epochs=1, batch_size=64, train_subset=128, val_size=50,
                      num_threads=1, device="cpu")
    loop.train(cfg, tmp_path / "run", progress=False, verbose=False)
    assert seen == [True]
