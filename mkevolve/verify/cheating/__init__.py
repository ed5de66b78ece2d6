"""Cheating detection: static rules over a solution's AST, runtime rules around its forward, output rules."""

from mkevolve.verify.cheating.outputs import output_violations
from mkevolve.verify.cheating.rules import Rule, Violation, headline
from mkevolve.verify.cheating.runtime import RuntimeGuard
from mkevolve.verify.cheating.static import dot_precision, static_violations

__all__ = ["Rule", "RuntimeGuard", "Violation", "dot_precision", "headline", "output_violations", "static_violations"]
