"""No function body in gpufeed runs over 80 lines (docstring excluded): a longer one is split
into named steps."""

from __future__ import annotations

import ast
from pathlib import Path

import gpufeed

MAX_BODY_LINES = 80


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


def test_no_function_body_is_over_80_lines():
    root = Path(gpufeed.__file__).parent
    long = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = _body_lines(node)
                if lines > MAX_BODY_LINES:
                    long[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    assert long == {}  # "module path:function" -> body lines
