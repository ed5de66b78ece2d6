"""Drops the local values emitted code computes but never reads, so a generated kernel reads cleanly.

The emitters write the index values and shapes a kernel of its kind may need (the end of a row chunk,
a wide copy of an index, each coordinate of a flat offset); a given kernel often uses only some of them.
Only assignments to a plain name, of an expression without side effects, are removed.
"""

from __future__ import annotations

import ast
from typing import Iterator

from mkevolve.pysource import parse_python

# Calls that compute a value and do nothing else.
_PURE_CALLS = {"minimum", "maximum", "to", "arange", "program_id", "cdiv", "next_power_of_2", "min", "max"}


def drop_unused_assignments(source: str) -> str:
    """`source` without its dead assignments; repeated, since one removal can leave another value unread."""
    while True:
        dead = [stmt for node in ast.walk(parse_python(source)) if isinstance(node, ast.FunctionDef)
                for stmt in _unread_assignments(node)]
        if not dead:
            return source
        lines = source.splitlines(keepends=True)
        for stmt in sorted(dead, key=lambda s: s.lineno, reverse=True):
            del lines[stmt.lineno - 1:stmt.end_lineno]
        source = "".join(lines)


def _unread_assignments(function: ast.FunctionDef) -> Iterator[ast.Assign]:
    read = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for node in ast.walk(function):
        for block in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if not isinstance(block, list):
                continue
            dead = [stmt for stmt in block if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id not in read
                    and _pure(stmt.value)]
            yield from dead[:len(block) - 1]  # a block emptied of every statement would not parse


def _pure(expr: ast.expr) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name not in _PURE_CALLS:
                return False
    return True
