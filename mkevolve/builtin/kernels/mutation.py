"""In-place ops in an fx graph: which tensor each one mutates, and whether a stale copy of it is read later.

The tensor program is functional: an in-place op becomes a new value. That is only right if every later
read of the mutated tensor reads the new value. The lowering rebinds the mutated node itself; a view or
alias of it taken before the mutation cannot be rebound, so reading one afterwards is refused.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable

import torch
from torch import fx, nn

from .errors import UnsupportedSubproblem
from .trace import FX_CONSTANT

_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv}

# Ops whose result may share memory with their first argument (the lowering keys, without "operator.").
_ALIASING = {"view", "view_as", "reshape", "reshape_as", "_unsafe_view", "flatten", "unflatten", "squeeze",
             "unsqueeze", "transpose", "swapaxes", "permute", "t", "expand", "expand_as", "narrow", "select",
             "chunk", "split", "tensor_split", "unbind", "getitem", "contiguous", "detach", "alias", "to", "float",
             "type", "type_as", "movedim", "diagonal", "as_strided", "unfold"}


def is_inplace_name(name: str) -> bool:
    """`relu_`, `mul_`: torch's spelling of an in-place op (dunders such as `__add__` are not)."""
    return name.endswith("_") and not name.endswith("__")


def mutated_input(node: fx.Node, module_of: Callable[[str], nn.Module]) -> fx.Node | None:
    """The node whose tensor `node` mutates in place, or None when it mutates nothing."""
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if node.op == "call_method":
        mutates = is_inplace_name(node.target)
    elif node.op == "call_module":
        mutates = getattr(module_of(node.target), "inplace", False) is True
    elif node.op == "call_function":
        mutates = _function_mutates(node)
    else:
        mutates = False
    return node.args[0] if mutates else None


def _function_mutates(node: fx.Node) -> bool:
    target = node.target
    if target in _INPLACE_OPERATORS:
        return True
    if isinstance(target, torch._ops.OpOverload):
        return is_inplace_name(target._schema.name.split("::")[-1])
    if is_inplace_name(getattr(target, "__name__", "")):
        return True
    return _inplace_flag(target, node.args, node.kwargs)


def _inplace_flag(target: Any, args: tuple, kwargs: dict) -> bool:
    """`F.relu(x, inplace=True)`, `F.leaky_relu(x, 0.2, True)`: the functional's own `inplace` argument."""
    if not inspect.isfunction(target):
        return False    # C builtins have no `inplace` argument: their in-place forms end in "_"
    try:
        bound = inspect.signature(target).bind(*args, **kwargs)
    except TypeError as err:
        raise UnsupportedSubproblem(f"{target.__name__} called with arguments its signature rejects: "
                                    f"{err}") from None
    return bound.arguments.get("inplace") is True


def check_no_stale_alias(node: fx.Node, mutated: fx.Node, module_of: Callable[[str], nn.Module],
                         order: dict[fx.Node, int], live: set[fx.Node]) -> None:
    """Refuse when a tensor sharing memory with `mutated`, created before `node` mutated it, is read later."""
    position = order[node]
    for alias in _aliases(mutated, module_of) - {mutated, node}:
        if order[alias] > position:
            continue    # taken after the mutation: it reads the rebound value
        for user in alias.users:
            if user in live and order[user] > position:
                raise UnsupportedSubproblem(
                    f"in-place {_label(node)} mutates {mutated.name}, and {alias.name}, which shares its memory, "
                    f"is read afterwards by {user.name}; the generated program cannot express the aliasing")


def is_module_attribute(node: fx.Node) -> bool:
    """`self.<path>` itself (a parameter, buffer or plain tensor attribute), not a view of it: the lowering can
    write an in-place op's result back into it."""
    return node.op == "get_attr" and not node.target.startswith(FX_CONSTANT)


def touches_caller_tensor(mutated: fx.Node, module_of: Callable[[str], nn.Module]) -> bool:
    """Whether `mutated` shares memory with a forward input or a parameter: mutating it is a side effect the
    caller sees, which the generated program (it writes new tensors only) does not reproduce."""
    return any(a.op in ("placeholder", "get_attr") for a in _aliases(mutated, module_of))


def _aliases(start: fx.Node, module_of: Callable[[str], nn.Module]) -> set[fx.Node]:
    """Every node that may share memory with `start`: up through the bases it views, down through views."""
    found = {start}
    stack = [start]
    while stack:
        current = stack.pop()
        neighbours = [u for u in current.users if _aliases_first_arg(u, module_of)]
        if _aliases_first_arg(current, module_of):
            neighbours.append(current.args[0])
        for other in neighbours:
            if other not in found:
                found.add(other)
                stack.append(other)
    return found


def _aliases_first_arg(node: fx.Node, module_of: Callable[[str], nn.Module]) -> bool:
    if not node.args or not isinstance(node.args[0], fx.Node):
        return False
    if mutated_input(node, module_of) is not None:
        return True     # an in-place op returns its input
    if node.op == "call_method":
        return node.target in _ALIASING
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        if isinstance(node.target, torch._ops.OpOverload):
            name = node.target._schema.name.split("::")[-1]
        return name in _ALIASING
    return node.op == "call_module" and isinstance(module_of(node.target), (nn.Flatten, nn.Unflatten,
                                                                              nn.Identity))


def _label(node: fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
