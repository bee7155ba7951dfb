"""README.md as a tested script: its quick start runs as pasted, in a clean shell.

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
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = Path(ROOT) / "README.md"


def shell_blocks(section: str) -> list[str]:
    """The ```bash blocks of the README section whose heading starts with ``section``."""
    text = README.read_text()
    m = re.search(rf"^## {re.escape(section)}.*?$(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"README.md has no section {section!r}"
    return re.findall(r"```bash\n(.*?)```", m.group(1), re.S)


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


@pytest.mark.slow
def test_the_quick_start_runs_as_pasted_in_a_clean_shell(tmp_path):
    import subprocess

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
