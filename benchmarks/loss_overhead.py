"""Step-time overhead of every calibkit loss against cross-entropy.

One training step = forward (features + head) + loss + backward + SGD step (model and the loss's
own parameters, e.g. FeDLaS's gate) of a CIFAR ResNet-20 on a batch of 128 random 32x32x3 images,
10 classes. Every loss gets its own copy of the same initial model. Rounds are interleaved: each
round runs ``--steps`` steps of every loss in a fresh random order, and each loss's time is divided
by cross-entropy's time in the same round, so slow drifts of a shared machine cancel in the ratio.
The reported ratio is the median over rounds.

    OMP_NUM_THREADS=1 python benchmarks/loss_overhead.py --rounds 15 --steps 2

Prints machine information and, per loss, the median step time and the median ratio to CE.
Target: every ratio <= 1.05. On a busy shared CPU the step ratios scatter by several percent, so
the script also times the loss alone (forward + backward on fixed logits/features, many
interleaved repeats) and reports ``1 + (loss - CE) / CE step``, the overhead that the loss itself
adds to a step, which is far less sensitive to machine noise.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import random
import statistics
import time

import torch

from calibkit.losses import LOSSES, build
from calibkit.models import MODELS


def machine_info(device: torch.device) -> str:
    lines = [f"python {platform.python_version()}, torch {torch.__version__}, {platform.platform()}",
             f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
             f"torch threads {torch.get_num_threads()}"]
    try:
        lines.append(f"load average (1, 5, 15 min): {os.getloadavg()}")
    except OSError:  # pragma: no cover - not on every platform
        pass
    if device.type == "cuda":
        lines.append(f"gpu: {torch.cuda.get_device_name(device)}")
    return "\n".join(lines)


def make_runner(name: str, base_model: torch.nn.Module, device: torch.device):
    """A closure running one training step with loss ``name`` on its own model copy."""
    model = copy.deepcopy(base_model).to(device)
    loss_fn = build(name, num_classes=10).to(device)
    params = list(model.parameters()) + list(loss_fn.parameters())  # the trainer's convention
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4)
    needs_features = getattr(loss_fn, "needs_features", False)

    def step(x, y):
        feats = model.forward_features(x)
        logits = model.head(feats)
        loss = loss_fn(logits, y, feats if needs_features else None)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def loss_only_times(device, batch, reps, rounds, rng, sync):
    """Median seconds of loss forward + backward on fixed (batch, 10) logits and (batch, 64) features."""
    logits = torch.randn(batch, 10, device=device) * 3
    feats = torch.randn(batch, 64, device=device).abs()
    y = torch.randint(0, 10, (batch,), device=device)
    losses = {name: build(name, num_classes=10).to(device) for name in LOSSES}
    for fn in losses.values():  # warm-up
        fn(logits.detach().requires_grad_(), y, feats).backward()
    times = {name: [] for name in losses}
    for _ in range(rounds):
        order = list(losses)
        rng.shuffle(order)
        for name in order:
            fn = losses[name]
            sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                x = logits.detach().requires_grad_()
                fn(x, y, feats).backward()
            sync()
            times[name].append((time.perf_counter() - t0) / reps)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=2, help="steps per loss per round")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--loss-reps", type=int, default=50, help="repeats per round of the loss-only timing")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    base = MODELS["resnet20"](num_classes=10, in_channels=3)
    x = torch.randn(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    runners = {name: make_runner(name, base, device) for name in LOSSES}
    for step in runners.values():  # warm-up (allocator, first-call overheads)
        step(x, y)
    sync()

    times = {name: [] for name in runners}
    for _ in range(args.rounds):
        order = list(runners)
        rng.shuffle(order)
        for name in order:
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                runners[name](x, y)
            sync()
            times[name].append((time.perf_counter() - t0) / args.steps)

    alone = loss_only_times(device, args.batch, args.loss_reps, args.rounds, rng, sync)
    ce_step = statistics.median(times["ce"])

    print(machine_info(device))
    print(f"ResNet-20, batch {args.batch}, {args.rounds} rounds x {args.steps} steps, device {device}")
    print(f"{'loss':<12} {'median ms':>10} {'ratio to CE':>12} {'IQR of ratio':>14} "
          f"{'loss alone ms':>14} {'1+(loss-CE)/step':>17}")
    for name in runners:
        ratios = [t / c for t, c in zip(times[name], times["ce"])]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        print(f"{name:<12} {1000 * statistics.median(times[name]):>10.1f} {statistics.median(ratios):>12.3f} "
              f"{q[0]:>6.3f}-{q[2]:.3f} {1000 * alone[name]:>14.3f} "
              f"{1 + (alone[name] - alone['ce']) / ce_step:>17.4f}")


if __name__ == "__main__":
    main()
