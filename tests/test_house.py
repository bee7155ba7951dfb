"""House rules that keep the package readable, checked on its source: no function longer than
:data:`MAX_FUNCTION_LINES` lines (its docstring included), so that each reads at once."""

from __future__ import annotations

import ast
from pathlib import Path

import calibkit

PACKAGE = Path(calibkit.__file__).parent
MAX_FUNCTION_LINES = 90


def long_functions(source: str, where: str) -> list[str]:
    """``where:line name (n lines)`` for each function or method of ``source`` over the limit."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_the_check_finds_a_long_function_and_passes_a_short_one():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions("def f():\n" + body, "m.py") == [f"m.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions("def f():\n" + body[: body.rindex("    x")], "m.py") == []


def test_no_function_is_longer_than_the_limit():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += long_functions(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split them): " + "; ".join(found)
