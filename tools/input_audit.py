"""Bad-input audit of the calibkit command line.

Feeds bad and edge inputs to ``calibkit`` (calibrate, apply, compare, report, preset, bench,
tune, own data for the bench, and the Python API: the pipeline's options and the statistics'
minimums) and classifies each result:

- clean:   the expectation is met exactly. "refuse": exit 1 (exit 2 when argparse itself
           rejects the option), one message line on stderr naming every key word, no traceback,
           nothing created or changed in the case's folder. "warn": exit 0 and a warning line
           naming every key word. "accept": exit 0 (a legitimate edge input that must work).
- partial: the right exit code, but the message misses a key word, runs over several lines or
           500 characters, a warning is missing or vague, or a refusal left files behind.
- bad:     the wrong exit code (nonsense accepted, a legitimate input refused), a traceback, a
           crash, a timeout, or a secret (a password) printed.

Every case prepares its own tiny files in a fresh temporary folder and runs there: in-process
through ``calibkit.cli.main(argv)`` (stdout/stderr captured), or as a subprocess where it needs a
fresh process (module imports that exit, environment variables, worker processes).

    PYTHONPATH=$PWD python tools/input_audit.py [--only SURFACE] [--json FILE] [--keep]

Always exits 0: it measures, it does not gate. docs/input_audit.md has the measured table.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SECRET = "s3cretPW"  # a password that no output may show
UNSET_ENV = "CALIBKIT_AUDIT_NEVER_SET"


@dataclass
class Case:
    surface: str
    name: str
    expect: str  # "refuse" | "warn" | "accept"
    keys: tuple
    prep: Callable  # prep(folder: Path) -> argv (without the leading "calibkit")
    forbid: tuple = ()  # text that must appear neither on stdout nor on stderr
    proc: bool = False  # run as a subprocess
    env: dict = field(default_factory=dict)
    note: str = ""
    check: Callable | None = None  # check(folder, stdout) -> a problem ("" when none), for a clean accept


CASES: list[Case] = []


def add(surface, name, expect, keys, prep, **kw):
    CASES.append(Case(surface, name, expect, tuple(keys), prep, **kw))


# ---------------------------------------------------------------- little file writers

def logits_labels(n=40, k=3, seed=0):
    """Separable-ish float32 logits (n, k) and int64 labels covering every class."""
    r = np.random.default_rng(seed)
    y = (np.arange(n) % k).astype(np.int64)
    x = r.normal(size=(n, k)).astype(np.float32)
    x[np.arange(n), y] += 1.5
    return x, y


def softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def npz(d, name, **arrays):
    np.savez(Path(d) / name, **arrays)


def write(d, name, data):
    p = Path(d) / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return p


def good_pair(d, k=3, n=40):
    x, y = logits_labels(n, k, 0)
    npz(d, "val.npz", logits=x, labels=y)
    x, y = logits_labels(n, k, 1)
    npz(d, "test.npz", logits=x, labels=y)


def random_bytes(n=2048, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def truncated_npz(d, name, **arrays):
    tmp = Path(d) / ".full.npz"
    np.savez(tmp, **arrays)
    data = tmp.read_bytes()
    tmp.unlink()
    write(d, name, data[: len(data) // 2])


class Marker:
    """An arbitrary class: pickling an instance needs code to load it again."""


CAL_ARGS = ["--calibrators", "temperature,vector", "--n-boot", "20", "--dpi", "20", "--num-threads", "1"]


def cal_argv(val="val.npz", test="test.npz", *extra, calibrators=True):
    base = CAL_ARGS if calibrators else CAL_ARGS[2:]
    return ["calibrate", "--val", val, "--test", test, "--out", "out", *base, *extra]


def cal_val(**arrays):
    """A case whose validation file holds ``arrays`` (the test file is a good one)."""
    def prep(d):
        good_pair(d)
        npz(d, "bad.npz", **arrays)
        return cal_argv("bad.npz")
    return prep


def cal_val_file(name, make):
    """A case whose validation file is ``name``, made by ``make(d)`` (the test file is a good one)."""
    def prep(d):
        good_pair(d)
        make(d)
        return cal_argv(name)
    return prep


# ---------------------------------------------------------------- calibrate

def calibrate_cases():
    S = "calibrate"
    x, y = logits_labels()
    p = softmax(x.astype(np.float64))

    def missing(d):
        good_pair(d)
        return cal_argv("missing.npz")
    add(S, "missing val file", "refuse", ["missing.npz"], missing)

    add(S, "val is a folder", "refuse", ["valdir.npz", "folder|directory"],
        cal_val_file("valdir.npz", lambda d: (d / "valdir.npz").mkdir()))

    add(S, "random bytes .npz", "refuse", ["rand.npz"],
        cal_val_file("rand.npz", lambda d: write(d, "rand.npz", random_bytes())))

    add(S, "truncated .npz", "refuse", ["trunc.npz"],
        cal_val_file("trunc.npz", lambda d: truncated_npz(d, "trunc.npz", logits=x, labels=y)))

    add(S, "empty (0-byte) .npz", "refuse", ["zero.npz"],
        cal_val_file("zero.npz", lambda d: write(d, "zero.npz", b"")))

    obj = np.empty(40, dtype=object)
    for i in range(40):
        obj[i] = x[i]
    add(S, "object array logits", "refuse", ["bad.npz", "logits"], cal_val(logits=obj, labels=y))

    def pickled_pt(d):
        import torch
        good_pair(d)
        torch.save({"logits": torch.tensor(x), "labels": torch.tensor(y), "meta": Marker()}, d / "pick.pt")
        return cal_argv("pick.pt")
    add(S, ".pt pickling a custom class object", "refuse", ["pick.pt"], pickled_pt)

    def plain_meta_pt(d):
        import torch
        good_pair(d)
        torch.save({"logits": torch.tensor(x), "labels": torch.tensor(y), "meta": {"model": "resnet", "epoch": 3}},
                   d / "meta.pt")
        return cal_argv("meta.pt")
    # Plain Python values load safely with weights_only (calibkit.data.tensors.read_pt allows them); the extra
    # entry is ignored like an extra .npz array. calibrate's epilog says "anything but tensors in a .pt [is]
    # refused", so the two texts disagree; the demanding user's view: a safe, ordinary file should work.
    add(S, ".pt with a plain metadata dict besides tensors", "accept", [], plain_meta_pt)

    def trunc_pt(d):
        import torch
        good_pair(d)
        torch.save({"logits": torch.tensor(x), "labels": torch.tensor(y)}, d / "full.pt")
        data = (d / "full.pt").read_bytes()
        (d / "full.pt").unlink()
        write(d, "trunc.pt", data[: len(data) // 2])
        return cal_argv("trunc.pt")
    add(S, "truncated .pt", "refuse", ["trunc.pt"], trunc_pt)

    def pt_list(d):
        import torch
        good_pair(d)
        torch.save([torch.tensor(x), torch.tensor(y)], d / "list.pt")
        return cal_argv("list.pt")
    add(S, ".pt holding a list, not a dict", "refuse", ["list.pt"], pt_list)

    def pt_ok(d):
        import torch
        good_pair(d)
        torch.save({"logits": torch.tensor(x), "labels": torch.tensor(y)}, d / "ok.pt")
        return cal_argv("ok.pt")
    add(S, ".pt of tensors", "accept", [], pt_ok)

    def st_ok(d):
        import torch
        from safetensors.torch import save_file
        good_pair(d)
        save_file({"logits": torch.tensor(x), "labels": torch.tensor(y)}, str(d / "ok.safetensors"))
        return cal_argv("ok.safetensors")
    add(S, ".safetensors of tensors", "accept", [], st_ok)

    add(S, "random bytes .safetensors", "refuse", ["rand.safetensors"],
        cal_val_file("rand.safetensors", lambda d: write(d, "rand.safetensors", random_bytes())))

    def st_trunc(d):
        import torch
        from safetensors.torch import save_file
        good_pair(d)
        save_file({"logits": torch.tensor(x), "labels": torch.tensor(y)}, str(d / "full.safetensors"))
        data = (d / "full.safetensors").read_bytes()
        (d / "full.safetensors").unlink()
        write(d, "trunc.safetensors", data[: len(data) - 100])
        return cal_argv("trunc.safetensors")
    add(S, "truncated .safetensors", "refuse", ["trunc.safetensors"], st_trunc)

    add(S, "unsupported suffix .csv", "refuse", ["val.csv"],
        cal_val_file("val.csv", lambda d: write(d, "val.csv", "0.1,0.9,1\n")))

    add(S, "file without a suffix", "refuse", ["valfile"],
        cal_val_file("valfile", lambda d: shutil.copy(d / "val.npz", d / "valfile")))

    add(S, "wrong keys (x, y)", "refuse", ["bad.npz", "logits"], cal_val(x=x, y=y))
    add(S, "both logits and probs", "refuse", ["bad.npz", "logits", "probs"], cal_val(logits=x, probs=p, labels=y))
    add(S, "no labels", "refuse", ["bad.npz", "labels"], cal_val(logits=x))
    xn = x.copy()
    xn[3, 1] = np.nan
    add(S, "NaN logits", "refuse", ["bad.npz", "NaN"], cal_val(logits=xn, labels=y))
    xi = x.copy()
    xi[5, 0] = np.inf
    add(S, "inf logits", "refuse", ["bad.npz", "infinite"], cal_val(logits=xi, labels=y))
    pn = p.copy()
    pn[2, 2] = np.nan
    add(S, "NaN probs", "refuse", ["bad.npz", "probs"], cal_val(probs=pn, labels=y))
    add(S, "probs not summing to 1", "refuse", ["bad.npz", "probs", "sum"], cal_val(probs=p * 0.7, labels=y))
    pneg = p.copy()
    pneg[0] = [-0.2, 0.6, 0.6]
    add(S, "negative probs (rows sum to 1)", "refuse", ["bad.npz", "probs"], cal_val(probs=pneg, labels=y))
    add(S, "probs above 1 (percentages)", "refuse", ["bad.npz", "probs"], cal_val(probs=p * 100, labels=y))
    add(S, "float32 softmax probs (sum 1 +- 1e-7)", "accept", [],
        cal_val(probs=softmax(x).astype(np.float32), labels=y))
    p0 = p.copy()
    p0[0] = [1.0, 0.0, 0.0]
    p0[1] = [0.0, 1.0, 0.0]
    add(S, "probs with exact zeros and ones", "accept", [], cal_val(probs=p0, labels=y))
    add(S, "float16 logits", "accept", [], cal_val(logits=x.astype(np.float16), labels=y))
    add(S, "huge finite logits (1e30)", "accept", [], cal_val(logits=x * np.float32(1e30), labels=y))
    add(S, "integer logits", "refuse", ["bad.npz", "logits"], cal_val(logits=(x * 10).astype(np.int64), labels=y))
    add(S, "extra arrays in the file", "accept", [], cal_val(logits=x, labels=y, names=np.array(["a", "b", "c"])))
    yo = y.copy()
    yo[0] = 3
    add(S, "label out of range (K=3, label 3)", "refuse", ["bad.npz", "labels"], cal_val(logits=x, labels=yo))
    yneg = y.copy()
    yneg[0] = -1
    add(S, "negative label", "refuse", ["bad.npz", "labels"], cal_val(logits=x, labels=yneg))
    # Integral float labels: the docs say labels are integers, so a demanding user wants them refused rather
    # than silently cast (an off-by-rounding label file would otherwise pass).
    add(S, "float labels (integral values)", "refuse", ["bad.npz", "labels"],
        cal_val(logits=x, labels=y.astype(np.float64)))
    add(S, "float labels (0.5)", "refuse", ["bad.npz", "labels"], cal_val(logits=x, labels=y + 0.5))
    add(S, "uint8 labels", "accept", [], cal_val(logits=x, labels=y.astype(np.uint8)))
    add(S, "uint64 label above int64 range", "refuse", ["bad.npz", "labels"],
        cal_val(logits=x, labels=np.r_[np.uint64(2 ** 63 + 5), y[1:].astype(np.uint64)]))
    add(S, "string labels", "refuse", ["bad.npz", "labels"], cal_val(logits=x, labels=y.astype(str)))
    add(S, "labels shape (N, 1)", "refuse", ["bad.npz", "labels"], cal_val(logits=x, labels=y[:, None]))
    add(S, "K = 0 (N, 0) logits", "refuse", ["bad.npz", "logits"],
        cal_val(logits=np.zeros((40, 0), np.float32), labels=y))
    add(S, "K = 1 (N, 1) logits", "refuse", ["bad.npz", "logits"], cal_val(logits=x[:, :1], labels=y * 0))
    add(S, "mismatched N (40 logits, 30 labels)", "refuse", ["bad.npz", "labels"], cal_val(logits=x, labels=y[:30]))
    add(S, "3-D logits", "refuse", ["bad.npz", "logits"], cal_val(logits=x[:, :, None], labels=y))
    add(S, "0-d logits", "refuse", ["bad.npz", "logits"], cal_val(logits=np.float32(1.0), labels=y[:1]))
    add(S, "empty (0, 3) logits", "refuse", ["bad.npz", "logits"],
        cal_val(logits=np.zeros((0, 3), np.float32), labels=np.zeros(0, np.int64)))
    add(S, "empty 1-D logits", "refuse", ["bad.npz", "logits"],
        cal_val(logits=np.zeros(0, np.float32), labels=np.zeros(0, np.int64)))

    xb, yb = logits_labels(40, 2, 0)
    binary = (xb[:, 1] - xb[:, 0]).astype(np.float32)

    def binary_pair(kind):
        def prep(d):
            t = np.r_[binary[20:], binary[:20]]
            if kind == "logits":
                npz(d, "val.npz", logits=binary, labels=yb)
                npz(d, "test.npz", logits=t, labels=np.r_[yb[20:], yb[:20]])
            else:
                sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
                npz(d, "val.npz", probs=sig(binary), labels=yb)
                npz(d, "test.npz", probs=sig(t), labels=np.r_[yb[20:], yb[:20]])
            return cal_argv(calibrators=False)
        return prep
    add(S, "1-D binary logits (every calibrator)", "accept", [], binary_pair("logits"))
    add(S, "1-D binary probs", "accept", [], binary_pair("probs"))
    add(S, "1-D probs outside [0, 1]", "refuse", ["bad.npz", "probs"], cal_val(probs=binary, labels=yb))
    add(S, "1-D logits with label 2", "refuse", ["bad.npz", "labels"],
        cal_val(logits=binary, labels=np.r_[2, yb[1:]]))

    def binary_vs_k2(d):
        good_pair(d, k=2)
        npz(d, "bin.npz", logits=binary, labels=yb)
        return cal_argv("bin.npz")
    add(S, "val binary (N,), test (N, 2)", "refuse", ["bin.npz", "test.npz"], binary_vs_k2)

    def k_mismatch(d):
        good_pair(d)
        x4, y4 = logits_labels(40, 4, 3)
        npz(d, "test4.npz", logits=x4, labels=y4)
        return cal_argv("val.npz", "test4.npz")
    add(S, "val K=3, test K=4", "refuse", ["val.npz", "test4.npz"], k_mismatch)

    def same(d):
        good_pair(d)
        return cal_argv("val.npz", "val.npz")
    add(S, "same file for --val and --test", "warn", ["--val", "--test"], same)

    def same_via_path(d):
        good_pair(d)
        (d / "sub").mkdir()
        return cal_argv("val.npz", "sub/../val.npz")
    add(S, "same file through sub/..", "warn", ["--val", "--test"], same_via_path)

    def same_content(d):
        good_pair(d)
        shutil.copy(d / "val.npz", d / "copy.npz")
        return cal_argv("val.npz", "copy.npz")
    add(S, "identical content, two files", "warn", ["--val", "--test"], same_content)

    def few_rows(d):
        good_pair(d)
        xs, ys = logits_labels(6, 10, 4)
        npz(d, "few.npz", logits=xs, labels=ys)
        xt, yt = logits_labels(40, 10, 5)
        npz(d, "t10.npz", logits=xt, labels=yt)
        return ["calibrate", "--val", "few.npz", "--test", "t10.npz", "--out", "out", "--calibrators",
                "temperature,matrix", "--n-boot", "20", "--dpi", "20", "--folds", "2", "--num-threads", "1"]
    add(S, "fewer rows than classes (6 rows, K=10)", "warn", ["few.npz", "rows"], few_rows)

    def few_rows_save(d):
        argv = few_rows(d)
        return argv + ["--save", "matrix"]
    add(S, "--save matrix with fewer rows than classes", "refuse", ["--save", "matrix"], few_rows_save)

    def folds_gt_rows(d):
        good_pair(d)
        xs, ys = logits_labels(6, 3, 4)
        npz(d, "six.npz", logits=xs, labels=ys)
        return cal_argv("six.npz", "test.npz", "--folds", "10")
    add(S, "--folds 10 with 6 validation rows", "refuse", ["--folds", "six.npz"], folds_gt_rows)

    def opt(*extra, calibrators=True):
        def prep(d):
            good_pair(d)
            return cal_argv("val.npz", "test.npz", *extra, calibrators=calibrators)
        return prep
    add(S, "--select-by accuracy", "refuse", ["--select-by"], opt("--select-by", "accuracy"))
    add(S, "--select-by nll", "accept", [], opt("--select-by", "nll"))
    for v in ("1", "0", "-1"):
        add(S, f"--folds {v}", "refuse", ["--folds"], opt("--folds", v))
    add(S, "--folds 2.5", "refuse", ["--folds"], opt("--folds", "2.5"))
    for v in ("-1", "nan", "inf", "101"):
        add(S, f"--acc-tolerance {v}", "refuse", ["--acc-tolerance"], opt("--acc-tolerance", v))
    add(S, "--acc-tolerance 0", "accept", [], opt("--acc-tolerance", "0"))
    add(S, "--n-bins 0", "refuse", ["--n-bins"], opt("--n-bins", "0"))
    add(S, "--n-bins -3", "refuse", ["--n-bins"], opt("--n-bins", "-3"))
    add(S, "--n-boot 0", "refuse", ["--n-boot"], opt("--n-boot", "0"))
    add(S, "--dpi 0", "refuse", ["--dpi"], opt("--dpi", "0"))
    add(S, "--num-threads 0", "refuse", ["--num-threads"], opt("--num-threads", "0"))
    add(S, "--calibrators ''", "refuse", ["calibrator"], opt("--calibrators", "", calibrators=False))
    add(S, "--calibrators ','", "refuse", ["calibrator"], opt("--calibrators", ",", calibrators=False))
    add(S, "--calibrators bogus", "refuse", ["bogus"], opt("--calibrators", "temperature,bogus", calibrators=False))
    add(S, "--calibrators repeated", "accept", [],
        opt("--calibrators", "temperature,temperature", calibrators=False))
    add(S, "--save not among --calibrators", "refuse", ["--save", "dirichlet"], opt("--save", "dirichlet"))
    add(S, "--save unknown name", "refuse", ["--save", "nosuch"], opt("--save", "nosuch"))

    def out_is_file(d):
        good_pair(d)
        write(d, "outfile", "keep me\n")
        argv = cal_argv()
        argv[argv.index("out")] = "outfile"
        return argv
    add(S, "--out is an existing file", "refuse", ["outfile"], out_is_file)

    def out_under_file(d):
        good_pair(d)
        write(d, "afile", "keep me\n")
        argv = cal_argv("val.npz", "test.npz", "--save", "temperature")
        argv[argv.index("out")] = "afile/out"
        return argv
    add(S, "--out under a file (unwritable), --save", "refuse", ["afile"], out_under_file)

    def save_path(d):
        good_pair(d)
        return cal_argv("val.npz", "test.npz", "--save", "../escape")
    add(S, "--save with a path (../escape)", "refuse", ["--save"], save_path)

    add(S, "--seed -1 (bootstrap seed)", "refuse", ["--seed"], opt("--seed", "-1"))
    add(S, "--out ''", "refuse", ["--out"], lambda d: (good_pair(d), cal_argv()[:6] + [""] + cal_argv()[7:])[1])
    add(S, "--calibrators with spaces", "accept", [], opt("--calibrators", "temperature, vector", calibrators=False))
    add(S, "K = 2 (N, 2) logits", "accept", [], lambda d: (good_pair(d, k=2), cal_argv())[1])

    add(S, "upper-case suffix .NPZ", "accept", [],
        cal_val_file("VAL.NPZ", lambda d: shutil.copy(d / "val.npz", d / "VAL.NPZ")))

    add(S, "file name with a space and an accent", "accept", [],
        cal_val_file("val data é.npz", lambda d: shutil.copy(d / "val.npz", d / "val data é.npz")))

    add(S, "dangling symlink", "refuse", ["link.npz"],
        cal_val_file("link.npz", lambda d: os.symlink("gone.npz", d / "link.npz")))
    add(S, "constant logits (every row equal)", "accept", [], cal_val(logits=np.ones((40, 3), np.float32), labels=y))
    # Every validation label is class 0 of K = 3: calibrators can still be fitted, but the choice means little;
    # a demanding user wants to be told (a warning naming the file).
    add(S, "validation labels all one class", "warn", ["bad.npz"], cal_val(logits=x, labels=np.zeros(40, np.int64)))

    def two_rows(d):
        good_pair(d)
        xs, _ = logits_labels(2, 3, 9)
        npz(d, "two.npz", logits=xs, labels=np.array([0, 1]))
        return cal_argv("two.npz", "test.npz", "--folds", "2")
    add(S, "2 validation rows, --folds 2", "warn", ["two.npz", "rows"], two_rows)
    add(S, "labels 0-d", "refuse", ["bad.npz", "labels"], cal_val(logits=x, labels=np.int64(1)))
    add(S, "bool labels with K=3", "refuse", ["bad.npz", "labels"], cal_val(logits=x, labels=(y > 0)))
    add(S, "complex logits", "refuse", ["bad.npz", "logits"], cal_val(logits=x.astype(np.complex64), labels=y))


# ---------------------------------------------------------------- apply

FIX: dict = {}  # fixtures built once: saved calibrators, a finished bench


def build_calibrators(root: Path):
    import torch

    from calibkit.calibrators import CALIBRATORS, save

    x, y = logits_labels(60, 3, 7)
    for name in ("temperature", "dirichlet", "isotonic", "histogram"):
        cal = CALIBRATORS[name]().fit(torch.tensor(x, dtype=torch.float64), torch.tensor(y))
        save(cal, root / f"{name}")
    xb, yb = logits_labels(60, 2, 7)
    cal = CALIBRATORS["temperature"]().fit(torch.tensor(xb[:, 1] - xb[:, 0], dtype=torch.float64), torch.tensor(yb))
    save(cal, root / "binary")


def copy_cal(d, name, as_name="cal"):
    for suffix in (".json", ".safetensors"):
        shutil.copy(FIX["cal"] / f"{name}{suffix}", d / f"{as_name}{suffix}")


def tamper(name, edit):
    """A temperature (or other) calibrator copied as cal.* with its JSON edited by ``edit(doc)``."""
    def prep(d):
        copy_cal(d, name)
        doc = json.loads((d / "cal.json").read_text())
        edit(doc)
        (d / "cal.json").write_text(json.dumps(doc))
        x, _ = logits_labels(20, 3, 2)
        npz(d, "in.npz", logits=x)
        return ["apply", "--calibrator", "cal", "--input", "in.npz", "--out", "res.npz"]
    return prep


def apply_cases():
    S = "apply"
    x, y = logits_labels(20, 3, 2)

    def base(d, name="temperature", **arrays):
        copy_cal(d, name)
        npz(d, "in.npz", **(arrays or {"logits": x, "labels": y}))
        return ["apply", "--calibrator", "cal", "--input", "in.npz", "--out", "res.npz"]

    add(S, "valid temperature", "accept", [], lambda d: base(d))
    add(S, "valid dirichlet, probs input", "accept", [], lambda d: base(d, "dirichlet", probs=softmax(x)))
    add(S, "input without labels", "accept", [], lambda d: base(d, logits=x))

    def by_st(d):
        argv = base(d)
        argv[2] = "cal.safetensors"
        return argv
    add(S, "--calibrator STEM.safetensors", "accept", [], by_st)

    def missing(d):
        argv = base(d)
        argv[2] = "nocal"
        return argv
    add(S, "missing calibrator", "refuse", ["nocal"], missing)

    def corrupt(d):
        argv = base(d)
        (d / "cal.json").write_text("{not json")
        return argv
    add(S, "corrupt JSON", "refuse", ["cal"], corrupt)

    def json_list(d):
        argv = base(d)
        (d / "cal.json").write_text("[1, 2]")
        return argv
    add(S, "JSON is a list", "refuse", ["cal"], json_list)

    def st_missing(d):
        argv = base(d, "dirichlet")
        (d / "cal.safetensors").unlink()
        return argv
    add(S, "dirichlet without its .safetensors", "refuse", ["cal"], st_missing)

    def st_nan(d):
        from safetensors.torch import load_file, save_file
        argv = base(d, "dirichlet")
        t = load_file(str(d / "cal.safetensors"))
        for k in t:
            if t[k].is_floating_point():
                t[k][..., 0] = float("nan")
        save_file(t, str(d / "cal.safetensors"))
        return argv
    add(S, "dirichlet with NaN weights", "refuse", ["cal", "NaN"], st_nan)

    def st_shape(d):
        from safetensors.torch import load_file, save_file
        argv = base(d, "dirichlet")
        t = load_file(str(d / "cal.safetensors"))
        t = {k: v[..., :1].contiguous() for k, v in t.items()}
        save_file(t, str(d / "cal.safetensors"))
        return argv
    add(S, "dirichlet weights of the wrong shape", "refuse", ["cal"], st_shape)

    def st_rand(d):
        argv = base(d, "dirichlet")
        (d / "cal.safetensors").write_bytes(random_bytes())
        return argv
    add(S, "dirichlet .safetensors random bytes", "refuse", ["cal"], st_rand)

    def setstate(key, value):
        def edit(doc):
            doc["state"][key] = value
        return edit
    add(S, "negative temperature", "refuse", ["temperature_"], tamper("temperature", setstate("temperature_", -1.0)))
    add(S, "zero temperature", "refuse", ["temperature_"], tamper("temperature", setstate("temperature_", 0.0)))
    add(S, "NaN temperature", "refuse", ["temperature_"], tamper("temperature", setstate("temperature_", float("nan"))))
    add(S, "string temperature", "refuse", ["temperature_"], tamper("temperature", setstate("temperature_", "1.5")))
    add(S, "string state", "refuse", ["state"], tamper("temperature", lambda doc: doc.update(state="oops")))
    add(S, "n_classes_ -3", "refuse", ["n_classes_"], tamper("temperature", setstate("n_classes_", -3)))
    add(S, "binary_ as a string", "refuse", ["binary_"], tamper("temperature", setstate("binary_", "no")))
    add(S, "state field missing", "refuse", ["temperature_"],
        tamper("temperature", lambda doc: doc["state"].pop("temperature_")))
    add(S, "unknown state field", "refuse", ["extra_"], tamper("temperature", setstate("extra_", 1)))
    add(S, "unknown calibrator name", "refuse", ["nosuchcal"],
        tamper("temperature", lambda doc: doc.update(calibrator="nosuchcal")))
    add(S, "format version 99", "refuse", ["version"], tamper("temperature", lambda doc: doc.update(version=99)))
    add(S, "hyperparameter t_min -1", "refuse", ["t_min"],
        tamper("temperature", lambda doc: doc["params"].update(t_min=-1.0)))
    add(S, "unknown hyperparameter", "refuse", ["bogus_param"],
        tamper("temperature", lambda doc: doc["params"].update(bogus_param=1)))

    def wrong_k(d):
        argv = base(d)
        x4, _ = logits_labels(20, 4, 2)
        npz(d, "in4.npz", logits=x4)
        argv[4] = "in4.npz"
        return argv
    add(S, "wrong K (4 vs 3)", "refuse", ["in4.npz", "cal"], wrong_k)

    def wrong_layout(d):
        argv = base(d)
        npz(d, "bin.npz", logits=x[:, 0])
        argv[4] = "bin.npz"
        return argv
    add(S, "binary scores into a K=3 calibrator", "refuse", ["bin.npz", "cal"], wrong_layout)

    def wrong_layout2(d):
        argv = base(d, "binary")
        return argv
    add(S, "(N, 3) logits into a binary calibrator", "refuse", ["in.npz", "cal"], wrong_layout2)

    def nan_input(d):
        xn = x.copy()
        xn[0, 0] = np.nan
        return base(d, logits=xn)
    add(S, "NaN input logits", "refuse", ["in.npz", "NaN"], nan_input)

    def missing_input(d):
        argv = base(d)
        argv[4] = "none.npz"
        return argv
    add(S, "missing input", "refuse", ["none.npz"], missing_input)

    def out_is_input(d):
        argv = base(d)
        argv[6] = "in.npz"
        return argv
    add(S, "--out equal to --input", "refuse", ["--out", "in.npz"], out_is_input)

    def out_is_input_rel(d):
        argv = base(d)
        (d / "sub").mkdir()
        argv[6] = "sub/../in.npz"
        return argv
    add(S, "--out = --input via sub/..", "refuse", ["--out"], out_is_input_rel)

    def out_symlink(d):
        argv = base(d)
        os.symlink("in.npz", d / "link.npz")
        argv[6] = "link.npz"
        return argv
    add(S, "--out a symlink to --input", "refuse", ["--out"], out_symlink)

    def out_folder(d):
        argv = base(d)
        (d / "res.npz").mkdir()
        return argv
    add(S, "--out a folder", "refuse", ["--out", "res.npz", "folder|directory"], out_folder)

    def out_no_suffix(d):
        argv = base(d)
        argv[6] = "res.txt"
        return argv
    add(S, "--out without .npz", "refuse", ["--out"], out_no_suffix)

    def out_under_file(d):
        argv = base(d)
        write(d, "afile", "x\n")
        argv[6] = "afile/res.npz"
        return argv
    add(S, "--out under a file", "refuse", ["afile"], out_under_file)

    def by_json(d):
        argv = base(d)
        argv[2] = "cal.json"
        return argv
    add(S, "--calibrator STEM.json", "accept", [], by_json)

    def cal_folder(d):
        argv = base(d)
        (d / "cdir").mkdir()
        argv[2] = "cdir"
        return argv
    add(S, "--calibrator a folder", "refuse", ["cdir"], cal_folder)
    add(S, "input probs not summing to 1", "refuse", ["in.npz", "probs"], lambda d: base(d, probs=softmax(x) * 0.5))
    add(S, "input labels out of range", "refuse", ["in.npz", "labels"],
        lambda d: base(d, logits=x, labels=np.r_[5, y[1:]]))
    add(S, "input labels of the wrong length", "refuse", ["in.npz", "labels"],
        lambda d: base(d, logits=x, labels=y[:10]))

    def st_edit(name, edit):
        def prep(d):
            from safetensors.torch import load_file, save_file
            argv = base(d, name)
            t = load_file(str(d / "cal.safetensors"))
            edit(t)
            save_file({k: v.contiguous() for k, v in t.items()}, str(d / "cal.safetensors"))
            return argv
        return prep

    def flip(key):
        def edit(t):
            t[key] = t[key].flip(-1)
        return edit

    def scale(key, factor):
        def edit(t):
            t[key] = t[key] * factor
        return edit
    add(S, "isotonic knots_x_ in decreasing order", "refuse", ["cal", "knots_x_"],
        st_edit("isotonic", flip("knots_x_")))
    add(S, "isotonic knots_y_ above 1", "refuse", ["cal", "knots_y_"], st_edit("isotonic", scale("knots_y_", 5.0)))
    add(S, "histogram edges_ decreasing", "refuse", ["cal", "edges_"], st_edit("histogram", flip("edges_")))
    add(S, "histogram values_ negative", "refuse", ["cal", "values_"], st_edit("histogram", scale("values_", -1.0)))
    add(S, "histogram values_ tensor missing", "refuse", ["cal", "values_"],
        st_edit("histogram", lambda t: t.pop("values_")))
    add(S, "histogram extra tensor", "refuse", ["cal", "extra_"],
        st_edit("histogram", lambda t: t.update(extra_=t["values_"].clone())))


# ---------------------------------------------------------------- compare / report

def bench_copy(d, name="bench"):
    shutil.copytree(FIX["bench"], d / name, symlinks=True)
    return name


def compare_report_cases():
    S = "compare"

    def cmp(*args, setup=bench_copy):
        def prep(d):
            name = setup(d) if setup else "bench"
            return ["compare", name, *args]
        return prep

    def empty_dir(d):
        (d / "bench").mkdir()
        return "bench"

    def file_dir(d):
        write(d, "bench", "not a folder\n")
        return "bench"

    def corrupt_db(d):
        (d / "bench").mkdir()
        write(d, "bench/runs.db", random_bytes(4096))
        return "bench"

    add(S, "valid: ls vs ce", "accept", [], cmp("ls", "ce", "--n-boot", "50"))
    add(S, "valid: --after temperature", "accept", [], cmp("ls", "ce", "--after", "temperature", "--n-boot", "50"))
    add(S, "missing folder", "refuse", ["bench"], cmp("ls", "ce", setup=None))
    add(S, "not a bench (empty folder)", "refuse", ["bench", "runs.db"], cmp("ls", "ce", setup=empty_dir))
    add(S, "DIR is a file", "refuse", ["bench"], cmp("ls", "ce", setup=file_dir))
    add(S, "corrupt runs.db", "refuse", ["runs.db"], cmp("ls", "ce", setup=corrupt_db))
    add(S, "a method with itself", "refuse", ["ce"], cmp("ce", "ce"))
    add(S, "unknown method", "refuse", ["zzz"], cmp("zzz", "ce"))
    add(S, "method not run in this bench", "refuse", ["focal"], cmp("focal", "ce"))
    add(S, "empty method name", "refuse", ["''|empty"], cmp("", "ce"))
    add(S, "--after ''", "refuse", ["--after"], cmp("ls", "ce", "--after", ""))
    add(S, "--after unknown", "refuse", ["bogus"], cmp("ls", "ce", "--after", "bogus"))
    # 'none' is listed among calibrator names (the uncalibrated model): comparing after "none" is the plain
    # comparison, a legitimate if redundant input.
    add(S, "--after none", "accept", [], cmp("ls", "ce", "--after", "none", "--n-boot", "50"))
    add(S, "--n-boot 0", "refuse", ["--n-boot"], cmp("ls", "ce", "--n-boot", "0"))
    add(S, "--n-boot -1", "refuse", ["--n-boot"], cmp("ls", "ce", "--n-boot", "-1"))
    add(S, "--preset unknown", "refuse", ["nopreset"], cmp("ls", "ce", "--preset", "nopreset"))

    S = "report"

    def rep(*args, setup=bench_copy):
        def prep(d):
            name = setup(d) if setup else "bench"
            return ["report", name, *args]
        return prep
    add(S, "valid report", "accept", [], rep("--n-boot", "50"))
    add(S, "missing folder", "refuse", ["bench"], rep(setup=None))
    add(S, "not a bench (empty folder)", "refuse", ["bench", "runs.db"], rep(setup=empty_dir))
    add(S, "DIR is a file", "refuse", ["bench"], rep(setup=file_dir))
    add(S, "corrupt runs.db", "refuse", ["runs.db"], rep(setup=corrupt_db))
    add(S, "--n-boot 0", "refuse", ["--n-boot"], rep("--n-boot", "0"))
    add(S, "--n-boot -1", "refuse", ["--n-boot"], rep("--n-boot", "-1"))
    add(S, "--preset unknown name", "refuse", ["nopreset"], rep("--preset", "nopreset"))
    add(S, "--preset missing .toml", "refuse", ["missing.toml"], rep("--preset", "missing.toml"))

    def bad_toml(d):
        write(d, "broken.toml", "name = \n[[[\n")
        return bench_copy(d)
    add(S, "--preset malformed .toml", "refuse", ["broken.toml"], rep("--preset", "broken.toml", setup=bad_toml))
    add(S, "--store env:UNSET", "refuse", [UNSET_ENV], rep("--store", f"env:{UNSET_ENV}"))

    def damaged(action, what="logits.safetensors"):
        def setup(d):
            name = bench_copy(d)
            target = sorted((d / name / "runs").rglob(what))[-1]  # the ls run (sorted after ce)
            if action == "delete":
                target.unlink()
            else:
                data = target.read_bytes()
                target.write_bytes(data[: len(data) // 2])
            return name
        return setup

    def report_out_is_file(d):
        name = bench_copy(d)
        shutil.rmtree(d / name / "report", ignore_errors=True)
        write(d, f"{name}/report", "a file where the report folder goes\n")
        return name
    # A run's logits file gone or damaged: a report built from the remaining runs would silently differ; a
    # demanding user wants the file named and nothing rewritten.
    # Deleted: "warn", not "refuse". Deliberate and documented (docs/bench.md, the calibrated-probabilities
    # paragraph; calibkit.report.build and row_problem; tests/report/test_data_rows.py): a finished run the
    # report cannot use is named in one warning line and left out, and the other runs are reported, so one
    # lost file does not block the report of a long bench. Not silent: the warning names the logits file.
    add(S, "a run's logits file deleted", "warn", ["logits.safetensors"], rep(setup=damaged("delete")))
    add(S, "a run's logits file truncated", "refuse", ["logits.safetensors"], rep(setup=damaged("truncate")))
    add(S, "report/ is a file", "refuse", ["report"], rep(setup=report_out_is_file))
    S = "compare"

    def cmp2(*args, setup):
        def prep(d):
            return ["compare", setup(d), *args]
        return prep
    add(S, "a run's logits file deleted", "refuse", ["logits.safetensors"],
        cmp2("ls", "ce", "--n-boot", "50", setup=damaged("delete")))
    add(S, "a run's logits file truncated", "refuse", ["logits.safetensors"],
        cmp2("ls", "ce", "--n-boot", "50", setup=damaged("truncate")))


# ---------------------------------------------------------------- preset files

FEATURE_MODEL = '''\
from torch import nn


class Tiny(nn.Module):
    def __init__(self, num_classes, in_channels):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(in_channels, 16), nn.ReLU())
        self.head = nn.Linear(16, num_classes)

    def forward_features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.head(self.forward_features(x))


def tiny(num_classes, in_channels):
    return Tiny(num_classes, in_channels)
'''


def features(n_train=120, n_test=60, k=3, dim=8, seed=0):
    r = np.random.default_rng(seed)

    def split(n):
        y = (np.arange(n) % k).astype(np.int64)
        x = r.normal(size=(n, dim)).astype(np.float32)
        x[np.arange(n), y % dim] += 2
        return x, y
    a, b = split(n_train)
    c, e = split(n_test)
    return dict(x_train=a, y_train=b, x_test=c, y_test=e)


def feature_setup(d, data="feat.npz", model=True, **arrays):
    npz(d, data, **(arrays or features()))
    if model:
        write(d, "fm.py", FEATURE_MODEL)


def smoke_toml():
    from calibkit.bench.presetfile import dump_preset, load_preset

    return dump_preset(load_preset("smoke"))


def feature_toml():
    """The smoke preset on a features file with the tiny model (training ~2 s)."""
    t = smoke_toml()
    for old, new in (('name = "smoke"', 'name = "audit"'),
                     ('dataset = "fmnist"', 'dataset = "tensors"\ndata_dir = "feat.npz"\nmodality = "features"'),
                     ('model = "mlp"', 'model = "fm:tiny"'), ('ood = "digits"', 'ood = "none"'),
                     ("severities = [1, 5]", "severities = []"), ("batch_size = 128", "batch_size = 32"),
                     ("val_size = 500", "val_size = 24"), ("train_subset = 1000", "train_subset = 96")):
        assert old in t, old
        t = t.replace(old, new)
    return t


def edited(base, *repl, append=""):
    t = base()
    for old, new in repl:
        assert old in t, old
        t = t.replace(old, new, 1)
    return t + append


def preset_cases():
    S = "preset"

    def chk(*repl, append="", base=smoke_toml, feat=False, setup=None):
        def prep(d):
            if feat:
                feature_setup(d)
            if setup:
                setup(d)
            write(d, "mine.toml", edited(base, *repl, append=append))
            return ["preset", "check", "mine.toml"]
        return prep

    def feat(*repl, append="", setup=None):
        return chk(*repl, append=append, base=feature_toml, feat=True, setup=setup)

    add(S, "valid smoke file", "accept", [], chk())
    add(S, "valid features file", "accept", [], feat())
    add(S, "shipped name (show)", "accept", [], lambda d: ["preset", "show", "smoke"])
    add(S, "missing file", "refuse", ["missing.toml"], lambda d: ["preset", "check", "missing.toml"])
    add(S, "unknown preset name", "refuse", ["nosuchpreset"], lambda d: ["preset", "check", "nosuchpreset"])
    add(S, "malformed TOML", "refuse", ["mine.toml"], chk(append="\n[train\nlr = \n"))
    add(S, "TOML duplicate key", "refuse", ["mine.toml", "seeds"], chk(append="\nseeds = [1]\n",
                                                                      base=lambda: "seeds = [0]\n" + smoke_toml()))
    add(S, "seeds []", "refuse", ["mine.toml", "seeds"], chk(("seeds = [0]", "seeds = []")))
    add(S, "seeds [-1]", "refuse", ["mine.toml", "seeds"], chk(("seeds = [0]", "seeds = [-1]")))
    add(S, "seeds [0, 0]", "refuse", ["mine.toml", "seeds"], chk(("seeds = [0]", "seeds = [0, 0]")))
    add(S, "seeds a string", "refuse", ["mine.toml", "seeds"], chk(("seeds = [0]", 'seeds = "0"')))
    add(S, "seeds [1.5]", "refuse", ["mine.toml", "seeds"], chk(("seeds = [0]", "seeds = [1.5]")))
    add(S, "n_boot 0", "refuse", ["mine.toml", "n_boot"], chk(("n_boot = 200", "n_boot = 0")))
    add(S, "robust_n -1", "refuse", ["mine.toml", "robust_n"], chk(("robust_n = 200", "robust_n = -1")))
    add(S, "severities [9]", "refuse", ["mine.toml", "severities"], chk(("severities = [1, 5]", "severities = [9]")))
    add(S, "severities [1, 1]", "refuse", ["mine.toml", "severities"],
        chk(("severities = [1, 5]", "severities = [1, 1]")))
    add(S, "num_threads 0", "refuse", ["mine.toml", "num_threads"], chk(("num_threads = 1", "num_threads = 0")))
    add(S, "name ''", "refuse", ["mine.toml", "name"], chk(('name = "smoke"', 'name = ""')))
    add(S, "name with a slash", "refuse", ["mine.toml", "name"], chk(('name = "smoke"', 'name = "a/b"')))
    add(S, "missing model key", "refuse", ["mine.toml", "model"], chk(('model = "mlp"\n', "")))
    add(S, "unknown key seds", "refuse", ["mine.toml", "seds"], chk(("seeds = [0]", "seeds = [0]\nseds = [1]")))
    add(S, "unknown table [trian]", "refuse", ["mine.toml", "trian"], chk(append="\n[trian]\nlr = 0.1\n"))
    add(S, "unknown [train] field", "refuse", ["mine.toml", "lrr"], chk(("lr = 0.05", "lrr = 0.05")))
    add(S, "[train] lr -1", "refuse", ["mine.toml", "lr"], chk(("lr = 0.05", "lr = -1.0")))
    add(S, "[train] lr nan", "refuse", ["mine.toml", "lr"], chk(("lr = 0.05", "lr = nan")))
    add(S, "[train] epochs 0", "refuse", ["mine.toml", "epochs"], chk(("epochs = 2\ntrain", "epochs = 0\ntrain")))
    add(S, "[train] batch_size 0", "refuse", ["mine.toml", "batch_size"], chk(("batch_size = 128", "batch_size = 0")))
    add(S, "[train] keep bogus", "refuse", ["mine.toml", "keep"], chk(('keep = "best-acc"', 'keep = "bogus"')))
    add(S, "unknown dataset", "refuse", ["mine.toml", "nosuchdata"],
        chk(('dataset = "fmnist"', 'dataset = "nosuchdata"')))
    add(S, "methods [bogus]", "refuse", ["mine.toml", "bogus"],
        chk(("seeds = [0]", 'seeds = [0]\nmethods = ["bogus"]')))
    add(S, "modality text on fmnist", "refuse", ["mine.toml", "modality"],
        chk(("seeds = [0]", 'seeds = [0]\nmodality = "text"')))
    add(S, "modality banana", "refuse", ["mine.toml", "modality"],
        chk(("seeds = [0]", 'seeds = [0]\nmodality = "banana"')))
    add(S, "modality images on a features file", "refuse", ["mine.toml", "modality"],
        feat(('modality = "features"', 'modality = "images"')))
    add(S, "augment true on features", "refuse", ["mine.toml", "augment"], feat(("augment = false", "augment = true")))
    add(S, "data_dir missing", "refuse", ["mine.toml", "data_dir", "nope.npz"],
        feat(('data_dir = "feat.npz"', 'data_dir = "nope.npz"')))
    add(S, "data_dir a folder for tensors", "refuse", ["mine.toml", "data_dir", "folder|directory"],
        feat(('data_dir = "feat.npz"', 'data_dir = "."')))
    add(S, "ood path missing", "refuse", ["mine.toml", "ood", "nood"], feat(('ood = "none"', 'ood = "nood/"')))
    add(S, "ood unknown name", "refuse", ["mine.toml", "ood", "martians"], chk(('ood = "digits"', 'ood = "martians"')))
    add(S, "[csm] sharpness -1", "refuse", ["mine.toml", "sharpness"], chk(append="\n[csm]\nsharpness = -1.0\n"))
    add(S, "[csm] sharpness nan", "refuse", ["mine.toml", "sharpness"], chk(append="\n[csm]\nsharpness = nan\n"))
    add(S, "[csm] store missing", "refuse", ["mine.toml", "nostore"], chk(append='\n[csm]\nstore = "nostore"\n'))
    add(S, "[maccal] eta -1", "refuse", ["mine.toml", "eta"], chk(("[maccal]\n", "[maccal]\neta = -1.0\n")))
    add(S, "[maccal] unknown keyword", "refuse", ["mine.toml", "etaa"], chk(("[maccal]\n", "[maccal]\netaa = 1.0\n")))
    # the smoke preset has a [losses] table of its own (mbls, acls): the bad entry goes into it
    add(S, "[losses] ls alpha 2", "refuse", ["mine.toml", "alpha"],
        chk(("[losses]\n", '[losses]\nls = "ls:alpha=2"\n')))
    add(S, "[space.ls] address it does not use (maccal.eta)", "refuse", ["mine.toml", "maccal.eta"],
        chk(append='\n[space.ls]\n"maccal.eta" = [1.0, 2.0]\n'))
    add(S, "[space.ce] (no search space)", "refuse", ["mine.toml", "ce"],
        chk(append='\n[space.ce]\n"loss.alpha" = [0.1]\n'))
    add(S, "[space.ls] NaN value", "refuse", ["mine.toml", "loss.alpha"],
        chk(append='\n[space.ls]\n"loss.alpha" = [nan, 0.1]\n'))
    add(S, "[space.ls] negative value", "refuse", ["mine.toml", "loss.alpha"],
        chk(append='\n[space.ls]\n"loss.alpha" = [-0.1, 0.1]\n'))
    add(S, "[space.ls] empty list", "refuse", ["mine.toml", "loss.alpha"],
        chk(append='\n[space.ls]\n"loss.alpha" = []\n'))
    add(S, "[space.ls] default outside values", "refuse", ["mine.toml", "default"],
        chk(append='\n[space.ls]\n"loss.alpha" = {values = [0.05, 0.1], default = 0.3}\n'))
    add(S, "[space.mixup] train.lr = [-1]", "refuse", ["mine.toml", "train.lr"],
        chk(append='\n[space.mixup]\n"train.lr" = [-1.0, 0.1]\n'))
    add(S, "tune_seed -1", "refuse", ["mine.toml", "tune_seed"], chk(("seeds = [0]", "seeds = [0]\ntune_seed = -1")))
    add(S, "tune_seed equal to an evaluation seed", "warn", ["tune_seed"],
        chk(("seeds = [0]", "seeds = [0]\ntune_seed = 0")))

    def mod(name, body):
        def setup(d):
            write(d, f"{name}.py", body)
        return setup
    add(S, "model module does not exist", "refuse", ["mine.toml", "nomod_audit"],
        feat(('model = "fm:tiny"', 'model = "nomod_audit:f"')))
    add(S, "model factory does not exist", "refuse", ["mine.toml", "nofactory"],
        feat(('model = "fm:tiny"', 'model = "fm:nofactory"')))
    add(S, "model module raises on import", "refuse", ["mine.toml", "raisemod_audit"],
        feat(('model = "fm:tiny"', 'model = "raisemod_audit:f"'),
             setup=mod("raisemod_audit", "raise RuntimeError('broken at import')\n")), proc=True)
    add(S, "model module calls sys.exit on import", "refuse", ["mine.toml", "exitmod_audit"],
        feat(('model = "fm:tiny"', 'model = "exitmod_audit:f"'),
             setup=mod("exitmod_audit", "import sys\nsys.exit(3)\n")), proc=True)
    add(S, "model file.py:factory missing file", "refuse", ["mine.toml", "gone.py"],
        feat(('model = "fm:tiny"', 'model = "gone.py:f"')))
    add(S, "model string without factory", "refuse", ["mine.toml", "model"],
        feat(('model = "fm:tiny"', 'model = "fm:"')))

    add(S, "empty file", "refuse", ["mine.toml"],
        lambda d: (write(d, "mine.toml", ""), ["preset", "check", "mine.toml"])[1])
    add(S, "binary garbage file", "refuse", ["mine.toml"],
        lambda d: (write(d, "mine.toml", random_bytes(500)), ["preset", "check", "mine.toml"])[1])
    add(S, "a folder as the preset", "refuse", ["mine.toml"],
        lambda d: ((d / "mine.toml").mkdir(), ["preset", "check", "mine.toml"])[1])
    add(S, "show a malformed file", "refuse", ["mine.toml"],
        lambda d: (write(d, "mine.toml", "name = [\n"), ["preset", "show", "mine.toml"])[1])
    add(S, "name an integer", "refuse", ["mine.toml", "name"], chk(('name = "smoke"', "name = 5")))
    add(S, "note an integer", "refuse", ["mine.toml", "note"], chk(("note = ", "note = 5\nxnote = ")))
    add(S, "robust_n 1.5", "refuse", ["mine.toml", "robust_n"], chk(("robust_n = 200", "robust_n = 1.5")))
    add(S, "[train_by_method.bogus]", "refuse", ["mine.toml", "bogus"],
        chk(append="\n[train_by_method.bogus]\nlr = 0.1\n"))
    add(S, "[train_by_method.ls] lr -1", "refuse", ["mine.toml", "lr"],
        chk(append="\n[train_by_method.ls]\nlr = -1.0\n"))
    add(S, "[train] schedule bogus", "refuse", ["mine.toml", "schedule"],
        chk(('schedule = "multistep"', 'schedule = "bogus"')))
    add(S, "[train] weight_decay -1", "refuse", ["mine.toml", "weight_decay"],
        chk(("weight_decay = 0.0005", "weight_decay = -1.0")))
    add(S, "[train] grad_clip -1", "refuse", ["mine.toml", "grad_clip"], chk(("grad_clip = 2.0", "grad_clip = -1.0")))
    add(S, "[train] epochs 2.5", "refuse", ["mine.toml", "epochs"], chk(("epochs = 2\ntrain", "epochs = 2.5\ntrain")))
    add(S, "[train] val_size -1", "refuse", ["mine.toml", "val_size"], chk(("val_size = 500", "val_size = -1")))
    add(S, "[csm] sharpness inf", "refuse", ["mine.toml", "sharpness"], chk(append="\n[csm]\nsharpness = inf\n"))
    add(S, "[maccal] r_min 0", "refuse", ["mine.toml", "r_min"], chk(("[maccal]\n", "[maccal]\nr_min = 0.0\n")))
    add(S, "[maccal] epochs 0", "refuse", ["mine.toml", "epochs"],
        chk(("[maccal]\nepochs = 2", "[maccal]\nepochs = 0")))
    add(S, "[space.ls] duplicate values", "refuse", ["mine.toml", "loss.alpha"],
        chk(append='\n[space.ls]\n"loss.alpha" = [0.1, 0.1]\n'))
    add(S, "[space.ls] string values", "refuse", ["mine.toml", "loss.alpha"],
        chk(append='\n[space.ls]\n"loss.alpha" = ["a", "b"]\n'))
    add(S, "[space.ls] extra key next to values", "refuse", ["mine.toml", "extra"],
        chk(append='\n[space.ls]\n"loss.alpha" = {values = [0.1], default = 0.1, extra = 1}\n'))
    add(S, "[space.ls] train.mix_alpha (Mixup only)", "refuse", ["mine.toml", "mix_alpha"],
        chk(append='\n[space.ls]\n"train.mix_alpha" = [0.2, 0.4]\n'))
    add(S, "[space.maccal] maccal.eta valid", "accept", [], chk(append='\n[space.maccal]\n"maccal.eta" = [1.0, 2.0]\n'))
    add(S, "[space.mixup] train.mix_alpha valid", "accept", [],
        chk(append='\n[space.mixup]\n"train.mix_alpha" = [0.2, 0.4]\n'))
    add(S, "[space.ls] unknown method table [space.bogus]", "refuse", ["mine.toml", "bogus"],
        chk(append='\n[space.bogus]\n"loss.alpha" = [0.1]\n'))
    add(S, "tune_seed distinct from seeds", "accept", [], chk(("seeds = [0]", "seeds = [0, 1]\ntune_seed = 3")))


# ---------------------------------------------------------------- bench / tune flags

BENCH_BASE = ["--preset", "smoke", "--data", "tensors", "--data-dir", "feat.npz", "--model", "fm:tiny",
              "--batch-size", "32", "--num-threads", "1"]


def bench_argv(*extra, command="bench", methods=("ce",), seeds=("0",), base=True):
    argv = [command, *(BENCH_BASE if base else []), "--out", "out"]
    if methods:
        argv += ["--methods", *methods]
    if seeds and command == "bench":
        argv += ["--seeds", *seeds]
    if command == "bench":
        argv.append("--no-report")
    return argv + list(extra)


def bench_cases():
    S = "bench"

    def b(*extra, **kw):
        setup = kw.pop("setup", None)

        def prep(d):
            feature_setup(d)
            if setup:
                setup(d)
            return bench_argv(*extra, **kw)
        return prep

    add(S, "valid: smoke on features, ce, seed 0", "accept", [], b())
    for v in ("1e308", "-1", "0", "nan", "inf"):
        # 1e308 is finite but no step can survive it: a demanding user wants it refused before training.
        add(S, f"--lr {v}", "refuse", ["lr"], b("--lr", v))
    add(S, "--epochs 0", "refuse", ["epochs"], b("--epochs", "0"))
    add(S, "--epochs -2", "refuse", ["epochs"], b("--epochs", "-2"))
    add(S, "--batch-size 0", "refuse", ["--batch-size|batch_size"], b("--batch-size", "0"))
    add(S, "--batch-size 1000 (more than the rows)", "refuse", ["--batch-size|batch_size"], b("--batch-size", "1000"))
    add(S, "--seeds -1", "refuse", ["seeds"], b(seeds=("-1",)))
    add(S, "--seeds 0 0", "refuse", ["seeds"], b(seeds=("0", "0")))
    add(S, "--val-size 0", "refuse", ["--val-size|val_size"], b("--val-size", "0"))
    add(S, "--val-size 1.5", "refuse", ["--val-size|val_size"], b("--val-size", "1.5"))
    add(S, "--val-size 500 (more than the rows)", "refuse", ["--val-size|val_size"], b("--val-size", "500"))
    add(S, "--train-subset 0", "refuse", ["train-subset|train_subset"], b("--train-subset", "0"))
    add(S, "--train-subset -5", "refuse", ["train-subset|train_subset"], b("--train-subset", "-5"))
    add(S, "--workers 0", "refuse", ["--workers"], b("--workers", "0"))
    add(S, "--workers -1", "refuse", ["--workers"], b("--workers", "-1"))
    add(S, "--num-threads 0", "refuse", ["--num-threads"], b("--num-threads", "0"))
    add(S, "--augment on feature data", "refuse", ["augment"], b("--augment"))
    add(S, "--methods bogus", "refuse", ["bogus"], b(methods=("ce", "bogus")))
    add(S, "--methods mixup on features", "refuse", ["mixup"], b(methods=("mixup",)))
    add(S, "--keep bogus", "refuse", ["--keep"], b("--keep", "bogus"))
    add(S, "--device banana", "refuse", ["banana"], b("--device", "banana"))
    add(S, "--device cuda:99", "refuse", ["cuda:99"], b("--device", "cuda:99"))
    add(S, "--max-extensions -1", "refuse", ["--max-extensions"], b("--max-extensions", "-1"))
    add(S, "--preset missing.toml", "refuse", ["missing.toml"], b("--preset", "missing.toml"))
    add(S, "--model nosuch module", "refuse", ["nomod_bench"], b("--model", "nomod_bench:f"))
    add(S, "--data nosuchdata", "refuse", ["nosuchdata"], b("--data", "nosuchdata"))
    add(S, "--ood missing file", "refuse", ["nood.npz"], b("--ood", "nood.npz"))
    add(S, "--status on a missing folder", "refuse", ["--out"], b("--status"))
    add(S, "--collect on a missing folder", "refuse", ["--out"], b("--collect"))

    def nonbench(d):
        (d / "out").mkdir()
        write(d, "out/notes.txt", "mine\n")
    add(S, "--collect on a non-bench folder", "refuse", ["--out"], b("--collect", setup=nonbench))
    add(S, "--status on a non-bench folder", "refuse", ["--out"], b("--status", setup=nonbench))
    add(S, "--status with --collect", "refuse", ["--status", "--collect"], b("--status", "--collect"))

    def in_run(d, level="run"):
        bench_copy(d, "done")
        if level == "run":  # a training run's own folder (it holds config.json)
            target = sorted(p.parent for p in (d / "done" / "runs").rglob("config.json"))[0]
        else:  # the preset's folder of runs inside another bench
            target = sorted(p for p in (d / "done" / "runs").iterdir() if p.is_dir())[0]
        (d / "target.txt").write_text(str(target.relative_to(d)))

    def out_in_run(d, level="run"):
        feature_setup(d)
        in_run(d, level)
        argv = bench_argv()
        argv[argv.index("out")] = (d / "target.txt").read_text()
        return argv
    add(S, "--out a training run's folder", "refuse", ["--out", "done/runs"], out_in_run)
    # Not promised by the docs (they name a training run's folder only), so unsure; a demanding user would not
    # want a second bench written into another bench's runs/ tree.
    # "accept": deliberate. check_out (calibkit/bench/preflight.py) refuses only a folder a training run owns
    # (its config.json), whose files a bench would overwrite; runs/<preset> of another bench is a plain folder
    # that no run owns, and a bench written there touches none of the other bench's files (its own runs.db,
    # runs/, report/ go under the new --out), so nothing is lost.
    add(S, "--out another bench's runs/<preset> folder", "accept", [], lambda d: out_in_run(d, "preset"))

    url = f"postgresql://calib:{SECRET}@127.0.0.1:1/calib?connect_timeout=2&sslpassword={SECRET}"
    add(S, "--store with passwords (unreachable)", "refuse", ["127.0.0.1"], b("--store", url), forbid=(SECRET,))
    add(S, "--store keyword form with a password", "refuse", ["--store"],
        b("--store", f"host=127.0.0.1 port=1 password={SECRET}"), forbid=(SECRET,))
    add(S, "--store mysql://", "refuse", ["--store"], b("--store", "mysql://u@h/db"))
    add(S, "--store env:UNSET", "refuse", [UNSET_ENV], b("--store", f"env:{UNSET_ENV}"), proc=True)
    add(S, "--store env: (empty name)", "refuse", ["--store"], b("--store", "env:"))
    # The masked URL (its host) says which database failed; naming the variable too would be kinder.
    add(S, "--store env:NAME holding an unreachable URL", "refuse", ["127.0.0.1"],
        b("--store", "env:CALIBKIT_AUDIT_BAD_STORE"), proc=True,
        env={"CALIBKIT_AUDIT_BAD_STORE": f"postgresql://u:{SECRET}@127.0.0.1:1/db?connect_timeout=2"},
        forbid=(SECRET,))

    slurm = ("--executor", "slurm", "--dry-run")

    add(S, "slurm dry-run valid", "accept", [], b(*slurm, "--partition", "gpu", "--time", "01:00:00", "--mem", "4G"))
    add(S, "slurm --partition with a newline", "refuse", ["--partition"], b(*slurm, "--partition", "gpu\ntouch x"))
    add(S, "slurm --time garbage", "refuse", ["--time", "garbage"], b(*slurm, "--time", "garbage"))
    add(S, "slurm --mem lots", "refuse", ["--mem", "lots"], b(*slurm, "--mem", "lots"))
    add(S, "slurm --sbatch-arg with a newline", "refuse", ["--sbatch-arg"],
        b(*slurm, "--sbatch-arg", "--constraint=a100\ntouch x"))
    add(S, "slurm --sbatch-arg not an option", "refuse", ["--sbatch-arg"], b(*slurm, "--sbatch-arg", "rm -rf ~"))
    add(S, "slurm --account with ;", "refuse", ["--account"], b(*slurm, "--account", "a; touch x"))
    add(S, "slurm --gpus-per-run -1", "refuse", ["--gpus-per-run"], b(*slurm, "--gpus-per-run", "-1"))
    add(S, "slurm --cpus-per-run 0", "refuse", ["--cpus-per-run"], b(*slurm, "--cpus-per-run", "0"))
    add(S, "slurm --array-parallelism 0", "refuse", ["--array-parallelism"], b(*slurm, "--array-parallelism", "0"))
    add(S, "slurm --signal -5", "refuse", ["--signal"], b(*slurm, "--signal", "-5"))
    add(S, "slurm with --workers 2", "refuse", ["--workers"], b(*slurm, "--workers", "2"))
    add(S, "--partition without --executor slurm", "refuse", ["--partition"], b("--partition", "gpu"))
    add(S, "--dry-run without --executor slurm", "refuse", ["--dry-run"], b("--dry-run"))

    add(S, "--name with a slash", "refuse", ["--name|name", "a/b"], b("--name", "a/b"))
    add(S, "--name ''", "refuse", ["--name|name"], b("--name", ""))
    add(S, "--val-size 0.0001 (0 rows)", "refuse", ["--val-size|val_size"], b("--val-size", "0.0001"))
    add(S, "--train-subset 2 (fewer than the classes)", "refuse", ["train-subset|train_subset"],
        b("--train-subset", "2"))
    add(S, "--ood digits on feature data", "refuse", ["ood"], b("--ood", "digits"))
    # --csm-store is only read by csm; a missing folder given by hand is still most likely a typo.
    add(S, "--csm-store missing (ce only)", "refuse", ["nostore"], b("--csm-store", "nostore"))
    add(S, "--methods csm on features", "refuse", ["csm"], b(methods=("csm",)))
    add(S, "--seeds 4294967296 (above 32 bits)", "accept", [], b(seeds=("4294967296",)))

    def out_file(d):
        write(d, "outfile", "keep\n")
    def with_out(name, setup):
        def prep(d):
            feature_setup(d)
            setup(d)
            argv = bench_argv()
            argv[argv.index("out")] = name
            return argv
        return prep
    add(S, "--out an existing file", "refuse", ["outfile"], with_out("outfile", out_file))
    add(S, "--out under a file", "refuse", ["outfile"], with_out("outfile/sub", out_file))

    def rerun(*extra):
        def prep(d):
            feature_setup(d)
            bench_copy(d, "done")
            argv = bench_argv(*extra)
            argv[argv.index("out")] = "done"
            return argv
        return prep
    # --name keeps the recorded preset's name, so the directory holds a changed version of it
    add(S, "same out, changed preset (--lr 0.01)", "refuse", ["lr"],
        rerun("--lr", "0.01", "--name", "smoke+data=tensors,model=fm-tiny,batch_size=32"))
    add(S, "same out, another --keep policy", "refuse", ["keep"], rerun("--keep", "last"))
    add(S, "same out, same command again (skips)", "accept", [], rerun())

    S = "tune"

    def t(*extra, **kw):
        setup = kw.pop("setup", None)
        methods = kw.pop("methods", ("ls",))

        def prep(d):
            feature_setup(d)
            if setup:
                setup(d)
            return bench_argv(*extra, command="tune", methods=methods, **kw)
        return prep

    def one_value_preset(d):
        write(d, "one.toml", feature_toml() + '\n[space.ls]\n"loss.alpha" = [0.1]\n')

    def tp(*extra, **kw):
        def prep(d):
            feature_setup(d)
            one_value_preset(d)
            return ["tune", "--preset", "one.toml", "--out", "out", "--methods", "ls", "--num-threads", "1",
                    "--max-extensions", "0", *extra]
        return prep
    # ce has no search space: tuning it alone trains nothing useful; a demanding user wants to be told before
    # anything is written.
    add(S, "tune --methods ce", "refuse", ["ce"], t(methods=("ce",)))
    add(S, "tune --seed equal to an evaluation seed", "warn", ["seed"], tp("--seed", "0"))
    add(S, "tune --seed -1", "refuse", ["seed"], t("--seed", "-1"))
    add(S, "tune --methods bogus", "refuse", ["bogus"], t(methods=("bogus",)))
    add(S, "tune --lr -1", "refuse", ["lr"], t("--lr", "-1"))
    add(S, "tune --epochs 0", "refuse", ["epochs"], t("--epochs", "0"))
    add(S, "tune --workers 0", "refuse", ["--workers"], t("--workers", "0"))
    add(S, "tune --workers 2 --executor slurm", "refuse", ["--workers"], t("--workers", "2", "--executor", "slurm"))
    add(S, "tune --max-extensions -1", "refuse", ["--max-extensions"], t("--max-extensions", "-1"))
    add(S, "tune --status on a missing folder", "refuse", ["--out"], t("--status"))
    add(S, "tune --collect on a missing folder", "refuse", ["--out"], t("--collect"))
    add(S, "tune --collect on a non-bench folder", "refuse", ["--out"], t("--collect", setup=nonbench))
    add(S, "tune --status with --collect", "refuse", ["--status", "--collect"], t("--status", "--collect"))

    def tune_in_run(d):
        feature_setup(d)
        in_run(d)
        argv = bench_argv(command="tune", methods=("ls",))
        argv[argv.index("out")] = (d / "target.txt").read_text()
        return argv
    add(S, "tune --out inside a run folder", "refuse", ["--out", "done/runs"], tune_in_run)
    add(S, "tune --store env:UNSET", "refuse", [UNSET_ENV], t("--store", f"env:{UNSET_ENV}"), proc=True)
    add(S, "tune slurm --time garbage", "refuse", ["--time"],
        t("--executor", "slurm", "--dry-run", "--time", "garbage"))
    add(S, "tune --augment on features", "refuse", ["augment"], t("--augment"))

    add(S, "tune --methods ls ls (repeated)", "accept", [], tp("--methods", "ls", "ls"))
    add(S, "tune --seed 5 (not an evaluation seed)", "accept", [], tp("--seed", "5"))


# ---------------------------------------------------------------- own data for the bench

def own_data_cases():
    S = "own-data"

    def own(arrays=None, data="my.npz", extra=(), setup=None, raw=None):
        def prep(d):
            write(d, "fm.py", FEATURE_MODEL)
            if raw is not None:
                write(d, data, raw)
            elif arrays is not None:
                npz(d, data, **arrays)
            if setup:
                setup(d)
            argv = bench_argv(*extra)
            argv[argv.index("feat.npz")] = data
            return argv
        return prep

    f = features()

    def with_(**changes):
        a = dict(f)
        for k, v in changes.items():
            if v is None:
                a.pop(k)
            else:
                a[k] = v
        return a

    add(S, "one class", "refuse", ["my.npz", "class"],
        own(with_(y_train=np.zeros(120, np.int64), y_test=np.zeros(60, np.int64))))
    add(S, "0 training rows", "refuse", ["my.npz", "x_train"],
        own(with_(x_train=np.zeros((0, 8), np.float32), y_train=np.zeros(0, np.int64))))
    add(S, "0 test rows", "refuse", ["my.npz", "x_test"],
        own(with_(x_test=np.zeros((0, 8), np.float32), y_test=np.zeros(0, np.int64))))
    add(S, "missing y_test", "refuse", ["my.npz", "y_test"], own(with_(y_test=None)))
    add(S, "missing x_train", "refuse", ["my.npz", "x_train"], own(with_(x_train=None)))
    add(S, "unknown array x_trian", "refuse", ["my.npz", "x_trian"], own(with_(x_trian=f["x_train"])))
    add(S, "x_val without y_val", "refuse", ["my.npz", "y_val"], own(with_(x_val=f["x_test"][:20])))
    xn = f["x_train"].copy()
    xn[4, 2] = np.nan
    add(S, "NaN features", "refuse", ["my.npz", "x_train", "NaN"], own(with_(x_train=xn)))
    xi = f["x_test"].copy()
    xi[0, 0] = np.inf
    add(S, "inf test features", "refuse", ["my.npz", "x_test"], own(with_(x_test=xi)))
    yo = f["y_test"].copy()
    yo[0] = 7
    add(S, "test label out of range", "refuse", ["my.npz", "y_test"], own(with_(y_test=yo)))
    ym = f["y_train"].copy()
    ym[ym == 1] = 2
    add(S, "class 1 absent from y_train", "refuse", ["my.npz", "y_train"], own(with_(y_train=ym)))
    add(S, "x_train/y_train length mismatch", "refuse", ["my.npz", "y_train"], own(with_(y_train=f["y_train"][:100])))
    add(S, "float labels", "refuse", ["my.npz", "y_train"], own(with_(y_train=f["y_train"] + 0.5)))
    add(S, "train/test feature shapes differ", "refuse", ["my.npz", "x_test"],
        own(with_(x_test=f["x_test"][:, :5].copy())))
    obj = np.empty(120, dtype=object)
    for i in range(120):
        obj[i] = f["x_train"][i]
    add(S, "object array", "refuse", ["my.npz", "x_train"], own(with_(x_train=obj)))
    add(S, "random bytes file", "refuse", ["my.npz"], own(raw=random_bytes()))
    add(S, "random bytes .safetensors", "refuse", ["my.safetensors"], own(data="my.safetensors", raw=random_bytes()))

    def folder_as_file(d):
        (d / "dir.npz").mkdir()
    add(S, "a folder given as the .npz", "refuse", ["dir.npz", "folder|directory"],
        own(data="dir.npz", setup=folder_as_file))
    add(S, "missing data file", "refuse", ["gone.npz"], own(data="gone.npz"))
    add(S, "uint16 labels with a fixed x_val/y_val", "accept", [],
        own(with_(y_train=f["y_train"].astype(np.uint16), y_test=f["y_test"].astype(np.uint16),
                  x_val=f["x_test"][:30].copy(), y_val=f["y_test"][:30].astype(np.uint16))))

    def ood(arrays):
        def setup(d):
            npz(d, "ood.npz", **arrays)
        return own(f, extra=("--ood", "ood.npz"), setup=setup)
    add(S, "OOD file with 0 rows", "refuse", ["ood.npz"], ood({"x": np.zeros((0, 8), np.float32)}))
    add(S, "OOD file with the wrong feature size", "refuse", ["ood.npz"], ood({"x": np.zeros((10, 5), np.float32)}))
    add(S, "OOD file without x", "refuse", ["ood.npz", "x"], ood({"inputs": np.zeros((10, 8), np.float32)}))
    add(S, "OOD file with NaN", "refuse", ["ood.npz", "NaN"], ood({"x": np.full((10, 8), np.nan, np.float32)}))

    # image folders
    def images(layout, size=(8, 8), sizes=None):
        def setup(d):
            from PIL import Image
            r = np.random.default_rng(0)
            for i, (rel, n) in enumerate(layout.items()):
                folder = d / "imgs" / rel
                folder.mkdir(parents=True, exist_ok=True)
                for j in range(n):
                    s = sizes[(i + j) % len(sizes)] if sizes else size
                    Image.fromarray(r.integers(0, 255, (*s, 3), dtype=np.uint8)).save(folder / f"{j}.png")
        return setup

    def imgcase(layout, **kw):
        def prep(d):
            images(layout, **kw)(d)
            return ["bench", "--preset", "smoke", "--data", "imagefolder", "--data-dir", "imgs", "--out", "out",
                    "--methods", "ce", "--seeds", "0", "--batch-size", "8", "--model", "cnn", "--num-threads", "1",
                    "--no-report"]
        return prep
    add(S, "image folder with an empty class folder", "refuse", ["empty_cls"],
        imgcase({"train/a": 6, "train/b": 6, "train/empty_cls": 0, "test/a": 2, "test/b": 2}))
    add(S, "image folder with no images at all", "refuse", ["imgs"], imgcase({"train/a": 0, "test/a": 0}))
    add(S, "image folder with one class", "refuse", ["class"], imgcase({"train/a": 8, "test/a": 2}))
    add(S, "image folder, images of different sizes", "refuse", ["imgs/train"],
        imgcase({"train/a": 6, "train/b": 6, "test/a": 2, "test/b": 2}, sizes=[(8, 8), (10, 12)]))

    def notimg(d):
        images({"train/a": 6, "train/b": 6, "test/a": 2, "test/b": 2})(d)
        write(d, "imgs/train/a/broken.png", random_bytes(300))
    add(S, "image folder with a corrupt .png", "refuse", ["broken.png"],
        lambda d: (notimg(d), imgcase({})(d))[1])
    add(S, "image folder missing", "refuse", ["imgs"], imgcase({}))


# ---------------------------------------------------------------- the Python API

API = "__api__"  # argv[0] of a case run as Python code in the case's folder instead of a command line


def api_cases():
    """The bench's and the tuning's refusals through ``calibkit.pipeline`` (a refusal is a UserError,
    shown as exit 1 with its message, and nothing created)."""
    S = "api"
    head = "from calibkit.pipeline import BenchOptions as B, TuneOptions as T, run_bench, run_tune\n"
    for name, code, keys in (
        ("report='no'", "B(report='no')", ["report"]),
        ("seeds=(2**70,)", "run_bench('smoke', 'out', B(seeds=(2**70,)))", ["seeds"]),
        ("device='tpu'", "run_bench('smoke', 'out', B(device='tpu'))", ["tpu"]),
        ("store='mysql://x'", "run_bench('smoke', 'out', B(store='mysql://x'))", ["store"]),
        ("log=None", "run_bench('smoke', 'out', B(log=None))", ["log"]),
        ("a dict for the options", "run_bench('smoke', 'out', {'seeds': [0]})", ["BenchOptions"]),
        ("out=None", "run_bench('smoke', None, B(seeds=(0,)))", ["out"]),
        ("missing preset file", "import pathlib; run_bench(pathlib.Path('gone.toml'), 'out', B(seeds=(0,)))",
         ["gone.toml"]),
        ("unknown preset name", "run_bench('no_such_preset', 'out', B(seeds=(0,)))", ["no_such_preset"]),
        ("a Preset named a/b", "from dataclasses import replace; from calibkit.bench.presetfile import load_preset; "
         "run_bench(replace(load_preset('smoke'), name='a/b'), 'out', B(seeds=(0,)))", ["a/b"]),
        ("missing CSM store", "run_bench('smoke', 'out', B(seeds=(0,), csm_store='nostore'))", ["nostore"]),
        ("tune: a dict", "run_tune('smoke', 'out', {'seed': 0})", ["TuneOptions"]),
        ("tune: seed -1", "run_tune('smoke', 'out', T(seed=-1))", ["seed"]),
        ("bootstrap_ci n_resamples=1", "import torch; from calibkit.bootstrap import bootstrap_ci; "
         "bootstrap_ci('ece', torch.full((20, 2), 0.5), torch.arange(20) % 2, n_resamples=1)", ["n_resamples"]),
        ("spiegelhalter_z on one row", "import torch; from calibkit.functional.calibration_tests import "
         "spiegelhalter_z; spiegelhalter_z(torch.tensor([[0.9, 0.1]]), torch.tensor([0]))", ["spiegelhalter_z"]),
        ("ks_calibration_test on one row", "import torch; from calibkit.functional.calibration_tests import "
         "ks_calibration_test; ks_calibration_test(torch.tensor([[0.9, 0.1]]), torch.tensor([0]))",
         ["ks_calibration_test"]),
    ):
        add(S, name, "refuse", keys, lambda d, code=code: [API, head + code])

    minimum_cases()

    def no_class_4(d):  # K = 5, validation without class 4
        x, y = logits_labels(200, 5, 0)
        npz(d, "val.npz", logits=x[y != 4], labels=y[y != 4])
        x, y = logits_labels(100, 5, 1)
        npz(d, "test.npz", logits=x, labels=y)
        return cal_argv("val.npz", "test.npz", "--n-boot", "20", "--calibrators", "temperature,vector,histogram")
    add("edges", "calibrate: validation without class 4", "warn", ["class 4"], no_class_4)
    add("edges", "calibrate: --save of a map that needs class 4", "refuse", ["--save", "class 4"],
        lambda d: no_class_4(d) + ["--save", "vector"])

    def n_boot(v):
        def prep(d):
            good_pair(d)
            return cal_argv("val.npz", "test.npz", "--n-boot", v)
        return prep
    for v in ("1", "9"):
        add("edges", f"calibrate --n-boot {v}", "refuse", ["--n-boot"], n_boot(v))


def minimum_cases():
    """The statistics' minimums (docs/metrics.md, "Minimum samples"): one below is refused naming
    the minimum, the minimum itself is accepted."""
    S = "api"
    head = "import torch\n"
    q = "from calibkit.conformal import conformal_quantile as q, SplitConformal as SC\n"
    sel = "from calibkit.functional import risk_coverage_curve as rc, aurc, augrc, eaurc, selective_risk as sr\n"
    two = "torch.tensor([[0.9, 0.1], [0.6, 0.4]]), torch.tensor([0, 1])"
    one = "torch.tensor([[0.9, 0.1]]), torch.tensor([0])"
    for name, code, expect, keys in (
        ("conformal_quantile: 8 scores, alpha 0.1", q + "q(torch.arange(8.), 0.1)", "refuse", ["at least 9", "alpha"]),
        ("conformal_quantile: 9 scores, alpha 0.1", q + "assert q(torch.arange(9.), 0.1) == 8", "accept", []),
        ("conformal_quantile: 18 scores, alpha 0.05", q + "q(torch.arange(18.), 0.05)", "refuse", ["at least 19"]),
        ("conformal_quantile: 19 scores, alpha 0.05", q + "q(torch.arange(19.), 0.05)", "accept", []),
        ("SplitConformal.fit: 8 rows, alpha 0.1", q + "p = torch.rand(8, 3).softmax(1); SC('lac', 0.1).fit(p, "
         "torch.arange(8) % 3)", "refuse", ["at least 9"]),
        ("SplitConformal.fit: 9 rows, alpha 0.1", q + "p = torch.rand(9, 3).softmax(1); SC('lac', 0.1).fit(p, "
         "torch.arange(9) % 3)", "accept", []),
        ("risk_coverage_curve: 1 row", sel + f"rc({one})", "refuse", ["at least 2"]),
        ("aurc: 1 row", sel + f"aurc({one})", "refuse", ["at least 2"]),
        ("augrc / eaurc / selective_risk: 1 row", sel + f"augrc({one})", "refuse", ["at least 2"]),
        ("selective curves: 2 rows", sel + f"rc({two}); aurc({two}); augrc({two}); eaurc({two}); sr({two})",
         "accept", []),
        ("aurc: 2 rows, one ignored", sel + "aurc(torch.tensor([[0.9, 0.1], [0.6, 0.4]]), torch.tensor([0, -1]), "
         "ignore_index=-1)", "refuse", ["at least 2"]),
    ):
        add(S, name, expect, keys, lambda d, code=code: [API, head + code])


TRIPLE = re.compile(r"([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")


def intervals_hold(*files, stdout=True, least=1):
    """A check: the files (relative to the case folder) exist and, with stdout, hold at least
    ``least`` printed intervals ``estimate [low, high]``, each holding its estimate as printed."""
    from decimal import Decimal

    def check(d: Path, out: str) -> str:
        texts = [("stdout", out)] if stdout else []
        for f in files:
            if not (d / f).is_file():
                return f"{f} not written"
            texts.append((f, (d / f).read_text(errors="replace")))
        found = 0
        for where, text in texts:
            for e, lo, hi in TRIPLE.findall(text):
                found += 1
                if not Decimal(lo) <= Decimal(e) <= Decimal(hi):
                    return f"{where}: printed interval {e} [{lo}, {hi}] misses its estimate"
        return "" if found >= least else f"only {found} printed interval(s)"
    return check


def format_cases():
    """Every report format, accepted, with every printed interval holding its estimate: calibrate's
    terminal text, calibrators.md and index.html; the bench report's terminal text, report.md and
    index.html; compare's terminal table."""
    S = "formats"

    def calibrate(d):
        good_pair(d)
        return cal_argv("val.npz", "test.npz", "--n-boot", "50")
    add(S, "calibrate: terminal, calibrators.md, index.html", "accept", [], calibrate,
        check=intervals_hold("out/report/calibrators.md", "out/report/index.html", least=3))

    def report(d):
        return ["report", bench_copy(d), "--n-boot", "50", "--quiet"]
    add(S, "report: terminal, report.md, index.html", "accept", [], report,
        check=intervals_hold("bench/report/report.md", "bench/report/index.html", least=3))

    def compare(d):
        return ["compare", bench_copy(d), "ls", "ce", "--n-boot", "50"]
    add(S, "compare: terminal table", "accept", [], compare, check=intervals_hold(least=1))

    def report_alpha(d):  # the bench's validation half is below what alpha = 0.001 needs (999 rows)
        return ["report", bench_copy(d), "--n-boot", "50", "--alpha", "0.001", "--quiet"]

    def no_sets_said(d: Path, out: str) -> str:
        text = (d / "bench/report/report.md").read_text() if (d / "bench/report/report.md").is_file() else ""
        return "" if "No conformal sets" in text and "at least 999" in text else "report.md does not say why no sets"
    add(S, "report --alpha 0.001: no sets, the reason said", "accept", [], report_alpha, check=no_sets_said)


# ---------------------------------------------------------------- running and classifying

def snapshot(d: Path) -> dict:
    state = {}
    for root, dirs, files in os.walk(d):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(d))
            if p.is_symlink():
                state[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                state[rel] = ("dir",)
            else:
                st = p.stat()
                h = hashlib.sha1(p.read_bytes()).hexdigest() if st.st_size < 50_000_000 else st.st_mtime_ns
                state[rel] = ("file", st.st_size, h)
    return state


def sqlite_side(rel: str, before: dict) -> bool:
    """A SQLite side file (-wal, -shm, -journal) of a database that existed before the case ran: reading a
    database in WAL mode touches them, so they are no sign of a write."""
    for suffix in ("-wal", "-shm", "-journal"):
        if rel.endswith(suffix) and rel[: -len(suffix)] in before:
            return True
    return False


def run_api(code: str):
    """Run ``code``: a UserError is a refusal (exit 1, its message on stderr), anything else a crash."""
    from calibkit.errors import UserError

    try:
        exec(compile(code, "<api case>", "exec"), {})  # noqa: S102 - the audit's own case code
    except UserError as exc:
        print(f"calibkit: error: {exc}", file=sys.stderr)
        return 1
    return 0


def run_inprocess(argv, d: Path):
    from calibkit.cli import main

    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(d)
    sys.path.insert(0, str(d))
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            try:
                rc = run_api(argv[1]) if argv[:1] == [API] else main(argv)
            except SystemExit as exc:
                code = exc.code
                rc = 0 if code is None else code if isinstance(code, int) else 1
                if isinstance(code, str):
                    print(code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - anything escaping main() is a traceback for a user
                traceback.print_exc()
                rc = "crash"
    finally:
        os.chdir(cwd)
        if str(d) in sys.path:
            sys.path.remove(str(d))
    return rc, out.getvalue(), err.getvalue()


def run_subprocess(argv, d: Path, env_extra: dict, timeout=180):
    env = dict(os.environ)
    env.pop(UNSET_ENV, None)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(env_extra)
    try:
        proc = subprocess.run([sys.executable, "-m", "calibkit", *argv], cwd=d, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return "timeout", exc.stdout or "", (exc.stderr or "") if isinstance(exc.stderr, str) else ""
    return proc.returncode, proc.stdout, proc.stderr


def message_lines(err: str) -> list[str]:
    """stderr's non-empty lines, without argparse's usage block."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if lines and lines[0].startswith("usage:"):
        lines = [ln for ln in lines[1:] if not ln.startswith(" ")]
    return lines


def named(key: str, text: str) -> bool:
    """Whether ``text`` (lower case) names ``key``: any of its ``|``-separated spellings, any case, as a whole
    word (``ce`` is not found in ``once``; ``val`` is not found in ``val_size``)."""
    return any(re.search(r"(?<![a-z0-9_])" + re.escape(k.lower()) + r"(?![a-z0-9_])", text) for k in key.split("|"))


def classify(c: Case, rc, out: str, err: str, changed: list[str]):
    lines = message_lines(err)
    text = " ".join(lines).lower()
    if any(s in out or s in err for s in c.forbid):
        return "bad", "prints the password"
    if rc in ("crash", "timeout"):
        return "bad", rc
    if "Traceback (most recent call last)" in err:
        return "bad", "traceback"
    problems = []
    if c.expect == "refuse":
        if rc == 0:
            return "bad", "accepted (exit 0)"
        usage = rc == 2 and err.lstrip().startswith("usage:")
        if rc != 1 and not usage:
            return "bad", f"exit {rc}"
        if not lines:
            problems.append("no message")
        elif len(lines) > 1:
            problems.append(f"{len(lines)} lines")
        if len(text) > 500:
            problems.append(f"{len(text)} characters")
        missing = [k for k in c.keys if not named(k, text)]
        if missing and lines:
            problems.append("does not name " + ", ".join(map(repr, missing)))
        if changed:
            problems.append("left " + ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else ""))
    elif c.expect == "warn":
        if rc != 0:
            return "bad", f"refused (exit {rc})"
        warn = " ".join(ln for ln in lines if "warning" in ln.lower()).lower()
        if not warn:
            problems.append("no warning")
        else:
            missing = [k for k in c.keys if not named(k, warn)]
            if missing:
                problems.append("warning does not name " + ", ".join(map(repr, missing)))
    else:
        if rc != 0:
            return "bad", f"refused (exit {rc})"
    return ("partial" if problems else "clean"), "; ".join(problems)


def run_case(c: Case, root: Path, index: int) -> dict:
    d = root / f"{index:03d}"
    d.mkdir()
    start = time.perf_counter()
    try:
        argv = c.prep(d)
    except Exception as exc:  # noqa: BLE001 - a broken case must not stop the audit
        return dict(surface=c.surface, case=c.name, expect=c.expect, cls="bad",
                    why=f"AUDIT CASE BROKEN: {type(exc).__name__}: {exc}", first="", rc=None, seconds=0.0, argv=[])
    before = snapshot(d)
    if c.proc or c.env:
        rc, out, err = run_subprocess(argv, d, c.env)
    else:
        rc, out, err = run_inprocess(argv, d)
    after = snapshot(d)
    changed = sorted(k for k in set(before) | set(after)
                     if before.get(k) != after.get(k) and not sqlite_side(k, before))
    cls, why = classify(c, rc, out, err, changed)
    if c.check and cls == "clean":
        problem = c.check(d, out)
        if problem:
            cls, why = "bad", problem
    lines = message_lines(err)
    first = lines[0] if lines else ""
    for s in c.forbid:
        first = first.replace(s, "<PASSWORD>")
    return dict(surface=c.surface, case=c.name, expect=c.expect, cls=cls, why=why, first=first, rc=rc,
                seconds=round(time.perf_counter() - start, 2), argv=argv,
                stderr_tail=[ln.replace(SECRET, "<PASSWORD>") for ln in err.splitlines()[-5:]])


def build_fixtures(root: Path):
    """A saved calibrator set and one finished bench (ce and ls, seed 0, features, tiny model)."""
    FIX["cal"] = root / "calibrators"
    FIX["cal"].mkdir()
    build_calibrators(FIX["cal"])
    b = root / "benchsrc"
    b.mkdir()
    feature_setup(b)
    rc, out, err = run_inprocess(["bench", *BENCH_BASE, "--out", "bench", "--methods", "ce", "ls", "--seeds", "0",
                                  "--no-report"], b)
    if rc != 0:
        raise SystemExit(f"input_audit: the fixture bench failed (exit {rc}):\n{err[-2000:]}")
    FIX["bench"] = b / "bench"


def build_cases():
    calibrate_cases()
    apply_cases()
    compare_report_cases()
    preset_cases()
    bench_cases()
    own_data_cases()
    api_cases()
    format_cases()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Feed bad and edge inputs to calibkit's command line and classify "
                                 "each result as clean, partial or bad.")
    ap.add_argument("--only", metavar="SURFACE", help="run only this surface's cases (e.g. calibrate)")
    ap.add_argument("--json", metavar="FILE", help="write the results to FILE")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    opts = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    build_cases()
    cases = [c for c in CASES if opts.only in (None, c.surface)]
    if opts.list:
        for c in cases:
            print(f"{c.surface:<10} {c.expect:<7} {c.name}")
        print(f"{len(cases)} cases")
        return 0
    if not cases:
        print(f"no cases for surface {opts.only!r}; surfaces: {', '.join(dict.fromkeys(c.surface for c in CASES))}")
        return 0
    root = Path(tempfile.mkdtemp(prefix="calibkit-audit-"))
    start = time.perf_counter()
    try:
        if any(c.surface not in ("api", "edges") for c in cases):  # these cases need no fixture
            build_fixtures(root)
        results = []
        for i, c in enumerate(cases):
            r = run_case(c, root, i)
            results.append(r)
            print(f"{r['surface']:<10} {r['case'][:46]:<46} {r['cls']:<8} {r['first'][:120]}", flush=True)
    finally:
        if opts.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    seconds = time.perf_counter() - start
    print_summary(results, seconds)
    if opts.json:
        Path(opts.json).write_text(json.dumps({"seconds": round(seconds, 1), "results": results}, indent=1,
                                              default=str))
    return 0


def print_summary(results, seconds):
    classes = ("clean", "partial", "bad")
    surfaces = list(dict.fromkeys(r["surface"] for r in results))
    print(f"\n{len(results)} cases in {seconds:.0f} s")
    print(f"{'surface':<10} {'cases':>5} " + " ".join(f"{k:>7}" for k in classes))
    for s in surfaces + ["overall"]:
        rs = [r for r in results if s in ("overall", r["surface"])]
        print(f"{s:<10} {len(rs):>5} " + " ".join(f"{sum(r['cls'] == k for r in rs):>7}" for k in classes))
    rest = [r for r in results if r["cls"] != "clean"]
    if rest:
        print("\nnot clean:")
        for r in rest:
            print(f"  [{r['cls']}] {r['surface']}: {r['case']} ({r['why']}): {r['first'][:160]}")


if __name__ == "__main__":
    sys.exit(main())
