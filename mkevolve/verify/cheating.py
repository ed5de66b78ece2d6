"""Cheating detection: static rules over a solution's AST and runtime rules around its forward."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Rule(str, Enum):
    NO_TRITON_KERNEL = "no-triton-kernel"
    NO_LAUNCH = "no-triton-launch"
    TORCH_COMPUTE = "torch-compute"
    TRY_EXCEPT = "try-except-fallback"
    MONKEYPATCH = "monkeypatch"
    REFERENCE_ACCESS = "reference-access"
    TENSOR_SUBCLASS = "tensor-subclass"
    THREADS = "threads"
    OUTPUT_ALIAS = "output-aliases-input"
    PRECISION = "precision-downgrade"


@dataclass(frozen=True)
class Violation:
    rule: Rule
    message: str
    line: int | None = None

    def describe(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"[{self.rule.value}]{where} {self.message}"


def static_violations(source: str, filename: str = "<solution>") -> list[Violation]:
    raise NotImplementedError


def dot_precision(source: str) -> str | None:
    raise NotImplementedError


class RuntimeGuard:
    raise NotImplementedError


def output_violations(outputs: list, inputs: list) -> list[Violation]:
    raise NotImplementedError
