"""One traced op call as the lowering handlers see it: canonical name, arguments, traced shapes, module."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from .builders import Builder
from .errors import UnsupportedSubproblem
from .ir import Scalar, Shape, Value

_REQUIRED = object()


@dataclass
class Call:
    name: str
    args: list
    kwargs: dict
    shapes: tuple[Shape, ...] | None = None         # the traced result's shape per config, for tensor results
    results: Any = None                              # per config, the traced shapes of any result (tuples too)
    modules: list[nn.Module] = field(default_factory=list)   # call_module: the instance under each config
    path: str = ""                                   # call_module: its attribute path on the model
    method: bool = False                             # a Tensor method (x.unfold), not a function (F.unfold)

    def arg(self, index: int, name: str, default: Any = _REQUIRED) -> Any:
        """Positional `index` or keyword `name` (aten spells the first argument `self`)."""
        if index < len(self.args):
            return self.args[index]
        for key in (name, "self") if index == 0 else (name,):
            if key in self.kwargs:
                return self.kwargs[key]
        if default is _REQUIRED:
            raise UnsupportedSubproblem(f"{self.name}: missing argument {name!r}")
        return default

    @property
    def module(self) -> nn.Module:
        return self.modules[0]

    def module_attr(self, name: str):
        """A module attribute that shapes the code: identical under every config, or the subproblem is unsupported."""
        values = [getattr(m, name) for m in self.modules]
        if any(_differs(v, values[0]) for v in values[1:]):
            raise UnsupportedSubproblem(f"{type(self.module).__name__}.{name} differs between input configs")
        return values[0]

    def module_scalar(self, name: str) -> Scalar:
        """A numeric module attribute: a literal when every config agrees, else read at run time."""
        values = [getattr(m, name) for m in self.modules]
        if all(v == values[0] for v in values):
            return Scalar(float(values[0]))
        return Scalar(float(values[0]), attr=f"{self.path}.{name}" if self.path else name)


def _differs(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    return a != b


Handler = Callable[[Builder, Call], Any]


def module_param(b: Builder, call: Call, name: str) -> Value | None:
    """`self.<path>.<name>` as a leaf, or None when the module has none (e.g. bias=False) under every config."""
    tensors = [getattr(m, name, None) for m in call.modules]
    if all(t is None for t in tensors):
        return None
    if any(t is None for t in tensors):
        raise UnsupportedSubproblem(f"{type(call.module).__name__}.{name} exists under some input configs only")
    path = f"{call.path}.{name}" if call.path else name
    return b.param(path, tuple(tuple(t.shape) for t in tensors))


def as_param(value: Any, what: str) -> Value | None:
    if value is None or isinstance(value, Value):
        return value
    raise UnsupportedSubproblem(f"{what} must be a tensor, got {type(value).__name__}")
