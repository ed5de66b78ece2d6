"""The original's __init__ as source: the statements that create each raw parameter, the expressions behind
each layer's arguments, and the statements that change layers after they are built (custom inits)."""

from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

from torch import nn

from mkevolve.builtin.construction import Construction, LeafRecord, Owner, RawRecord, plain_tensor_attributes
from mkevolve.builtin.errors import UnsupportedModule
from mkevolve.builtin.values import literal_source, module_constants, same_value
from mkevolve.pysource import parse_python


def _assigns(stmt: ast.stmt, name: str) -> bool:
    return isinstance(stmt, ast.Assign) and any(is_self_attr(t, name) for t in stmt.targets)


def _registers(stmt: ast.stmt, name: str) -> bool:
    """`self.register_buffer("<name>", ...)` or `self.register_parameter("<name>", ...)`."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr in ("register_buffer", "register_parameter")
            and bool(call.args) and isinstance(call.args[0], ast.Constant) and call.args[0].value == name)


@dataclass
class InitSource:
    """The top module's __init__ as statements, for slicing out what creates one parameter."""

    statements: list[ast.stmt]
    arg_names: set[str]
    module_globals: dict[str, Any]

    @classmethod
    def of(cls, source: str, module_globals: dict[str, Any], class_name: str = "Model") -> InitSource:
        tree = parse_python(source)
        model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
        init = next((n for n in (model.body if model else []) if isinstance(n, ast.FunctionDef)
                     and n.name == "__init__"), None)
        if init is None:
            return cls([], set(), module_globals)
        args = init.args
        names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        return cls(list(init.body), names - {"self"}, module_globals)

    def raw_statements(self, name: str, plain: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
        """The statements that create self.<name> (its inputs, its definition, in-place inits after it)
        and the free names they need. Attributes in `plain` hold plain values (`self.head_dim = dim // heads`):
        a tensor made from them takes the statements that assign them along."""
        index = self._definition(name)
        if index is None:
            raise UnsupportedModule(f"cannot find the statement that creates self.{name} in Model.__init__")
        chosen = {index}
        pending = _inputs_of(self.statements[index], plain)
        while pending:
            needed = pending.pop()
            for j in range(index - 1, -1, -1):
                if j not in chosen and needed in assigned_names(self.statements[j]) | _assigned_self(
                        self.statements[j], plain):
                    chosen.add(j)
                    pending += _inputs_of(self.statements[j], plain)
                    break
        for j in range(index + 1, len(self.statements)):
            stmt = self.statements[j]
            if isinstance(stmt, ast.Expr) and _self_attributes(stmt) == {name}:
                chosen.add(j)
        picked = [self.statements[j] for j in sorted(chosen)]
        if any(_self_attributes(s) - {name} - plain for s in picked):
            raise UnsupportedModule(f"self.{name} is created from other attributes of the module")
        assigned = set().union(*(assigned_names(s) for s in picked))
        free = [n for n in dict.fromkeys(n for s in picked for n in loaded_names(s))
                if n not in assigned and n != "self"]
        return [ast.unparse(s) for s in picked], free

    def _definition(self, name: str) -> int | None:
        """The index of the last statement that defines `self.<name>`: an assignment or a registration."""
        found = None
        for i, stmt in enumerate(self.statements):
            if _assigns(stmt, name) or _registers(stmt, name):
                found = i
        return found

    def leaf_expressions(self, leaf: LeafRecord, root_arguments: dict[str, Any]) -> dict[str, str]:
        """Constructor arguments of a layer made by `self.<attr> = Layer(...)`, as expressions over the
        top module's arguments and module constants, where they evaluate to what the layer received."""
        call = self._constructor_call(leaf.path)
        if call is None or any(isinstance(a, ast.Starred) for a in call.args):
            return {}
        try:
            bound = inspect.signature(leaf.cls.__init__).bind(None, *call.args,
                                                              **{k.arg: k.value for k in call.keywords if k.arg})
        except TypeError:
            return {}  # the call does not bind as written (a **kwargs spread): keep the literal values
        namespace = {name: self.module_globals[name] for name in self.literal_globals}
        namespace.update(root_arguments)
        values = {name: value for name, value, _ in leaf.arguments}
        expressions = {}
        for name, node in list(bound.arguments.items())[1:]:
            names = _loaded_names_expr(node) if isinstance(node, ast.expr) else {"*"}
            if name not in values or not names <= set(namespace):
                continue
            try:
                value = eval(compile(ast.Expression(node), "<init>", "eval"), {"__builtins__": builtins}, namespace)
            except (ArithmeticError, TypeError, ValueError, IndexError, KeyError):
                continue  # the expression needs more than sizes and constants: keep the literal value
            if same_value(value, values[name]):
                expressions[name] = ast.unparse(node)
        return expressions

    @property
    def literal_globals(self) -> set[str]:
        return set(module_constants(self.module_globals))

    def _constructor_call(self, path: str) -> ast.Call | None:
        if "." in path:
            return None
        for stmt in self.statements:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and is_self_attr(stmt.targets[0], path)
                    and isinstance(stmt.value, ast.Call)):
                return stmt.value
        return None

    def follow_ups(self) -> list[tuple[ast.stmt, set[str]]]:
        """Statements that change attributes after they are built (custom inits such as
        `nn.init.zeros_(self.fc.bias)` or `self.conv.bias = nn.Parameter(...)`), with the attributes they name."""
        found = []
        for stmt in self.statements:
            touches_inside = isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(
                _is_nested_self_attribute(t) for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]))
            plain_call = isinstance(stmt, ast.Expr) and not (
                isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute)
                and stmt.value.func.attr in ("register_buffer", "register_parameter", "__init__"))
            if (touches_inside or plain_call) and _self_attributes(stmt):
                found.append((stmt, _self_attributes(stmt)))
        return found


def _is_nested_self_attribute(node: ast.AST) -> bool:
    """self.<a>.<b>...: an attribute of something the module holds."""
    return (isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.value, (ast.Attribute, ast.Subscript))
            and _root_is_self(node))


def _root_is_self(node: ast.AST) -> bool:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def is_self_attr(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Name)
            and node.value.id == "self")


def _assigned_self(stmt: ast.AST, plain: frozenset[str]) -> set[str]:
    """The plain-value attributes a statement assigns (`self.heads, self.head_dim = heads, dim // heads`)."""
    return {n.attr for n in ast.walk(stmt) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            and isinstance(n.value, ast.Name) and n.value.id == "self" and n.attr in plain}


def _inputs_of(stmt: ast.AST, plain: frozenset[str]) -> list[str]:
    """The names a statement reads, and the plain-value attributes it reads (`self.head_dim`)."""
    attributes = [n.attr for n in ast.walk(stmt) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
                  and isinstance(n.value, ast.Name) and n.value.id == "self" and n.attr in plain]
    return loaded_names(stmt) + attributes


def plain_value_attributes(module: nn.Module) -> frozenset[str]:
    """Attributes a module holds as plain numbers, strings or tuples of them (sizes, flags), not tensors or layers."""
    def plain(value) -> bool:
        return isinstance(value, (int, float, bool, str)) or (
            isinstance(value, tuple) and all(isinstance(v, (int, float, bool, str)) for v in value))
    return frozenset(name for name, value in vars(module).items() if not name.startswith("_") and plain(value))


def _self_attributes(stmt: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(stmt) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "self"} - {"register_buffer", "register_parameter"}


def assigned_names(stmt: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def loaded_names(stmt: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]


def _loaded_names_expr(node: ast.AST) -> set[str]:
    return set(loaded_names(node)) - set(dir(builtins))


def raw_records(units, construction: Construction, init_source: InitSource, model,
                 constants: dict[str, Any], import_names: set[str], source: str) -> dict[str, RawRecord]:
    """The top module's own parameters and buffers that a subproblem must create: used ones, and unused
    ones whose creation draws random numbers (they shift every later weight)."""
    names = {owner.name for unit in units for owner in unit.owners if not owner.is_leaf}
    names |= {name for name, (_, draws) in construction.raw_order.items()
              if draws and (name in model._parameters or name in model._buffers
                            or name in plain_tensor_attributes(model))}
    raws = {}
    for name in sorted(names):
        order, draws = construction.raw_order.get(name, (-1, True))
        if "." in name:
            raws[name] = _nested_raw(name, construction, model, source, init_source.module_globals, constants,
                                     import_names, order, draws)
            continue
        statements, free = init_source.raw_statements(name, plain_value_attributes(model))
        needed = []
        for free_name in free:
            if free_name in construction.root_arguments or free_name in constants:
                needed.append(free_name)
            elif free_name not in import_names and not hasattr(builtins, free_name):
                raise UnsupportedModule(f"self.{name} is created from '{free_name}', which is neither an argument "
                                        "of Model nor a module-level constant")
        raws[name] = RawRecord(name, statements, needed, order, draws)
    return raws


def _nested_raw(name: str, construction: Construction, model: nn.Module, source: str, module_globals,
                constants: dict[str, Any], import_names: set[str], order: int, draws: bool) -> RawRecord:
    """A parameter or buffer of a user-defined submodule (`attn.bias`): the statements of that class's
    __init__ that create it, with the submodule's own constructor arguments written in as literals (the
    subproblem has no such argument; the value is the one this instance received)."""
    parent, _, local = name.rpartition(".")
    cls = type(model.get_submodule(parent))
    statements, free = InitSource.of(source, module_globals, cls.__name__).raw_statements(
        local, plain_value_attributes(model.get_submodule(parent)))
    arguments = construction.module_arguments.get(parent, {})
    literals, needed = {}, []
    for free_name in free:
        if free_name in arguments:
            literals[free_name] = literal_source(arguments[free_name])
        elif free_name in constants:
            needed.append(free_name)
        elif free_name not in import_names and not hasattr(builtins, free_name):
            raise UnsupportedModule(f"{cls.__name__}.{local} is created from '{free_name}', which is neither an "
                                    f"argument of {cls.__name__} nor a module-level constant")
    statements = [_substitute_names(s, literals) for s in statements]
    return RawRecord(name, statements, needed, order, draws, local)


def _substitute_names(statement: str, literals: dict[str, str]) -> str:
    """The statement with each named variable read replaced by its literal source."""
    if not literals:
        return statement

    class Substitute(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name):
            if isinstance(node.ctx, ast.Load) and node.id in literals:
                return parse_python(literals[node.id], mode="eval").body
            return node

    return ast.unparse(Substitute().visit(parse_python(statement)))


def imported_names(imports: tuple[str, ...]) -> set[str]:
    names = {"torch", "nn", "F", "math", "operator"}
    for statement in imports:
        for node in ast.walk(parse_python(statement)):
            if isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
    return names


# How a subproblem lists one layer's items, per method the loop calls: a layer's own items, or the layer itself
# as one item (a child of the top module).
ITEMS_OF_LAYER = {"modules": "{layer}.modules()", "named_modules": "{layer}.named_modules()",
                  "parameters": "{layer}.parameters()", "named_parameters": "{layer}.named_parameters()"}
LAYER_AS_ITEM = {"children": "{layer}", "named_children": "({name!r}, {layer})"}


@dataclass(frozen=True)
class InitLoop:
    """`for <target> in self.<held>(): <body>`, written again over the layers of one subproblem."""

    target: str
    held: str
    body: str

    def statement(self, layers: list[tuple[str, str]]) -> str:
        """The loop over the items of `layers`, each (its path in the original, its source in the subproblem)."""
        return f"for {self.target} in {self._items(layers)}:\n{textwrap.indent(self.body, '    ')}"

    def _items(self, layers: list[tuple[str, str]]) -> str:
        if self.held in LAYER_AS_ITEM:
            items = [LAYER_AS_ITEM[self.held].format(layer=source, name=path) for path, source in layers]
            return f"({', '.join(items)},)"
        items = [ITEMS_OF_LAYER[self.held].format(layer=source) for _, source in layers]
        return items[0] if len(items) == 1 else f"[{', '.join('*' + i for i in items)}]"


@dataclass(frozen=True)
class FollowUp:
    """A statement of the original __init__ that changes layers after they are built."""

    statement: str
    layers: tuple[str, ...]       # the layer attributes it names (a replayed loop: the one layer it runs on)
    free_names: tuple[str, ...]   # Model arguments and module constants it reads
    order: float                  # its place among the construction events, so its random draws keep theirs
    draws_random: bool
    loop: InitLoop | None = None  # the loop it replays on its layer; a subproblem runs it once over its layers
    tie: bool = False             # `self.head.weight = self.embed.weight`: the layers may sit in two subproblems,
                                  # and the top-level ties them once both are built


def statement_place(stmt: ast.stmt, construction: Construction) -> tuple[int, bool]:
    """When a statement of Model.__init__ ran among the construction events, and whether it drew random numbers."""
    lines = construction.root_lines
    order = lines.order(stmt.lineno, stmt.end_lineno or stmt.lineno)
    if order is None:
        raise UnsupportedModule(f"cannot tell when `{ast.unparse(stmt).splitlines()[0][:60]}` runs in Model.__init__")
    return order, lines.draws(stmt.lineno, stmt.end_lineno or stmt.lineno)


def follow_up_free_names(stmt: ast.AST, construction: Construction, constants: dict[str, Any], import_names: set[str],
                         local_names: frozenset[str] | set[str] = frozenset()) -> tuple[str, ...]:
    """The Model arguments and module constants a statement reads; anything else it reads (other locals of
    __init__, functions of the file) a subproblem would not have."""
    free = [n for n in dict.fromkeys(loaded_names(stmt)) if n != "self" and n not in import_names
            and n not in local_names and not hasattr(builtins, n)]
    unknown = [n for n in free if n not in construction.root_arguments and n not in constants]
    if unknown:
        raise UnsupportedModule(f"`{ast.unparse(stmt).splitlines()[0][:60]}` in Model.__init__ reads "
                                f"{', '.join(unknown)}, which is neither an argument of Model nor a module-level "
                                "constant")
    return tuple(free)


def init_links(init_source: InitSource, model: nn.Module, construction: Construction, constants: dict[str, Any],
           import_names: set[str]) -> tuple[list[set[str]], dict[str, list[FollowUp]]]:
    """Statements after construction that touch layers (custom inits) tie those layers together; each is
    kept under its first layer."""
    links, follow_ups = [], {}
    for stmt, attributes in init_source.follow_ups():
        tied = _tied_layers(stmt, model, construction)
        if tied:      # no link: the two layers may sit in two subproblems
            order, draws = statement_place(stmt, construction)
            follow_ups.setdefault(Owner.leaf(min(tied)), []).append(
                FollowUp(ast.unparse(stmt), tuple(sorted(tied)), (), order, draws, tie=True))
            continue
        keys = set()
        for attribute in attributes:
            if attribute in construction.leaves:
                keys.add(Owner.leaf(attribute))
            elif attribute in model._parameters or attribute in model._buffers:
                continue  # raw parameters carry their own follow-ups
            else:
                raise UnsupportedModule(f"Model.__init__ runs `{ast.unparse(stmt)[:60]}` on self.{attribute}, "
                                        "which the builtin decomposer cannot move into a subproblem")
        if keys:
            free = follow_up_free_names(stmt, construction, constants, import_names)
            links.append(keys)
            layers = tuple(sorted(k.name for k in keys))
            order, draws = statement_place(stmt, construction)
            follow_ups.setdefault(min(keys), []).append(FollowUp(ast.unparse(stmt), layers, free, order, draws))
    return links, follow_ups


def _tied_layers(stmt: ast.stmt, model: nn.Module, construction: Construction) -> set[str]:
    """The two layers of `self.<layer>.<param> = self.<other layer>.<param>` (paths such as
    `transformer.wte`): one parameter shared by two layers, a language model's head and its token embedding.
    Empty for any other statement."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
        return set()
    layers = []
    for node in (stmt.targets[0], stmt.value):
        path = self_path(node)
        layer, _, name = (path or "").rpartition(".")
        if layer not in construction.leaves or name not in model.get_submodule(layer)._parameters:
            return set()
        layers.append(layer)
    return set(layers) if layers[0] != layers[1] else set()


def self_path(node: ast.AST) -> str | None:
    """"a.b.c" for `self.a.b.c`; None for anything but a chain of attributes from self."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return ".".join(reversed(names)) if isinstance(node, ast.Name) and node.id == "self" and names else None
