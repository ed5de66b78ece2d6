"""The cheating rules a solution can break, the violation record, and what both checkers share."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from mkevolve.config import PRECISION_VS_EAGER


class Rule(str, Enum):
    """A rule a kernel can break: its id (the value, what a rejection names) and what it asks of a kernel
    (`asks`, in the words the prompts list it with; prompts/_rules.j2 loops over this enum)."""

    def __new__(cls, rule_id: str, asks: str):
        rule = str.__new__(cls, rule_id)
        rule._value_ = rule_id
        rule.asks = asks
        return rule

    NO_TRITON_KERNEL = ("no-triton-kernel", "Do the math in `@triton.jit` kernels.")
    NO_LAUNCH = ("no-triton-launch", "Launch those kernels from `forward`.")
    TORCH_COMPUTE = ("torch-compute",
                     "In `forward`, torch may only allocate outputs (`torch.empty`, `torch.empty_like`, ...), make "
                     "views and reshapes, make tensors contiguous, and read the module's parameters. No torch math "
                     "(`torch.matmul`, `F.relu`, `x.sum()`, arithmetic operators on tensors), no calls to `torch.nn` "
                     "layers, no `torch.compile`, and no kernels from cuBLAS, cuDNN or any other library.")
    TRY_EXCEPT = ("try-except-fallback", "No `try`/`except` that falls back to another implementation.")
    MONKEYPATCH = ("monkeypatch", "Do not patch attributes of torch, triton or any other module.")
    REFERENCE_ACCESS = ("reference-access", "Do not touch the reference `Model` or the module that defines it.")
    TENSOR_SUBCLASS = ("tensor-subclass", "Do not subclass `torch.Tensor`.")
    THREADS = ("threads", "Do not start threads or processes; run on the current stream.")
    OUTPUT_ALIAS = ("output-aliases-input",
                    "Return freshly computed tensors: never an input, a view of an input, or a tensor kept from an "
                    "earlier call; the output must follow the inputs.")
    PRECISION = ("precision-downgrade",
                 "Keep every step at least as accurate as fp32. A `tl.dot` on fp32 data must state its precision, "
                 '`input_precision="ieee"` or `input_precision="tf32x3"`; a bare `tl.dot` (tf32 by default) or '
                 "computing in fp16, bf16 or plain tf32 is rejected even when the result happens to pass. "
                 "Measured too, on trials and timed calls alike: the error against the reference run in fp64 may be "
                 f"at most {PRECISION_VS_EAGER:g} times eager fp32's.")
    # Found by the isolated evaluation rather than by reading the source or watching the dispatcher:
    NON_TRITON_KERNEL = ("non-triton-kernel",
                         "On a GPU, every kernel `forward` launches must be compiled from your own `@triton.jit` "
                         "functions.")
    HOST_COPY = ("device-to-host-copy",
                 "Do not copy device data to the host in `forward` (`.item()`, `.cpu()`, `.tolist()`).")
    SANDBOX = ("sandbox",
               "The kernel runs confined: no files outside its folder, sockets, processes, signals, native "
               "libraries, frame or gc introspection, or strings run as code.")
    TIMED_OUTPUT = ("timed-output",
                    "Compute the full result on every call, from that call's inputs: calls outside the correctness "
                    "trials are checked too, and no two calls get the same input values.")
    FORGED_RESULT = ("forged-result", "Report nothing yourself: only the checker's harness writes results.")
    MODULE_STATE = ("module-state",
                    "Change the module's state as `Model` does, on every call: a buffer that `Model`'s forward "
                    "updates (batch norm's running mean and variance in training) must hold the same values "
                    "after each call, kept in a buffer of `ModelNew`.")
    INPUT_STATE = ("input-state",
                   "Leave `forward`'s arguments as `Model`'s forward leaves them: write into an argument only "
                   "where `Model` does (an in-place `x.relu_()`), and then leave in it what `Model` does.")
    # Found by neither: the optional LLM judge (--judge) read the kernel beside its reference and named a semantic
    # cheat (the test shapes special-cased, work the reference does skipped).
    LLM_JUDGE = ("llm-judge",
                 "Solve the problem in general: no special cases for the test shapes or values, and no skipping "
                 "work the reference does.")


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
