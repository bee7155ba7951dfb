"""Two processes in one gloo process group, for the tests of what synchronises across ranks."""

import os

import torch.multiprocessing as mp

from tests.helpers.ports import free_port


def _worker(rank, world, port, shard, args, out):
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out[rank] = shard(rank, *args)
    finally:
        dist.destroy_process_group()


def on_two_processes(shard, *args) -> dict:
    """``{rank: shard(rank, *args)}`` computed in two spawned processes that share a gloo group.

    ``shard`` must be a module-level function (the spawned processes import it by name) and return
    something picklable.
    """
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(2, free_port(), shard, args, out), nprocs=2, join=True)
        return dict(out)
