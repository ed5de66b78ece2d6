"""Static cheating rules: what a solution's source may not do, read from its AST without running it.

The entry points: parse the executed part of the source once, walk it with the checker (checker.py), and add
the rules about the module as a whole (a kernel exists and is launched)."""

from __future__ import annotations

import ast

import torch

from mkevolve.pysource import parse_python
from mkevolve.verify.cheating.checker import StaticChecker
from mkevolve.verify.cheating.exemptions import bindings, container_names, table_dtypes
from mkevolve.verify.cheating.names import Names, collect_names, executed_module, kernel_names
from mkevolve.verify.cheating.precision import DOT_PRECISION_ORDER, stated_dot_precision
from mkevolve.verify.cheating.rules import Rule, Violation


def _forward_line(tree: ast.Module) -> int | None:
    """The line of the first `def forward`, where a missing kernel launch belongs."""
    lines = [node.lineno for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "forward"]
    return min(lines, default=None)


def _launch_violations(tree: ast.Module, checker: StaticChecker, kernels: dict[str, int]) -> list[Violation]:
    if not kernels:
        return [Violation(Rule.NO_TRITON_KERNEL, "no @triton.jit kernel: ModelNew must do its work in "
                          "Triton kernels decorated with @triton.jit and launched from forward as "
                          "kernel[grid](...)", _forward_line(tree))]
    if not checker.launched:
        first = min(kernels, key=kernels.get)
        shown = ", ".join(f"`{name}`" for name in kernels)
        return [Violation(Rule.NO_LAUNCH, f"kernel(s) {shown} are defined but never launched (no "
                          "`kernel[grid](...)` outside `if __name__ == \"__main__\":`); launch them "
                          "from forward to do the work", kernels[first])]
    return []


def parse_executed(source: str, filename: str) -> tuple[ast.Module, Names]:
    tree = executed_module(parse_python(source, filename=filename))
    names = collect_names(tree)
    names.kernels = kernel_names(names, tree)
    names.containers = container_names(bindings(tree))
    names.table_dtypes = table_dtypes(tree, names)
    return tree, names


def static_violations(source: str, filename: str = "<solution>", *, problem_name: str | None = None,
                      reference_dtype: torch.dtype = torch.float32) -> list[Violation]:
    """Every rule the source breaks, ordered by line; raises SyntaxError on unparsable source.

    Code under `if __name__ == "__main__":` is skipped: the verifier never runs it.
    `problem_name` (the problem file's stem) also rejects imports of a module with that name;
    `reference_dtype` sets what counts as a precision downgrade (tf32 rules apply to fp32 only).
    """
    tree, names = parse_executed(source, filename)
    checker = StaticChecker(names, reference_dtype, problem_name)
    checker.visit(tree)
    found = checker.violations + _launch_violations(tree, checker, names.kernels)
    unique = list(dict.fromkeys(found))
    return sorted(unique, key=lambda v: v.line or 0)


def dot_precision(source: str) -> str | None:
    """The weakest precision the source's tl.dot calls state: "ieee", "tf32x3", "tf32", ...

    An unstated precision counts as Triton's fp32 default, "tf32"; one that is not a literal
    is "unknown"; None when the executed code has no tl.dot.
    """
    tree, names = parse_executed(source, "<solution>")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and names.dotted(node.func) == "triton.language.dot":
            found.append(stated_dot_precision(node, names.constants) or "tf32")
    if not found:
        return None
    rank = {name: i for i, name in enumerate(DOT_PRECISION_ORDER)}
    return min(found, key=lambda p: rank.get(p, 0))
