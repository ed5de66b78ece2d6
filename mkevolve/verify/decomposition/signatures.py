"""Arguments bound to a signature, each described by shape/dtype or value, so that calls can be compared."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Signature:
    """Arguments bound to a signature (defaults applied), each described by shape/dtype or value."""

    items: tuple[tuple[str, Any], ...]

    def render(self) -> str:
        return ", ".join(f"{k}={_render(v)}" for k, v in self.items) or "(no arguments)"


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype).replace("torch.", ""))
    if isinstance(value, (list, tuple, torch.Size)):
        return ("seq", tuple(_describe(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _describe(v)) for k, v in value.items())))
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return ("value", repr(value))
    if isinstance(value, (int, float)):
        return ("number", float(value))
    if isinstance(value, (torch.dtype, torch.device)):
        return ("value", str(value))
    return ("object", type(value).__qualname__)


def _render(described: Any) -> str:
    kind, payload = described[0], described[1]
    if kind == "tensor":
        return f"{described[2]}[{', '.join(map(str, payload))}]"
    if kind == "seq":
        return "(" + ", ".join(_render(v) for v in payload) + ("," if len(payload) == 1 else "") + ")"
    if kind == "dict":
        return "{" + ", ".join(f"{k}: {_render(v)}" for k, v in payload) + "}"
    if kind == "number":
        return str(int(payload)) if float(payload).is_integer() else repr(payload)
    return str(payload)


def bind(function, args: tuple, kwargs: dict, skip_self: bool) -> Signature | None:
    """None when the arguments do not fit the signature at all."""
    signature = inspect.signature(function)
    try:
        bound = signature.bind(None, *args, **kwargs) if skip_self else signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    items = list(bound.arguments.items())[1 if skip_self else 0:]
    return Signature(tuple((k, _describe(v)) for k, v in items))
