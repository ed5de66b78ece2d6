"""The builtin decomposer: traces a module, cuts its graph at fusion blockers and writes the subproblem files.

It answers Decompose, Split, Fuse and TotalFuse without an LLM, in the same `### FILE:` reply format a model
uses, so its output goes through the same parsing and checks. A decomposition it wrote records its cut
points in the top-level's docstring; Split and Fuse start from them.

This module holds the four replies; the work is in its siblings, each importing only those before it:
errors, values, kinds, construction, init_source, init_loops, tracing, segments, writing.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkevolve.builtin.errors import UnsupportedModule
from mkevolve.builtin.segments import Segmentation, hoist_late_loops
from mkevolve.builtin.tracing import TracedModule, trace_problem
from mkevolve.builtin.writing import CodeWriter
from mkevolve.codebase import wrap_original
from mkevolve.problem import read_source

# The agents and tests import the error and the cached tracer from here, beside the four replies.
__all__ = ["UnsupportedModule", "decomposition_files", "format_reply", "fuse_files", "split_files",
           "total_fuse_files", "trace_problem"]


_CUTS = re.compile(r"Builtin cuts: \[([\d ]*)\] over graph (\w+)")


def decomposition_files(problem_path: str | Path, eval_mode: bool = False) -> dict[str, str]:
    traced = _traced(problem_path, eval_mode)
    return CodeWriter(traced, Segmentation(traced).decompose_cuts()).files()


def split_files(problem_path: str | Path, top_level: str, failing: list[str],
                eval_mode: bool = False) -> dict[str, str]:
    """Cut every group of each failing subproblem in two at its best point."""
    traced = _traced(problem_path, eval_mode)
    cuts = _own_cuts(traced, top_level)
    segmentation = Segmentation(traced)
    names = CodeWriter(traced, cuts).pattern_names()
    added = []
    for group in segmentation.groups(cuts):
        if names[group.start] in failing:
            cut = segmentation.best_cut(group)
            if cut is not None:
                added.append(cut)
    new_cuts = segmentation.normalize(cuts + added)
    if new_cuts == cuts:
        raise UnsupportedModule(f"cannot split {', '.join(failing)}: no valid cut point inside")
    return CodeWriter(traced, new_cuts).files()


def fuse_files(problem_path: str | Path, top_level: str, eval_mode: bool = False) -> dict[str, str]:
    """Merge the two adjacent groups whose boundary costs most."""
    traced = _traced(problem_path, eval_mode)
    cuts = _own_cuts(traced, top_level)
    segmentation = Segmentation(traced)
    cut = segmentation.cut_to_fuse(cuts)
    if cut is None:
        raise UnsupportedModule("nothing to fuse: there is a single subproblem, or every boundary is next to a "
                                "random draw (dropout), which stays a subproblem of its own")
    return CodeWriter(traced, segmentation.normalize([c for c in cuts if c != cut])).files()


def total_fuse_files(problem_path: str | Path) -> dict[str, str]:
    path = Path(problem_path)
    return wrap_original(path.stem, read_source(path)).files()


def _traced(problem_path: str | Path, eval_mode: bool) -> TracedModule:
    """The traced problem, with the init loops that only the top-level can run in order moved there."""
    return hoist_late_loops(trace_problem(problem_path, eval_mode))


def _own_cuts(traced: TracedModule, top_level: str) -> list[int]:
    match = _CUTS.search(top_level)
    if match is None:
        raise UnsupportedModule("this decomposition was not written by the builtin decomposer, which can only "
                                "refine its own")
    if match.group(2) != traced.fingerprint:
        raise UnsupportedModule("the problem changed since this decomposition was written")
    return [int(c) for c in match.group(1).split()]


def format_reply(files: dict[str, str], note: str) -> str:
    """Files in the reply format every model must use (a note, then one `### FILE:` block per file)."""
    blocks = [f"### FILE: {path}\n```python\n{source.rstrip()}\n```" for path, source in files.items()]
    return "\n\n".join([note] + blocks) + "\n"
