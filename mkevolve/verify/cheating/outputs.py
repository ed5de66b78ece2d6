"""Output rules: a forward must return fresh, plain tensors, never an input or a lazy stand-in."""

from __future__ import annotations

import torch

from mkevolve.verify.cheating.rules import Rule, Violation

_PLAIN_VALUES = (int, float, bool, complex, str, type(None))


def _storage_span(tensor: torch.Tensor) -> tuple[int, int] | None:
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return None
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def output_violations(outputs: list, inputs: list) -> list[Violation]:
    """Outputs that are not plain tensors, and outputs that share memory with an input."""
    violations = []
    input_spans = [(i, span) for i, x in enumerate(inputs)
                   if isinstance(x, torch.Tensor) and (span := _storage_span(x))]
    for index, out in enumerate(outputs):
        if type(out) in _PLAIN_VALUES:
            continue
        if type(out) is not torch.Tensor:
            violations.append(Violation(Rule.TENSOR_SUBCLASS, f"output {index} is a "
                              f"{type(out).__module__}.{type(out).__qualname__}, not a plain "
                              "torch.Tensor; return the tensor your kernel wrote"))
            continue
        span = _storage_span(out)
        for input_index, input_span in input_spans:
            if span and span[0] < input_span[1] and input_span[0] < span[1]:
                violations.append(Violation(Rule.OUTPUT_ALIAS, f"output {index} shares memory with "
                                  f"input {input_index}; write results to a new tensor "
                                  "(torch.empty_like) instead of into or as an input"))
                break
    return violations
