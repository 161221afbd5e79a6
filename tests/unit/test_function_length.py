"""No function body in the repository's code (gpufeed, benchmarks, scripts, tests) runs over 80 lines
(docstring excluded): a longer one is split into named steps."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

MAX_BODY_LINES = 80
REPO = Path(__file__).resolve().parents[2]
CHECKED = ("gpufeed", "benchmarks", "scripts", "tests")


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]  # the docstring
    if not body:
        return 0
    end = body[-1].end_lineno
    assert end is not None
    return end - body[0].lineno + 1


@pytest.mark.parametrize("folder", CHECKED)
def test_no_function_body_is_over_80_lines(folder: str):
    root = REPO / folder
    files = sorted(root.rglob("*.py"))
    assert files, f"no Python files under {root}"
    long = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = _body_lines(node)
                if lines > MAX_BODY_LINES:
                    long[f"{path.relative_to(REPO).as_posix()}:{node.name}"] = lines
    assert long == {}  # "repository path:function" -> body lines
