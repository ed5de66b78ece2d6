"""Values as the decomposer sees them: Python literals it can write into a file, and what each traced value was."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from mkevolve.builtin.errors import UnsupportedModule


def literal_source(value: Any) -> str:
    """Python source for a constructor or config value; UnsupportedModule when it has none."""
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return f"float('{value}')"
    if isinstance(value, torch.Size):
        value = tuple(value)
    if isinstance(value, tuple):
        inner = ", ".join(literal_source(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(literal_source(v) for v in value) + "]"
    if isinstance(value, torch.dtype):
        return str(value)
    raise UnsupportedModule(f"a {type(value).__name__} value cannot be written as a literal")


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return (numbers or type(a) is type(b)) and a == b


class ValueKind(Enum):
    TENSOR = "tensor"
    TENSORS = "tensors"       # a tuple or list of tensors
    OTHER = "other"           # a Python value (a size, a scale) or anything else


@dataclass(frozen=True)
class ValueInfo:
    """What a graph value was when the original ran on its own inputs."""

    kind: ValueKind
    shape: tuple = ()
    dtype: torch.dtype | None = None
    contiguous: bool = True
    nonneg: bool = False
    low: int = 0
    high: int = 1
    nbytes: int = 0
    python: Any = None

    @classmethod
    def of(cls, value: Any) -> ValueInfo:
        if isinstance(value, torch.Tensor):
            return cls._tensor(value)
        if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return cls(ValueKind.TENSORS)
        literal = isinstance(value, (int, float, bool, str, type(None)))
        return cls(ValueKind.OTHER, python=value if literal else None)

    @classmethod
    def _tensor(cls, t: torch.Tensor) -> ValueInfo:
        floating = t.is_floating_point()
        low = high = 0
        if not floating and t.dtype != torch.bool and t.numel():
            low, high = int(t.min()), int(t.max())
        nonneg = bool(t.numel() == 0 or (t.min() >= 0).item()) if t.dtype != torch.bool else True
        return cls(ValueKind.TENSOR, tuple(t.shape), t.dtype, t.is_contiguous(), nonneg, low, high,
                   t.numel() * t.element_size())

    def factory(self) -> str:
        """Source that makes a random input like this value (non-negative stays non-negative)."""
        if self.kind is not ValueKind.TENSOR:
            return literal_source(self.python)
        shape = ", ".join(str(d) for d in self.shape)
        if self.dtype == torch.bool:
            return f"torch.rand({shape}) < 0.5"
        if self.dtype.is_floating_point:
            dtype = "" if self.dtype == torch.float32 else f", dtype={self.dtype}"
            return f"torch.{'rand' if self.nonneg else 'randn'}({shape}{dtype})"
        dtype = "" if self.dtype == torch.int64 else f", dtype={self.dtype}"
        return f"torch.randint({self.low}, {self.high + 1}, ({shape}{',' if len(self.shape) == 1 else ''}){dtype})"


def module_constants(module_globals: dict[str, Any]) -> dict[str, Any]:
    """Module-level values a generated file can write as literals (sizes, shapes, scales)."""
    found = {}
    for name, value in module_globals.items():
        if name.startswith("__") or isinstance(value, (type(sys), type)) or callable(value):
            continue
        try:
            literal_source(value)
        except UnsupportedModule:
            continue
        found[name] = value
    return found
