"""calibkit has no import cycles, deferred imports included, and every module imports on its own.

The import graph is read from the source (every ``import`` statement, also those inside
functions: a deferred import only postpones a cycle to the first call that takes it). An edge
``a -> b`` means module ``a`` names module ``b`` (``from pkg import sub`` names ``pkg.sub`` when
``sub`` is a module, otherwise ``pkg``). A cycle is a strongly connected component of more than
one module (Tarjan's algorithm).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "calibkit"


def module_files() -> dict[str, Path]:
    """``{"calibkit.bench.runner": path, ...}`` for every module of the package."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a (possibly relative) ``from`` target."""
    if level == 0:
        return name or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph() -> dict[str, set[str]]:
    """``module -> {calibkit modules it imports}`` from every import statement in its source."""
    files = module_files()
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node.level, node.module)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in files else base)
            for t in targets:
                # `import calibkit.a.b` names calibkit.a.b; keep the longest known prefix
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_known_cycle_and_accepts_a_chain():
    # a -> b -> c -> a is one cycle; d -> a hangs off it; e alone
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(g) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert _resolve("calibkit.data.ood", False, 1, "datasets") == "calibkit.data.datasets"
    assert _resolve("calibkit.data", True, 1, "bundle") == "calibkit.data.bundle"
    assert _resolve("calibkit.bench.runner", False, 2, "store") == "calibkit.store"


def test_graph_sees_deferred_imports():
    g = import_graph()
    # calibkit.bench.producers imports calibkit.train only inside RunFactory.train
    assert "calibkit.train" in g["calibkit.bench.producers"]
    assert "calibkit.data.transforms" in g["calibkit.data.inputs"]  # a relative import


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_module_imports_alone_in_a_fresh_interpreter():
    # One interpreter per module would take minutes; one interpreter imports them in reverse
    # order, another in sorted order: a module that works only after another was imported first
    # fails in one of the two.
    mods = [m for m in module_files() if not m.endswith("__main__")]
    for order in (sorted(mods), sorted(mods, reverse=True)):
        code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
        proc = subprocess.run([sys.executable, "-c", code, *order], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("module", ["calibkit.bench.twostage", "calibkit.bench.runner"])
def test_modules_that_once_formed_cycles_import_first(module):
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_help_and_version_load_no_torch():
    # `calibkit --help`, `--version` and every subcommand's --help only read argparse tables: loading
    # torch would cost seconds of start-up. One interpreter tries them in turn and names the first
    # that loaded torch.
    code = (
        "import contextlib, io, sys\n"
        "from calibkit.cli import COMMANDS, main\n"
        "for argv in [['--help'], ['--version']] + [[c, '--help'] for c in COMMANDS]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    if 'torch' in sys.modules:\n"
        "        sys.exit('torch loaded by calibkit ' + ' '.join(argv))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_maccal_package_names_load_on_first_use():
    # The package defers its modules (so the command line's help stays light) yet every public name
    # resolves, to the object its defining module holds.
    import calibkit.methods.maccal as maccal
    from calibkit.methods.maccal import defaults, stage2

    assert set(maccal.__all__) <= set(dir(maccal))
    for name in maccal.__all__:
        assert getattr(maccal, name) is not None
    assert maccal.DEFAULTS is defaults.DEFAULTS is stage2.DEFAULTS
    assert maccal.fit_masked_head is stage2.fit_masked_head
    with pytest.raises(AttributeError, match="no_such_name"):
        maccal.no_such_name  # noqa: B018
