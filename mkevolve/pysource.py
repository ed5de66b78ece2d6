"""Parsing Python source into an AST, safely from several threads at once.

CPython 3.11 (and 3.12 before 3.12.5) keeps the recursion depth of its AST constructor in state shared by
every thread: two threads parsing at the same moment can fail with "SystemError: AST constructor recursion
depth mismatch". A run checks candidates and evolves subproblems on several threads, so every parse in
this package goes through one lock.
"""

from __future__ import annotations

import ast
import threading

_PARSE_LOCK = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse(source, filename, mode)`, one thread at a time; raises SyntaxError like it."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename, mode=mode)
