"""Training-step time with and without ``torch.compile`` (``TrainConfig.compile`` / ``--compile``).

One step is what calibkit's trainer runs: forward (features + head, the trainer's ``(logits,
features)`` wrapper), the loss, backward, gradient clipping and SGD with momentum. The eager and the
compiled model start from the same weights. The compile time (the first steps of the compiled
model) is printed apart; then rounds alternate eager and compiled (``--steps`` steps each, order
flipped every round), and the median per-step ratio compiled / eager is printed, so slow drifts of
a shared machine cancel in the ratio.

    OMP_NUM_THREADS=1 python benchmarks/compile_speed.py                       # MLP of the default preset
    OMP_NUM_THREADS=1 python benchmarks/compile_speed.py --model cnn --batch 128

On the CPU inductor generates C++ (a compiler must be installed); on a GPU, Triton kernels.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

from calibkit.losses import build
from calibkit.models import MODELS


class WithFeatures(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        f = self.model.forward_features(x)
        return self.model.head(f), f


def make_step(net, model, loss_fn, clip: float):
    opt = torch.optim.SGD(list(model.parameters()), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def step(x, y):
        logits, _ = net(x)
        loss = loss_fn(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss

    return step


def timed(step, batches, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for x, y in batches:
        step(x, y)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / len(batches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mlp", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--loss", default="ce")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.num_threads)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    shape = (1, 28, 28) if args.model in ("mlp", "cnn") else (3, 32, 32)
    base = MODELS[args.model](num_classes=10, in_channels=shape[0]).to(dev)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(args.batch, *shape, generator=gen).to(dev),
                torch.randint(0, 10, (args.batch,), generator=gen).to(dev)) for _ in range(args.steps)]
    loss_fn = build(args.loss, num_classes=10).to(dev)

    m_eager, m_comp = copy.deepcopy(base), copy.deepcopy(base)
    eager = make_step(WithFeatures(m_eager), m_eager, loss_fn, 2.0)
    compiled = make_step(torch.compile(WithFeatures(m_comp)), m_comp, loss_fn, 2.0)
    t0 = time.perf_counter()
    for x, y in batches[:3]:  # compiles (the first call) and settles
        compiled(x, y)
    compile_s = time.perf_counter() - t0
    for x, y in batches[:3]:
        eager(x, y)

    t_e, t_c, ratios = [], [], []
    for r in range(args.rounds):
        order = (("eager", eager), ("compiled", compiled))
        res = {name: timed(fn, batches, dev) for name, fn in (order if r % 2 == 0 else order[::-1])}
        t_e.append(res["eager"])
        t_c.append(res["compiled"])
        ratios.append(res["compiled"] / res["eager"])
    print(f"torch {torch.__version__}, device {dev}, torch threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.1f}; model {args.model}, batch {args.batch}, loss {args.loss}")
    print(f"compile (first 3 compiled steps): {compile_s:.1f} s")
    print(f"{'':<10}{'median step (ms)':>18}")
    print(f"{'eager':<10}{1e3 * statistics.median(t_e):>18.2f}")
    print(f"{'compiled':<10}{1e3 * statistics.median(t_c):>18.2f}")
    print(f"compiled / eager step time: median {statistics.median(ratios):.3f} "
          f"(rounds: {' '.join(f'{r:.2f}' for r in ratios)})")
    steps_to_repay = compile_s / max(statistics.median(t_e) - statistics.median(t_c), 1e-12)
    if statistics.median(t_c) < statistics.median(t_e):
        print(f"compile time repaid after ~{steps_to_repay:.0f} steps")
    else:
        print("compiled steps are not faster here: compiling never repays its cost")


if __name__ == "__main__":
    main()
