"""How spline calibration should spread the probability that the top class gives up: three
options side by side, on over-confident synthetic logits.

Data (as in the calibrator tables of ``docs/calibrators.md``): ``z`` standard normal x 2, labels
drawn from ``softmax(z)``, logits ``3 z`` (over-confident, T* = 3); ``--n-val`` rows fit the
spline, ``--n-test`` other rows are scored. The spline's top-label estimate is ``f(c)``
(``c`` the top softmax probability); the options differ only in what the other classes get:

* ``raise``: the other classes share ``1 - q`` in proportion to their probabilities, and ``q``
  is raised to ``p_2 / (1 - c + p_2) (1 + 1e-6)`` where the runner-up would otherwise overtake
  the top class (calibkit's earlier rule);
* ``none``: the same proportional shares with ``q = f(c)`` everywhere, no guard: where the
  runner-up's share exceeds ``f(c)`` it becomes the prediction;
* ``mix`` (calibkit's ``SplineCalibration``): ``q = f(c)``, the other classes' proportional
  shares mixed with the uniform share just enough that none reaches ``q``.

Printed per K: test ECE x100 (15 equal-width bins, top label of the returned distribution),
accuracy %, the share of rows whose argmax differs from the logits', the share of rows on which
``raise`` overrides the spline, NLL and classwise ECE x100; ``spline f(c)`` is the ECE of the
spline's own estimate scored against the original prediction (what the paper measures).

Usage: ``.venv/bin/python benchmarks/spline_guard.py [--ks 10,100] [--n-val 5000] [--n-test 5000] [--seed 0]``
"""

from __future__ import annotations

import argparse

import torch


def _data(k: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return 3 * z, y


def _proportional(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``q`` for the top class, ``1 - q`` shared by the others in proportion to ``p``."""
    top = p.argmax(1, keepdim=True)
    others = p.scatter(1, top, 0.0)
    rest = others.sum(1, keepdim=True)
    share = torch.where(rest > 0, others / rest.clamp(min=1e-300), 1.0 / (p.shape[1] - 1)).scatter(1, top, 0.0)
    return (share * (1 - q)[:, None]).scatter(1, top, q[:, None])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="10,100")
    ap.add_argument("--n-val", type=int, default=5000)
    ap.add_argument("--n-test", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import calibkit.functional as F
    from calibkit.calibrators import SplineCalibration
    from calibkit.calibrators.binning import interpolate
    from calibkit.functional.binning import bin_sums, binned_errors, equal_width_bins

    print(f"spline calibration (n_knots 6) fitted on {args.n_val:,} rows, scored on {args.n_test:,}; seed {args.seed}")
    print(f"{'K':>4} {'option':<13}{'ECE x100':>9}{'acc %':>8}{'argmax changed %':>18}{'NLL':>8}{'cw-ECE x100':>13}")
    for k in (int(v) for v in args.ks.split(",")):
        z, y = _data(k, args.n_val + args.n_test, args.seed)
        zv, yv, zt, yt = z[:args.n_val], y[:args.n_val], z[args.n_val:], y[args.n_val:]
        cal = SplineCalibration().fit(zv, yv)
        p = torch.softmax(zt, 1)
        top2 = p.topk(2, 1).values
        c, p2 = top2[:, 0], top2[:, 1]
        pred = p.argmax(1)
        f = interpolate(cal.knots_x_, cal.knots_y_, cal.n_knots_, c[None, :])[0].clamp(0, 1)
        bound = p2 / (1 - c + p2) * (1 + 1e-6)
        options = {
            "raise": _proportional(p, torch.where(c > p2, torch.maximum(f, bound).clamp(max=1), c)),
            "none": _proportional(p, f),
            "mix": cal.predict_proba(zt),
        }
        own = binned_errors(bin_sums(equal_width_bins(f, 15), f, (pred == yt).double(), 15))["ece"]
        print(f"{k:>4} {'spline f(c)':<13}{100 * float(own):>9.2f}{100 * float((pred == yt).double().mean()):>8.1f}"
              f"{'-':>18}{'-':>8}{'-':>13}")
        for name, q in options.items():
            changed = float((q.argmax(1) != pred).double().mean())
            print(f"{k:>4} {name:<13}{100 * float(F.ece(q, yt)):>9.2f}{100 * float(F.accuracy(q, yt)):>8.1f}"
                  f"{100 * changed:>18.1f}{float(F.nll(q, yt)):>8.3f}{100 * float(F.classwise_ece(q, yt)):>13.2f}")
        print(f"{k:>4} 'raise' overrides the spline (q > f(c)) on {100 * float((bound > f).double().mean()):.1f}% "
              "of the rows; 'mix' raises q on "
              f"{100 * float((options['mix'].max(1).values > f + 1e-12).double().mean()):.2f}% "
              f"(f(c) below ~1/K)")


if __name__ == "__main__":
    main()
