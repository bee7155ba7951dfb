"""Every run's saved logits through every post-hoc calibrator, at report time.

For each finished run the report fits every entry of :data:`calibkit.calibrators.CALIBRATORS`
(``Calibrator()``, default hyperparameters) on the run's saved **validation** logits and applies
it to its saved **test** logits (``logits.safetensors``): no retraining, and nothing fitted on the
test split. ``"none"`` is the uncalibrated softmax.

Why at report time, from the saved logits, and not at evaluation time into the database row:

* the report then works for every existing bench directory (their rows were written before the
  calibrators existed), and the table grows with the registry without rerunning a bench;
* the paired bootstraps against CE + TS need the per-sample test probabilities anyway, which the
  database rows do not hold;
* the shipped presets' run configs and the database rows stay as they are.

The price is fitting the calibrators when a report is built. The calibrated test probabilities are
therefore cached: in memory for one report, and on disk under ``DIR/cache/calibrated/`` keyed by the
*content* of the run's saved tensors (:func:`tensor_digest` of the validation logits and labels and
the test logits), the calibrator's ``repr`` (its hyperparameters), :data:`CACHE_FORMAT` and the
calibkit version, so a rebuilt report, ``calibkit compare`` and a copied or moved bench directory
refit nothing, and logits rewritten in place are never served stale probabilities. A cache file
that cannot be read is recomputed, never trusted.

Each calibrator fitted here on a run's whole validation split is kept for the report
(:meth:`CalibratedProbs.fitted`): the cross-fitting of :mod:`calibkit.report.verdict` starts from
the same fit on the same rows instead of fitting it a second time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from calibkit import __version__
from calibkit.calibrators.registry import CALIBRATORS, default_names
from calibkit.errors import UserError
from calibkit.metrics import evaluate
from calibkit.report.data import mean_std
from calibkit.rundir import read_tensors, write_tensors

NONE = "none"  # the uncalibrated column
#: Version of the report's cache files (calibrated probabilities, cross-fitted scores, conformal rows):
#: raised whenever what they hold or how they are keyed changes, so that older files are never read.
CACHE_FORMAT = 2
#: The saved tensors that the calibrated test probabilities depend on.
FIT_AND_TEST = ("val_logits", "val_labels", "test_logits")


def tensor_digest(tensors: dict, names) -> str:
    """SHA-256 (hex) of the named tensors' names, dtypes, shapes and bytes: the content key of the caches."""
    h = hashlib.sha256()
    for name in names:
        t = tensors[name].detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}|{t.dtype}|{tuple(tensors[name].shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def cache_file(cache_dir: Path, row: dict, stem: str, ident: str, suffix: str) -> Path:
    """``cache_dir/RUN__STEM__HASH.SUFFIX``: ``HASH`` of ``ident`` (which must hold the content digest)
    with :data:`CACHE_FORMAT` and the calibkit version; ``RUN`` only makes the files readable."""
    digest = hashlib.sha256(f"{ident}|format {CACHE_FORMAT}|{__version__}".encode()).hexdigest()[:24]
    return cache_dir / f"{row['run_key'].replace('/', '_')}__{stem}__{digest}.{suffix}"


class NoValidationLogits(UserError):
    """A run's logits file holds no validation logits, so no calibrator can be fitted for it."""


def calibrator_names(names=None) -> list[str]:
    """``["none", *CALIBRATORS]``: the columns of the methods x calibrators table, in order, without
    the opt-in ones (:data:`calibkit.calibrators.boost.OPT_IN`); ``names`` (a preset's
    ``report_calibrators``): ``["none", *names]`` instead, in registry order."""
    if names is None:
        return [NONE] + default_names()
    unknown = [n for n in names if n not in CALIBRATORS]
    if unknown:
        raise UserError(f"unknown calibrator {unknown[0]!r} in the report's calibrators; expected one of "
                        f"{', '.join(CALIBRATORS)}")
    return [NONE] + [n for n in CALIBRATORS if n in set(names)]


def _check_name(name: str) -> None:
    names = calibrator_names()
    if name not in names:
        raise UserError(f"unknown calibrator {name!r}; expected one of {', '.join(names)}")


class CalibratedProbs:
    """Test probabilities of runs after each calibrator, fitted on the run's validation logits.

    Args:
        cache_dir: where calibrated test probabilities are kept between reports (None: memory only).
        names: the calibrators the report fits (a preset's ``report_calibrators``; None: every
            calibrator of the registry but the opt-in ones); ``self.names`` holds them after ``"none"``.
    """

    def __init__(self, cache_dir=None, names=None):
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.names = calibrator_names(names)
        self._mem: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}
        self._logits: dict[str, dict] = {}
        self._digests: dict[tuple, str] = {}
        self._fitted: dict[str, dict] = {}  # logits path -> {calibrator: fitted on every validation row}
        self.failures: dict[tuple[str, str], str] = {}  # (run key, calibrator) -> error (calibrator_grid)

    def logits(self, row: dict) -> dict:
        """The run's saved tensors (``val_logits``, ``val_labels``, ``test_logits``, ``test_labels``, ...)."""
        path = row.get("logits_path")
        if not path:
            raise UserError(f"run {row['run_key']} has no logits_path in the database")
        if path not in self._logits:
            tensors = read_tensors(path)
            missing = {"test_logits", "test_labels"} - set(tensors)
            if missing:
                raise UserError(f"{path}: missing entries {sorted(missing)}")
            self._logits[path] = tensors
        return self._logits[path]

    def digest(self, row: dict, names=FIT_AND_TEST) -> str:
        """:func:`tensor_digest` of the run's saved tensors ``names`` (computed once per report)."""
        key = (row["logits_path"], tuple(names))
        if key not in self._digests:
            self._digests[key] = tensor_digest(self.logits(row), names)
        return self._digests[key]

    def fitted(self, row: dict) -> dict:
        """``{calibrator: instance}`` fitted by this object on the run's whole validation split so far."""
        return dict(self._fitted.get(row["logits_path"], {}))

    def groups(self, row: dict):
        """The test image of every stored test pixel (segmentation runs), else None."""
        t = self.logits(row)
        return t["test_image"].numpy() if "test_image" in t else None

    def __call__(self, row: dict, name: str = NONE) -> tuple[torch.Tensor, torch.Tensor]:
        """``(probs, labels)``: float64 ``(N, K)`` test probabilities after ``name``, int64 ``(N,)`` labels."""
        _check_name(name)
        key = (row["logits_path"] if row.get("logits_path") else row["run_key"], name)
        if key not in self._mem:
            self._mem[key] = self._compute(row, name)
        return self._mem[key]

    def _compute(self, row: dict, name: str):
        t = self.logits(row)
        labels = t["test_labels"].long()
        if name == NONE:
            return t["test_logits"].double().softmax(1), labels
        # before the cache: its content key hashes the validation logits
        if not {"val_logits", "val_labels"} <= set(t):
            raise NoValidationLogits(f"{row['logits_path']}: no validation logits (val_logits, val_labels) to fit "
                                     f"calibrator {name!r} on")
        path = self._cache_path(row, name)
        if path is not None and path.is_file():
            try:
                probs = read_tensors(path)["probs"]
                if probs.shape == t["test_logits"].shape:
                    return probs.double(), labels
            except (ValueError, KeyError):
                pass  # a cache killed mid-write (or from elsewhere) is recomputed
        cal = CALIBRATORS[name]().fit(t["val_logits"], t["val_labels"].long())
        self._fitted.setdefault(row["logits_path"], {})[name] = cal
        # float64 test logits, as the bench's own evaluation (evaluate_before_after_ts) applies TS
        probs = torch.as_tensor(cal.predict_proba(t["test_logits"].double())).double()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_tensors(path, {"probs": probs})
        return probs, labels

    def _cache_path(self, row: dict, name: str) -> Path | None:
        if self.cache_dir is None:
            return None
        return cache_file(self.cache_dir, row, name, f"{self.digest(row)}|{CALIBRATORS[name]()!r}", "safetensors")


#: The metrics of the methods x calibrators table: (panel key, header, scale, decimals). ``changed``
#: is the share of test rows whose predicted class the calibrator moved (against ``none``).
GRID_METRICS = (("ece", "ECE", 100, 2), ("cece", "cwECE", 100, 2), ("nll", "NLL", 1, 3),
                ("changed", "changed %", 100, 2))
#: A true-class probability below this counts as zero (the NLL cell is flagged).
ZERO_P = 1e-12


def _guards(p: torch.Tensor, labels: torch.Tensor, base_pred: torch.Tensor) -> dict:
    """``changed`` (share of rows whose argmax moved) and ``zero_rows`` (true-class probability < ZERO_P)."""
    p_y = p.gather(1, labels.view(-1, 1)).squeeze(1)
    return {"changed": float((p.argmax(1) != base_pred).double().mean()), "zero_rows": int((p_y < ZERO_P).sum())}


def calibrator_grid(summary: dict, probs: CalibratedProbs, n_bins: int = 15) -> dict:
    """``{method: {calibrator: {metric: (mean, std, n)} or None}}`` over seeds (the calibrators of
    ``probs.names``), for :data:`GRID_METRICS`,
    plus ``"zero_rows"``: the largest count over seeds of test rows given a true-class probability
    below :data:`ZERO_P` (their NLL terms dominate the NLL).

    Every metric is :func:`calibkit.metrics.evaluate` on the run's test probabilities after the
    calibrator (``"none"``: before any); ``changed`` compares its predicted class with the
    uncalibrated one. A calibrator that fails on a run (its fit or its output
    refused with a ``ValueError``/``RuntimeError``) gives ``None`` for that method, and the error
    is kept in ``probs.failures[(run_key, calibrator)]`` for the report to name; the rest of the
    report is unaffected.
    """
    out = {}
    for method, entry in summary.items():
        cells = {}
        for name in probs.names:
            panels = []
            for row in entry["runs"]:
                try:
                    p, labels = probs(row, name)
                    panel = dict(evaluate(p, labels, n_bins=n_bins))
                    if p.dim() == 2:  # dense (segmentation) probabilities have no row-level guards here
                        panel.update(_guards(p, labels, probs(row, NONE)[0].argmax(1)))
                    panels.append(panel)
                except NoValidationLogits:
                    raise
                except (ValueError, RuntimeError) as exc:
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    probs.failures[(row["run_key"], name)] = first
            ok = len(panels) == len(entry["runs"])
            cells[name] = ({key: mean_std([p[key] for p in panels])
                            for key, _, _, _ in GRID_METRICS if key in panels[0]}
                           | {"zero_rows": max(p.get("zero_rows", 0) for p in panels)}) if ok else None
        out[method] = cells
    return out
