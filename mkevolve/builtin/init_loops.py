"""Loops of the original __init__ over what the module holds, such as MobileNetV2's
`for m in self.modules(): nn.init.kaiming_normal_(m.weight)`: each subproblem replays the loop on its own layers.

The equivalence check builds the original and the top-level from the same seed, so a replay is exact only where
it changes the same tensors and draws the same random numbers in the same order. A probe runs the loop's body on
each item of a copy of the module, one at a time, and records what it writes and whether it draws; the body must
leave alone everything that is not a torch.nn layer (the top-level may not touch tensors), and its draws take
their place among the construction events, which the segmentation keeps in order."""

from __future__ import annotations

import ast
import copy
import sys
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mkevolve.builtin.construction import Construction, Owner
from mkevolve.builtin.errors import UnsupportedModule
from mkevolve.builtin.init_source import (ITEMS_OF_LAYER, LAYER_AS_ITEM, FollowUp, InitLoop, InitSource,
                                          assigned_names, follow_up_free_names, loaded_names, statement_place)

# The names these give differ inside a subproblem ("0.weight" for "features.0.weight"): a body must not read them.
_RELATIVE_NAMES = frozenset({"named_modules", "named_parameters"})


def loop_follow_ups(init_source: InitSource, model: nn.Module, construction: Construction,
                    constants: dict[str, Any], import_names: set[str]) -> dict[Owner, list[FollowUp]]:
    """Each layer the init loops change -> the replays of those loops on it."""
    follow_ups: dict[Owner, list[FollowUp]] = {}
    for stmt in init_source.statements:
        loop = _parse(stmt)
        if loop is None:
            continue
        free = follow_up_free_names(stmt, construction, constants, import_names,
                                    assigned_names(stmt.target) | assigned_names(ast.Module(stmt.body, [])))
        order, _ = statement_place(stmt, construction)
        namespace = {**init_source.module_globals, **construction.root_arguments}
        for path, (position, draws) in _probe(stmt, loop, model, set(construction.leaves), namespace).items():
            # Between the loop's start and the next event, where nothing but the loop happens.
            follow_up = FollowUp(ast.unparse(stmt), (path,), free, order + position, draws, loop)
            follow_ups.setdefault(Owner.leaf(path), []).append(follow_up)
    return follow_ups


def _parse(stmt: ast.stmt) -> InitLoop | None:
    """The loop, where `stmt` is a loop over self.<held>() whose body a subproblem can run item by item."""
    call = stmt.iter if isinstance(stmt, ast.For) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr in ITEMS_OF_LAYER.keys() | LAYER_AS_ITEM.keys()
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"):
        return None
    held = call.func.attr
    why = _not_replayable(stmt, held)
    if why:
        raise UnsupportedModule(f"Model.__init__ re-initialises its layers in a loop over self.{held}() "
                                f"(`{_header(stmt)}`) that no subproblem can replay on its own layers: {why}")
    return InitLoop(ast.unparse(stmt.target), held, "\n".join(ast.unparse(s) for s in stmt.body))


def _not_replayable(stmt: ast.For, held: str) -> str | None:
    call = stmt.iter
    body = ast.Module(stmt.body, [])
    if call.args or call.keywords:
        return "it passes arguments to the method"
    if stmt.orelse:
        return "it has an else block"
    if any(isinstance(n, (ast.Break, ast.Return, ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal))
           for n in ast.walk(body)):
        return "its body leaves the loop early or binds names outside it"
    if "self" in loaded_names(body):
        return "its body reads self, which in a subproblem is another module"
    if any(isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) for n in ast.walk(body)):
        return "its body carries a value from one item to the next"
    if held in _RELATIVE_NAMES and isinstance(stmt.target, ast.Tuple) and isinstance(stmt.target.elts[0], ast.Name) \
            and stmt.target.elts[0].id in loaded_names(body):
        return f"its body reads the names self.{held}() gives, which differ inside a subproblem"
    return None


def _header(stmt: ast.stmt) -> str:
    return ast.unparse(stmt).splitlines()[0][:60]


def _probe(stmt: ast.For, loop: InitLoop, model: nn.Module, leaves: set[str],
           namespace: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    """Run the body on each item of a copy, one at a time: layer path -> (where the body first changes it or draws
    for it, as a share of the loop between 0 and 1, whether the body draws for it)."""
    try:
        scratch = copy.deepcopy(model)
    except Exception as err:  # noqa: BLE001  (the user's modules decide how they copy)
        raise UnsupportedModule(f"cannot copy the module to try `{_header(stmt)}` on it item by item "
                                f"({type(err).__name__}: {err})") from None
    items = list(getattr(scratch, loop.held)())
    paths = _item_paths(scratch)
    one_item = ast.fix_missing_locations(ast.Module(
        [ast.For(stmt.target, ast.Name("__items__", ast.Load()), stmt.body, [])], []))
    code = compile(one_item, "<init loop>", "exec")
    changed: dict[str, tuple[float, bool]] = {}
    effects = _Effects(scratch)
    with torch.random.fork_rng(devices=[]):
        for index, item in enumerate(items):
            item_path = paths.get(id(item[1] if isinstance(item, tuple) else item), "")
            try:
                written, drew = effects.of(lambda: exec(code, {**namespace, "__items__": [item]}))  # noqa: S102
            except Exception as err:  # noqa: BLE001  (the user's loop body, alone on one item)
                raise UnsupportedModule(f"the loop `{_header(stmt)}` in Model.__init__ fails when run on "
                                        f"'{item_path}' alone ({type(err).__name__}: {err}): it carries state "
                                        "from one item to the next") from None
            if not (written or drew):
                continue
            leaf = _leaf_of(item_path, leaves)
            outside = sorted(n for n in written if leaf is None or not _within(n, leaf))
            if leaf is None or outside:
                effect = f"writes {', '.join(outside)}" if outside else "draws random numbers"
                raise UnsupportedModule(f"the loop `{_header(stmt)}` in Model.__init__ {effect} for "
                                        f"'{item_path or 'self'}', which is not one torch.nn layer that a subproblem "
                                        "rebuilds: no subproblem could replay that")
            position, draws = changed.get(leaf, ((index + 1) / (len(items) + 1), False))
            changed[leaf] = (position, draws or drew)
    return changed


def _item_paths(model: nn.Module) -> dict[int, str]:
    """Every module, parameter and buffer of the module by its path."""
    paths = {id(t): n for n, t in model.named_parameters(remove_duplicate=False)}
    paths |= {id(t): n for n, t in model.named_buffers(remove_duplicate=False)}
    paths |= {id(m): p for p, m in model.named_modules(remove_duplicate=False)}
    return paths


def _leaf_of(path: str, leaves: set[str]) -> str | None:
    return next((leaf for leaf in leaves if _within(path, leaf)), None)


def _within(path: str, leaf: str) -> bool:
    return path == leaf or path.startswith(leaf + ".")


class _Effects(TorchDispatchMode):
    """What one run of the body does to the module: the parameters and buffers it writes (in place, through
    .data too), the attributes it sets on modules, and whether it draws random numbers."""

    def __init__(self, model: nn.Module):
        super().__init__()
        tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
        self.storage_names: dict[int, list[str]] = {}
        for name, tensor in tensors:
            if tensor.numel():
                self.storage_names.setdefault(_storage(tensor), []).append(name)
        self.module_paths = {id(m): p for p, m in model.named_modules(remove_duplicate=False)}
        self.written: set[str] = set()

    def of(self, run) -> tuple[set[str], bool]:
        """What `run()` writes, and whether it draws random numbers."""
        self.written = set()
        state = torch.random.get_rng_state()
        previous = sys.getprofile()
        sys.setprofile(self._attribute_set)
        try:
            with self:
                run()
        finally:
            sys.setprofile(previous)
        return self.written, not torch.equal(state, torch.random.get_rng_state())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for position, argument in enumerate(func._schema.arguments):
            if argument.alias_info is not None and argument.alias_info.is_write:
                value = args[position] if position < len(args) else kwargs.get(argument.name)
                if isinstance(value, torch.Tensor):
                    self.written.update(self.storage_names.get(_storage(value), []))
        return func(*args, **kwargs)

    def _attribute_set(self, frame, event, arg) -> None:
        # `m.weight = nn.Parameter(...)`, `m.eps = 1e-3`: a new value, not a write into a tensor.
        if event == "call" and frame.f_code.co_name in ("__setattr__", "register_buffer", "register_parameter"):
            path = self.module_paths.get(id(frame.f_locals.get("self")))
            name = frame.f_locals.get("name")
            if path is not None and isinstance(name, str):
                self.written.add(f"{path}.{name}" if path else name)


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()

