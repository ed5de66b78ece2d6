"""Matching the subproblems of two decompositions: normalised source, signatures, place in the subproblem graph."""

from __future__ import annotations

import ast
import builtins
import hashlib
from dataclasses import dataclass

import networkx as nx

from mkevolve.codebase import LOADER, Decomposition
from mkevolve.pysource import parse_python

GRAPH_INPUT, GRAPH_OUTPUT = "<input>", "<output>"
_INPUT_FUNCTIONS = frozenset({"get_inputs", "get_init_inputs", "get_input_configs"})
# The interface every subproblem shares; renaming these would hide what the code implements.
_INTERFACE_NAMES = frozenset({"Model", "__init__", "forward", "self", "super"})


# ---- normalised source -------------------------------------------------------------------------------


class _Abstractor(ast.NodeTransformer):
    """Constants become one placeholder; local, parameter, helper and self-attribute names become v0, v1, ...
    in order of first use. Imported modules, builtins, library attributes and keyword names stay: they say
    what the code computes."""

    def __init__(self, kept: frozenset[str]):
        self.kept = kept
        self.placeholders: dict[str, str] = {}

    def _abstract(self, name: str) -> str:
        if name in self.kept or name in _INTERFACE_NAMES:
            return name
        return self.placeholders.setdefault(name, f"v{len(self.placeholders)}")

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.copy_location(ast.Constant(value=Ellipsis), node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._abstract(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._abstract(node.arg)
        self.generic_visit(node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self._abstract(f"self.{node.attr}")
        self.generic_visit(node)
        return node

    def _definition(self, node):
        node.name = self._abstract(node.name)
        node.body = _without_docstring(node.body) or [ast.Pass()]
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _definition


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _imported_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def normalised_source(source: str) -> str:
    """The module's classes and functions (input functions, imports, constants and docstrings left out)
    with constants and names abstracted, as an AST dump: equal for files that differ only in naming,
    numbers, comments and test inputs."""
    tree = parse_python(source)
    kept = frozenset(_imported_names(tree) | set(dir(builtins)))
    definitions = [node for node in tree.body
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                   and node.name not in _INPUT_FUNCTIONS]
    abstractor = _Abstractor(kept)
    module = ast.Module(body=[abstractor.visit(node) for node in definitions], type_ignores=[])
    return ast.dump(module, annotate_fields=False, include_attributes=False)


# ---- signatures ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signature:
    """The shape of a method's parameter list (self left out); names are abstracted like the source."""

    positional: int
    defaults: int
    keyword_only: int
    varargs: bool
    kwargs: bool

    @classmethod
    def of(cls, function: ast.FunctionDef | None) -> Signature | None:
        if function is None:
            return None
        args = function.args
        return cls(positional=len(args.posonlyargs) + len(args.args) - 1, defaults=len(args.defaults),
                   keyword_only=len(args.kwonlyargs), varargs=args.vararg is not None,
                   kwargs=args.kwarg is not None)

    def describe(self) -> str:
        parts = [f"{self.positional} positional"]
        if self.defaults:
            parts.append(f"{self.defaults} with defaults")
        if self.keyword_only:
            parts.append(f"{self.keyword_only} keyword-only")
        if self.varargs:
            parts.append("*args")
        if self.kwargs:
            parts.append("**kwargs")
        return ", ".join(parts)


def _model_methods(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        return {}
    return {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}


@dataclass(frozen=True)
class Fingerprint:
    """What a subproblem computes, in a form that ignores naming: the basis of a match."""

    name: str
    source_hash: str
    init: Signature | None
    forward: Signature | None

    @classmethod
    def of(cls, name: str, source: str) -> Fingerprint:
        try:
            tree = parse_python(source)
            normal = normalised_source(source)
        except SyntaxError:
            # An unparsable file matches nothing: its hash is its own text's.
            return cls(name, "unparsable:" + hashlib.sha256(source.encode()).hexdigest()[:16], None, None)
        methods = _model_methods(tree)
        return cls(name=name, source_hash=hashlib.sha256(normal.encode()).hexdigest()[:16],
                   init=Signature.of(methods.get("__init__")), forward=Signature.of(methods.get("forward")))

    def same_interface(self, other: Fingerprint) -> bool:
        return self.init == other.init and self.forward == other.forward


# ---- the subproblem graph ------------------------------------------------------------------------------


class _DataFlow:
    """Which subproblem produced each value in the top-level's forward; an edge for every value passed on."""

    def __init__(self, graph: nx.DiGraph, modules: dict[str, str]):
        self.graph = graph
        self.modules = modules              # "self.attr" or a local name -> subproblem name
        self.producers: dict[str, set[str]] = {}

    def subproblem_called(self, func: ast.AST) -> str | None:
        while isinstance(func, ast.Subscript):          # self.blocks[i](x)
            func = func.value
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            return self.modules.get(f"self.{func.attr}")
        if isinstance(func, ast.Name):
            return self.modules.get(func.id)
        return None

    def flow(self, node: ast.AST | None) -> set[str]:
        """The subproblems (or the graph input) whose outputs reach the value of `node`."""
        if node is None:
            return set()
        if isinstance(node, ast.Name):
            return set(self.producers.get(node.id, set()))
        if isinstance(node, ast.Call):
            called = self.subproblem_called(node.func)
            sources = set().union(*(self.flow(a) for a in node.args + [k.value for k in node.keywords]))
            if called is None:
                return sources | self.flow(node.func)
            for source in sources:
                self.graph.add_edge(source, called)
            return {called}
        return set().union(set(), *(self.flow(child) for child in ast.iter_child_nodes(node)
                                    if isinstance(child, ast.expr)))

    def bind(self, target: ast.AST, values: set[str]) -> None:
        if isinstance(target, ast.Name):
            self.producers[target.id] = set(values)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.bind(element, values)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, values)

    def run(self, statements: list[ast.stmt]) -> None:
        for stmt in statements:
            self.statement(stmt)

    def statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Assign):
            values = self.flow(stmt.value)
            for target in stmt.targets:
                self.bind(target, values)
        elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and stmt.value is not None:
            values = self.flow(stmt.value)
            if isinstance(stmt.target, ast.Name) and isinstance(stmt, ast.AugAssign):
                values |= self.producers.get(stmt.target.id, set())
            self.bind(stmt.target, values)
        elif isinstance(stmt, ast.Return):
            for source in self.flow(stmt.value):
                self.graph.add_edge(source, GRAPH_OUTPUT)
        elif isinstance(stmt, ast.For):
            self._loop(stmt)
        elif isinstance(stmt, (ast.If, ast.While, ast.With)):
            self.flow(getattr(stmt, "test", None))
            self.run(stmt.body)
            self.run(getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.Expr):
            self.flow(stmt.value)

    def _loop(self, stmt: ast.For) -> None:
        # `for block in self.blocks:` makes `block` stand for that subproblem; the body runs twice so a
        # value carried from one pass to the next gives its edge too.
        module = self.subproblem_called(stmt.iter)
        if module is not None and isinstance(stmt.target, ast.Name):
            self.modules[stmt.target.id] = module
        else:
            self.bind(stmt.target, self.flow(stmt.iter))
        for _ in range(2):
            self.run(stmt.body)
        self.run(stmt.orelse)


def _loaded_aliases(tree: ast.Module) -> dict[str, str]:
    """`Alias = load_subproblem("name")` bindings of the top-level: alias -> subproblem name."""
    aliases = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == LOADER
                and node.value.args and isinstance(node.value.args[0], ast.Constant)):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    aliases[target.id] = node.value.args[0].value
    return aliases


def _module_attributes(init: ast.FunctionDef | None, aliases: dict[str, str]) -> dict[str, str]:
    """`self.attr = Alias(...)` (or a container of them) in __init__: "self.attr" -> subproblem name."""
    modules: dict[str, str] = {}
    for node in ast.walk(init) if init is not None else ():
        if not isinstance(node, ast.Assign):
            continue
        built = next((aliases[c.func.id] for c in ast.walk(node.value)
                      if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in aliases), None)
        for target in node.targets:
            if (built and isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self"):
                modules[f"self.{target.attr}"] = built
    return modules


def subproblem_graph(decomposition: Decomposition) -> nx.DiGraph:
    """Subproblems as nodes (with their instance counts), an edge wherever the top-level's forward passes
    one subproblem's output to another; GRAPH_INPUT and GRAPH_OUTPUT stand for the model's inputs and result."""
    graph = nx.DiGraph()
    graph.add_node(GRAPH_INPUT)
    for spec in decomposition.subproblems:
        graph.add_node(spec.name, instances=spec.instances)
    graph.add_node(GRAPH_OUTPUT)
    try:
        tree = parse_python(decomposition.top_level)
    except SyntaxError:
        return graph
    methods = _model_methods(tree)
    forward = methods.get("forward")
    if forward is None:
        return graph
    flow = _DataFlow(graph, _module_attributes(methods.get("__init__"), _loaded_aliases(tree)))
    for arg in forward.args.posonlyargs + forward.args.args[1:] + forward.args.kwonlyargs:
        flow.producers[arg.arg] = {GRAPH_INPUT}
    for extra in (forward.args.vararg, forward.args.kwarg):
        if extra is not None:
            flow.producers[extra.arg] = {GRAPH_INPUT}
    flow.run(forward.body)
    return graph


# ---- matching ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """The solution subproblem a variant subproblem reuses the kernel of (None: a new subproblem)."""

    variant: str
    solution: str | None
    position: float          # how alike their places in the two graphs are, 0..1
    reason: str


@dataclass(frozen=True)
class _Neighbourhood:
    predecessors: frozenset[str]
    successors: frozenset[str]


def _neighbourhoods(decomposition: Decomposition, prints: dict[str, Fingerprint]) -> dict[str, _Neighbourhood]:
    """Each subproblem's neighbours, named by what they compute (source hash), so names do not matter."""
    graph = subproblem_graph(decomposition)

    def label(node: str) -> str:
        return prints[node].source_hash if node in prints else node

    return {name: _Neighbourhood(frozenset(map(label, graph.predecessors(name))),
                                 frozenset(map(label, graph.successors(name))))
            for name in decomposition.names}


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return 1.0 if not a and not b else len(a & b) / len(a | b)


def position_similarity(a: _Neighbourhood, b: _Neighbourhood) -> float:
    return (_jaccard(a.predecessors, b.predecessors) + _jaccard(a.successors, b.successors)) / 2


@dataclass(frozen=True)
class _Side:
    """One decomposition as matching sees it: each subproblem's fingerprint and neighbourhood."""

    names: list[str]
    prints: dict[str, Fingerprint]
    places: dict[str, _Neighbourhood]

    @classmethod
    def of(cls, decomposition: Decomposition) -> _Side:
        prints = {s.name: Fingerprint.of(s.name, s.source) for s in decomposition.subproblems}
        return cls(decomposition.names, prints, _neighbourhoods(decomposition, prints))


def _match_one(name: str, variant: _Side, solution: _Side) -> Match:
    mine, place = variant.prints[name], variant.places[name]

    def rank(other: str) -> tuple:
        return (position_similarity(place, solution.places[other]), other == name, -solution.names.index(other))

    same = [s for s in solution.names
            if solution.prints[s].source_hash == mine.source_hash and solution.prints[s].same_interface(mine)]
    if same:
        best = max(same, key=rank)
        alike = position_similarity(place, solution.places[best])
        return Match(name, best, alike, f"same normalised source and signatures as {best}, "
                                        f"graph position {alike:.0%} alike")
    nearest = max(solution.names, key=lambda s: (solution.prints[s].same_interface(mine),) + rank(s), default=None)
    return Match(name, None, 0.0, _why_new(mine, solution.prints.get(nearest)))


def match_subproblems(solution: Decomposition, variant: Decomposition) -> list[Match]:
    """One Match per variant subproblem, in the variant's order.

    A variant subproblem matches a solution subproblem when their normalised sources are equal and their
    constructor and forward signatures agree; when several do, the one whose place in the subproblem graph
    is most alike wins (then the same name, then the earlier one). Several variant subproblems may match
    the same solution subproblem: its kernel is re-verified on each.
    """
    solution_side, variant_side = _Side.of(solution), _Side.of(variant)
    return [_match_one(name, variant_side, solution_side) for name in variant.names]


def _why_new(mine: Fingerprint, nearest: Fingerprint | None) -> str:
    if nearest is None:
        return "new: the solution has no subproblems"
    what = "normalised source differs" if nearest.same_interface(mine) else "normalised source and signatures differ"
    return f"new: its {what} from every solution subproblem's (nearest: {nearest.name})"
