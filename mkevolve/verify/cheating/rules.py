"""The cheating rules a solution can break, the violation record, and what both checkers share."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch


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
    # Found by the isolated evaluation rather than by reading the source or watching the dispatcher:
    NON_TRITON_KERNEL = "non-triton-kernel"    # a GPU kernel not compiled from the candidate's @triton.jit
    HOST_COPY = "device-to-host-copy"          # forward copied device data to the host
    SANDBOX = "sandbox"                        # the candidate process tried what its confinement denies
    TIMED_OUTPUT = "timed-output"              # a call outside the correctness trials returned a wrong result
    FORGED_RESULT = "forged-result"            # the result channel carried a report the harness did not sign
    # Found by neither: the optional LLM judge (--judge) read the kernel beside its reference and named a semantic
    # cheat (the test shapes special-cased, work the reference does skipped).
    LLM_JUDGE = "llm-judge"


@dataclass(frozen=True)
class Violation:
    rule: Rule
    message: str
    line: int | None = None

    def describe(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"[{self.rule.value}]{where} {self.message}"

    def to_dict(self) -> dict:
        """The form EvalResult.violations and `check --json` carry."""
        return {"rule": self.rule.value, "line": self.line, "message": self.message}


PYTORCH_ONLY = "a PyTorch solution, not a Triton kernel: "


def headline(violations: list[Violation]) -> tuple[Violation, str]:
    """The violation a verdict names and the reason's text (`violations` is not empty).

    A ModelNew with no @triton.jit kernel whose other violations are all PyTorch compute is an honest
    PyTorch solution rather than a trick: the reason says so first, instead of the first rule by line."""
    rules = {v.rule for v in violations}
    if Rule.NO_TRITON_KERNEL in rules and rules <= {Rule.NO_TRITON_KERNEL, Rule.TORCH_COMPUTE}:
        missing = next(v for v in violations if v.rule is Rule.NO_TRITON_KERNEL)
        return missing, PYTORCH_ONLY + missing.describe()
    return violations[0], violations[0].describe()


KERNEL_ADVICE = "do this math inside a @triton.jit kernel instead"


def is_less_precise(dtype: torch.dtype, reference: torch.dtype) -> bool:
    """True for a floating dtype with a coarser resolution than the reference's."""
    if not (dtype.is_floating_point and reference.is_floating_point):
        return False
    return torch.finfo(dtype).eps > torch.finfo(reference).eps
