"""Parsing from many threads at once: a run checks candidates and evolves subproblems on several."""

import gc
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from mkevolve.pysource import parse_python

SOURCE = "".join(f"def f{i}(a, b):\n    return [a + b * {i} for _ in range(3)]\n" for i in range(1500))


class _Garbage:
    """A cycle with a finalizer: collected in the middle of a parse, it runs Python code, and so lets
    another thread in while the parse is inside CPython's AST constructor."""

    def __init__(self):
        self.cycle = self

    def __del__(self):
        sum(range(100))


def _parse_at_depth(depth: int) -> str:
    if depth:
        return _parse_at_depth(depth - 1)  # threads parse from different stack depths
    [_Garbage() for _ in range(20)]
    try:
        parse_python(SOURCE)
    except SystemError as err:  # "AST constructor recursion depth mismatch" with plain ast.parse
        return str(err)
    return ""


@pytest.mark.slow
def test_parses_on_many_threads_all_succeed():
    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(20, 1, 1)
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            failures = [f for f in pool.map(_parse_at_depth, [i % 20 for i in range(60)]) if f]
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    assert failures == []
