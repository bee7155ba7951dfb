"""README.md as a tested script: its quick start runs as pasted, in a clean shell, and its first
Python example runs as written.

The shell blocks of the sections "Set up (once)" and "Compare methods" are taken from README.md as
they are written; the ``make`` lines (the set-up itself, and the two big jobs) are left out, since
the tests run after ``make setup`` (``make test`` depends on it) and the big jobs take minutes.
The rest runs in ``bash -e`` with a clean environment: ``PATH`` holds the system's folders only (no
virtual environment on it), so ``calibkit`` must come from the README's own activation line. It
runs in a temporary folder whose ``.venv`` is the virtual environment these tests run in, and
``PYTHONPATH`` names this checkout, so that the code tested is the checkout's even where the
environment's editable install points at another clone.
"""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT

README = Path(ROOT) / "README.md"


def shell_blocks(section: str, language: str = "bash") -> list[str]:
    """The ```bash (or ``language``) blocks of the README section whose heading starts with ``section``."""
    text = README.read_text()
    m = re.search(rf"^## {re.escape(section)}.*?$(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"README.md has no section {section!r}"
    return re.findall(rf"```{language}\n(.*?)```", m.group(1), re.S)


def quick_start() -> str:
    lines = [line for section in ("Set up", "Compare methods") for block in shell_blocks(section)
             for line in block.splitlines()]
    return "\n".join(line for line in lines if line.strip() and not line.lstrip().startswith("make "))


def test_the_quick_start_activates_the_venv_and_runs_the_smoke_bench():
    script = quick_start()
    assert script.splitlines()[0].startswith(". .venv/bin/activate")
    assert "calibkit bench --preset smoke --out runs/smoke" in script
    # exactly two set-up commands for the two big jobs, and both are make targets that exist
    jobs = [b for b in shell_blocks("Set up") if "make bench" in b]
    assert len(jobs) == 1 and [ln.split()[1] for ln in jobs[0].splitlines() if ln.strip()] == ["bench", "test"]
    makefile = (Path(ROOT) / "Makefile").read_text()
    assert re.search(r"^bench: setup$", makefile, re.M) and re.search(r"^test: setup$", makefile, re.M)


def _top_label_ece(probs: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> float:
    """Equal-width binned ECE of the top label, written out here (not calibkit's)."""
    conf, right = probs.max(1), (probs.argmax(1) == labels)
    which = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    return sum(abs(right[which == b].sum() - conf[which == b].sum()) for b in range(n_bins)) / len(labels)


def test_the_first_screen_holds_a_short_python_example_that_runs_as_written(tmp_path):
    text = README.read_text()
    first = text.index("```python")
    assert text[:first].count("\n") < 40  # on the first screen, after the set-up commands
    assert text.index("## Set up") < first
    (block,) = shell_blocks("Calibrate a model's outputs in Python", language="python")
    assert len(block.strip().splitlines()) <= 10
    # outputs.npz of an over-confident model: logits 3 times those the labels are drawn from
    rng = np.random.default_rng(0)
    z = rng.normal(size=(8000, 10)) * 2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = (p.cumsum(1) < rng.random((8000, 1))).sum(1)
    np.savez(tmp_path / "outputs.npz", logits=3 * z, labels=y)
    res = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    t, ece = map(float, re.fullmatch(r"T = ([\d.]+), test ECE ([\d.]+)\n", res.stdout).groups())
    assert 2.7 < t < 3.3  # the factor the logits were sharpened by, estimated on 5000 rows
    logits = 3 * z[5000:]
    before = np.exp(logits - logits.max(1, keepdims=True))
    assert ece < _top_label_ece(before / before.sum(1, keepdims=True), y[5000:]) / 5


def test_the_counts_the_readme_states_are_the_registries():
    """A method added to the grid joins every preset without a ``methods`` list (the smoke bench and
    ``make bench``): the README's "all N methods" must follow, and so must its tables and times."""
    from calibkit.bench.grid import get_preset, grid_methods
    from calibkit.calibrators import CALIBRATORS

    text = README.read_text()
    stated = {int(n) for n in re.findall(r"\ball (\d+) methods\b", text)}
    runs = {len(grid_methods(get_preset(name))[0]) for name in ("smoke", "default")}
    assert stated and stated == runs, f"README.md says all {stated} methods; the smoke and default presets run {runs}"
    intro = text.split("\n## ", 1)[0]  # what calibkit is
    assert [int(n) for n in re.findall(r"\b(\d+) post-hoc calibrators\b", intro)] == [len(CALIBRATORS)]


@pytest.mark.slow
def test_the_quick_start_runs_as_pasted_in_a_clean_shell(tmp_path):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").is_file():
        pytest.skip("the tests do not run in a virtual environment (no bin/activate to source)")
    (tmp_path / ".venv").symlink_to(venv)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(["bash", "-e", "-c", quick_start()], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = tmp_path / "runs" / "smoke" / "report"
    assert (report / "index.html").is_file() and (report / "report.md").is_file()
    assert "Recommendation (chosen on validation)" in res.stdout
    # the first comparison compares: MbLS and ACLS (margin 1 in the smoke preset) differ from CE
    assert "gave exactly CE's test predictions" not in (report / "report.md").read_text()
    assert "index.html" in res.stdout  # the README's `ls` line listed the report
    assert "report: " not in res.stderr and "[ 1/15]" not in res.stdout  # --quiet: no progress lines
