"""Training throughput of calibkit models: forward + backward + SGD step, images per second.

    python benchmarks/model_throughput.py [--models resnet20 cnn] [--steps 10] [--batch 128]

Inputs are random tensors of each model's native size (3x32x32 for CIFAR networks, 1x28x28 for
the small ones). Prints one line per model and layout, plus the machine it ran on.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from calibkit.models import MODELS, num_parameters

SMALL = {"cnn", "mlp"}


def measure(name: str, batch: int, steps: int, channels_last: bool) -> float:
    torch.manual_seed(0)
    c, s = (1, 28) if name in SMALL else (3, 32)
    model = MODELS[name](num_classes=10, in_channels=c)
    x, y = torch.randn(batch, c, s, s), torch.randint(0, 10, (batch,))
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(2):  # warm-up: kernel selection and allocator
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet20", "cnn", "mlp"], choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    for name in args.models:
        for cl in (False, True) if name != "mlp" else (False,):  # the MLP has no 4-D weights
            ips = measure(name, args.batch, args.steps, cl)
            layout = "channels_last" if cl else "contiguous"
            print(f"{name:12s} {num_parameters(MODELS[name]()) / 1e6:6.2f}M params  batch {args.batch}  "
                  f"{layout:13s} {ips:8.0f} img/s")  # fmt: skip


if __name__ == "__main__":
    main()
