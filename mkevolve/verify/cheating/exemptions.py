"""Names the rules exempt because the source shows their values: Python containers and dtype lookup tables."""

from __future__ import annotations

import ast

import torch
from torch import nn

from mkevolve.verify.cheating.names import Names
from mkevolve.verify.cheating.precision import low_precision_dtype

# Method names like `add` are tensor math on a tensor but bookkeeping on a set, and a dtype
# name in a table that translates torch dtypes to Triton ones computes nothing. Both are
# decided from every binding in the module at once, so that rebinding a name elsewhere (to a
# tensor, by a loop, by setattr or register_buffer with its name as a string) cancels the
# exemption. Names built at run time (getattr with a computed string) are out of reach of any
# static rule; the runtime guard sees the PyTorch ops they run.

_CONTAINER_NODES = (ast.Set, ast.Dict, ast.List, ast.SetComp, ast.DictComp, ast.ListComp)
_CONTAINER_BUILTINS = frozenset({"set", "dict", "list", "frozenset"})


def bindings(tree: ast.Module) -> dict[str, list[ast.AST | None]]:
    """Every identifier the module gives a value, with the values it is given.

    A plain `name = value` or `obj.name = value` records the value; every other binding
    (parameters, loop and `with` targets, unpacking, augmented assignment, imports, defs,
    match captures) and every string equal to the name (setattr, register_buffer, getattr)
    records None: a value the source does not show.
    """
    plain = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            plain.update((id(target), node.value) for target in node.targets)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            plain[id(node.target)] = node.value
    found: dict[str, list[ast.AST | None]] = {}
    for node in ast.walk(tree):
        for name in _bound_names(node):
            found.setdefault(name, []).append(plain.get(id(node)))
    return found


def _bound_names(node: ast.AST) -> list[str]:
    """The identifiers one AST node binds (or, for a string, may bind by name)."""
    if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
        return [node.id if isinstance(node, ast.Name) else node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.asname or node.name.split(".")[0]]
    if isinstance(node, (ast.MatchAs, ast.MatchStar, ast.ExceptHandler)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
        return [node.value]
    return []


def container_names(bindings: dict[str, list[ast.AST | None]]) -> frozenset[str]:
    """Names (or `self.` attributes) whose every binding is a set/dict/list literal,
    comprehension or builtin constructor call, and never a name tensors or modules carry."""
    def is_container(value: ast.AST | None) -> bool:
        if isinstance(value, _CONTAINER_NODES):
            return True
        # `set()` counts only while the module never rebinds `set` itself.
        return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in _CONTAINER_BUILTINS and value.func.id not in bindings)

    return frozenset(name for name, values in bindings.items()
                     if all(map(is_container, values)) and not _tensor_or_module_attribute(name))


def _tensor_or_module_attribute(name: str) -> bool:
    """`x.data`, `x.grad`, `m.training`: reached through any tensor or module, bound or not."""
    return hasattr(torch.Tensor, name) or hasattr(nn.Module, name)


def table_dtypes(tree: ast.Module, names: Names) -> frozenset[int]:
    """Ids of the low-precision dtype names in dict literals that only translate dtypes.

    A dict literal qualifies when it is only ever looked up (`table[key]`, `table.get(key)`,
    `key in table`): its keys then never leave it, so a low-precision key is exempt; a
    low-precision value is exempt only under the same dtype as key, so looking up a
    float32 tensor's dtype can never yield float16.
    """
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    exempt = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and _only_looked_up(node, tree, parents):
            for key, value in zip(node.keys, node.values):
                key_dtype = _low_precision_of(names, key)
                if key_dtype is not None:
                    exempt.add(id(key))
                    if _low_precision_of(names, value) == key_dtype:
                        exempt.add(id(value))
    return frozenset(exempt)


def _low_precision_of(names: Names, node: ast.AST | None) -> torch.dtype | None:
    dotted = names.dotted(node) if node is not None else None
    if not dotted or dotted.split(".")[0] not in ("torch", "triton", "numpy"):
        return None
    return low_precision_dtype(dotted.rsplit(".", 1)[-1])


def _only_looked_up(table: ast.Dict, tree: ast.Module, parents: dict[int, ast.AST]) -> bool:
    """The dict literal is looked up in place, or bound to a name used only in lookups."""
    if _is_lookup(table, parents):
        return True
    parent = parents.get(id(table))
    if not isinstance(parent, (ast.Assign, ast.AnnAssign)) or parent.value is not table:
        return False
    targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
    keys = {_binding_name(target) for target in targets}
    if None in keys:
        return False
    uses = [node for node in ast.walk(tree) if _loads_name(node, keys)]
    return all(_is_lookup(use, parents) for use in uses) and not _named_by_string(tree, keys)


def _binding_name(target: ast.AST) -> str | None:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return target.attr
    return None


def _loads_name(node: ast.AST, keys: set[str]) -> bool:
    """A read of one of the names, bare or as any object's attribute (`self.table`, `Cls.table`)."""
    if isinstance(node, ast.Name):
        return isinstance(node.ctx, ast.Load) and node.id in keys
    return isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in keys


def _named_by_string(tree: ast.Module, keys: set[str]) -> bool:
    """getattr(obj, "table") reaches the table without a lookup the checker can see."""
    return any(isinstance(node, ast.Constant) and node.value in keys for node in ast.walk(tree))


def _is_lookup(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """`node[key]` read, `node.get(...)` called, or `key in node` / `key not in node`."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.Subscript):
        return parent.value is node and isinstance(parent.ctx, ast.Load)
    if isinstance(parent, ast.Attribute) and parent.attr == "get":
        call = parents.get(id(parent))
        return isinstance(call, ast.Call) and call.func is parent
    if isinstance(parent, ast.Compare) and node in parent.comparators:
        operator = parent.ops[parent.comparators.index(node)]
        return isinstance(operator, (ast.In, ast.NotIn))
    return False
