"""Where a bench run's wall time goes, against the time of its bare training steps.

One process runs a bench of a preset (by default ``default`` with method ``ce`` and seed 0: one
full run of 40 epochs; ``--epochs`` shortens it) and, side by side in the same process, before
and after the bench (averaged, against drift), the *bare training steps* of every trained run:
the same model, loss, method step, batches (sliced from the training tensor on the device),
gradient clipping and SGD, for the same number of steps, and nothing else -- no per-step
bookkeeping, no validation, no checkpoints, no evaluation.

Phases of the bench's wall time (exclusive, so nothing is counted twice):

* ``import``  -- importing torch and the calibkit modules the bench command uses, and
  ``torch._dynamo``, which the first ``torch.optim`` optimizer of a process imports;
* ``data``    -- ``calibkit.data.load`` in every run; ``rawread``: decoding the data set's files,
  which a process does once (``calibkit.data.datasets`` keeps the last read); ``evaldata``: the
  bench's evaluation sets (its own load, the OOD and the corrupted test sets: ``Bench.eval_data``,
  ``EvalData``);
* ``train``   -- ``calibkit.train.train`` minus its data loading, split into ``steps`` (the epochs'
  step loops), ``validate`` (the validation pass of every epoch: the checkpoint policy needs it),
  ``ckpt`` (checkpoint writes), ``finish`` (the kept weights' val/test logits) and set-up;
* ``eval``    -- ``calibkit.bench.evaluation.evaluate_run`` minus the evaluation data;
* ``report``  -- ``calibkit.report.build_report``;
* ``other``   -- the rest (database, claims).

Printed: each phase as a share of the wall time; the per-run overhead (what every run of a bench
costs beyond its bare steps: its data load, its train loop's extra and its evaluation) over the
bare steps; and the same with the once-per-bench costs (import, evaluation data, report) spread
over the preset's full number of runs. Target: per-run overhead <= 10%. Also timed side by side:
the *bare validation passes* (the model's logits on the validation split once per epoch, nothing
else), the computation the checkpoint policy needs whatever the loop around it does, and the
per-run overhead beyond the bare steps and those passes together. Last, the loop's own cost per
step without the machine's drift: on one run, the loop's epoch and a bare epoch (and the loop's
validation and a bare pass) alternate epoch by epoch (:func:`interleaved`).

    OMP_NUM_THREADS=1 python benchmarks/bench_overhead.py                  # one default CE run
    OMP_NUM_THREADS=1 python benchmarks/bench_overhead.py --epochs 4 --methods ce mixup

On a shared machine the absolute times are noisy; the ratios come from one process.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401  (the first torch.optim optimizer imports it: ~2 s, once per process)

import calibkit.bench.evaluation as evaluation  # noqa: E402
import calibkit.bench.runner as runner  # noqa: E402
import calibkit.cli  # noqa: E402,F401
import calibkit.commands.bench  # noqa: E402,F401
import calibkit.data as data  # noqa: E402
import calibkit.data.datasets as datasets  # noqa: E402
import calibkit.report as report  # noqa: E402
import calibkit.train as train_pkg  # noqa: E402
import calibkit.train.loop as loop  # noqa: E402
from calibkit import _validation  # noqa: E402
from calibkit import distributed as D  # noqa: E402
from calibkit.bench.grid import BENCH_METHODS, get_preset  # noqa: E402
from calibkit.train.evaluate import ClassificationEvaluator  # noqa: E402
from calibkit.train.steps import EpochGenerators  # noqa: E402

T_IMPORTED = time.perf_counter()
_TRAIN_EPOCH = loop._train_epoch  # unwrapped, for interleaved()


class Phases:
    """Exclusive time per phase: a phase entered inside another pauses the outer one."""

    def __init__(self):
        self.total = defaultdict(float)
        self.stack = []  # [phase, start]

    @contextlib.contextmanager
    def phase(self, name: str):
        if name == "data" and self.stack and self.stack[-1][0] == "evaldata":
            name = "evaldata"  # the load behind the evaluation sets is theirs (once per bench)
        now = time.perf_counter()
        if self.stack:
            outer = self.stack[-1]
            self.total[outer[0]] += now - outer[1]
        self.stack.append([name, now])
        try:
            yield
        finally:
            now = time.perf_counter()
            inner = self.stack.pop()
            self.total[inner[0]] += now - inner[1]
            if self.stack:
                self.stack[-1][1] = now

    def timed(self, fn, name: str):
        @functools.wraps(fn)
        def timed(*a, **k):
            with self.phase(name):
                return fn(*a, **k)

        return timed

    def wrap(self, owner, attr: str, name: str, *more_owners) -> None:
        timed = self.timed(getattr(owner, attr), name)
        for o in (owner, *more_owners):
            setattr(o, attr, timed)


def _built(cfg):
    """A fresh run of ``cfg`` as the training loop builds it (``calibkit.train.run.build_run``)."""
    dd = D.setup(cfg.device)
    with tempfile.TemporaryDirectory() as tmp:
        return loop.build_run(cfg, dd, None, Path(tmp), lambda *a, **k: None)


def bare_steps(cfg) -> tuple[float, float]:
    """Seconds of ``cfg.epochs`` epochs of bare steps (same model, loss, step, batches, clip, SGD),
    and of the bare passes over the validation split after each (:func:`bare_validation`), timed
    apart but interleaved as in training, so each pass starts with the caches an epoch leaves."""
    run = _built(cfg)
    steps = val = 0.0
    for epoch in range(cfg.epochs):
        steps += bare_epochs(run, 1, first=epoch)
        val += bare_validation(run, 1)
    return steps, val


def interleaved(cfg) -> dict:
    """The loop's epoch and validation against the bare ones, alternating epoch by epoch on one
    built run (bare first on even epochs, the loop's first on odd ones), so that a drift of the
    machine's speed hits both alike: seconds of each, summed over ``cfg.epochs`` epochs."""
    run = _built(cfg)
    t = defaultdict(float)

    def timed(name, fn):
        t0 = time.perf_counter()
        fn()
        t[name] += time.perf_counter() - t0

    for epoch in range(cfg.epochs):
        pair = [("bare", lambda epoch=epoch: bare_epochs(run, 1, first=epoch)),
                ("loop", lambda epoch=epoch: _TRAIN_EPOCH(run, epoch, False))]
        for name, fn in pair if epoch % 2 == 0 else pair[::-1]:
            timed(name, fn)
        pair = [("bare_val", lambda: bare_validation(run, 1)), ("loop_val", lambda: run.evaluator.validate(run))]
        for name, fn in pair if epoch % 2 == 0 else pair[::-1]:
            timed(name, fn)
    return dict(t)


@torch.no_grad()
def bare_validation(run, epochs: int) -> float:
    """Seconds of ``epochs`` bare forward passes over a built run's validation split: the model's
    logits in eval mode, in the run's evaluation batches, and nothing else (no metrics, no copies).
    This is the computation the checkpoint policy cannot do without."""
    device, images = run.dd.device, run.bundle.val.images
    b = D.eval_batch_size(device, run.cfg.eval_batch_size)
    run.model.eval()
    t0 = time.perf_counter()
    for _ in range(epochs):
        for i in range(0, len(images), b):
            run.model(run.inputs.eval_batch(images[i:i + b].to(device)))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def bare_epochs(run, epochs: int, first: int = 0) -> float:
    """Seconds of ``epochs`` epochs of bare steps of a built run (``calibkit.train.run.build_run``)."""
    cfg, device = run.cfg, run.dd.device
    n, b = len(run.train_y), cfg.batch_size
    steps = n // b
    run.net.train()
    run.loss_fn.train()
    t0 = time.perf_counter()
    for epoch in range(first, first + epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        order_dev = order.to(device)
        gens = EpochGenerators(aug=loop._epoch_rng(cfg.seed, epoch, 0, 1, device),
                               draw=loop._epoch_rng(cfg.seed, epoch, 0, 2))
        with _validation.trusted_inputs():
            for step in range(steps):
                idx = order_dev[step * b:(step + 1) * b]
                x, y = run.inputs.train_batch(run.train_x[idx], run.train_y[idx], gens.aug)
                loss, _, _ = run.step(run.net, x, y, run.train_y_cpu[order[step * b:(step + 1) * b]], gens)
                run.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
                run.optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="default")
    ap.add_argument("--methods", nargs="+", default=["ce"], help="methods of kind 'train' (default: ce)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--epochs", type=int, help="shorten every run to this many epochs")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-threads", type=int, default=1)
    ap.add_argument("--out", help="bench directory (default: a temporary one, removed afterwards)")
    args = ap.parse_args()
    torch.set_num_threads(args.num_threads)
    bad = [m for m in args.methods if m not in BENCH_METHODS or BENCH_METHODS[m].kind != "train"]
    if bad:
        raise SystemExit(f"--methods: {bad}: only methods trained by calibkit.train (kind 'train') are timed")
    preset = get_preset(args.preset)
    full_runs = len(preset.seeds) * len(BENCH_METHODS)
    if args.epochs:
        from dataclasses import replace

        preset = replace(preset, train={**preset.train, "epochs": args.epochs})
    epochs = preset.train["epochs"]

    ph = Phases()
    ph.wrap(datasets, "load", "data", data)
    spec = datasets.DATASETS[preset.dataset]  # the file decoding behind the load: once per process
    datasets.DATASETS[preset.dataset] = dataclasses.replace(spec, read=ph.timed(spec.read, "rawread"))
    ph.wrap(runner.Bench, "eval_data", "evaldata")
    ph.wrap(evaluation.EvalData, "on", "evaldata")
    ph.wrap(evaluation.EvalData, "ood_images", "evaldata")
    ph.wrap(evaluation.EvalData, "corrupted", "evaldata")
    ph.wrap(loop, "train", "train", train_pkg)
    ph.wrap(loop, "_train_epoch", "steps")
    ph.wrap(ClassificationEvaluator, "validate", "validate")
    ph.wrap(loop, "_end_epoch", "ckpt")
    ph.wrap(ClassificationEvaluator, "finish", "finish")
    ph.wrap(evaluation, "evaluate_run", "eval")
    ph.wrap(report, "build_report", "report")

    # The bare steps are timed both before and after the bench and averaged: timed only after,
    # they drifted against the bench's step loops by up to +-10% between invocations.
    runs = [(s, m) for s in args.seeds for m in args.methods]
    configs = [runner.train_config(preset, m, s, device=args.device, num_threads=args.num_threads) for s, m in runs]
    before = [bare_steps(cfg) for cfg in configs]  # its first set-up decodes the data set's files
    raw = ph.total.get("rawread", 0.0)
    ph.total.clear()
    ph.total["rawread"] = raw  # once per process, whoever comes first
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_overhead_"))
    try:
        t0 = time.perf_counter()
        bench = runner.Bench(preset, out, seeds=args.seeds, methods=args.methods, device=args.device,
                             num_threads=args.num_threads, log=lambda *a, **k: None)
        try:
            counts = bench.run()
        finally:
            bench.close()
        if counts.failed or not counts.done:
            raise SystemExit(f"bench did not finish its runs: {counts}")
        report.build_report(out, preset=preset.name)
        wall_bench = time.perf_counter() - t0
        t = dict(ph.total)  # before the bare steps, whose set-up loads the data again
        after = [bare_steps(cfg) for cfg in configs]
        inter = interleaved(configs[0])
        bare_before, bare_after = sum(a for a, _ in before), sum(a for a, _ in after)
        bare = (bare_before + bare_after) / 2
        bare_val = (sum(v for _, v in before) + sum(v for _, v in after)) / 2
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)

    t["import"] = T_IMPORTED - T_START
    wall = t["import"] + t["rawread"] + wall_bench
    phases = ("import", "rawread", "data", "evaldata", "steps", "validate", "ckpt", "finish", "train", "eval", "report")
    t["other"] = wall - sum(t.get(k, 0.0) for k in phases)
    n = len(runs)
    per_bench = t["import"] + t.get("rawread", 0.0) + t.get("evaldata", 0.0) + t.get("report", 0.0) + t["other"]
    per_run = wall - per_bench  # data loads of the runs, train (steps + the rest), eval
    print(f"bench overhead: preset {preset.name}, {epochs} epochs, methods {' '.join(args.methods)}, "
          f"seeds {' '.join(map(str, args.seeds))} ({n} run(s)), device {args.device}, "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    print(f"wall {wall:.1f} s, bare training steps {bare:.1f} s  ->  wall / bare = {wall / bare:.3f}")
    print("phase shares of the wall time:")
    for k in (*phases, "other"):
        label = {"rawread": "data: decoding the files (once)", "data": "data: the runs' data loads",
                 "evaldata": "data: evaluation sets (OOD, corrupted)",
                 "steps": "train: epoch step loops", "validate": "train: validation every epoch",
                 "ckpt": "train: end of epoch, checkpoints", "finish": "train: final val/test logits",
                 "train": "train: set-up (model, optimizer, run dir)"}.get(k, k)
        print(f"  {label:<40} {t.get(k, 0.0):8.2f} s  {t.get(k, 0.0) / wall:6.1%}")
    print(f"bare steps timed before / after the bench: {bare_before:.1f} s / {bare_after:.1f} s (mean: bare)")
    print(f"epoch step loops / bare steps: {t.get('steps', 0.0) / bare:.3f}")
    print(f"per-run overhead beyond the bare steps: (per-run time - bare) / bare = "
          f"{(per_run - bare) / bare:.1%}  (target <= 10%)")
    print(f"  of which the per-epoch validation (model selection, part of the protocol): "
          f"{t.get('validate', 0.0) / bare:.1%}; the rest: {(per_run - t.get('validate', 0.0) - bare) / bare:.1%}")
    print(f"bare validation passes (the logits the checkpoint policy needs, nothing else): {bare_val:.1f} s "
          f"= {bare_val / bare:.1%} of the bare steps; validation every epoch / bare passes: "
          f"{t.get('validate', 0.0) / bare_val:.3f}")
    print(f"interleaved, epoch by epoch on one run ({epochs} epochs of each): the loop's step loop / bare steps "
          f"{inter['loop'] / inter['bare']:.3f}, its validation / bare validation passes "
          f"{inter['loop_val'] / inter['bare_val']:.3f}")
    print(f"per-run overhead beyond the bare steps and the bare validation passes: "
          f"{(per_run - bare - bare_val) / (bare + bare_val):.1%}")
    spread = per_bench * n / full_runs
    print(f"with the once-per-bench costs ({per_bench:.1f} s: import, file decoding, evaluation data, report, "
          f"other) spread over the preset's {full_runs} runs: {(per_run + spread - bare) / bare:.1%}")


if __name__ == "__main__":
    main()
